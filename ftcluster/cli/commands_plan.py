"""`plan`, `prepare` and `render`: everything up to (not including) submission."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ftcluster.cli import cli
from ftcluster.cli.options import echo_json, load_and_plan, plan_options
from ftcluster.modelrepo import prepare_repository
from ftcluster.plan import Plan
from ftcluster.render import RenderOptions, RunPaths, render


def plan_table(plan: Plan, title: str = "plan") -> Table:
    table = Table(title=title, show_header=False)
    for key in ("nodes", "gpus_per_node", "tensor_para_size", "pipeline_para_size", "world_size",
                "mpi_ranks", "model_type", "ft_model", "checkpoint_dir"):
        table.add_row(key, str(getattr(plan, key)))
    ranks = ", ".join(f"{r.rank}->{r.node or f'node[{r.node_index}]'}" for r in plan.ranks[:16])
    if len(plan.ranks) > 16:
        ranks += f", ... ({len(plan.ranks)} ranks)"
    table.add_row("rank -> node", ranks)
    return table


@cli.command("plan")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_cmd(as_json: bool, **kw: Any) -> None:
    """Check and print the parallel plan for a cluster, a model and a node count.

    \b
    Example:
      ftcluster plan --cluster configs/clusters/pyxis.yaml --model configs/models/gpt.yaml --nodes 2
    """
    planned = load_and_plan(**kw)
    if as_json:
        echo_json(planned.plan.to_dict())
    else:
        Console().print(plan_table(planned.plan))


@cli.command("prepare")
@plan_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="New folder for the model repository.")
def prepare_cmd(out: str, **kw: Any) -> None:
    """Write the per-run model repository (config.pbtxt set for the plan) to --out.

    \b
    Example:
      ftcluster prepare --model configs/models/gpt.yaml --nodes 2 --out /shared/run1/model_repository
    """
    planned = load_and_plan(**kw)
    prepared = prepare_repository(planned.model, planned.plan, Path(out))
    click.echo(f"prepared {prepared.path} (FT model {prepared.ft_model!r}: "
               + ", ".join(f"{k}={v}" for k, v in prepared.parameters.items()) + ")")


@cli.command("render")
@plan_options
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run folder to write (scripts/, model_repository/, logs/).")
@click.option("--keep-serving", is_flag=True, help="Scripts keep serving after the client step.")
@click.option("--no-client", is_flag=True, help="Scripts run no client step.")
def render_cmd(out: str, keep_serving: bool, no_client: bool, **kw: Any) -> None:
    """Write launch scripts a person can read, edit and submit by hand.

    \b
    Example:
      ftcluster render --cluster configs/clusters/slurm-bare.yaml --model configs/models/gpt.yaml \\
          --nodes 2 --out /shared/runs/gpt-2n && cd /shared/runs/gpt-2n && sbatch scripts/job.sbatch
    """
    planned = load_and_plan(**kw)
    run_dir = Path(out).expanduser().resolve()
    paths = RunPaths.for_folder(run_dir)
    prepare_repository(planned.model, planned.plan, paths.repo)
    scripts = render(planned.cluster, planned.model, planned.plan, paths,
                     RenderOptions(keep_serving=keep_serving, client=not no_client))
    for path in scripts.materialize(paths.scripts):
        click.echo(str(path))
