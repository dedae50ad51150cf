"""`report`: a serving run's history from its samples; `--plot FILE.png`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ftcluster.cli import cli
from ftcluster.cli.commands_runs import forward_record
from ftcluster.cli.output import complete_run, echo_json
from ftcluster.observe.documents import document
from ftcluster.run.store import RunRecord, RunStore


@cli.command("report")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write throughput, latency and GPU use over time (restarts marked) to a .png/.svg/.pdf "
                   "(the `plot` extra: matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print the series as JSON.")
def report_cmd(run: str | None, plot_path: str | None, as_json: bool) -> None:
    """A service's history from its samples: throughput, latency, GPUs, restarts, outages (default: the newest run).

    A run that handed over (its time limit, a lost node) is reported with its successors: the
    service's runs joined, its moves, and each outage with its cause. A replica set is
    reported with every member it ever had: its endpoint answered while its balancer served and
    any one member answered.

    \b
    Examples:
      ftcluster report gpt-20261121-101500-ab12 --plot gpt.png
      ftcluster report --json > history.json
    """
    # startup: the samples' readers and the run's status only when the command runs, not for its --help
    from ftcluster.observe.report import front_spans, plot, service_history, summary
    from ftcluster.observe.status import live_states, successors

    store = RunStore()
    rec = store.get(run)
    if forward_record(rec, ["report", rec.run_id] + (["--json"] if as_json else [])):
        return
    if rec.style == "front":
        # A replica set: each member's chain (every member it ever had), behind its balancer.
        members = [r for r in store.all() if r.replica_of == rec.run_id]
        firsts = [r for r in members if r.predecessor is None or all(m.run_id != r.predecessor for m in members)]
        chains = [[first, *successors(first, store)] for first in firsts]
    else:
        chains = [[rec, *successors(rec, store)]]
    states = live_states([chain[-1] for chain in chains] + ([rec] if rec.style == "front" else []))

    def live(r: RunRecord) -> bool:
        return r.run_id in states and not states[r.run_id].gone

    now = time.time()
    gate = front_spans(Path(rec.run_dir), now if live(rec) else None) if rec.style == "front" else None
    hist = service_history([([(r.run_id, Path(r.run_dir), r.nodes) for r in chain], live(chain[-1]))
                            for chain in chains], now=now, gate=gate)
    if plot_path:
        title = f"replica set {rec.run_id} ({len(chains)} members)" if rec.style == "front" else \
            f"run {rec.run_id}" + (f" to {chains[0][-1].run_id}" if len(chains[0]) > 1 else "")
        plot(hist, title, plot_path)
    if as_json:
        echo_json(document("report", {"run_id": rec.run_id, **hist}))
        return
    if plot_path:
        click.echo(f"wrote {plot_path}")
    for line in summary(rec.run_id, hist):
        click.echo(line)
    if not plot_path:
        click.echo("(--plot FILE.png to see it, --json for the series)")
