"""`launch` (and what `check` shares with it: forwarding to a login node, the launch itself)."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ftcluster.cli import ARGV, cli
from ftcluster.cli.commands_runs import forward_record  # noqa: F401  (re-exported)
from ftcluster.cli.numbers import count
from ftcluster.cli.options import Planned, load_and_plan, plan_options
from ftcluster.cli.output import cell, console, echo_json, table
from ftcluster.observe.documents import document, run_json
from ftcluster.errors import LaunchError, UserError, all_problems, every_problem
from ftcluster.launch.run import Launch, LaunchOptions, LaunchOutcome
from ftcluster.run.phases import PHASES
from ftcluster.hosts.login import forward, needs_forwarding
from ftcluster.plan.endpoint import same_host_note
from ftcluster.run.layout import FILES
from ftcluster.spec.cluster import MAX_RESTARTS, ClusterSpec
from ftcluster.spec.defaults import default_cluster_path
from ftcluster.spec.load import load_cluster
from ftcluster.run.store import RunRecord, RunStore, new_run_id
from ftcluster.spec.defaults import user_default

if TYPE_CHECKING:
    from rich.console import Console


@lru_cache(maxsize=None)
def err() -> Console:
    """The progress console, made at its first line: `launch --json` prints none and so never
    imports rich (~30 ms of the command's start-up)."""
    return console(stderr=True)


def _progress(phase: str, t: float, detail: str) -> None:
    # startup: rich only when there is progress to print (~30 ms)
    from rich.markup import escape

    if phase == "log":
        err().print(f"[dim]{t:7.2f}s   rank0 | {escape(detail)}[/dim]", soft_wrap=True)
        return
    label = PHASES.get(phase, phase)
    err().print(f"[dim]{t:7.2f}s[/dim] {label}" + (f" [dim]({detail})[/dim]" if detail else ""))


def _report(outcome: LaunchOutcome) -> None:
    # startup: rich only when there is progress to print (~30 ms)
    from rich.markup import escape

    out = console()
    rec = outcome.record
    if outcome.detached:
        out.print(f"submitted run {rec.run_id} (job {rec.job_id}); follow it with "
                  f"`ftcluster status {rec.run_id}` and `ftcluster logs {rec.run_id} -f`", markup=False)
        return
    t = table(f"run {rec.run_id}", show_header=False)
    t.add_row("job", cell(rec.job_id))
    t.add_row("result", "[green]ok[/green]" if outcome.ok else "[red]failed[/red]: " + escape(str(outcome.failure)))
    if outcome.endpoint:
        t.add_row("endpoint", cell(outcome.endpoint))
    for phase, secs in outcome.phases.items():
        t.add_row(PHASES.get(phase, phase), f"{secs:.2f}s")
    client = outcome.client or {}
    for key in ("checks_passed", "batch_size", "input_len", "output_len"):
        if key in client:
            t.add_row(f"client {key}", cell(client[key]))
    latency = client.get("latency_ms")
    if isinstance(latency, dict):
        t.add_row("client latency", " / ".join(f"{k} {v:.2f} ms" for k, v in latency.items()
                                               if isinstance(v, (int, float))))
    for note in client.get("notes") or []:   # said, never a failure (identity.py's notes)
        t.add_row("client note", cell(note))
    mpi = outcome.mpicheck or {}
    if mpi:
        t.add_row("MPI check", cell(f"{'passed' if mpi.get('ok') else 'FAILED'} in {mpi.get('seconds')}s "
                                    f"({len(mpi.get('ranks', []))} ranks on "
                                    f"{', '.join(sorted({r['host'] for r in mpi.get('ranks', [])}))})"))
        for problem in mpi.get("problems", []):
            t.add_row("MPI problem", cell(problem))
    t.add_row("run folder", cell(rec.run_dir))
    out.print(t)
    if outcome.failed_rank:
        fr = outcome.failed_rank
        # A rank that ended before its server wrote a line (a port in use) has no log to show:
        # the failure above says why.
        err().print(f"rank {fr['rank']} on {fr['node']} exited with {fr['exit_code']}"
                    + ("; last lines of its log:" if outcome.log_tail else " before its server wrote a line"),
                    markup=False)
    if outcome.log_tail:
        if not outcome.failed_rank:
            err().print("last lines of the log:")
        for line in outcome.log_tail:
            err().print(f"  {line}", markup=False, soft_wrap=True)
    if outcome.ok and outcome.record.status == "SERVING":
        out.print(f"serving at http://{outcome.endpoint}; stop it with `ftcluster stop {rec.run_id}`", markup=False)
        if (Path(rec.run_dir) / "scripts" / FILES.token).is_file():
            out.print(f"private: clients send the run's token (`ftcluster token {rec.run_id}`, or "
                      f"`ftcluster client ... --run {rec.run_id}`)", markup=False)


def launch_json(outcome: LaunchOutcome) -> dict[str, Any]:
    """The `launch` object: the outcome, with the run object under `run`."""
    body = outcome.to_dict()
    body["run"] = run_json(outcome.record)
    body["num_nodes"] = outcome.record.nodes
    body["nodes"] = body["run"]["nodes"]
    return document("launch", body)


@cli.command("launch")
@plan_options
@click.option("--keep-serving", is_flag=True, help="Leave the servers up after the client (prints the endpoint).")
@click.option("--detach", is_flag=True, help="Submit and return; follow with status/logs.")
@click.option("--dry-run", is_flag=True, help="Print the scripts and the submit command; change nothing. Refuses what a launch refuses first.")
@click.option("--no-client", is_flag=True, help="Run no client step (with --keep-serving: just serve).")
@click.option("--no-mpi-check", is_flag=True, help="Skip the MPI world check before the servers start.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("--preflight", is_flag=True,
              help="First check every rank's GPUs and NCCL bandwidth (also resolves gpus_per_node: auto).")
@click.option("--restarts", type=count(0, MAX_RESTARTS), default=None,
              help="With --keep-serving: restarts of the whole world on a fault while serving, in a row "
                   "(server.restart_reset: a long healthy stretch starts afresh; default: server.restarts, else 3).")
@click.option("--replicas", type=count(1, 256), default=None,
              help="With --keep-serving: this many identical worlds behind one balancer (default: replicas "
                   "in the cluster spec, else 1).")
@click.option("--balancer", is_flag=True,
              help="With --keep-serving: serve behind the balancer even with one replica, so that the endpoint "
                   "stays while the world moves (hand-over, lost node; default: balancer.always).")
@click.option("--run-id", default=None, hidden=True, help="Run id to use (set when forwarded).")
def launch_cmd(keep_serving: bool, detach: bool, dry_run: bool, no_client: bool, no_mpi_check: bool,
               as_json: bool, preflight: bool, restarts: int | None, replicas: int | None, balancer: bool,
               run_id: str | None, **kw: Any) -> None:
    """Plan, prepare, submit, wait for rank 0, run the client, report and clean up.

    Exits 0 only when the client succeeded. Ctrl-C cancels the job.

    \b
    Examples:
      ftcluster launch --nodes 2                       # the embedded local default
      ftcluster launch --cluster configs/clusters/slurm-bare.yaml --model configs/models/gpt.yaml --nodes 2
      ftcluster launch --cluster C.yaml --model M.yaml --nodes 2 --dry-run
    """
    if maybe_forward(kw, record_run=not dry_run):
        return
    if preflight and not dry_run:
        kw["gpus_per_node"] = preflight_gate(kw) or kw.get("gpus_per_node")
    problems = [] if keep_serving else [  # the options' conflicts and the specs' problems at once
        UserError(what, field=option, hint="add --keep-serving") for what, option, given in (
            ("restarts happen while serving", "--restarts", restarts is not None),
            ("a balancer is for serving runs", "--replicas", (replicas or 1) > 1),
            ("a balancer is for serving runs", "--balancer", balancer)) if given]
    if dry_run and as_json:
        problems.append(UserError("--dry-run prints the job request as text", field="--json",
                                  hint="leave out --json, or --dry-run"))
    try:
        planned = load_and_plan(**kw)
    except UserError as exc:
        problems.append(exc)
    if problems:
        raise all_problems(problems)
    if restarts is not None:
        server = planned.cluster.server.model_copy(update={"restarts": restarts})
        planned = replace(planned, cluster=planned.cluster.model_copy(update={"server": server}))
    opts = LaunchOptions(keep_serving=keep_serving, detach=detach, dry_run=dry_run, client=not no_client,
                         mpi_check=not no_mpi_check)
    count_ = replicas if replicas is not None else planned.cluster.replicas
    if count_ > 1 or balancer or planned.cluster.balancer.always:
        if not keep_serving:
            field = "--replicas" if count_ > 1 else "--balancer" if balancer else "balancer.always"
            raise UserError("a balancer is for serving runs", field=field, hint="add --keep-serving")
        run_replicas(planned, opts, count_, as_json, run_id)
        return
    run_launch(planned, opts, as_json, run_id)


def run_replicas(planned: Planned, opts: LaunchOptions, replicas: int, as_json: bool, run_id: str | None) -> None:
    # startup: a replica set's code only for --replicas
    from ftcluster.launch.replica_set import ReplicaSet

    rs = ReplicaSet(planned.cluster, planned.model, planned.plan, opts, replicas,
                    progress=None if as_json else _progress, run_id=run_id)
    if opts.dry_run:
        click.echo(rs.dry_run(), nl=False)
        _same_host(planned.cluster, opts)
        return
    outcome = rs.run()
    if as_json:
        echo_json(document("launch", {**outcome.to_dict(), "replicas": replicas}))
    elif outcome.detached:
        console().print(f"submitted replica set {outcome.set_id} ({replicas} replicas); follow it with "
                        f"`ftcluster status {outcome.set_id}`", markup=False)
    elif outcome.ok:
        console().print(f"serving {replicas} replicas at http://{outcome.endpoint} (run {outcome.set_id}); "
                        f"stop them with `ftcluster stop {outcome.set_id}`", markup=False)
    if outcome.ok and not as_json:
        _same_host(planned.cluster, opts)
    if not outcome.ok:
        raise LaunchError(f"replica set {outcome.set_id} failed: {outcome.failure}")


def _same_host(cluster: ClusterSpec, opts: LaunchOptions) -> None:
    """A private run whose rank 0 may share its node: who can reach its Triton without the token,
    on stderr after what the launch says (`status` says it again; `--json` has it in `status`)."""
    note = same_host_note(cluster) if opts.servers and opts.step is None else ""
    if note:
        click.echo(f"note: {note}", err=True)


def maybe_forward(kw: dict[str, Any], record_run: bool = False) -> bool:
    """With a login_host in the cluster spec, run this very command on the login node."""
    path = kw.get("cluster_path") or user_default("cluster")
    if not path:
        return False
    cluster_path = str(path)
    cluster = load_cluster(cluster_path)
    if not needs_forwarding(cluster):
        return False
    ctx = click.get_current_context()
    args = list(ARGV)
    # Spec files move over SFTP; every other argument is passed on as given.
    args = _without_options(args, ("--cluster", "--model", "--run-id"))
    run_id = None
    if record_run and ctx.command.name == "launch":
        model_name = Path(kw.get("model_path") or "run").stem
        run_id = new_run_id(model_name)
        args += ["--run-id", run_id]
        RunStore().add(RunRecord(run_id=run_id, created=time.time(), cluster_name=cluster.name,
                                 cluster_source=cluster.source or "", scheduler="remote", style="remote",
                                 run_dir="", nodes=int(kw.get("nodes") or 1), model=model_name,
                                 job_id=None, status="REMOTE"))
    rc = forward(cluster, args, {"--cluster": cluster_path, "--model": kw.get("model_path")})
    if rc:
        sys.exit(rc)
    return True


def preflight_gate(kw: dict[str, Any]) -> int | None:
    """Run the GPU preflight on the planned nodes; refuse on any problem; the GPUs per node."""
    # startup: the preflight's code only for --preflight
    from ftcluster.cli.commands_preflight import report_errors
    from ftcluster.launch.preflight import run_preflight
    from ftcluster.rank.preflight import InventoryError, RankReport, detect_gpus_per_node

    cluster = load_cluster(kw.get("cluster_path") or default_cluster_path())
    err().print("running the GPU preflight on every rank ...")
    report = run_preflight(cluster, int(kw.get("nodes") or 1))
    errors = report_errors(cluster, report, require_gpus=True)
    if errors:
        raise UserError(every_problem(errors), field="preflight", hint="see `ftcluster preflight` for the full report")
    try:
        detected = detect_gpus_per_node([RankReport.from_dict(d) for d in report["ranks"]])
    except InventoryError as exc:
        raise UserError(str(exc), field="preflight") from None
    err().print(f"preflight passed: {detected} GPU(s) per node")
    return detected if cluster.gpus_per_node == "auto" else None


def _without_options(args: list[str], names: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in names:
            skip = True
            continue
        if any(a.startswith(n + "=") for n in names):
            continue
        out.append(a)
    return out


def run_launch(planned: Planned, opts: LaunchOptions, as_json: bool, run_id: str | None = None
               ) -> LaunchOutcome | None:
    launch = Launch(planned.cluster, planned.model, planned.plan, opts,
                    progress=None if as_json else _progress, run_id=run_id)
    if opts.dry_run:
        click.echo(str(launch.dry_run()), nl=False)
        _same_host(planned.cluster, opts)
        return None
    outcome = launch.run()
    if as_json:
        echo_json(launch_json(outcome))
    else:
        _report(outcome)
        if outcome.ok:
            _same_host(planned.cluster, opts)
    if not outcome.ok:
        raise LaunchError(f"run {outcome.record.run_id} failed: {outcome.failure}")
    return outcome


@cli.command("successor", hidden=True)
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--exclude", default="", help="Nodes the successor must not use (comma-separated).")
@click.option("--fault", "faults", multiple=True, metavar="CAUSE",
              help="A fault of the run still counted against server.restarts (repeated, oldest first): the "
                   "successor counts on from them.")
@click.option("--took-over", "took_over", default=None, metavar="JOB",
              help="Record JOB as the run's job: another job of the run serves in its place (a replica set's "
                   "balancer hands over on its node before its time limit).")
def successor_cmd(run_dir: str, exclude: str, faults: tuple[str, ...], took_over: str | None) -> None:
    """Submit a serving run's successor (the job does this before its time limit); prints
    {"run_id", "job_id", "run_dir"} as one JSON line."""
    # startup: the successor's code only in the job's own `successor` call
    from ftcluster.launch.successor import record_job, submit_successor

    if took_over is not None:
        rec = record_job(Path(run_dir), took_over)
        click.echo(json.dumps({"run_id": rec.run_id, "job_id": rec.job_id, "run_dir": rec.run_dir}))
        return

    nodes = [n for n in exclude.split(",") if n]
    bad = [n for n in nodes if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", n)]
    if bad:
        raise UserError(f"not a node name: {', '.join(map(repr, bad))}", field="--exclude",
                        hint="give Slurm node names, comma-separated")
    if len(faults) > MAX_RESTARTS + 1:
        raise UserError(f"{len(faults)} faults: more than server.restarts can count", field="--fault",
                        hint=f"give at most {MAX_RESTARTS + 1}")
    # Each becomes part of an events line of the successor's (a cause given up on).
    broken = [f for f in faults if not f.strip() or not f.isprintable()]
    if broken:
        raise UserError(f"not a fault's cause on one line: {', '.join(map(repr, broken))}", field="--fault",
                        hint="give each cause as printable text on one line")
    outcome = submit_successor(Path(run_dir), nodes, faults)
    rec = outcome.record
    click.echo(json.dumps({"run_id": rec.run_id, "job_id": rec.job_id, "run_dir": rec.run_dir}))
