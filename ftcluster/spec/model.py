"""The model spec (ModelSpec): which FasterTransformer model a run serves (its type, the Triton
model repository and the converted checkpoint), what config.pbtxt is given beside the source's
values (data type, int8 mode, batch size, parameters), the converter `ftcluster convert` runs, and
the client's defaults (ClientDefaults) for the requests a launch sends. Reading the file, and
checking that its folders exist, is ftcluster.spec.load's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ftcluster.spec.base import NAME_RE, SpecModel, plugin_lookup_back, plugin_lookup_off

_PLUGINS_WERE = plugin_lookup_off()   # back after the last model (ftcluster.spec.base)

# The most a protobuf int32 holds: config.pbtxt's sizes (and config.ini's, ftcluster.plan.checkpoint).
INT32_MAX = 2**31 - 1


# What users call the model (ftcluster.spec.modeltypes.KINDS); config.pbtxt gets the backend's name
# for it (BLOOM and OPT are served as GPT).
ModelType = Literal["GPT", "GPT-J", "GPT-NeoX", "T5", "T5-Encoder", "bert", "BLOOM", "OPT"]


class ClientDefaults(SpecModel):
    batch_size: int = Field(2, ge=1, le=INT32_MAX)
    input_len: int = Field(8, ge=1, le=INT32_MAX)
    output_len: int = Field(8, ge=1, le=INT32_MAX)
    protocol: Literal["http", "grpc"] = "http"
    # bert's input is hidden states [batch, seq, hidden]; unset: the checkpoint's hidden size.
    hidden_size: int | None = Field(None, ge=1, le=INT32_MAX)


class ModelSpec(SpecModel):
    name: str
    backend: Literal["fastertransformer"] = "fastertransformer"
    model_type: ModelType
    repository: Path
    # Folder of the FT model inside the repository; default: the one whose backend is
    # fastertransformer, else `name`.
    ft_model: str | None = None
    checkpoint_root: Path
    # The path of checkpoint_root as the server sees it (inside a container); default: same.
    checkpoint_mount: str | None = None
    # Unset (None): config.pbtxt keeps what the source says (data_type, when the source has
    # none, becomes the checkpoint's weight_data_type: the backend cannot start without it).
    data_type: Literal["fp32", "fp16", "bf16"] | None = None
    int8_mode: int | None = Field(None, ge=0, le=2)
    enable_custom_all_reduce: bool | None = None
    # config.pbtxt's max_batch_size is a protobuf int32.
    max_batch_size: int | None = Field(None, ge=0, le=INT32_MAX)
    parameters: dict[str, str] = Field(default_factory=dict)
    client: ClientDefaults = ClientDefaults()
    # Which FT converter `ftcluster convert` runs when the type has several (GPT: Megatron
    # checkpoints); unset: the Hugging Face one.
    converter: Literal["megatron"] | None = None
    source: str | None = Field(None, exclude=True)

    @field_validator("name", "ft_model")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
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
    def _converter(self) -> ModelSpec:
        if self.converter == "megatron" and self.model_type != "GPT":
            raise ValueError(f"converter: megatron converts GPT checkpoints, not {self.model_type} "
                             "(leave converter out)")
        return self


plugin_lookup_back(_PLUGINS_WERE)
