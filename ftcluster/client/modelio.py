"""What an FT-style model takes and returns, read from its config (never hard-coded names).

FT models differ in input names: GPT takes input_ids/input_lengths/request_output_len, T5 takes
input_ids/sequence_length/max_output_len, FT's ensembles take text (INPUT_0...) and map it
through a tokenizer model. We give each declared input a *role* from its name, or, for an
ensemble, from the name the composing model uses for it (ensemble_scheduling input_map),
and then fill the roles. Optional inputs are left out; a required input with no known role
is an error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from ftcluster.errors import UserError

Role = Literal["input_ids", "input_lengths", "output_len", "text", "words_list", "hidden_state", "unknown"]
Style = Literal["decoder", "encoder-decoder", "encoder", "text"]

_ROLE_OF_KEY: dict[str, Role] = {
    "input_ids": "input_ids", "input_id": "input_ids",
    "input_lengths": "input_lengths", "input_length": "input_lengths",
    "request_input_len": "input_lengths", "sequence_length": "input_lengths",
    "sequence_lengths": "input_lengths",          # bert
    "input_hidden_state": "hidden_state",         # bert: the embedding output, [batch, seq, hidden]
    "request_output_len": "output_len", "max_output_len": "output_len", "output_len": "output_len",
}
_ENCODER_DECODER_TYPES = {"T5", "BART", "MBART"}
_ENCODER_TYPES = {"T5-ENCODER", "BERT"}   # return hidden states, not tokens
# Filler words for text prompts: common English words are about one token each in GPT-2's BPE,
# so N words give roughly N tokens with a real tokenizer.
_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "small", "birds", "sing", "in", "green", "trees", "near", "old", "river", "banks", "under", "blue", "summer", "sky"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str                  # Triton dtype name: UINT32, BYTES, ...
    dims: tuple[int, ...]       # without the batch dimension when the model batches
    optional: bool = False
    key: str = ""               # the composing model's name for it (ensembles), else name

    @property
    def np_dtype(self) -> Any:
        return np.object_ if self.dtype == "BYTES" else triton_to_np_dtype(self.dtype)


@dataclass(frozen=True)
class ModelIO:
    name: str
    is_ensemble: bool
    max_batch_size: int
    model_type: str | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    roles: dict[str, Role] = field(default_factory=dict)   # input name -> role
    # FT's interactive GPT: sequence batching, max_batch_size 1 and a pseudo batch dimension
    # (always 1) in front of [batch, ...]; requests carry a correlation id, start and end.
    sequence_batching: bool = False

    def output_named(self, key: str) -> TensorSpec | None:
        return next((o for o in self.outputs if o.key == key), None)

    @property
    def output_ids(self) -> TensorSpec | None:
        return self.output_named("output_ids")

    @property
    def sequence_length(self) -> TensorSpec | None:
        return self.output_named("sequence_length")

    @property
    def hidden_state(self) -> TensorSpec | None:
        return self.output_named("output_hidden_state")

    @property
    def text_output(self) -> TensorSpec | None:
        return next((o for o in self.outputs if o.dtype == "BYTES"), None)

    def input_with(self, role: Role) -> TensorSpec | None:
        return next((i for i in self.inputs if self.roles.get(i.name) == role), None)

    @property
    def style(self) -> Style:
        if self.input_with("text") is not None:
            return "text"
        if self.model_type and self.model_type.upper() in _ENCODER_TYPES:
            return "encoder"
        if self.output_ids is None and self.hidden_state is not None:
            return "encoder"
        if self.model_type:  # FT's own parameter says it best
            return "encoder-decoder" if self.model_type.upper() in _ENCODER_DECODER_TYPES else "decoder"
        out_len = self.input_with("output_len")
        return "encoder-decoder" if out_len is not None and out_len.key == "max_output_len" else "decoder"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "style": self.style, "ensemble": self.is_ensemble,
                "max_batch_size": self.max_batch_size, "model_type": self.model_type,
                "sequence_batching": self.sequence_batching,
                "inputs": {i.name: self.roles.get(i.name, "unknown") for i in self.inputs}}


def _dtype(cfg_type: str) -> str:
    name = cfg_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _ensemble_keys(cfg: dict[str, Any], direction: str) -> dict[str, str]:
    """Ensemble tensor name -> the composing model's name, from the first step using it."""
    keys: dict[str, str] = {}
    for step in cfg.get("ensemble_scheduling", {}).get("step", []):
        for key, value in step.get(direction, {}).items():
            keys.setdefault(value, key)
    return keys


def _role(spec: TensorSpec) -> Role:
    key = spec.key.lower()
    if spec.dtype == "BYTES":
        return "words_list" if ("bad" in key or "stop" in key) else "text"
    return _ROLE_OF_KEY.get(key, "unknown")


def parse_config(cfg: dict[str, Any]) -> ModelIO:
    """ModelIO from a config dict as tritonclient returns it (HTTP JSON or gRPC as_json)."""
    is_ensemble = cfg.get("platform") == "ensemble"
    in_keys = _ensemble_keys(cfg, "input_map") if is_ensemble else {}
    out_keys = _ensemble_keys(cfg, "output_map") if is_ensemble else {}

    def specs(rows: list[dict[str, Any]], keys: dict[str, str]) -> tuple[TensorSpec, ...]:
        return tuple(
            TensorSpec(r["name"], _dtype(r.get("data_type", "TYPE_INVALID")),
                       tuple(int(d) for d in r.get("dims", [])), bool(r.get("optional", False)),
                       keys.get(r["name"], r["name"]))
            for r in rows)

    inputs = specs(cfg.get("input", []), in_keys)
    outputs = specs(cfg.get("output", []), out_keys)
    model_type = cfg.get("parameters", {}).get("model_type", {}).get("string_value") or None
    return ModelIO(str(cfg.get("name", "")), is_ensemble, int(cfg.get("max_batch_size", 0)),
                   model_type, inputs, outputs, {i.name: _role(i) for i in inputs},
                   sequence_batching=bool(cfg.get("sequence_batching")) or "sequence_batching" in cfg)


@dataclass(frozen=True)
class Request:
    """One request's arrays plus what was asked, for the checks."""

    arrays: dict[str, np.ndarray]
    batch_size: int
    input_len: int
    output_len: int
    prompt_ids: np.ndarray | None      # [batch, input_len] token ids, None for text
    prompts: list[str] | None          # text prompts, None for token ids
    hidden: np.ndarray | None = None   # [batch, input_len, hidden] (bert), else None


def _shape(spec: TensorSpec, batch: int, fill: int, batched: bool, pseudo: bool = False) -> list[int]:
    if pseudo:  # [1, batch, ...]: the config's first dim is the real batch
        return [1, batch] + [fill if d < 0 else d for d in spec.dims[1:]]
    if batched:
        return [batch] + [fill if d < 0 else d for d in spec.dims]
    dims = list(spec.dims) or [-1]
    first = next((i for i, d in enumerate(dims) if d < 0), None)
    return [batch if i == first else (fill if d < 0 else d) for i, d in enumerate(dims)]


def _filled(spec: TensorSpec, shape: list[int], value: Any) -> np.ndarray:
    return np.full(shape, value, dtype=spec.np_dtype)


def _hidden_check(io: ModelIO, hidden_size: int | None) -> None:
    spec = io.input_with("hidden_state")
    if spec is None:
        return
    if hidden_size is None:
        raise UserError(f"model {io.name!r} takes {spec.name} [batch, seq, hidden], whose hidden size its "
                        "config does not say", field="--hidden-size",
                        hint="give --hidden-size (bert: hidden_size in the checkpoint's config.ini)")
    if hidden_size < 1:
        raise UserError("must be at least 1", field="--hidden-size")
    if spec.dtype not in ("FP16", "FP32", "FP64"):
        raise UserError(f"{spec.name} is {spec.dtype}: the client sends FP16 or FP32 hidden states",
                        field="--model", hint="serve the model with data_type fp16 or fp32")


def build_request(io: ModelIO, batch_size: int, input_len: int, output_len: int,
                  *, seed: int = 0, vocab_size: int = 50257, hidden_size: int | None = None) -> Request:
    """Random token ids (or words, for text models; or hidden states, for bert) in the inputs
    the config declares."""
    if batch_size < 1 or input_len < 1 or output_len < 1:
        raise UserError("batch size, input length and output length must be at least 1")
    batched = io.max_batch_size > 0
    pseudo = io.sequence_batching and batched
    if batched and not pseudo and batch_size > io.max_batch_size:
        raise UserError(f"batch size {batch_size} is above the model's max_batch_size {io.max_batch_size}",
                        field="--batch-size")
    if not batched and batch_size != 1 and not any(d < 0 for i in io.inputs for d in i.dims):
        raise UserError("the model does not batch (max_batch_size 0)", field="--batch-size", hint="use 1")
    unknown = [i.name for i in io.inputs if not i.optional and io.roles.get(i.name) == "unknown"]
    if unknown:
        raise UserError(f"model {io.name!r} requires inputs the client cannot make up: {', '.join(unknown)}",
                        field="--model",
                        hint="the client fills token ids, lengths and text (FT GPT/GPT-J/GPT-NeoX/BLOOM, "
                             "T5, T5-Encoder and their ensembles); query such a model with your own client")
    _hidden_check(io, hidden_size)
    rng = np.random.default_rng(seed)
    hidden: np.ndarray | None = None
    arrays: dict[str, np.ndarray] = {}
    prompt_ids: np.ndarray | None = None
    prompts: list[str] | None = None
    for spec in io.inputs:
        role = io.roles.get(spec.name, "unknown")
        if role == "unknown":
            continue  # optional and unknown: the model's default applies
        if role == "input_ids":
            shape = _shape(spec, batch_size, input_len, batched, pseudo)
            # Avoid 0 and the top id, which GPT checkpoints use as end_id.
            prompt_ids = rng.integers(1, vocab_size - 1, size=(batch_size, input_len))
            arrays[spec.name] = prompt_ids.reshape(shape).astype(spec.np_dtype)
        elif role == "input_lengths":
            arrays[spec.name] = _filled(spec, _shape(spec, batch_size, 1, batched, pseudo), input_len)
        elif role == "output_len":
            arrays[spec.name] = _filled(spec, _shape(spec, batch_size, 1, batched, pseudo), output_len)
        elif role == "text":
            prompts = [" ".join(rng.choice(_WORDS, size=input_len)) for _ in range(batch_size)]
            shape = _shape(spec, batch_size, 1, batched, pseudo)
            arrays[spec.name] = np.array([p.encode() for p in prompts], dtype=np.object_).reshape(shape)
        elif role == "words_list":
            arrays[spec.name] = _filled(spec, _shape(spec, batch_size, 1, batched, pseudo), b"")
        elif role == "hidden_state":
            assert hidden_size is not None  # _hidden_check
            hidden = rng.standard_normal((batch_size, input_len, hidden_size))
            shape = _shape(spec, batch_size, input_len, batched, pseudo)[:-1] + [hidden_size]
            arrays[spec.name] = hidden.reshape(shape).astype(spec.np_dtype)
    if prompt_ids is None and prompts is None and hidden is None:
        raise UserError(f"model {io.name!r} has no input_ids, text or input_hidden_state input", field="--model")
    return Request(arrays, batch_size, input_len, output_len, prompt_ids, prompts, hidden)


def output_names(io: ModelIO) -> list[str]:
    """The outputs the client asks for (only these are serialized back)."""
    if io.style == "encoder" and io.hidden_state is not None:
        return [io.hidden_state.name]
    names = [o.name for o in (io.output_ids, io.sequence_length) if o is not None]
    if io.style == "text" and io.text_output is not None:
        names.insert(0, io.text_output.name)
    if not names:
        raise UserError(f"model {io.name!r} has no output_ids, sequence_length, output_hidden_state "
                        "or text output",
                        field="--model")
    return names
