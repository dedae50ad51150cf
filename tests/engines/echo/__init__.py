"""The echo engine, for the tests only: the proof that an engine plugs in through the seam alone
(ftcluster.engines.base.Engine, found by name through the `ftcluster.engines` entry points),
touching nothing of ftcluster.

Triton serves one python-backend model, `echo` (repository/), that answers a prompt with its
token ids shifted by the spec's `shift`: the run's repository is this engine's (prepare sets
`shift` and the world's size on its config.pbtxt). Its plan is its own: one rank per node, at
most MAX_NODES nodes. Every rank logs the engine's own load line; rank 0 serves, the others
stay in their model load for good (as FT's do), so the job's world is the one it knows.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, ClassVar, Literal

from google.protobuf.json_format import MessageToDict
from pydantic import Field

from ftcluster.engines.base import Prepared
from ftcluster.engines.triton_config import dump_model_config, read_model_config, set_param
from ftcluster.errors import PlanError
from ftcluster.plan.parallel import Plan, RankSlot, node_names
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.model import ModelSpec

REPOSITORY = Path(__file__).parent / "repository"
MAX_NODES = 4
ENTRY_POINT = "tests.engines.echo:ENGINE"


class EchoSpec(ModelSpec):
    """The echo model."""

    folders: ClassVar[dict[str, str]] = {"repository": "point it at a repository holding echo/config.pbtxt"}

    # The engine: echo (tests only).
    backend: Literal["echo"] = "echo"
    # The repository holding the echo model.
    repository: Path
    # What the echo adds to every token id.
    shift: int = Field(1, ge=0, le=1000)


def _echo(model: ModelSpec) -> EchoSpec:
    assert isinstance(model, EchoSpec), model
    return model


class Echo:
    name = "echo"
    spec = EchoSpec
    loaded_marker = r"echo engine: rank [0-9]+ of [0-9]+ loaded"
    image = None   # it serves in the image the cluster spec names: no image build of its own

    def plan(self, cluster: ClusterSpec, model: ModelSpec, nodes: int, gpus_per_node: int,
             tp: int | None, pp: int | None) -> Plan:
        if nodes > MAX_NODES:
            raise PlanError(f"the echo engine serves on at most {MAX_NODES} nodes, not {nodes}", field="--nodes",
                            hint=f"lower --nodes to {MAX_NODES}")
        names = node_names(cluster, nodes)
        ranks = tuple(RankSlot(rank=i, node_index=i, node=names[i], gpus=gpus_per_node) for i in range(nodes))
        return Plan(nodes=nodes, gpus_per_node=gpus_per_node, tensor_para_size=tp or gpus_per_node,
                    pipeline_para_size=pp or nodes, world_size=nodes * gpus_per_node, ranks=ranks,
                    engine_model=model.name, backends=("python",), details={"shift": _echo(model).shift})

    def prepare(self, model: ModelSpec, plan: Plan, out: Path) -> Prepared:
        echo = _echo(model)
        shutil.copytree(echo.repository, out)
        path = out / model.name / "config.pbtxt"
        cfg = read_model_config(path)
        params = {"shift": str(echo.shift), "world_size": str(plan.mpi_ranks)}
        for key, value in params.items():
            set_param(cfg, key, value)
        path.write_text(dump_model_config(cfg))
        return Prepared(out, model.name, params)

    def check_visible(self, cluster: ClusterSpec, model: ModelSpec, plan: Plan, run_dir: Path) -> None:
        """Nothing to see beyond the run's own repository, which every rank sees."""

    def served_config(self, model: ModelSpec, plan: Plan) -> dict[str, Any]:
        cfg: dict[str, Any] = MessageToDict(read_model_config(_echo(model).repository / model.name / "config.pbtxt"),
                                            preserving_proto_field_name=True)
        return cfg

    def binds(self, model: ModelSpec, repository: Path, links: bool) -> list[tuple[str, str]]:
        return []


ENGINE = Echo()


def install(site: Path) -> Path:
    """Declare the engine in `site` as an installed package would (a dist-info with the entry
    point): a Python with `site` (and this checkout) on its path finds it by name."""
    info = site / "ftcluster_echo_engine-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ftcluster-echo-engine\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[ftcluster.engines]\necho = {ENTRY_POINT}\n")
    return site
