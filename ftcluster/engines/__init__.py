"""The engines: what serves a model, one package each behind one interface (base.Engine).

A model spec names its engine in `backend` (ftcluster.spec.engines finds it by that name: a
built-in one here, or one another package adds); the pipeline asks the engine for the plan, the
run's model repository, what its ranks must see and the served model's config. `make_plan` is
the plan's entry: the checks every engine shares, then the engine's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.errors import PlanError, all_problems
from ftcluster.plan.parallel import JOB_LAYOUT, Plan, RankLayout, option_problems, resolve_gpus
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
    engine = engine_for(model)
    plan = engine.plan(cluster, model, nodes, resolve_gpus(cluster, gpus_per_node), tp, pp)
    if plan.layout != JOB_LAYOUT:
        # The job starts one rank per node, serves through rank 0 and knows the others ready
        # inside their load: an engine that asks for another layout needs the job taught it.
        raise PlanError(f"the {engine.name} engine asks for {_layout_words(plan.layout)}; the job runs "
                        f"{_layout_words(JOB_LAYOUT)}", field="backend",
                        hint="serve the model with an engine whose layout the job runs")
    return plan


def _layout_words(layout: RankLayout) -> str:
    where = "a server per GPU" if layout.per_gpu else "a server per node"
    serving = ", ".join(str(r) for r in layout.serving)
    others = "the others inside their model's load" if layout.others_stay_in_load else "the others ready on their own"
    return f"{where}, rank {serving} serving, {others}"
