"""`convert` (the engine's weight converter as a Slurm job) and `check-checkpoint` (is an N-gpu
folder complete)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ftcluster.launch import convert as conv
from ftcluster.cli import cli
from ftcluster.cli.numbers import count, seconds
from ftcluster.cli.output import echo_json
from ftcluster.cli.words import Word
from ftcluster.errors import PlanError
from ftcluster.observe.documents import document, run_json
from ftcluster.spec.cluster import MAX_GPUS_PER_NODE
from ftcluster.spec.defaults import default_cluster_path, default_model_path
from ftcluster.spec.engines import default_engine, engine_named
from ftcluster.spec.load import load_model, load_specs


# The default engine's converter, for the help's words (the run's engine is its model spec's).
_DEFAULT = default_engine()
_CONVERTER = engine_named(_DEFAULT).converter


@cli.command("convert")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), help="Cluster spec YAML.")
@click.option("--model", "model_path", type=click.Path(dir_okay=False), help="Model spec YAML.")
@click.option("--nodes", "-N", type=count(), default=1, show_default=True, help="Nodes the model will be served on.")
@click.option("--gpus-per-node", type=count(1, MAX_GPUS_PER_NODE), default=None, help="Override the spec's gpus_per_node.")
@click.option("--tp", type=count(), default=None, help="tensor_para_size (default: GPUs per node).")
@click.option("--pp", type=count(), default=None, help="pipeline_para_size (default: nodes).")
@click.option("--converter-root", required=True, type=click.Path(file_okay=False),
              help=f"The engine's converter source tree ({_DEFAULT}: {_CONVERTER.root if _CONVERTER else 'none'}).")
@click.option("--input", "input_dir", required=True, type=Word(), help="HF model folder or training checkpoint to convert.")
@click.option("--python", default="python3", show_default=True, type=Word(),
              help="Python that runs the converter on the node (needs torch/transformers).")
@click.option("--dry-run", is_flag=True, help="Print the job request (scripts and command); run nothing.")
@click.option("--detach", is_flag=True, help="Submit and return; follow with `ftcluster logs RUN`.")
@click.option("--timeout", type=seconds(), default=None, help="Stop waiting after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the conversion's run object and its output folder as JSON.")
def convert_cmd(cluster_path: str | None, model_path: str | None, nodes: int, gpus_per_node: int | None,
                tp: int | None, pp: int | None, converter_root: str, input_dir: str, python: str,
                dry_run: bool, detach: bool, timeout: float | None, as_json: bool) -> None:
    """Convert weights with the engine's converter for the model, for tensor_para_size GPUs.

    The engine picks the converter script and its arguments for the model; the output is
    <checkpoint_root>/<tp>-gpu/, checked after the job. Runs as a job on one node through the
    cluster's launch path (inside the Pyxis container where there is one; a process here for a
    local cluster); `ftcluster status/logs/stop RUN` work for it.

    \b
    Example:
      ftcluster convert --cluster configs/clusters/pyxis.yaml --model configs/models/gpt.yaml \\
          --nodes 2 --converter-root /lustre/src/converter --input /lustre/hf/gpt2
    """
    # Its output, checkpoint_root/<tp>-gpu, is what it makes: checkpoint_root need not exist yet.
    cluster, model = load_specs(cluster_path or default_cluster_path(), model_path or default_model_path(),
                                to_make=("checkpoint_root",))
    size = conv.plan_tp(cluster, nodes, gpus_per_node, tp, pp)
    # The job runs elsewhere: relative paths are made absolute here.
    inp = str(Path(input_dir).expanduser().resolve()) if not input_dir.startswith("/") else input_dir
    req = conv.ConvertRequest(cluster, model, size, Path(converter_root).expanduser().resolve(), inp, python)
    out = req.output_root / f"{size}-gpu"

    def progress(phase: str, t: float, detail: str) -> None:
        if phase == "submitted" and detail.startswith("job ") and not as_json:
            click.echo(f"run {launch.paths.run_id}: {detail} converting for {size} GPU(s) -> {out}")

    launch = conv.convert_launch(req, detach=detach, progress=progress)
    if dry_run:
        click.echo(str(launch.dry_run()), nl=False)
        return
    outcome = conv.run(launch, req)
    rec = outcome.record if detach else conv.finish(launch, outcome)
    if as_json:
        echo_json(document("convert", {"run": run_json(rec), "output": str(out), "detached": detach,
                                       "checked": not detach}))
        return
    if detach:
        click.echo(f"follow with: ftcluster logs {rec.run_id} -f")
        return
    click.echo(f"converted and checked: {rec.plan['checkpoint_dir']} (logs: ftcluster logs {rec.run_id})")


@cli.command("check-checkpoint")
@click.option("--model", "model_path", type=click.Path(dir_okay=False), help="Model spec YAML.")
@click.option("--gpus", type=count(), required=True, help="tensor_para_size the checkpoint must be for.")
@click.option("--json", "as_json", is_flag=True, help="Print {folder, ok, problems} as JSON (exit 1 when not ok).")
def check_checkpoint_cmd(model_path: str | None, gpus: int, as_json: bool) -> None:
    """Check <checkpoint_root>/<gpus>-gpu/: config.ini fields, every shard, every file size.

    \b
    Example:
      ftcluster check-checkpoint --model configs/models/gpt.yaml --gpus 8
    """
    model = load_model(model_path or default_model_path())
    converter = conv.converter_of(model)
    folder, problems = converter.problems(model, gpus)
    if as_json:
        echo_json(document("checkpoint", {"folder": str(folder), "gpus": gpus,
                                          "ok": not problems, "problems": problems}))
        if problems:
            sys.exit(1)
        return
    for p in problems:
        click.echo(p)
    if problems:
        raise PlanError(f"{len(problems)} problem(s) in {folder}", field=converter.output_field)
    click.echo(f"ok: {folder} is complete for {gpus} GPU(s)")
