"""The engines: what serves a model, one package each behind one interface (base.Engine).

A model spec names its engine in `backend` (ftcluster.spec.engines finds it by that name: a
built-in one here, or one another package adds); the pipeline asks the engine for the plan, the
run's model repository, what its ranks must see and the served model's config. `make_plan` is
the plan's entry: the checks every engine shares, then the engine's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.errors import all_problems
from ftcluster.plan.parallel import Plan, option_problems, resolve_gpus
from ftcluster.spec.engines import engine_named

if TYPE_CHECKING:
    from ftcluster.engines.base import Engine
    from ftcluster.spec.cluster import ClusterSpec
    from ftcluster.spec.model import ModelSpec


def engine_for(model: ModelSpec) -> Engine:
    """The engine the model spec names."""
    engine: Engine = engine_named(model.backend)
    return engine


def make_plan(cluster: ClusterSpec, model: ModelSpec, nodes: int, *, gpus_per_node: int | None = None,
              tp: int | None = None, pp: int | None = None) -> Plan:
    """The run's plan: the options checked on their own (every problem at once), the GPU count
    resolved, then the engine's plan with its own checks."""
    problems = option_problems(cluster, nodes, gpus_per_node, tp, pp)
    if problems:
        raise all_problems(problems)
    return engine_for(model).plan(cluster, model, nodes, resolve_gpus(cluster, gpus_per_node), tp, pp)
