"""A `GenerateRequest` -> the FT model's Triton inputs, and Triton's outputs -> a response; pure.

Input names come from the model's config through the client's `ModelIO` roles (GPT's
input_ids/input_lengths/request_output_len, T5's sequence_length/max_output_len, ensembles'
text inputs). Sampling parameters go only into inputs the model declares; asking for one it
does not declare is a 400 that names it, rather than a silently ignored setting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ftcluster.client.modelio import ModelIO, TensorSpec, output_names
from ftcluster.client.modelio import _shape as tensor_shape  # the client's batching rule, reused
from ftcluster.gateway.schema import GenerateRequest, GenerateResponse
from ftcluster.gateway.tokenizer import Tokenizer

# request field -> the names FT models (and FT's ensembles) use for it
SAMPLING_INPUTS: dict[str, tuple[str, ...]] = {
    "top_k": ("runtime_top_k", "top_k"),
    "top_p": ("runtime_top_p", "top_p"),
    "temperature": ("temperature",),
    "repetition_penalty": ("repetition_penalty",),
    "random_seed": ("random_seed",),
    "beam_width": ("beam_width",),
    "end_id": ("end_id",),
}


class RequestError(Exception):
    """A request the model cannot take; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    max_input_tokens: int = 4096     # also: characters of a text prompt for text models
    max_tokens: int = 4096
    max_batch: int = 64


@dataclass(frozen=True)
class Prepared:
    arrays: dict[str, np.ndarray]
    outputs: list[str]
    batch: int


def _sampling_input(io: ModelIO, field: str) -> TensorSpec | None:
    names = SAMPLING_INPUTS[field]
    return next((i for i in io.inputs if i.key.lower() in names or i.name.lower() in names), None)


def check_model(io: ModelIO) -> None:
    """Refuse (at start-up) a model with a required input the gateway cannot fill."""
    known = {i.name for f in SAMPLING_INPUTS if (i := _sampling_input(io, f)) is not None}
    missing = [i.name for i in io.inputs
               if not i.optional and io.roles.get(i.name) == "unknown" and i.name not in known]
    if missing:
        raise RequestError(f"model {io.name!r} requires inputs the gateway cannot fill: {', '.join(missing)}", 500)
    if io.input_with("input_ids") is None and io.input_with("text") is None:
        raise RequestError(f"model {io.name!r} has no input_ids or text input", 500)
    output_names(io)  # raises when there is nothing to return


def _padded(rows: list[list[int]], pad: int) -> np.ndarray:
    out = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=np.int64)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out


def build(io: ModelIO, req: GenerateRequest, tok: Tokenizer | None, limits: Limits) -> Prepared:
    batch = req.batch_size
    batched = io.max_batch_size > 0
    if batch > limits.max_batch or (batched and batch > io.max_batch_size):
        cap = min(limits.max_batch, io.max_batch_size) if batched else limits.max_batch
        raise RequestError(f"batch of {batch} is above the limit of {cap}")
    if not batched and batch != 1:
        raise RequestError(f"model {io.name!r} does not batch: send one prompt per request")
    if req.max_tokens > limits.max_tokens:
        raise RequestError(f"max_tokens {req.max_tokens} is above the limit of {limits.max_tokens}")
    arrays: dict[str, np.ndarray] = {}
    text_in = io.input_with("text")
    ids_in = io.input_with("input_ids")
    if text_in is not None and ids_in is None:  # an ensemble that tokenizes by itself
        prompts = req.prompts() if req.prompt is not None else None
        if prompts is None:
            if tok is None:
                raise RequestError(f"model {io.name!r} takes text: send 'prompt' (or start the gateway "
                                   "with --tokenizer to accept input_ids)")
            prompts = [tok.decode(r) for r in req.id_rows()]
        longest = max(len(p) for p in prompts)
        if longest > limits.max_input_tokens:
            raise RequestError(f"prompt of {longest} characters is above the limit of {limits.max_input_tokens}")
        arrays[text_in.name] = np.array([p.encode() for p in prompts], dtype=np.object_).reshape(
            tensor_shape(text_in, batch, 1, batched))
        lengths: np.ndarray | None = None
    else:
        assert ids_in is not None  # check_model made sure of one of them
        if req.prompt is not None:
            if tok is None:
                raise RequestError(f"model {io.name!r} takes token ids: send 'input_ids', or start the "
                                   "gateway with --tokenizer to accept 'prompt'")
            rows = [tok.encode(p) for p in req.prompts()]
            if any(not r for r in rows):
                raise RequestError("a prompt tokenizes to no tokens")
        else:
            rows = req.id_rows()
        longest = max(len(r) for r in rows)
        if longest > limits.max_input_tokens:
            raise RequestError(f"prompt of {longest} tokens is above the limit of {limits.max_input_tokens}")
        ids = _padded(rows, req.end_id if req.end_id is not None else 0)
        arrays[ids_in.name] = ids.reshape(tensor_shape(ids_in, batch, ids.shape[1], batched)).astype(ids_in.np_dtype)
        lengths = np.array([len(r) for r in rows])
    for spec in io.inputs:
        role = io.roles.get(spec.name)
        shape = tensor_shape(spec, batch, 1, batched)
        if role == "input_lengths" and lengths is not None:
            arrays[spec.name] = lengths.reshape(shape).astype(spec.np_dtype)
        elif role == "output_len":
            arrays[spec.name] = np.full(shape, req.max_tokens, dtype=spec.np_dtype)
        elif role == "words_list" and not spec.optional:
            arrays[spec.name] = np.full(shape, b"", dtype=np.object_)
    for field in SAMPLING_INPUTS:
        value = getattr(req, field)
        if value is None:
            continue
        spec_or_none = _sampling_input(io, field)
        if spec_or_none is None:
            raise RequestError(f"model {io.name!r} does not take {field} (no such input in its config)")
        arrays[spec_or_none.name] = np.full(tensor_shape(spec_or_none, batch, 1, batched), value,
                                            dtype=spec_or_none.np_dtype)
    return Prepared(arrays, output_names(io), batch)


def response(io: ModelIO, prepared: Prepared, got: dict[str, np.ndarray],
             tok: Tokenizer | None) -> GenerateResponse:
    batch = prepared.batch
    ids_spec, len_spec, text_spec = io.output_ids, io.sequence_length, io.text_output
    seq = got.get(len_spec.name) if len_spec is not None else None
    seq_rows = seq.reshape(batch, -1).astype(np.int64).tolist() if seq is not None else None
    out_ids: list[list[list[int]]] | None = None
    if ids_spec is not None and ids_spec.name in got:
        arr = got[ids_spec.name]
        arr = arr.reshape(batch, -1, arr.shape[-1]).astype(np.int64)
        out_ids = []
        for b in range(batch):
            beams = arr[b].tolist()
            if seq_rows is not None and len(seq_rows[b]) == len(beams):
                beams = [row[: seq_rows[b][k]] for k, row in enumerate(beams)]
            out_ids.append(beams)
    text: list[list[str]] | None = None
    if text_spec is not None and text_spec.name in got:
        raw = got[text_spec.name].reshape(batch, -1)
        text = [[v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in row]
                for row in raw]
    elif tok is not None and out_ids is not None:
        text = [[tok.decode(beam) for beam in beams] for beams in out_ids]
    return GenerateResponse(model=io.name, output_ids=out_ids, sequence_length=seq_rows, text=text)
