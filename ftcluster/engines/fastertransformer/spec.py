"""FasterTransformer's model spec: the fields a model served by the FT backend adds to the shared
ones (ftcluster.spec.model.ModelSpec)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ftcluster.errors import UserError
from ftcluster.spec.base import NAME_RE, plugin_lookup_back, plugin_lookup_off
from ftcluster.spec.model import INT32_MAX, ModelSpec

_PLUGINS_WERE = plugin_lookup_off()   # back after the last model (ftcluster.spec.base)

# What users call the model (modeltypes.KINDS); config.pbtxt gets the backend's name
# for it (BLOOM and OPT are served as GPT).
ModelType = Literal["GPT", "GPT-J", "GPT-NeoX", "T5", "T5-Encoder", "bert", "BLOOM", "OPT"]



class FTModelSpec(ModelSpec):
    """A FasterTransformer model: its type, the Triton model repository and the converted
    checkpoint, what config.pbtxt is given beside the source's values (data type, int8 mode, batch
    size, parameters) and the converter `ftcluster convert` runs."""

    folders: ClassVar[dict[str, str]] = {
        "repository": "point it at the Triton model repository holding config.pbtxt",
        "checkpoint_root": "point it at the converter output that holds the N-gpu/ folders",
    }

    # The engine: FasterTransformer (the Triton backend fastertransformer_backend).
    backend: Literal["fastertransformer"] = "fastertransformer"
    # The FT model type (BLOOM and OPT are served as GPT): config.pbtxt's model_type, the
    # converter and the plan's checks follow it.
    model_type: ModelType
    # The Triton model repository (a relative path is this spec file's folder's); a run serves a
    # copy of it with the plan's parameters set on the FT model's config.pbtxt.
    repository: Path
    # Folder of the FT model inside the repository; default: the one whose backend is
    # fastertransformer, else `name`.
    ft_model: str | None = None
    # The converted checkpoint's folder, holding the converter's <N>-gpu/ folders (N the tensor
    # parallel size; `convert` writes them); relative: this spec file's folder's.
    checkpoint_root: Path
    # The path of checkpoint_root as the server sees it (inside a container); default: same.
    checkpoint_mount: str | None = None
    # The FT model's data_type in config.pbtxt. Unset: what the source says (where it has none,
    # the checkpoint's weight_data_type: the backend cannot start without one).
    data_type: Literal["fp32", "fp16", "bf16"] | None = None
    # FT's int8_mode in config.pbtxt: 0 off, 1 int8 weights, 2 int8 weights and activations
    # (SmoothQuant); unset: the source's. Only GPT, BLOOM and OPT take a non-zero one.
    int8_mode: int | None = Field(None, ge=0, le=2)
    # FT's enable_custom_all_reduce in config.pbtxt (its own all-reduce kernel instead of
    # NCCL's between a node's GPUs); unset: the source's.
    enable_custom_all_reduce: bool | None = None
    # The FT model's max_batch_size in config.pbtxt (an ensemble that calls it is capped to it
    # too); unset: the source's. A protobuf int32.
    max_batch_size: int | None = Field(None, ge=0, le=INT32_MAX)
    # More FT parameters for config.pbtxt, name: value; set last, they win over the plan's and
    # over the fields above.
    parameters: dict[str, str] = Field(default_factory=dict)
    # Which FT converter `ftcluster convert` runs when the type has several (GPT: Megatron
    # checkpoints); unset: the Hugging Face one.
    converter: Literal["megatron"] | None = None

    @field_validator("ft_model")
    @classmethod
    def _ft_model(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.fullmatch(v):
            raise ValueError("use letters, digits, '.', '_' and '-' only")
        return v

    @field_validator("parameters", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): str(val) for k, val in v.items()}
        return v

    @model_validator(mode="after")
    def _converter(self) -> FTModelSpec:
        if self.converter == "megatron" and self.model_type != "GPT":
            raise ValueError(f"converter: megatron converts GPT checkpoints, not {self.model_type} "
                             "(leave converter out)")
        return self


def ft_spec(model: ModelSpec, what: str) -> FTModelSpec:
    """The spec as FasterTransformer's, for what only FT has (`what`: its converter, its
    checkpoint check); another engine's spec is refused in one line."""
    if not isinstance(model, FTModelSpec):
        raise UserError(f"{what} is FasterTransformer's; model {model.name} is served by {model.backend}",
                        field="backend", hint="use the engine's own tools for its weights")
    return model


plugin_lookup_back(_PLUGINS_WERE)
