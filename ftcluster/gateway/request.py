"""A `GenerateRequest` -> the FT model's Triton inputs, and Triton's outputs -> a response; pure.

Input names come from the model's config through the client's `ModelIO` roles (GPT's
input_ids/input_lengths/request_output_len, T5's sequence_length/max_output_len, ensembles'
text inputs). Sampling parameters go only into inputs the model declares; asking for one it
does not declare is a 400 that names it, rather than a silently ignored setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ftcluster.client.modelio import ModelIO, TensorSpec, output_names
from ftcluster.client.modelio import _shape as tensor_shape  # the client's batching rule, reused
from ftcluster.gateway.schema import GenerateRequest
from ftcluster.client.tokenizer import Tokenizer

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
    outputs: tuple[str, ...]
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


@dataclass(frozen=True)
class Layout:
    """Which input takes what and which outputs to ask for: worked out once per model config."""

    io: ModelIO
    batched: bool
    ids: TensorSpec | None                 # token ids (None: a text model, see `text`)
    text: TensorSpec | None                # the text input of an ensemble without an ids input
    lengths: tuple[TensorSpec, ...]        # input_lengths / sequence_length
    output_lens: tuple[TensorSpec, ...]    # request_output_len / max_output_len
    words: tuple[TensorSpec, ...]          # required stop/bad words lists, sent empty
    sampling: dict[str, TensorSpec]        # request field -> the input taking it
    outputs: tuple[str, ...]
    out_ids: str | None
    out_len: str | None
    out_text: str | None

    @staticmethod
    def of(io: ModelIO) -> Layout:
        """The layout of a model the gateway can serve; RequestError (500) otherwise."""
        check_model(io)
        ids, text = io.input_with("input_ids"), io.input_with("text")

        def with_role(role: str, required_only: bool = False) -> tuple[TensorSpec, ...]:
            return tuple(i for i in io.inputs
                         if io.roles.get(i.name) == role and not (required_only and i.optional))

        sampling = {f: spec for f in SAMPLING_INPUTS if (spec := _sampling_input(io, f)) is not None}
        text_out = io.text_output
        return Layout(io, io.max_batch_size > 0, ids, text if ids is None else None,
                      with_role("input_lengths") if ids is not None else (), with_role("output_len"),
                      with_role("words_list", required_only=True), sampling, tuple(output_names(io)),
                      io.output_ids.name if io.output_ids else None,
                      io.sequence_length.name if io.sequence_length else None,
                      text_out.name if text_out else None)


def _padded(rows: list[list[int]], pad: int, dtype: Any) -> np.ndarray:
    if len(rows) == 1:
        return np.array(rows, dtype=dtype)
    out = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=dtype)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out


def build(lay: Layout, req: GenerateRequest, tok: Tokenizer | None, limits: Limits) -> Prepared:
    """The request's input arrays; RequestError (400) for what the model or the limits refuse."""
    try:
        return _build(lay, req, tok, limits)
    except OverflowError as exc:  # e.g. a token id above 2^31 for an INT32 input
        raise RequestError(f"a value does not fit the model's input type: {exc}") from None


def _build(lay: Layout, req: GenerateRequest, tok: Tokenizer | None, limits: Limits) -> Prepared:
    io, batched = lay.io, lay.batched
    batch = req.batch_size
    if batch > limits.max_batch or (batched and batch > io.max_batch_size):
        cap = min(limits.max_batch, io.max_batch_size) if batched else limits.max_batch
        raise RequestError(f"batch of {batch} is above the limit of {cap}")
    if not batched and batch != 1:
        raise RequestError(f"model {io.name!r} does not batch: send one prompt per request")
    if req.max_tokens > limits.max_tokens:
        raise RequestError(f"max_tokens {req.max_tokens} is above the limit of {limits.max_tokens}")
    arrays: dict[str, np.ndarray] = {}
    if lay.ids is None:  # an ensemble that tokenizes by itself
        assert lay.text is not None  # Layout.of made sure of one of them
        prompts = req.prompts() if req.prompt is not None else None
        if prompts is None:
            if tok is None:
                raise RequestError(f"model {io.name!r} takes text: send 'prompt' (or start the gateway "
                                   "with --tokenizer to accept input_ids)")
            prompts = [tok.decode(r) for r in req.id_rows()]
        longest = max(len(p) for p in prompts)
        if longest > limits.max_input_tokens:
            raise RequestError(f"prompt of {longest} characters is above the limit of {limits.max_input_tokens}")
        arrays[lay.text.name] = np.array([p.encode() for p in prompts], dtype=np.object_).reshape(
            tensor_shape(lay.text, batch, 1, batched))
    else:
        if req.prompt is not None:
            if tok is None:
                raise RequestError(f"model {io.name!r} takes token ids: send 'input_ids', or start the "
                                   "gateway with --tokenizer to accept 'prompt'")
            rows = [tok.encode(p) for p in req.prompts()]
            if any(not r for r in rows):
                raise RequestError("a prompt tokenizes to no tokens")
        else:
            rows = req.id_rows()
        lengths = [len(r) for r in rows]
        longest = max(lengths)
        if longest > limits.max_input_tokens:
            raise RequestError(f"prompt of {longest} tokens is above the limit of {limits.max_input_tokens}")
        ids = _padded(rows, req.end_id if req.end_id is not None else 0, lay.ids.np_dtype)
        arrays[lay.ids.name] = ids.reshape(tensor_shape(lay.ids, batch, longest, batched))
        for spec in lay.lengths:
            arrays[spec.name] = np.array(lengths, dtype=spec.np_dtype).reshape(
                tensor_shape(spec, batch, 1, batched))
    for spec in lay.output_lens:
        arrays[spec.name] = np.full(tensor_shape(spec, batch, 1, batched), req.max_tokens, dtype=spec.np_dtype)
    for spec in lay.words:
        arrays[spec.name] = np.full(tensor_shape(spec, batch, 1, batched), b"", dtype=np.object_)
    for field in SAMPLING_INPUTS:
        value = getattr(req, field)
        if value is None:
            continue
        spec_or_none = lay.sampling.get(field)
        if spec_or_none is None:
            raise RequestError(f"model {io.name!r} does not take {field} (no such input in its config)")
        arrays[spec_or_none.name] = np.full(tensor_shape(spec_or_none, batch, 1, batched), value,
                                            dtype=spec_or_none.np_dtype)
    return Prepared(arrays, lay.outputs, batch)


def response(lay: Layout, prepared: Prepared, got: dict[str, np.ndarray],
             tok: Tokenizer | None) -> dict[str, Any]:
    """The response body (GenerateResponse's fields) as plain lists, ready for a JSON encoder."""
    batch = prepared.batch
    seq = got.get(lay.out_len) if lay.out_len is not None else None
    seq_rows: list[list[int]] | None = seq.reshape(batch, -1).tolist() if seq is not None else None
    out_ids: list[list[list[int]]] | None = None
    arr = got.get(lay.out_ids) if lay.out_ids is not None else None
    if arr is not None:
        out_ids = arr.reshape(batch, -1, arr.shape[-1]).tolist()
        if seq_rows is not None:
            for beams, lens in zip(out_ids, seq_rows):
                if len(lens) == len(beams):
                    beams[:] = [row[:n] for row, n in zip(beams, lens)]
    text: list[list[str]] | None = None
    raw = got.get(lay.out_text) if lay.out_text is not None else None
    if raw is not None:
        text = [[v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in row]
                for row in raw.reshape(batch, -1).tolist()]
    elif tok is not None and out_ids is not None:
        text = [[tok.decode(beam) for beam in beams] for beams in out_ids]
    return {"model": lay.io.name, "output_ids": out_ids, "sequence_length": seq_rows, "text": text}
