"""`scale` and `restart`: change a serving replica set one member at a time."""

from __future__ import annotations

import click

from ftcluster.cli import cli
from ftcluster.cli.output import complete_run, echo_json
from ftcluster.cli.commands_launch import _progress
from ftcluster.cli.commands_runs import forward_record
from ftcluster.cli.numbers import count
from ftcluster.errors import UserError
from ftcluster.observe.documents import document
from ftcluster.run.store import RunRecord, RunStore


def _set(run: str | None) -> RunRecord:
    rec = RunStore().get(run)
    if rec.scheduler != "remote" and rec.style != "front":
        raise UserError(f"run {rec.run_id} is not a replica set", field="RUN",
                        hint="launch one with `ftcluster launch --keep-serving --replicas R`")
    return rec


@cli.command("scale")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--replicas", type=count(1, 256), required=True, help="The number of members from now on.")
@click.option("--json", "as_json", is_flag=True, help="Print {run_id, replicas, changes: [lines]} as JSON.")
def scale_cmd(run: str | None, replicas: int, as_json: bool) -> None:
    """Change a replica set's number of members while it serves.

    New members start one at a time and join the balancer's rotation once ready; members taken
    away are the highest-numbered, each out of rotation before it stops (requests in flight
    finish).

    \b
    Example:
      ftcluster scale gpt-20261121-101500-ab12 --replicas 3
    """
    # startup: the replica set's code only when the command runs, not for its --help
    from ftcluster.launch.replica_set import scale

    rec = _set(run)
    if forward_record(rec, ["scale", rec.run_id, "--replicas", str(replicas)] + (["--json"] if as_json else [])):
        return
    changes = scale(rec, replicas, _progress)
    if as_json:
        _said("scale", rec, changes, replicas=replicas)
        return
    for line in changes or [f"replica set {rec.run_id} has {replicas} members already"]:
        click.echo(line)


def _said(kind: str, rec: RunRecord, changes: list[str], **more: object) -> None:
    echo_json(document(kind, {"run_id": rec.run_id, **more, "changes": list(changes)}))


@cli.command("restart")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--model", "model_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Serve this model spec from now on (the same node count).")
@click.option("--image", default=None, help="Run this container image from now on (container.image).")
@click.option("--surge/--no-surge", default=None,
              help="Start each member's replacement before the member stops (the nodes of one more member "
                   "meanwhile; default: only for a set of one).")
@click.option("--json", "as_json", is_flag=True, help="Print {run_id, changes: [lines]} as JSON.")
def restart_cmd(run: str | None, model_path: str | None, image: str | None, surge: bool | None,
                as_json: bool) -> None:
    """Restart a replica set one member at a time, optionally with a new model or image.

    Each member leaves the balancer's rotation, finishes its requests in flight, stops, starts
    again and rejoins the rotation before the next one goes: with two or more members the
    endpoint serves throughout. With --surge (the default for one member) the replacement
    starts first and the member stops once it is in rotation.

    \b
    Examples:
      ftcluster restart gpt-20261121-101500-ab12
      ftcluster restart gpt-20261121-101500-ab12 --image registry/ft-triton:23.04
    """
    # startup: the replica set's code only when the command runs, not for its --help
    from ftcluster.launch.replica_set import rolling_restart

    rec = _set(run)
    args = ["restart", rec.run_id] + (["--image", image] if image else []) + \
        ([] if surge is None else ["--surge" if surge else "--no-surge"]) + (["--json"] if as_json else [])
    if model_path and rec.scheduler == "remote":
        raise UserError("a new model spec cannot be passed on to a login node yet", field="--model",
                        hint="run `ftcluster restart` on the login node")
    if forward_record(rec, args):
        return
    changes = list(rolling_restart(rec, model_path, image, _progress, surge))
    if as_json:
        _said("restart", rec, changes)
        return
    for line in changes:
        click.echo(line)
