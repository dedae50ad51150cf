"""The model spec's shared part (ModelSpec): the model the client queries, the engine that serves
it (`backend`, ftcluster.spec.engines) and the client's defaults (ClientDefaults) for the requests
a launch sends. Each engine's spec adds its own fields (ftcluster.engines.<name>.spec). Reading
the file, and checking that its folders exist, is ftcluster.spec.load's."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from ftcluster.spec.base import NAME_RE, SpecModel, plugin_lookup_back, plugin_lookup_off
from ftcluster.spec.engines import default_engine

_PLUGINS_WERE = plugin_lookup_off()   # back after the last model (ftcluster.spec.base)

# The most a protobuf int32 holds: the sizes Triton's config.pbtxt (and FT's config.ini) take.
INT32_MAX = 2**31 - 1


class ClientDefaults(SpecModel):
    # Sequences in each request of the launch's own client (`client identity`); at most the
    # served model's max_batch_size.
    batch_size: int = Field(2, ge=1, le=INT32_MAX)
    # Input tokens per sequence of the launch's client requests.
    input_len: int = Field(8, ge=1, le=INT32_MAX)
    # Tokens the launch's client asks a decoder to generate per sequence.
    output_len: int = Field(8, ge=1, le=INT32_MAX)
    # How the launch's client reaches Triton: http (ports.http) or grpc (ports.grpc).
    protocol: Literal["http", "grpc"] = "http"
    # bert's input is hidden states [batch, seq, hidden]; unset: the checkpoint's hidden size.
    hidden_size: int | None = Field(None, ge=1, le=INT32_MAX)


class ModelSpec(SpecModel):
    """What every engine's model spec shares; the engine named in `backend` adds its own fields
    (ftcluster.engines.<name>.spec) and is the class a spec file is read with."""

    # The Triton model the client queries: a folder of the repository (an ensemble, or the
    # engine's model itself); letters, digits, '.', '_' and '-'.
    name: str
    # The engine that serves the model (ftcluster/engines/): a built-in one, or one an installed
    # package adds. Unset: the default engine (ftcluster.engines.built_in), asked for when a spec
    # is read (the table lives above the spec layer).
    backend: str = Field(default_factory=default_engine)
    client: ClientDefaults = ClientDefaults()
    # Where the spec came from; set by the loader, not by users.
    source: str | None = Field(None, exclude=True)
    # Fields naming folders that must exist when the spec is read, with the hint for a wrong one.
    folders: ClassVar[dict[str, str]] = {}

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("use letters, digits, '.', '_' and '-' only")
        return v


plugin_lookup_back(_PLUGINS_WERE)
