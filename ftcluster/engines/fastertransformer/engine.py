"""The FasterTransformer engine (ftcluster.engines.base.Engine): Triton's fastertransformer
backend, one MPI task per node (tensor_para_size = GPUs per node, pipeline_para_size = nodes),
rank 0 serving while every other rank blocks in its model load for good."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftcluster.engines.base import Converter, ImageRecipe, Prepared
from ftcluster.engines.triton_config import read_model_config
from ftcluster.engines.fastertransformer.image import IMAGE
from ftcluster.engines.fastertransformer.plan import make_ft_plan
from ftcluster.engines.fastertransformer.repository import ft_parameters, prepare_repository
from ftcluster.engines.fastertransformer.spec import FTModelSpec, ft_spec
from ftcluster.engines.fastertransformer.visibility import check_checkpoint_visible
from ftcluster.plan.parallel import Plan
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.model import ModelSpec

# FT's ModelState::AutoCompleteConfig: a hidden-state tensor takes the model's data_type.
_HIDDEN_TYPES = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32", "bf16": "TYPE_BF16"}


def _ft(model: ModelSpec) -> FTModelSpec:
    """The spec as this engine's (the loader read it with FTModelSpec: its backend names FT)."""
    return ft_spec(model, "the FasterTransformer engine")


class FasterTransformer:
    name = "fastertransformer"
    spec = FTModelSpec
    # TRITONBACKEND_ModelInstanceInitialize in src/libfastertransformer.cc logs it on every rank;
    # every rank != 0 then blocks in model load for good and never opens its ports.
    loaded_marker = r"TRITONBACKEND_ModelInstanceInitialize: .* \(count [0-9]+\) \(instance_id [0-9]+\)"
    image: ImageRecipe = IMAGE

    def plan(self, cluster: ClusterSpec, model: ModelSpec, nodes: int, gpus_per_node: int,
             tp: int | None, pp: int | None) -> Plan:
        return make_ft_plan(cluster, _ft(model), nodes, gpus_per_node, tp, pp)

    def prepare(self, model: ModelSpec, plan: Plan, out: Path) -> Prepared:
        return prepare_repository(_ft(model), plan, out)

    def check_visible(self, cluster: ClusterSpec, model: ModelSpec, plan: Plan, run_dir: Path) -> None:
        check_checkpoint_visible(cluster, _ft(model), plan.tensor_para_size, run_dir)

    def served_config(self, model: ModelSpec, plan: Plan) -> dict[str, Any]:
        # startup: protobuf's json_format when a probe is made, not on the way to the plan
        from google.protobuf.json_format import MessageToDict

        ft = _ft(model)
        config: dict[str, Any] = MessageToDict(read_model_config(ft.repository / model.name / "config.pbtxt"),
                                               preserving_proto_field_name=True)
        if model.name != plan.engine_model:
            return config
        # As the server will see it: the run's parameters set, FT's auto-completed types.
        source = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        data_type = {**source, **ft_parameters(ft, plan, source)}.get("data_type", "")
        for tensor in config.get("input", []):
            if tensor.get("data_type", "TYPE_INVALID") == "TYPE_INVALID" and data_type in _HIDDEN_TYPES:
                tensor["data_type"] = _HIDDEN_TYPES[data_type]
        return config

    @property
    def converter(self) -> Converter:
        # startup: the converters' table only for `convert` and `check-checkpoint`, not a launch
        from ftcluster.engines.fastertransformer.convert import FTConverter

        return FTConverter()

    def binds(self, model: ModelSpec, repository: Path, links: bool) -> list[tuple[str, str]]:
        ft = _ft(model)
        binds = [(str(ft.checkpoint_root), ft.checkpoint_mount or str(ft.checkpoint_root))]
        if links:  # the per-run copy links large files of the user's repository by host path
            binds.append((str(ft.repository), str(ft.repository)))
        return binds


ENGINE = FasterTransformer()
