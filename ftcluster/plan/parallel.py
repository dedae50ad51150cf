"""The parallel plan: a run's ranks over nodes x GPUs, and its tensor x pipeline sizes.

What every engine's plan shares: the `Plan` itself, the checks of the plan's options on their
own, where the GPU count comes from and the nodes known before submission. The engine plans
(ftcluster.engines: `make_plan`), with every refusal it knows, so nothing impossible is ever
submitted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ftcluster.errors import PlanError, UserError
from ftcluster.spec.launch_styles import style_of
from ftcluster.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class RankSlot:
    rank: int
    node_index: int
    node: str | None        # None until Slurm allocates the nodes
    gpus: int


@dataclass(frozen=True)
class Plan:
    nodes: int
    gpus_per_node: int
    tensor_para_size: int
    pipeline_para_size: int
    world_size: int          # GPUs in the model-parallel world: tp * pp
    mpi_ranks: int           # one MPI task per node
    ranks: tuple[RankSlot, ...]
    ft_model: str
    checkpoint_dir: str       # host-side <root>/<tp>-gpu
    model_type: str
    weight_data_type: str | None = None   # from the checkpoint's config.ini
    input_hidden_size: int | None = None  # bert: the client's input_hidden_state width
    # The backend libraries the servers load (each model's `backend` in its config.pbtxt),
    # which the MPI check looks for in the image.
    backends: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        ranks = tuple(RankSlot(**r) for r in data["ranks"])
        return cls(**{**data, "ranks": ranks, "backends": tuple(data.get("backends", ()))})


def option_problems(cluster: ClusterSpec | None, nodes: int, gpus_per_node: int | None = None,
                    tp: int | None = None, pp: int | None = None) -> list[UserError]:
    """What is wrong with the plan's options on their own (every one at once); cluster None:
    its spec did not load, its node limit is not checked."""
    problems: list[UserError] = []
    if gpus_per_node is not None and gpus_per_node < 1:
        problems.append(PlanError("must be >= 1", field="--gpus-per-node"))
    if nodes < 1:
        problems.append(PlanError("must be >= 1", field="--nodes"))
    elif cluster is not None and nodes > cluster.max_nodes:
        fix = ("add hosts to the cluster spec's hosts" if style_of(cluster).host_list
               and cluster.max_nodes == len(cluster.hosts) else "raise max_nodes in the cluster spec")
        problems.append(PlanError(f"{nodes} nodes requested but cluster {cluster.name!r} allows "
                                  f"{cluster.max_nodes}", field="--nodes", hint=f"lower --nodes or {fix}"))
    if (tp is not None and tp < 1) or (pp is not None and pp < 1):
        problems.append(PlanError("tensor and pipeline sizes must be >= 1", field="--tp/--pp"))
    return problems


def resolve_gpus(cluster: ClusterSpec, gpus_per_node: int | None) -> int:
    if gpus_per_node is not None:
        return gpus_per_node
    if cluster.gpus_per_node == "auto":
        raise PlanError(
            "is 'auto' and no GPU count was detected yet", field="gpus_per_node",
            hint="run `ftcluster preflight` or pass --gpus-per-node N",
        )
    return cluster.gpus_per_node


def node_names(cluster: ClusterSpec, nodes: int) -> list[str | None]:
    """The nodes known before submission: a host list's, this machine's ranks; else the scheduler picks."""
    style = style_of(cluster)
    if style.host_list:
        return list(cluster.hosts[:nodes])
    if style.one_host:
        return [f"local{i}" for i in range(nodes)]
    return [None] * nodes


