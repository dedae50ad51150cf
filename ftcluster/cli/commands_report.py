"""`report`: a serving run's history from its samples; `--plot FILE.png`."""

from __future__ import annotations

from pathlib import Path

import click

from ftcluster.cli import cli
from ftcluster.cli.commands_runs import forward_record
from ftcluster.cli.output import complete_run, echo_json
from ftcluster.store import RunStore


@cli.command("report")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write throughput, latency and GPU use over time (restarts marked) to a .png/.svg/.pdf "
                   "(the `plot` extra: matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print the series as JSON.")
def report_cmd(run: str | None, plot_path: str | None, as_json: bool) -> None:
    """A serving run's history from its samples: throughput, latency, GPUs, restarts (default: the newest run).

    \b
    Examples:
      ftcluster report gpt-20261121-101500-ab12 --plot gpt.png
      ftcluster report --json > history.json
    """
    from ftcluster.documents import document
    from ftcluster.report import history, plot

    rec = RunStore().get(run)
    if forward_record(rec, ["report", rec.run_id] + (["--json"] if as_json else [])):
        return
    hist = history(Path(rec.run_dir), rec.nodes)
    if plot_path:
        plot(hist, f"run {rec.run_id}", plot_path)
    if as_json:
        echo_json(document("report", {"run_id": rec.run_id, **hist}))
    elif plot_path:
        click.echo(f"wrote {plot_path} ({hist['samples']} samples, {len(hist['restarts'])} restarts)")
    else:
        click.echo(f"run {rec.run_id}: {hist['samples']} samples; models {', '.join(hist['models']) or 'none yet'}; "
                   f"{len(hist['restarts'])} restarts (--plot FILE.png to see them, --json for the series)")
