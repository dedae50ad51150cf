"""`check`: the MPI world check alone, through the same launch path as the servers."""

from __future__ import annotations

from typing import Any

import click

from ftcluster.cli import cli
from ftcluster.cli.commands_launch import maybe_forward, run_launch
from ftcluster.cli.options import load_and_plan, plan_options
from ftcluster.errors import UserError
from ftcluster.launch.run import LaunchOptions
from ftcluster.spec.launch_styles import style_of


@cli.command("check")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def check_cmd(as_json: bool, **kw: Any) -> None:
    """Run only the MPI world check (ranks, hosts, binaries, ring, allreduce) on N nodes.

    \b
    Example:
      ftcluster check --cluster configs/clusters/slurm-bare.yaml --model configs/models/gpt.yaml --nodes 3
    """
    if maybe_forward(kw):
        return
    planned = load_and_plan(**kw)

    if style_of(planned.cluster).one_host:
        raise UserError("local ranks are separate processes, not an MPI world; nothing to check",
                        field="scheduler", hint="use a slurm cluster spec")
    run_launch(planned, LaunchOptions(servers=False, client=False), as_json)
