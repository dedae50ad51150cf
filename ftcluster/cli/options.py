"""Options shared by the commands that plan a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from ftcluster.cli.numbers import count
from ftcluster.cli.output import echo_json  # noqa: F401  (re-exported for the command modules)
from ftcluster.errors import UserError, all_problems
from ftcluster.engines import make_plan
from ftcluster.plan.parallel import Plan, option_problems
from ftcluster.spec.cluster import MAX_GPUS_PER_NODE, ClusterSpec
from ftcluster.spec.defaults import default_cluster_path, default_model_path
from ftcluster.spec.load import load_specs
from ftcluster.spec.model import ModelSpec

# The cluster spec's fields that plan_options override, by the option that does.
OVERRIDE_OPTIONS = {"partition": "--partition", "account": "--account", "qos": "--qos", "time_limit": "--time"}


@dataclass(frozen=True)
class Planned:
    cluster: ClusterSpec
    model: ModelSpec
    plan: Plan


def plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
                     help="Cluster spec YAML (default: the embedded local cluster)."),
        click.option("--model", "model_path", type=click.Path(dir_okay=False),
                     help="Model spec YAML (default: the embedded FT-shaped test model)."),
        click.option("--nodes", "-N", type=count(None), default=1, show_default=True, help="Nodes (pipeline stages)."),
        click.option("--gpus-per-node", type=count(None, MAX_GPUS_PER_NODE), default=None, help="Override the spec's gpus_per_node."),
        click.option("--tp", type=count(None), default=None, help="tensor_para_size (default: GPUs per node)."),
        click.option("--pp", type=count(None), default=None, help="pipeline_para_size (default: nodes)."),
        click.option("--partition", "-p", default=None, help="Slurm partition (overrides the cluster spec's)."),
        click.option("--account", "-A", default=None, help="Slurm account (overrides the cluster spec's)."),
        click.option("--qos", "-q", default=None, help="Slurm QOS (overrides the cluster spec's)."),
        click.option("--time", "-t", "time_limit", default=None,
                     help="Time limit as Slurm takes it, e.g. 2:00:00 or 1-00 (overrides the spec's time_limit)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def load_and_plan(
    cluster_path: str | None, model_path: str | None, nodes: int,
    gpus_per_node: int | None, tp: int | None, pp: int | None, partition: str | None = None,
    account: str | None = None, qos: str | None = None, time_limit: str | None = None, **_: Any,
) -> Planned:
    given = {k: v for k, v in (("partition", partition), ("account", account), ("qos", qos),
                               ("time_limit", time_limit)) if v is not None}
    try:
        cluster, model = load_specs(cluster_path or default_cluster_path(), model_path or default_model_path(),
                                    given, OVERRIDE_OPTIONS)
    except UserError as exc:   # with what is wrong with the options themselves: every problem at once
        raise all_problems([exc, *option_problems(None, nodes, gpus_per_node, tp, pp)]) from None
    plan = make_plan(cluster, model, nodes, gpus_per_node=gpus_per_node, tp=tp, pp=pp)
    return Planned(cluster, model, plan)
