"""`status`, `stop` and `list`: re-attach to recorded runs.

Light imports only (store, layout, the launcher of the run's kind): these start fast.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ftcluster.cli import cli
from ftcluster.cli.numbers import count, seconds
from ftcluster.cli.output import cell, complete_run, console, echo_json, table
from ftcluster.errors import UserError
from ftcluster.observe.documents import document, run_json
from ftcluster.run.store import RUN_STATUSES, RunRecord, RunStore

if TYPE_CHECKING:
    from rich.table import Table


def forward_record(rec: RunRecord, args: list[str]) -> bool:
    """Pass a command about a run launched through a login node on to that node."""
    if rec.scheduler != "remote":
        return False
    # startup: ssh and the spec models (pydantic) only for a run made through a login node
    from ftcluster.hosts.login import forward
    from ftcluster.spec.load import load_cluster

    rc = forward(load_cluster(rec.cluster_source), args, {})
    if rc:
        sys.exit(rc)
    return True


@cli.command("status")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON (see docs/reference.md).")
def status_cmd(run: str | None, as_json: bool) -> None:
    """Queue state, per-rank state and endpoint of a run (default: the newest).

    \b
    Example:
      ftcluster status gpt-20261121-101500-ab12
    """
    # startup: the status readers (the schedulers and their queries) only for `status`, not `list` or `--help`
    from ftcluster.observe.status import run_status

    rec = RunStore().get(run)
    if forward_record(rec, ["status", rec.run_id] + (["--json"] if as_json else [])):
        return
    st = run_status(rec)
    if as_json:
        echo_json(st)
        return
    console().print(status_table(st))
    if st["same_host"]:
        console().print(f"note: {st['same_host']}", markup=False, soft_wrap=True)


def status_table(st: dict[str, Any]) -> Table:
    """`status`'s table of a status object: one row a fact, whole values (a long one wraps at
    word boundaries on a terminal); a replica set's balancer and a row per member."""
    # startup: the status readers only for `status`, not `list` or `--help`
    from ftcluster.observe.status import health_label, successor_label

    t = table(f"run {st['run_id']}", show_header=False)
    is_set = st.get("replicas") is not None
    rows = {"job_id": st["job_id"], "state": st.get("state"), "phase": st["phase_label"],
            "failure": st["failure"], "endpoint": st["endpoint"],
            "access": "private (`ftcluster token`)" if st["access"] == "private" else None, "source": st.get("source"),
            "reason": st["reason"],
            # A set's own job is its balancer's: its members' nodes are in their rows.
            "balancer nodes" if is_set else "nodes": ", ".join(st["balancer_nodes"] if is_set else st["nodes"]),
            "run_dir": st["run_dir"],
            "health": health_label(st["health"]) if st["health"] else None, "room": st["room"],
            "restarts": "\n".join(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['time']))} {r['cause']}"
                                  for r in st["restarts"]) or None,
            "predecessor": st["predecessor"], "successor": successor_label(st["successor"])}
    for key, value in rows.items():
        if value:
            t.add_row(key, cell(value))
    for m in st.get("replicas") or []:
        rotation = "in rotation" if m["in_rotation"] else f"out of rotation{': ' + m['rotation_why'] if m['rotation_why'] else ''}"
        words = [f"run {m['run_id']} (job {m['job_id']}): {m['state']}, {m['phase']}, {rotation}",
                 f"nodes {', '.join(m['nodes']) or '?'}", f"endpoint {m['endpoint'] or 'none yet'}"]
        words += [f"{m['restarts']} restart(s)"] if m["restarts"] else []
        words += [f"failed: {m['failure']}"] if m["failure"] else []
        t.add_row(f"replica {m['replica']}", cell("; ".join(words)))
    for r in st["ranks"]:
        t.add_row(f"rank {r['rank']}", cell(f"{r['node'] or '?'}: {r['state_label']}"))
    return t


@cli.command("token")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--json", "as_json", is_flag=True, help="Print {run_id, token} as JSON.")
def token_cmd(run: str | None, as_json: bool) -> None:
    """Print a private run's token, which its clients send (default: the newest run).

    A private run (access: private) serves through a proxy that passes a request on only with
    `Authorization: Bearer TOKEN` (gRPC: the same `authorization` metadata). Keep it like a
    password: `ftcluster client ... --run RUN` finds it by itself.

    \b
    Example:
      ftcluster token gpt-20261121-101500-ab12 > ~/.gpt-token && chmod 600 ~/.gpt-token
    """
    # startup: only `token` reads a run's access
    from ftcluster.access.run_access import token_of

    rec = RunStore().get(run)
    if forward_record(rec, ["token", rec.run_id] + (["--json"] if as_json else [])):
        return
    token = token_of(rec)
    if token is None:
        raise UserError(f"run {rec.run_id} has no token: its endpoint is open to the cluster (access: cluster)",
                        field="RUN", hint="launch with access: private for a token")
    if as_json:
        echo_json(document("token", {"run_id": rec.run_id, "token": token}))
        return
    click.echo(token)


@cli.command("stop")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--replica", type=count(0, 255), default=None,
              help="A replica set: stop this member alone (it leaves the balancer's rotation first).")
@click.option("--yes", "-y", is_flag=True, help="Stop the newest run without asking (when RUN is left out).")
@click.option("--json", "as_json", is_flag=True, help="Print {stopped: [run objects], already_ended} as JSON.")
def stop_cmd(run: str | None, replica: int | None, yes: bool, as_json: bool) -> None:
    """Cancel a run's job and stop its servers (RUN left out: the newest run, once confirmed).

    A replica set stops each member (out of the balancer's rotation first: requests in flight
    finish), then its balancer.

    \b
    Examples:
      ftcluster stop gpt-20261121-101500-ab12
      ftcluster stop gpt-20261121-101500-ab12 --replica 1
    """
    store = RunStore()
    rec = store.get(run)
    if run is None and not yes:
        # A guessed run is never stopped unasked: another terminal may have launched a newer one.
        if not sys.stdin.isatty():
            raise UserError(f"no RUN given: the newest is {rec.run_id}", field="RUN",
                            hint=f"name it (ftcluster stop {rec.run_id}) or add --yes")
        click.confirm(f"stop run {rec.run_id} (job {rec.job_id}, {rec.status})?", abort=True, err=True)
    if forward_record(rec, ["stop", rec.run_id, "--yes"] + (["--replica", str(replica)] if replica is not None else [])
                      + (["--json"] if as_json else [])):
        return
    stopped, ended = _stop(rec, store, replica)
    if as_json:
        echo_json({"schema_version": 2, "kind": "stop", "stopped": [run_json(r) for r in stopped],
                   "already_ended": ended})
        return
    if ended:
        click.echo(f"run {rec.run_id} has already ended ({ended}); nothing was stopped")
    for r in stopped:
        click.echo(f"stopped run {r.run_id} (job {r.job_id})")


def _stop(rec: RunRecord, store: RunStore, replica: int | None) -> tuple[list[RunRecord], str | None]:
    """Stop a run (a replica set: its members, or one), its successors too; the runs stopped, and
    for a run that had ended already, its job's end in words."""
    # startup: the stopping code only for `stop`, not `list` or `--help`
    from ftcluster.observe.status import LIVE_STATUSES, stop_run, successors

    if rec.style == "front":
        # startup: a replica set's code (the launch, the specs) only to stop a set
        from ftcluster.launch.replica_set import stop_set

        return stop_set(rec, store, replica), None
    if replica is not None:
        raise UserError(f"run {rec.run_id} is not a replica set", field="--replica", hint="leave --replica out")
    # Its successors too (a hand-over before the time limit): the one serving now, or pending.
    later = [r for r in successors(rec, store) if r.job_id and r.status in LIVE_STATUSES]
    if rec.job_id and not later:
        # startup: the run's launcher and state only when a run is stopped
        from ftcluster.schedulers import scheduler_for_record
        from ftcluster.run.state import run_state
        from ftcluster.observe.status import paths_of
        from ftcluster.run.events import events_in

        launcher = scheduler_for_record(rec)
        info = run_state(launcher.info(rec.job_id, paths_of(rec)), events_in(Path(rec.run_dir)), rec.status)
        if info.gone and launcher.identifies(rec.job_id):
            # Nothing to stop, but what the run left on this side (a Docker run's keys) goes.
            launcher.release_resources(paths_of(rec))
            return [], f"job {rec.job_id}: {info.state.value}"
    return [stop_run(r, store) for r in (rec, *later)], None


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of run objects (see docs/reference.md).")
@click.option("--limit", type=count(), default=20, show_default=True)
@click.option("--status", "statuses", multiple=True, type=click.Choice(RUN_STATUSES, case_sensitive=False),
              help="Only runs recorded with this status.")
@click.option("--cluster", "cluster_name", default=None, help="Only runs on this cluster (its spec's name).")
@click.option("--model", "model_name", default=None, help="Only runs of this model.")
def list_cmd(as_json: bool, limit: int, statuses: tuple[str, ...], cluster_name: str | None,
             model_name: str | None) -> None:
    """Runs recorded in the local store, newest last, with the state now of those whose job may live.

    Their state is as `status` tells it; the others' is their recorded status.

    The states cost one scheduler query for all the runs listed.

    \b
    Examples:
      ftcluster list --limit 5
      ftcluster list --status SERVING --cluster selene
    """
    # startup: the scheduler's queries only for `list`, not `--help`
    from ftcluster.observe.status import live_states

    wanted = {s.upper() for s in statuses}
    runs = [r for r in RunStore().all() if (not wanted or r.status in wanted)
            and (cluster_name is None or r.cluster_name == cluster_name)
            and (model_name is None or r.model == model_name)][-limit:]
    live = {run_id: info.state.value for run_id, info in live_states(runs).items()}
    if as_json:
        echo_json([run_json(r, live.get(r.run_id)) for r in runs])
        return
    if not runs:
        click.echo("no run matches" if wanted or cluster_name or model_name else "no runs yet", err=True)
        return
    # One word per run: its state now where its job may live (as `status` says it), else as recorded.
    t = table(columns=("run", "cluster", "nodes", "job", "state", "folder"))
    for r in runs:
        t.add_row(*(cell(v) for v in (r.run_id, r.cluster_name, r.nodes, r.job_id, live.get(r.run_id) or r.status,
                                      r.run_dir)))
    console().print(t)


@cli.command("prune")
@click.option("--older-than", "days", type=seconds(high=100 * 365, zero_ok=True), default=30.0, show_default=True,
              help="Days since the run was created.")
@click.option("--yes", "-y", is_flag=True, help="Remove without asking.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {runs: [run objects], removed} as JSON (removed: false for --dry-run).")
def prune_cmd(days: float, yes: bool, dry_run: bool, as_json: bool) -> None:
    """Remove ended runs older than N days: their run folders and records.

    A run whose job may still live (recorded SUBMITTED or SERVING, and the scheduler does not
    say it is gone) is kept, and so are the runs it needs: those it succeeded (their run id
    still names the service) and, for a replica set, its members' first runs. A folder that is
    not the run's own (no scripts/ of that run in it) is kept too.

    \b
    Example:
      ftcluster prune --older-than 14 --dry-run
    """
    # startup: the status readers only for `prune`, not `list` or `--help`
    from ftcluster.observe.status import LIVE_STATUSES, live_states, still_needed

    store = RunStore()
    every = list(store.all())
    old = [r for r in every if r.created < time.time() - days * 86400 and r.scheduler != "remote"]
    live = live_states([r for r in old if r.status in LIVE_STATUSES])
    ended = [r for r in old if r.status not in LIVE_STATUSES or (r.run_id in live and live[r.run_id].gone)]
    gone = {r.run_id for r in ended}
    needed = still_needed(every, {r.run_id for r in every if r.run_id not in gone and
                                  (r.status in LIVE_STATUSES or r.scheduler == "remote")})
    ended = [r for r in ended if r.run_id not in needed]

    def say(removed: bool, words: str) -> None:
        if as_json:
            echo_json({"schema_version": 2, "kind": "prune", "runs": [run_json(r) for r in ended],
                       "removed": removed})
        else:
            click.echo(words)

    if not ended:
        say(False, f"no ended run older than {days:g} days")
        return
    if not as_json:
        for r in ended:
            click.echo(f"{r.run_id}  {r.status}  {r.run_dir}")
    if dry_run:
        say(False, f"{len(ended)} run(s) would be removed (--dry-run: nothing was)")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(f"{len(ended)} run(s) to remove", field="--yes", hint="add --yes (or --dry-run to look)")
        click.confirm(f"remove these {len(ended)} run(s), folders and records?", abort=True, err=True)
    for r in ended:
        if r.run_dir and _names_run(Path(r.run_dir), r.run_id):
            shutil.rmtree(r.run_dir, ignore_errors=True)
        store.remove(r.run_id)
    say(True, f"removed {len(ended)} run(s)")


def _names_run(folder: Path, run_id: str) -> bool:
    """The folder is that run's own: its scripts/job.json names it (a record may point at a
    path reused since)."""
    try:
        return bool(json.loads((folder / "scripts" / "job.json").read_text()).get("run_id") == run_id)
    except (OSError, ValueError, AttributeError):
        return False
