"""End-to-end text test: prompts in, text out, and corpus BLEU against references (translation).

Token-id models (FT GPT, T5): the prompts are tokenized here (`bytes`, or a transformers
tokenizer), sent in batches with the inputs the model's config declares (modelio's roles), and
output_ids are decoded up to sequence_length. Decoder-only models return the prompt first: its
tokens are cut off, so `text` is what the model generated and `output` all it returned.
Text models (FT-style ensembles) take the strings and tokenize inside Triton; a GPT ensemble's
text starts with the prompt, which is cut off the same way (not for a T5 one, whose composing
model says model_type T5).

BLEU (sacrebleu, `pip install 'ftcluster[text]'`) scores `text` against one reference per prompt.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ftcluster.client.endpoint import AsyncTriton, ClientError, Endpoint
from ftcluster.client.modelio import (
    _ENCODER_DECODER_TYPES,
    ModelIO,
    _shape,
    output_names,
    parse_config,
)
from ftcluster.client.tokenizer import Tokenizer, load_tokenizer
from ftcluster.errors import UserError


@dataclass
class TextRow:
    prompt: str
    text: str                       # generated text (decoder-only models: without the prompt)
    output: str                     # all the model returned, decoded
    input_tokens: int | None        # None for text models (they tokenize inside Triton)
    output_tokens: int | None
    latency_ms: float               # of the request the prompt was in


@dataclass
class TextResult:
    url: str
    protocol: str
    model: str
    style: str
    tokenizer: str | None           # None: the model tokenizes (text models)
    batch_size: int
    output_len: int
    inputs_sent: list[str]
    rows: list[TextRow] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)   # one per request
    total_s: float = 0.0
    bleu: float | None = None
    bleu_signature: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.rows)

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.rows]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        lat = self.latencies_ms
        d["latency_ms"] = ({"min": min(lat), "median": statistics.median(lat), "max": max(lat)}
                           if lat else {})
        return d


# --- files and BLEU ------------------------------------------------------------------------------

def read_lines(path: str | Path, option: str) -> list[str]:
    """The file's lines without line ends; trailing empty lines dropped."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"{p}: no such file", field=option) from None
    except IsADirectoryError:
        raise UserError(f"{p} is a folder, not a file", field=option) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})", field=option) from None
    except OSError as exc:
        raise UserError(f"cannot read {p}: {exc.strerror or exc}", field=option) from None
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per line; an empty file or an empty line is an error."""
    prompts = read_lines(path, "--prompts")
    if not prompts:
        raise UserError(f"{path} holds no prompts", field="--prompts", hint="one prompt per line")
    empty = [i + 1 for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        raise UserError(f"{path}: line {empty[0]} is empty", field="--prompts", hint="one prompt per line")
    return prompts


def read_references(path: str | Path, n_prompts: int) -> list[str]:
    """One reference per prompt, line by line."""
    refs = read_lines(path, "--reference")
    if len(refs) != n_prompts:
        lines = f"{len(refs)} line" + ("" if len(refs) == 1 else "s")
        raise UserError(f"{path} has {lines} for {n_prompts} prompts", field="--reference",
                        hint="one reference per prompt, in the same order")
    return refs


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """(BLEU score 0-100, sacrebleu's signature) of one reference per hypothesis."""
    try:
        # optional extra: text (sacrebleu)
        from sacrebleu.metrics import BLEU
    except ImportError:
        raise UserError("--reference (BLEU) needs sacrebleu", field="--reference",
                        hint="pip install 'ftcluster[text]'") from None
    if len(hypotheses) != len(references):
        raise UserError(f"{len(references)} references for {len(hypotheses)} outputs", field="--reference")
    bleu = BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    return float(score.score), str(bleu.get_signature())


# --- requests ------------------------------------------------------------------------------------

def build_arrays(io: ModelIO, prompts: list[str], output_len: int,
                 tok: Tokenizer | None) -> tuple[dict[str, np.ndarray], list[int] | None]:
    """The inputs the config declares for these prompts, and the prompts' token counts
    (None for text models)."""
    if io.style == "encoder":
        raise UserError(f"model {io.name!r} is an encoder ({io.model_type or 'hidden-state outputs'}): it "
                        "returns hidden states, not text", field="--model",
                        hint="check it with `ftcluster client identity` or `bench`")
    batch, batched = len(prompts), io.max_batch_size > 0
    unknown = [i.name for i in io.inputs if not i.optional and io.roles.get(i.name) == "unknown"]
    if unknown:
        raise UserError(f"model {io.name!r} requires inputs ftcluster cannot fill: {', '.join(unknown)}",
                        field="--model")
    arrays: dict[str, np.ndarray] = {}
    ids_in, text_in = io.input_with("input_ids"), io.input_with("text")
    lengths: list[int] | None = None
    if ids_in is not None:
        if tok is None:
            raise UserError(f"model {io.name!r} takes token ids", field="--tokenizer",
                            hint="'bytes' for the demo test model, or a transformers name/path")
        rows = [tok.encode(p) for p in prompts]
        empty = [p for p, r in zip(prompts, rows) if not r]
        if empty:
            raise UserError(f"prompt {empty[0]!r} is no tokens with tokenizer {tok.name!r}",
                            field="--prompts")
        lengths = [len(r) for r in rows]
        ids = np.full((batch, max(lengths)), tok.pad_id, dtype=np.int64)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = row
        shape = _shape(ids_in, batch, ids.shape[1], batched, io.sequence_batching)
        arrays[ids_in.name] = ids.reshape(shape).astype(ids_in.np_dtype)
    elif text_in is not None:
        arrays[text_in.name] = np.array([p.encode("utf-8") for p in prompts], dtype=np.object_).reshape(
            _shape(text_in, batch, 1, batched, io.sequence_batching))
    else:
        raise UserError(f"model {io.name!r} has no input_ids or text input", field="--model")
    for spec in io.inputs:
        role = io.roles.get(spec.name)
        shape = _shape(spec, batch, 1, batched, io.sequence_batching)
        if role == "input_lengths" and lengths is not None:
            arrays[spec.name] = np.array(lengths).reshape(shape).astype(spec.np_dtype)
        elif role == "output_len":
            arrays[spec.name] = np.full(shape, output_len, dtype=spec.np_dtype)
        elif role == "words_list" and not spec.optional:
            arrays[spec.name] = np.full(shape, b"", dtype=np.object_)
    return arrays, lengths


def decode_outputs(io: ModelIO, prompts: list[str], lengths: list[int] | None, out: dict[str, np.ndarray],
                   tok: Tokenizer | None, echoes_prompt: bool) -> list[tuple[str, str, int | None]]:
    """(text, output, generated tokens) per prompt; beam 0, cut at sequence_length."""
    batch = len(prompts)
    text_spec, ids_spec, seq_spec = io.text_output, io.output_ids, io.sequence_length
    if lengths is None:  # a text model: the strings it returned
        if text_spec is None or text_spec.name not in out:
            name = text_spec.name if text_spec else "none declared"
            raise ClientError(f"the response has no text output ({name})")
        values = out[text_spec.name].reshape(batch, -1)[:, 0]
        rows: list[tuple[str, str, int | None]] = []
        for prompt, value in zip(prompts, values):
            output = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
            text = output[len(prompt):] if echoes_prompt and output.startswith(prompt) else output
            rows.append((text, output, None))
        return rows
    assert tok is not None  # build_arrays refuses token-id models without one
    if ids_spec is None or ids_spec.name not in out:
        raise ClientError("the response has no output_ids")
    ids = out[ids_spec.name]
    ids = ids.reshape(batch, -1, ids.shape[-1]).astype(np.int64)[:, 0, :]
    if seq_spec is not None and seq_spec.name in out:
        seq = out[seq_spec.name].reshape(batch, -1)[:, 0].astype(np.int64)
    else:
        seq = np.full(batch, ids.shape[1], dtype=np.int64)
    rows = []
    for b in range(batch):
        full = ids[b, : max(0, int(seq[b]))].tolist()
        generated = full[lengths[b]:] if echoes_prompt else full
        rows.append((tok.decode(generated), tok.decode(full), len(generated)))
    return rows


async def _echoes_prompt(client: AsyncTriton, io: ModelIO, cfg: dict[str, Any]) -> bool:
    """Decoder-only models return the prompt first; for an ensemble, ask its composing models."""
    if io.style != "text":
        return io.style == "decoder"
    for step in cfg.get("ensemble_scheduling", {}).get("step", []):
        try:
            model_type = parse_config(await client.model_config(str(step.get("model_name")))).model_type
        except ClientError:
            continue
        if model_type:
            return model_type.upper() not in _ENCODER_DECODER_TYPES
    return True  # unknown: cut the prompt only when the text starts with it


async def run_text_async(endpoint: Endpoint, model: str, prompts: list[str], *,
                         tokenizer: str | Tokenizer | None = None, output_len: int = 16,
                         batch_size: int | None = None, references: list[str] | None = None) -> TextResult:
    """Send the prompts in batches of `batch_size` (default: up to 8, within max_batch_size).

    UserError for what the user must fix (files, options, server, model); a failed request is
    in the result (`error`), with the rows done before it.
    """
    if not prompts:
        raise UserError("no prompts", field="--prompts")
    if output_len < 1:
        raise UserError("must be at least 1", field="--output-len")
    if references is not None and len(references) != len(prompts):
        raise UserError(f"{len(references)} references for {len(prompts)} prompts", field="--reference")
    async with AsyncTriton(endpoint) as client:
        await client.check_model(model)
        cfg = await client.model_config(model)
        io = parse_config(cfg)
        names = output_names(io)
        batched = io.max_batch_size > 0
        if batch_size is None:
            batch_size = min(8, io.max_batch_size) if batched else 1
        too_big = (batch_size > io.max_batch_size and not io.sequence_batching) if batched else batch_size != 1
        if batch_size < 1 or too_big:
            raise UserError(f"batch size {batch_size} does not fit the model (max_batch_size "
                            f"{io.max_batch_size})", field="--batch-size")
        tok: Tokenizer | None = None
        if io.input_with("input_ids") is not None:
            tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        echoes = await _echoes_prompt(client, io, cfg)
        chunks = [prompts[i: i + batch_size] for i in range(0, len(prompts), batch_size)]
        first, first_lengths = build_arrays(io, chunks[0], output_len, tok)  # refusals before any request
        result = TextResult(endpoint.url, endpoint.protocol, model, io.style, tok.name if tok else None,
                            batch_size, output_len, list(first))
        t_start = time.perf_counter()
        for i, chunk in enumerate(chunks):
            arrays, lengths = (first, first_lengths) if i == 0 else build_arrays(io, chunk, output_len, tok)
            t0 = time.perf_counter()
            try:
                out = await client.infer_arrays(model, arrays, names, sequence=io.sequence_batching)
                decoded = decode_outputs(io, chunk, lengths, out, tok, echoes)
            except ClientError as exc:
                result.error = str(exc)
                break
            ms = (time.perf_counter() - t0) * 1e3
            result.latencies_ms.append(ms)
            result.rows += [TextRow(p, text, output, lengths[k] if lengths else None, n_out, ms)
                            for k, (p, (text, output, n_out)) in enumerate(zip(chunk, decoded))]
        result.total_s = time.perf_counter() - t_start
    if references is not None and result.error is None:
        result.bleu, result.bleu_signature = corpus_bleu(result.texts, references)
    return result


def run_text(endpoint: Endpoint, model: str, prompts: list[str], **kwargs: Any) -> TextResult:
    return asyncio.run(run_text_async(endpoint, model, prompts, **kwargs))


def format_text(result: TextResult) -> str:
    tok = f"tokenizer {result.tokenizer}" if result.tokenizer else "the model tokenizes"
    lines = [(f"text {result.model} @ {result.protocol}://{result.url} ({result.style}, {tok}, "
              f"{len(result.rows)} prompts, batch {result.batch_size}, output {result.output_len})")]
    for i, row in enumerate(result.rows, 1):
        lines.append(f"  {i}. {row.prompt!r} -> {row.text!r}")
    if result.error:
        lines.append(f"  [FAIL] request failed: {result.error}")
    lat = result.latencies_ms
    if lat:
        lines.append(f"  latency ms: min {min(lat):.2f}  median {statistics.median(lat):.2f}  "
                     f"max {max(lat):.2f}  ({len(lat)} request{'' if len(lat) == 1 else 's'}, "
                     f"{result.total_s:.3f} s in all)")
    if result.bleu is not None:
        lines.append(f"  BLEU {result.bleu:.2f}  ({result.bleu_signature})")
    lines.append("OK" if result.ok else "FAIL")
    return "\n".join(lines)
