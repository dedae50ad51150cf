"""The parallel plan: a run's ranks over nodes x GPUs, and its tensor x pipeline sizes.

What every engine's plan shares: the `Plan` itself, the checks of the plan's options on their
own, where the GPU count comes from and the nodes known before submission. The engine plans
(ftcluster.engines: `make_plan`), with every refusal it knows, so nothing impossible is ever
submitted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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
class RankLayout:
    """How an engine's server processes sit on the run's nodes, as the engine says."""

    per_gpu: bool = False              # a server process per GPU (else one per node, seeing its GPUs)
    serving: tuple[int, ...] = (0,)    # the ranks whose server answers requests: the run's endpoint
    # The other ranks stay inside their model's load while they serve (FT's ranks != 0 wait
    # there for rank 0's broadcasts): their load's start is their readiness.
    others_stay_in_load: bool = True

    def rank_count(self, nodes: int, gpus_per_node: int) -> int:
        return nodes * gpus_per_node if self.per_gpu else nodes


# What the job knows how to run: one rank per node, rank 0 serving, the others inside load.
JOB_LAYOUT = RankLayout()


@dataclass(frozen=True)
class Plan:
    nodes: int
    gpus_per_node: int
    tensor_para_size: int
    pipeline_para_size: int
    world_size: int          # GPUs in the model-parallel world: tp * pp
    ranks: tuple[RankSlot, ...]
    # The model of the run's repository that the engine runs (the plan's parameters are set on
    # it); the endpoint may serve another in front of it (an ensemble). "": a run that serves none.
    engine_model: str = ""
    layout: RankLayout = JOB_LAYOUT
    # The backend libraries the servers load (each model's `backend` in its config.pbtxt),
    # which the MPI check looks for in the image.
    backends: tuple[str, ...] = ()
    client_hidden_size: int | None = None   # an encoder's input width, where the engine read it (the client's)
    # What only its engine reads or shows (`ftcluster plan`, the run record), plain JSON values;
    # shown beside the shared keys, so none of them may take a shared key's name.
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = sorted(set(self.details) & _SHARED)
        if clash:
            raise ValueError(f"an engine's plan details may not be named as the plan's own keys: {clash}")

    @property
    def mpi_ranks(self) -> int:
        """The ranks of the run's MPI world."""
        return self.layout.rank_count(self.nodes, self.gpus_per_node)

    def to_dict(self) -> dict[str, Any]:
        """The shared keys with the engine's beside them (`plan --json` keeps the keys it had
        before the engines had a seam: FT's `ft_model`, `model_type`, ... are its details)."""
        shared = asdict(self)
        return {**shared.pop("details"), **shared, "mpi_ranks": self.mpi_ranks}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        layout = data.get("layout") or {}
        return cls(**{k: v for k, v in data.items() if k in _FIELDS},
                   ranks=tuple(RankSlot(**r) for r in data["ranks"]), backends=tuple(data.get("backends", ())),
                   layout=RankLayout(**{**layout, "serving": tuple(layout.get("serving", (0,)))}),
                   details={k: v for k, v in data.items() if k not in _SHARED},
                   # A plan saved before the seam named the engine's model by FT's word.
                   **({"engine_model": data["ft_model"]} if "engine_model" not in data and "ft_model" in data else {}))


_FIELDS = {"nodes", "gpus_per_node", "tensor_para_size", "pipeline_para_size", "world_size", "engine_model",
           "client_hidden_size"}
_SHARED = _FIELDS | {"ranks", "layout", "backends", "mpi_ranks"}


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


