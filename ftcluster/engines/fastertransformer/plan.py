"""FasterTransformer's plan: tensor_para_size = GPUs per node, pipeline_para_size = nodes, one MPI
task per node; and every refusal the FT backend would otherwise make minutes after submission --
the checkpoint's folder for the plan's GPUs and its shapes, config.pbtxt's instance group and
batching, the model type and its parameters, the client's request against the model.

`plan_for` is pure: it takes the specs and the facts read from the model repository and the
checkpoint, and either returns a `Plan` or raises `PlanError` with a one-line reason.
`make_ft_plan` is the thin edge that reads those facts from disk first.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftcluster.engines.fastertransformer.checkpoint import CheckpointFacts, read_checkpoint
from ftcluster.engines.fastertransformer.checkpoint_check import verify_checkpoint
from ftcluster.engines.triton_config import get_param, scan_repository
from ftcluster.engines.fastertransformer.config import find_ft_model
from ftcluster.engines.fastertransformer.modeltypes import BACKEND_TYPES, backend_type
from ftcluster.engines.fastertransformer.spec import FTModelSpec
from ftcluster.errors import PlanError, all_problems
from ftcluster.plan.parallel import Plan, RankLayout, RankSlot, node_names, option_problems
from ftcluster.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs from the FT model's config.pbtxt."""

    ft_model: str
    instance_groups: tuple[tuple[int, str], ...]   # (count, KIND_*)
    dynamic_batching: bool
    sequence_batching: bool
    max_batch_size: int
    # parameters.model_type as the source says it (None: unset, which the backend reads as GPT)
    config_model_type: str | None = None
    input_ranks: tuple[tuple[str, int], ...] = ()     # (input name, len(dims)) of the FT model
    served: str = ""                                  # the model the client queries
    served_max_batch_size: int | None = None          # None: the client queries the FT model
    source_params: tuple[tuple[str, str], ...] = ()   # the FT model's parameters as the source says
    backends: tuple[str, ...] = ()                    # every model's `backend` in the repository


def plan_for(
    cluster: ClusterSpec,
    model: FTModelSpec,
    facts: ModelFacts,
    ckpt: CheckpointFacts,
    nodes: int,
    gpus_per_node: int,
    tp: int | None = None,
    pp: int | None = None,
) -> Plan:
    """Check a plan against the cluster, the model config and the checkpoint. Pure."""
    problems = option_problems(cluster, nodes, gpus_per_node, tp, pp)
    if problems:
        raise all_problems(problems)
    tp = gpus_per_node if tp is None else tp
    pp = nodes if pp is None else pp
    if tp * pp != nodes * gpus_per_node:
        raise PlanError(
            f"tensor_para_size {tp} x pipeline_para_size {pp} = {tp * pp} GPUs, but {nodes} node(s) x "
            f"{gpus_per_node} GPU(s) = {nodes * gpus_per_node}",
            field="plan", hint="make tp*pp equal nodes*gpus_per_node",
        )
    _check_checkpoint(model, ckpt, tp, pp)
    _check_model_config(facts, nodes)
    _check_model_type(model, facts)
    _check_type_params(model, facts)
    _check_client(model, facts)
    _check_hidden_size(model, ckpt)
    names = node_names(cluster, nodes)
    ranks = tuple(RankSlot(rank=i, node_index=i, node=names[i], gpus=gpus_per_node) for i in range(nodes))
    assert ckpt.gpu_dir is not None
    return Plan(
        nodes=nodes, gpus_per_node=gpus_per_node, tensor_para_size=tp, pipeline_para_size=pp,
        world_size=tp * pp, ranks=ranks, engine_model=facts.ft_model,
        # One process per node, rank 0 serving: FT's own layout (its ranks != 0 wait in their
        # model's load for rank 0's broadcasts).
        layout=RankLayout(per_gpu=False, serving=(0,), others_stay_in_load=True),
        backends=facts.backends, client_hidden_size=ckpt.input_hidden_size,
        details={"ft_model": facts.ft_model, "model_type": model.model_type, "checkpoint_dir": str(ckpt.gpu_dir),
                 "weight_data_type": ckpt.weight_data_type, "input_hidden_size": ckpt.input_hidden_size},
    )


def _check_checkpoint(model: FTModelSpec, ckpt: CheckpointFacts, tp: int, pp: int) -> None:
    if ckpt.gpu_dir is None:
        have = ", ".join(f"{n}-gpu" for n in ckpt.available_gpus) or "none"
        raise PlanError(
            f"no {tp}-gpu folder under {ckpt.root} (found: {have})", field="checkpoint_root",
            hint=f"convert the weights for {tp} GPUs (the converter's inference GPU count, -i_g {tp})",
        )
    if ckpt.ini_path is None:
        raise PlanError(f"{ckpt.gpu_dir}/config.ini is missing", field="checkpoint_root",
                        hint="re-run the FT converter; the backend reads this file")
    if ckpt.ini_tensor_para_size is not None and ckpt.ini_tensor_para_size != tp:
        raise PlanError(
            f"{ckpt.ini_path} says tensor_para_size={ckpt.ini_tensor_para_size} but the plan uses {tp}",
            field="checkpoint_root",
            hint=f"this folder was converted for {ckpt.ini_tensor_para_size} GPU(s); convert for {tp}",
        )
    for split in ckpt.splits:
        if split.head_num % tp:
            raise PlanError(
                f"[{split.section}] head_num {split.head_num} is not divisible by tensor_para_size {tp}",
                field="plan", hint="choose a tensor_para_size (GPUs per node) that divides the head count",
            )
        if split.num_layer % pp:
            raise PlanError(
                f"[{split.section}] num_layer {split.num_layer} is not divisible by pipeline_para_size {pp}",
                field="plan", hint="choose a node count that divides the layer count",
            )


def _check_model_config(facts: ModelFacts, nodes: int) -> None:
    where = f"{facts.ft_model}/config.pbtxt"
    if nodes > 1:
        if not facts.instance_groups:
            # Triton then gives the model one KIND_GPU instance per visible GPU.
            raise PlanError(
                "instance_group is not set (Triton's default, one instance per GPU) and cannot run on several nodes",
                field=f"{where} instance_group",
                hint="set instance_group [{count: 1, kind: KIND_CPU}] for multi-node FT",
            )
        for count, kind in facts.instance_groups:
            if count != 1 or kind != "KIND_CPU":
                raise PlanError(
                    f"instance_group {{count: {count}, kind: {kind}}} cannot run on several nodes",
                    field=f"{where} instance_group",
                    hint="the FT backend needs exactly one KIND_CPU instance when multi-node",
                )
    if facts.dynamic_batching and facts.sequence_batching:
        raise PlanError("dynamic_batching and sequence_batching are both set", field=f"{where}",
                        hint="keep one of them")
    if facts.sequence_batching and facts.max_batch_size != 1:
        raise PlanError(
            f"sequence_batching needs max_batch_size 1 (it is {facts.max_batch_size})",
            field=f"{where} max_batch_size", hint="set max_batch_size: 1 or drop sequence_batching",
        )


def _check_model_type(model: FTModelSpec, facts: ModelFacts) -> None:
    wanted = backend_type(model.model_type)
    said = facts.config_model_type
    if said is not None and said != wanted:
        known = said in BACKEND_TYPES
        raise PlanError(
            f"parameters.model_type is {said!r} but model_type {model.model_type} is served as {wanted!r}",
            field=f"{facts.ft_model}/config.pbtxt model_type",
            hint=(f"set model_type in the model spec to what the repository holds ({said})" if known else
                  f"the FT backend knows only {', '.join(BACKEND_TYPES)}; fix the repository's model_type"),
        )


# ModelFactory (libfastertransformer.cc) passes int8_mode to GPT (BLOOM, OPT) and bert only;
# GPT-J, GPT-NeoX, T5 and T5-Encoder are built without it. BertTritonModel's constructor
# aborts (FT_CHECK) on int8_mode != 0 and on is_sparse.
_NO_INT8 = ("GPT-J", "GPT-NeoX", "T5", "T5-Encoder")


def _check_type_params(model: FTModelSpec, facts: ModelFacts) -> None:
    where = f"{facts.ft_model}/config.pbtxt"
    params = dict(facts.source_params)
    said_int8 = model.int8_mode is not None or "int8_mode" in model.parameters
    if model.int8_mode is not None:
        params["int8_mode"] = str(model.int8_mode)
    params.update(model.parameters)

    def number(key: str) -> int:
        try:
            return int(params.get(key) or "0")
        except ValueError:
            raise PlanError(f"parameters.{key} is {params[key]!r}, not an integer", field=f"{where} {key}",
                            hint="the FT backend reads it with stoi") from None

    if model.data_type is not None:
        params["data_type"] = model.data_type
    dtype = params.get("data_type")
    if dtype is not None and dtype not in ("fp16", "bf16", "fp32"):
        raise PlanError(f"parameters.data_type is {dtype!r}: the FT backend builds fp16, bf16 or fp32 only",
                        field=f"{where} data_type", hint="set data_type: fp16, bf16 or fp32")
    if model.model_type == "GPT-NeoX" and dtype == "bf16":
        # ModelFactory: GPT-NeoX is half for fp16 and float for anything else.
        raise PlanError("data_type bf16: the FT backend builds GPT-NeoX in fp16 or fp32 only and would "
                        "run it in fp32", field="data_type", hint="set data_type: fp16 or fp32")
    int8 = number("int8_mode")
    if model.model_type == "bert":
        if int8:
            raise PlanError(f"int8_mode {int8}: the FT backend does not support int8 for bert "
                            "(BertTritonModel aborts)", field="int8_mode", hint="set int8_mode: 0")
        if number("is_sparse"):
            raise PlanError("is_sparse is set: the FT backend does not support sparse bert "
                            "(BertTritonModel aborts)", field=f"{where} is_sparse", hint="set it to 0")
    elif model.model_type in _NO_INT8 and said_int8 and int8:
        raise PlanError(f"int8_mode {int8}: the FT backend builds {model.model_type} without int8 and would "
                        "ignore it", field="int8_mode", hint="leave int8_mode out (or 0) for this model type")


def _check_client(model: FTModelSpec, facts: ModelFacts) -> None:
    """The client's request must fit the model: refused here, not after the servers are up."""
    where = f"{facts.ft_model}/config.pbtxt"
    if facts.sequence_batching:
        # FT's interactive GPT: a pseudo batch dimension of 1 in front of [batch, ...]
        # (fastertransformer_backend docs/gpt_guide.md); the client sends [1, batch, ...].
        ranks = dict(facts.input_ranks)
        if ranks.get("input_ids", 2) < 2:
            raise PlanError(
                "sequence_batching needs input_ids dims [ -1, -1 ] (FT reads the second dimension "
                "as the batch)", field=f"{where} input",
                hint="start from all_models/gpt-interactive-text-generation, whose inputs carry it")
        return
    mbs = facts.max_batch_size if facts.served_max_batch_size is None else facts.served_max_batch_size
    if mbs > 0 and model.client.batch_size > mbs:
        served = facts.served or facts.ft_model
        raise PlanError(
            f"client.batch_size {model.client.batch_size} is above max_batch_size {mbs} of {served}",
            field="client.batch_size", hint=f"set client.batch_size to at most {mbs}")


def _check_hidden_size(model: FTModelSpec, ckpt: CheckpointFacts) -> None:
    """bert reads the width of input_hidden_state from the tensor: another width is garbage."""
    want, said = ckpt.input_hidden_size, model.client.hidden_size
    if said is not None and want is not None and said != want:
        raise PlanError(f"client.hidden_size {said} but {ckpt.ini_path} says hidden_size {want}",
                        field="client.hidden_size", hint=f"set it to {want} or leave it out")


def read_model_facts(model: FTModelSpec) -> ModelFacts:
    models = scan_repository(model.repository)
    ft = find_ft_model(models, model.ft_model, model.name)
    cfg = ft.config
    # startup: Triton's config schema (protobuf) only when a model's facts are read
    from ftcluster.engines.triton_config import model_config_pb2

    groups = tuple(
        (int(g.count) if g.count else 1, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind))
        for g in cfg.instance_group
    )
    mbs = model.max_batch_size if model.max_batch_size is not None else int(cfg.max_batch_size)
    served = models.get(model.name)
    served_mbs: int | None = None
    if served is not None and served.name != ft.name:
        served_mbs = int(served.config.max_batch_size)
        if any(s.model_name == ft.name for s in served.config.ensemble_scheduling.step):
            served_mbs = min(served_mbs, mbs)  # prepare caps the ensemble to its FT model
    return ModelFacts(
        ft_model=ft.name, instance_groups=groups,
        dynamic_batching=cfg.HasField("dynamic_batching"),
        sequence_batching=cfg.HasField("sequence_batching"),
        max_batch_size=mbs,
        config_model_type=get_param(cfg, "model_type"),
        input_ranks=tuple((i.name, len(i.dims)) for i in cfg.input),
        served=served.name if served is not None else ft.name,
        served_max_batch_size=served_mbs,
        source_params=tuple((k, v.string_value) for k, v in sorted(cfg.parameters.items())),
        # A platform (ensemble) is built into the server: only a `backend` is a library to find.
        backends=tuple(sorted({str(m.config.backend) for m in models.values() if m.config.backend})),
    )


def make_ft_plan(cluster: ClusterSpec, model: FTModelSpec, nodes: int, gpn: int, tp: int | None, pp: int | None) -> Plan:
    """Read the model's facts and plan (the edge around `plan_for`)."""
    facts = read_model_facts(model)
    ckpt = read_checkpoint(model.checkpoint_root, model.model_type, gpn if tp is None else tp)
    plan = plan_for(cluster, model, facts, ckpt, nodes, gpn, tp, pp)
    # Weight files, when there are any: every shard present with the size config.ini implies.
    verify_checkpoint(model.checkpoint_root, model.model_type, plan.tensor_para_size)
    return plan
