"""`config`: the cluster and model spec commands use when none is named."""

from __future__ import annotations

from pathlib import Path

import click

from ftcluster.cli import cli
from ftcluster.cli.output import echo_json
from ftcluster.errors import UserError, all_problems
from ftcluster.observe.documents import document


@cli.command("config")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), default=None,
              help="Use this cluster spec when --cluster is left out.")
@click.option("--model", "model_path", type=click.Path(dir_okay=False), default=None,
              help="Use this model spec when --model is left out.")
@click.option("--unset", type=click.Choice(["cluster", "model"]), multiple=True,
              help="Forget a default (the embedded one applies again).")
@click.option("--json", "as_json", is_flag=True, help="Print the defaults as JSON.")
def config_cmd(cluster_path: str | None, model_path: str | None, unset: tuple[str, ...], as_json: bool) -> None:
    """Show or set the cluster and model spec used when --cluster/--model are left out.

    Order: the option, then $FTCLUSTER_CLUSTER / $FTCLUSTER_MODEL, then the config file
    ($XDG_CONFIG_HOME/ftcluster/config.yaml, default ~/.config/ftcluster/config.yaml), then the
    embedded local cluster and test model.

    \b
    Examples:
      ftcluster config --cluster ~/specs/selene.yaml     # every command's cluster from now on
      ftcluster config                                   # what applies, and from where
      ftcluster config --unset cluster
    """
    # startup: YAML and the spec models (pydantic) only when the command runs, not for its --help
    from ftcluster.spec.defaults import KEYS, config_path, default_with_source, write_config
    from ftcluster.spec.load import load_cluster, load_model

    changes: dict[str, str | None] = {key: None for key in unset}
    problems: list[UserError] = []
    for key, given, load in (("cluster", cluster_path, load_cluster), ("model", model_path, load_model)):
        if given:
            if key in unset:
                problems.append(UserError(f"--{key} sets what --unset {key} removes", field=f"--unset {key}",
                                          hint="give one of the two"))
            try:
                load(given)   # a spec that loads, or the error now rather than at launch
            except UserError as exc:
                problems.append(exc)
            changes[key] = str(Path(given).resolve())
    if problems:
        raise all_problems(problems)
    if changes:
        write_config(changes)
    shown = {}
    for key in KEYS:
        path, source = default_with_source(key)
        shown[key] = {"path": str(path), "from": source}
    if as_json:
        echo_json(document("config", {"file": str(config_path()), **shown}))
        return
    for key, v in shown.items():
        click.echo(f"{key}: {v['path']}  ({v['from']})")
