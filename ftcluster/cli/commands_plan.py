"""`plan`, `prepare` and `render`: everything up to (not including) submission."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ftcluster.cli import cli
from ftcluster.cli.folders import new_folder, out_folder
from ftcluster.cli.options import load_and_plan, plan_options
from ftcluster.cli.output import cell, console, echo_json, table
from ftcluster.observe.documents import document, plan_json
from ftcluster.errors import UserError
from ftcluster.run.layout import RunPaths
from ftcluster.engines import engine_for
from ftcluster.plan.parallel import Plan


def plan_table(plan: Plan, title: str = "plan") -> Table:
    t = table(title, show_header=False)
    for key in ("nodes", "gpus_per_node", "tensor_para_size", "pipeline_para_size", "world_size",
                "mpi_ranks", "engine_model"):
        t.add_row(key, cell(getattr(plan, key)))
    for key, value in plan.details.items():   # the engine's own (FT: model_type, checkpoint_dir, ...)
        if value is not None:
            t.add_row(key, cell(value))
    ranks = ", ".join(f"{r.rank}->{r.node or f'node[{r.node_index}]'}" for r in plan.ranks[:16])
    if len(plan.ranks) > 16:
        ranks += f", ... ({len(plan.ranks)} ranks)"
    t.add_row("rank -> node", cell(ranks))
    return t


@cli.command("plan")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_cmd(as_json: bool, **kw: Any) -> None:
    """Check and print the parallel plan for a cluster, a model and a node count.

    After `ftcluster examples`: demo.yaml is the shipped test model, gpt.yaml points at yours.

    \b
    Example:
      ftcluster plan --cluster configs/clusters/pyxis.yaml --model configs/models/demo.yaml --nodes 2
      ftcluster plan --cluster configs/clusters/pyxis.yaml --model configs/models/gpt.yaml --nodes 2
    """
    planned = load_and_plan(**kw)
    if as_json:
        echo_json(plan_json(planned.plan))
    else:
        console().print(plan_table(planned.plan))


@cli.command("prepare")
@plan_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="New folder for the model repository.")
@click.option("--json", "as_json", is_flag=True, help="Print {path, engine_model, parameters} as JSON.")
def prepare_cmd(out: str, as_json: bool, **kw: Any) -> None:
    """Write the per-run model repository (config.pbtxt set for the plan) to --out.

    \b
    Example:
      ftcluster prepare --model configs/models/gpt.yaml --nodes 2 --out /shared/run1/model_repository
    """
    planned = load_and_plan(**kw)
    with new_folder(out_folder(out)) as folder:
        prepared = engine_for(planned.model).prepare(planned.model, planned.plan, folder)
    if as_json:
        echo_json(document("prepare", {"path": str(prepared.path), "engine_model": prepared.model,
                                       "ft_model": prepared.model,   # its name before the engines had a seam
                                       "parameters": dict(prepared.parameters)}))
        return
    click.echo(f"prepared {prepared.path} (the engine's model {prepared.model!r}: "
               + ", ".join(f"{k}={v}" for k, v in prepared.parameters.items()) + ")")


@cli.command("render")
@plan_options
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run folder to write (scripts/, model_repository/, logs/).")
@click.option("--keep-serving", is_flag=True, help="Scripts keep serving after the client step.")
@click.option("--no-client", is_flag=True, help="Scripts run no client step.")
@click.option("--json", "as_json", is_flag=True, help="Print the run folder, its files and how to submit it as JSON.")
def render_cmd(out: str, keep_serving: bool, no_client: bool, as_json: bool, **kw: Any) -> None:
    """Write launch scripts a person can read, edit and submit by hand.

    The run folder is the one `launch` would write: scripts, model repository, logs/, run.json
    and, for Docker, the run's ssh keys.

    \b
    Example:
      ftcluster render --cluster configs/clusters/slurm-bare.yaml --model configs/models/demo.yaml \\
          --nodes 2 --out /shared/runs/demo-2n && sbatch /shared/runs/demo-2n/scripts/job.sbatch
      ftcluster status /shared/runs/demo-2n
    """
    # startup: the launch code only for `render`, not `plan` or `prepare`
    from ftcluster.launch.run import LaunchOptions, job_request, write_run

    planned = load_and_plan(**kw)
    run_dir = out_folder(out).resolve()
    try:
        paths = RunPaths.for_folder(run_dir)
    except ValueError as exc:
        raise UserError(str(exc), field="--out", hint="choose a plain folder name") from None
    # The request first (pure; may refuse), then the folder: a refusal leaves nothing to clean
    # up, and what is written is what `launch` would write for this run.
    request = job_request(planned.cluster, planned.model, planned.plan, paths,
                          LaunchOptions(keep_serving=keep_serving, client=not no_client))
    with new_folder(run_dir):
        written = write_run(request, planned.cluster, planned.model, planned.plan)
    if as_json:
        echo_json(document("render", {"run_id": paths.run_id, "run_dir": str(run_dir),
                                      "files": [str(p) for p in written], "submit": request.command()}))
        return
    for path in written:
        click.echo(str(path))
