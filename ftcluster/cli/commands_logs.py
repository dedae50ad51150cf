"""`logs`: a run's server and client logs, tailed or followed, labelled by rank and node."""

from __future__ import annotations

import json
import sys

import click

from ftcluster.cli import cli
from ftcluster.cli.output import complete_run
from ftcluster.cli.commands_runs import forward_record
from ftcluster.cli.numbers import count
from ftcluster.errors import EXIT_FAILED, UserError, all_problems
from ftcluster.schedulers import scheduler_for_record
from ftcluster.run.logs import Follower, LogSource, follow, follow_job, incarnations, sources, tail
from ftcluster.run.state import STOPPED_REASON
from ftcluster.run.job_info import JobState
from ftcluster.observe.status import member_records, paths_of, successors
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.spec.launch_styles import STEP_STYLES


@cli.command("logs")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("-f", "--follow", "follow_", is_flag=True, help="Follow new lines until the job ends.")
@click.option("--rank", type=count(0), default=None, help="Only this rank's server log.")
@click.option("--all", "all_ranks", is_flag=True, help="Every rank's server log (the default).")
@click.option("--tail", "tail_n", type=count(0), default=None, help="Start with the last N lines of each log.")
@click.option("--server", "server_only", is_flag=True, help="Only server logs.")
@click.option("--client", "client_only", is_flag=True, help="Only the client log.")
@click.option("--incarnation", type=count(0), default=None,
              help="The server logs of an earlier incarnation (0: before the first restart).")
@click.option("--replica", type=count(0, 255), default=None,
              help="A replica set: this member's logs (default: the balancer's own).")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per line: {"source": "rank0 node1", "line": "..."} (JSON Lines).')
def logs_cmd(run: str | None, follow_: bool, rank: int | None, all_ranks: bool, tail_n: int | None,
             server_only: bool, client_only: bool, incarnation: int | None, replica: int | None,
             as_json: bool) -> None:
    """Server logs (per rank) and the client log of a run (default: the newest run).

    With -f, follows until the job ends; the exit code is 0 when the job completed or was stopped
    (`ftcluster stop`).

    \b
    Examples:
      ftcluster logs --tail 100
      ftcluster logs gpt-20261121-101500-ab12 -f --rank 0
    """
    problems = [UserError(f"give {a} or {b}, not both", field=a) for a, b, both in (
        ("--rank", "--all", rank is not None and all_ranks), ("--server", "--client", server_only and client_only))
        if both]
    if problems:
        raise all_problems(problems)
    store = RunStore()
    rec = store.get(run)
    if replica is not None:
        rec = _member(rec, store, replica)
    flags = (["-f"] if follow_ else []) + (["--rank", str(rank)] if rank is not None else []) \
        + (["--all"] if all_ranks else []) + (["--tail", str(tail_n)] if tail_n is not None else []) \
        + (["--server"] if server_only else []) + (["--client"] if client_only else []) \
        + (["--incarnation", str(incarnation)] if incarnation is not None else []) \
        + (["--json"] if as_json else [])
    if forward_record(rec, ["logs", rec.run_id, *flags]):
        return
    if rank is not None and not 0 <= rank < rec.nodes:
        raise UserError(f"run {rec.run_id} has ranks 0..{rec.nodes - 1}", field="--rank")
    paths = paths_of(rec)
    gone = paths.gone()
    if gone:
        raise UserError(f"run {rec.run_id}: {gone}, and its logs with it", field="RUN")
    kept = incarnations(paths)
    if incarnation is not None:
        if incarnation not in kept:
            raise UserError(f"run {rec.run_id} keeps the logs of incarnations {kept or 'none'}", field="--incarnation",
                            hint="leave it out for the current servers' logs")
        if follow_ or client_only:
            raise UserError("an earlier incarnation's logs are complete: nothing to follow, no client log",
                            field="--incarnation", hint="leave out -f and --client")
    elif kept:
        click.echo(f"(earlier incarnations, restarted: {', '.join(map(str, kept))}; "
                   f"see them with --incarnation N)", err=True)
    # --rank R means that rank's server log; the client log only when asked or for all ranks.
    with_client = (client_only or (rank is None and not server_only)) and incarnation is None
    step = rec.style in STEP_STYLES
    srcs = sources(paths, rec.nodes, rank, server=not client_only, client=with_client, step=step,
                   incarnation=incarnation)
    labelled = len(srcs) > 1

    def emit(src: LogSource, line: str) -> None:
        if as_json:
            click.echo(json.dumps({"source": src.label, "line": line}))
        else:
            click.echo(f"[{src.label}] {line}" if labelled else line)

    if not follow_:
        for src, line in tail(srcs, tail_n if tail_n is not None else 10**9):
            emit(src, line)
        return
    if tail_n is not None:
        for src, line in tail(srcs, tail_n):
            emit(src, line)
    follower = Follower(srcs, from_start=tail_n is None)
    if not rec.job_id:
        follow(follower, lambda: True, emit)
        click.echo(f"(run {rec.run_id} has no job: it was never submitted, nothing to follow)", err=True)
        sys.exit(EXIT_FAILED)
    # startup: the job watch only to follow a job (-f), not for `logs` alone
    from ftcluster.schedulers.watch import JobWatch

    # The service, not one job: a run that handed over (its time limit, a lost node) is followed
    # on into its successor, from the successor's first line (it started while this one served).
    while True:
        watch = JobWatch(scheduler_for_record(rec), rec.job_id or "", paths)
        try:
            final = follow_job(follower, watch, emit,
                               relabel=lambda: sources(paths, rec.nodes, rank, not client_only, with_client, step),
                               notice=lambda words: click.echo(f"(run {rec.run_id}: {words})", err=True),
                               recorded=rec.status)
        finally:
            watch.close()
        later = successors(rec, store)
        if not later or not later[0].job_id or (rank is not None and rank >= later[0].nodes):
            break
        click.echo(f"(run {rec.run_id} was succeeded by run {later[0].run_id}: following it)", err=True)
        rec, paths = later[0], paths_of(later[0])
        srcs = sources(paths, rec.nodes, rank, server=not client_only, client=with_client, step=step)
        labelled = len(srcs) > 1
        follower = Follower(srcs, from_start=True)
    if final is JobState.STOPPED:
        click.echo(f"(run {rec.run_id}: {STOPPED_REASON})", err=True)
    elif final is not JobState.COMPLETED:
        click.echo(f"(run {rec.run_id}: its job ended {final.value if final else 'with no state the scheduler or the run told'})", err=True)
    # A run stopped as asked ended well: only a job that failed (or was never told) is an error.
    sys.exit(0 if final in (JobState.COMPLETED, JobState.STOPPED) else EXIT_FAILED)


def _member(rec: RunRecord, store: RunStore, replica: int) -> RunRecord:
    """The run serving as member `replica` of the set `rec` (its newest in a hand-over's chain)."""
    if rec.style != "front":
        raise UserError(f"run {rec.run_id} is not a replica set", field="--replica", hint="leave --replica out")

    found = member_records(rec, store, replica)
    if not found:
        raise UserError(f"replica set {rec.run_id} has no replica {replica}", field="--replica",
                        hint=f"see `ftcluster status {rec.run_id}`")
    return found[-1]
