"""Identity test: one well-formed request to the FT model, with checks of what comes back.

Checks (each reported by name, all must pass):
- output_ids / sequence_length are returned with the declared batch size, and with the declared
  dtype -- for integer tensors, any integer dtype whose values the declared one holds: the real FT
  backend returns sequence_length (and T5's output_ids) as INT32 where its own config.pbtxt says
  UINT32 (ParallelGptTritonModelInstance.cc, T5TritonModelInstance.cc), and Triton passes the
  backend's type through. Such a difference is a note, never a failure;
- output_ids is [batch, beams, length] and long enough for every sequence_length;
- decoder-only (GPT-style): output_ids start with the prompt and
  input_len <= sequence_length <= input_len + output_len;
- encoder-decoder (T5-style): 1 <= sequence_length <= output_len;
- encoder (T5-Encoder): output_hidden_state is [batch, input_len, hidden], finite, declared dtype;
- sequence batching (interactive GPT): each request is its own sequence (correlation id,
  start and end) with FT's pseudo batch dimension, taken off before the checks;
- text (ensemble with tokenizers): one non-empty text per batch row.

Like FT's own identity test, a run can also be compared with a reference: `reference_of()`
keeps the request and the tokens of a run (`--save FILE`), `check_against()` checks that another
run (another parallel plan, say) gave the same tokens for the same request (`--against FILE`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ftcluster.client.endpoint import AsyncTriton, ClientError, Endpoint
from ftcluster.client.modelio import (
    ModelIO,
    Request,
    TensorSpec,
    build_request,
    output_names,
    parse_config,
)
from ftcluster.errors import UserError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class IdentityResult:
    url: str
    protocol: str
    model: str
    style: str
    batch_size: int
    input_len: int
    output_len: int
    inputs_sent: list[str]
    checks: list[Check] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    sample: dict[str, Any] = field(default_factory=dict)   # first row, for the report
    error: str | None = None
    seed: int = 0
    prompt_ids: list[list[int]] | None = None     # the request's ids (token-id models)
    outputs: dict[str, Any] = field(default_factory=dict)  # the first response, every row
    notes: list[str] = field(default_factory=list)   # said once, never a failure

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def latency_ms(self) -> dict[str, float]:
        lat = self.latencies_ms
        if not lat:
            return {}
        return {"min": min(lat), "median": statistics.median(lat), "max": max(lat)}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["latency_ms"] = self.latency_ms
        return d


def _dtype_check(name: str, arr: np.ndarray, spec: TensorSpec, notes: list[str]) -> Check:
    """The returned type against the declared one. Integer tensors are compared by their values:
    another integer type is accepted when every value fits the declared type (a note says so)."""
    if spec.dtype == "BYTES":
        ok = arr.dtype == np.object_
    else:
        want = np.dtype(spec.np_dtype)
        ok = arr.dtype == want
        if not ok and arr.dtype.kind in "iu" and want.kind in "iu":
            limits = np.iinfo(want)
            ok = arr.size == 0 or bool(limits.min <= arr.min() and arr.max() <= limits.max)
            if ok:
                notes.append(f"{name}: the server returned {arr.dtype.name.upper()} where config.pbtxt declares "
                             f"{spec.dtype} (its backend's own type, which Triton passes through); its values fit {spec.dtype}")
            else:
                return Check(f"{name} dtype", False, f"got {arr.dtype}, declared {spec.dtype}, and values "
                             f"[{arr.min()}, {arr.max()}] do not fit it")
    return Check(f"{name} dtype", ok, f"got {arr.dtype}, declared {spec.dtype}")


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def check_response(io: ModelIO, req: Request, out: dict[str, np.ndarray],
                   notes: list[str] | None = None) -> list[Check]:
    """Pure: the checks for one response (see the module docstring); what is worth saying but no
    failure (a returned type other than the declared one) is added to `notes`."""
    checks: list[Check] = []
    notes = [] if notes is None else notes
    b, n_in, n_out = req.batch_size, req.input_len, req.output_len
    seq: np.ndarray | None = None
    seq_spec = io.sequence_length
    if seq_spec is not None:
        if seq_spec.name not in out:
            checks.append(Check("sequence_length returned", False, "missing from the response"))
        else:
            seq = out[seq_spec.name]
            checks.append(_dtype_check("sequence_length", seq, seq_spec, notes))
            checks.append(Check("sequence_length batch", seq.ndim >= 1 and seq.shape[0] == b,
                                f"shape {list(seq.shape)}, batch {b}"))
            seq = seq.reshape(seq.shape[0], -1) if seq.ndim >= 1 else seq.reshape(1, 1)

    if io.style == "text":
        spec = io.text_output
        assert spec is not None  # output_names() refuses text models without one
        if spec.name not in out:
            return checks + [Check("text returned", False, f"{spec.name} missing from the response")]
        arr = out[spec.name]
        checks.append(_dtype_check(spec.name, arr, spec, notes))
        rows = arr.reshape(arr.shape[0], -1) if arr.ndim else arr.reshape(1, 1)
        checks.append(Check(f"{spec.name} batch", rows.shape[0] == b, f"shape {list(arr.shape)}, batch {b}"))
        texts = [_text(r[0]) for r in rows]
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        checks.append(Check("text not empty", not empty, f"empty rows: {empty}" if empty else ""))
        if seq is not None:
            checks.append(Check("sequence_length positive", bool((seq >= 1).all()),
                                f"{seq[:, 0].tolist()}"))
        return checks

    if io.style == "encoder":
        hs = io.hidden_state
        if hs is None or hs.name not in out:
            return checks + [Check("output_hidden_state returned", False, "missing from the response")]
        arr = out[hs.name]
        # The backend declares FP32 and sets the real type from data_type at load (auto-complete):
        # the config the server returns is what the output must match.
        checks.append(_dtype_check(hs.name, arr, hs, notes))
        ok = arr.ndim == 3 and arr.shape[0] == b and arr.shape[1] == n_in and arr.shape[2] >= 1
        checks.append(Check(f"{hs.name} shape", ok, f"{list(arr.shape)}, want [{b}, {n_in}, hidden]"))
        if ok and arr.dtype.kind == "f":
            checks.append(Check(f"{hs.name} finite", bool(np.isfinite(arr).all()), "NaN or inf in the output"))
            # A dimension exactly 0 at every position is no trained encoder's output: the
            # part of the hidden state some tensor-parallel rank computes went missing.
            dead = np.flatnonzero(~np.any(arr != 0, axis=(0, 1))).tolist()
            checks.append(Check(f"{hs.name} has no all-zero dimension", not dead,
                                f"dimensions {dead[:8]} are 0 everywhere" if dead else ""))
            if req.hidden is not None:
                checks.append(Check(f"{hs.name} hidden size", arr.shape[2] == req.hidden.shape[2],
                                    f"{arr.shape[2]}, sent {req.hidden.shape[2]}"))
        return checks

    ids_spec = io.output_ids
    if ids_spec is None or ids_spec.name not in out:
        return checks + [Check("output_ids returned", False, "missing from the response")]
    ids = out[ids_spec.name]
    checks.append(_dtype_check("output_ids", ids, ids_spec, notes))
    shape_ok = ids.ndim == 3 and ids.shape[0] == b and ids.shape[1] >= 1
    checks.append(Check("output_ids shape", shape_ok, f"{list(ids.shape)}, want [{b}, beams, length]"))
    if not shape_ok or seq is None or seq.shape[0] != b:
        return checks
    checks.append(Check("output_ids length", ids.shape[2] >= int(seq.max()),
                        f"width {ids.shape[2]}, max sequence_length {int(seq.max())}"))
    lens = seq[:, 0].astype(np.int64)
    if io.style == "decoder":
        assert req.prompt_ids is not None
        prompt = req.prompt_ids.astype(np.int64)
        echoed = ids[:, 0, :n_in].astype(np.int64)
        bad = [i for i in range(b) if echoed.shape[1] < n_in or not np.array_equal(echoed[i], prompt[i])]
        checks.append(Check("output_ids start with the prompt", not bad, f"rows differing: {bad}" if bad else ""))
        in_range = bool(((lens >= n_in) & (lens <= n_in + n_out)).all())
        checks.append(Check("sequence_length in [input_len, input_len+output_len]", in_range,
                            f"{lens.tolist()} vs [{n_in}, {n_in + n_out}]"))
    else:
        in_range = bool(((lens >= 1) & (lens <= n_out)).all())
        checks.append(Check("sequence_length in [1, output_len]", in_range, f"{lens.tolist()} vs [1, {n_out}]"))
    return checks


def _sample(io: ModelIO, req: Request, out: dict[str, np.ndarray]) -> dict[str, Any]:
    sample: dict[str, Any] = {}
    if req.prompts:
        sample["prompt"] = req.prompts[0]
        text = io.text_output
        if text is not None and text.name in out and out[text.name].size:
            # Informational: GPT ensembles echo the prompt, T5 (translation) ones do not.
            sample["echoes_prompt"] = _text(np.ravel(out[text.name])[0]).startswith(req.prompts[0])
    elif req.prompt_ids is not None:
        sample["prompt_ids"] = req.prompt_ids[0].tolist()
    for name, arr in out.items():
        first = arr[0] if arr.ndim else arr
        sample[name] = ([_text(v) for v in np.ravel(first)] if arr.dtype == np.object_
                        else np.asarray(first).tolist())
    return sample


async def run_identity_async(endpoint: Endpoint, model: str, *, batch_size: int = 2, input_len: int = 8,
                             output_len: int = 8, repeats: int = 3, seed: int = 0,
                             vocab_size: int = 50257, hidden_size: int | None = None) -> IdentityResult:
    """Send the request `repeats` times (same input), check every response, time each.

    Raises UserError for things the user must fix (server unreachable, unknown model,
    inputs the client cannot fill); a failed check or a failed request is in the result.
    """
    async with AsyncTriton(endpoint) as client:
        await client.check_model(model)
        io = parse_config(await client.model_config(model))
        req = build_request(io, batch_size, input_len, output_len, seed=seed, vocab_size=vocab_size,
                            hidden_size=hidden_size)
        names = output_names(io)
        result = IdentityResult(endpoint.url, endpoint.protocol, model, io.style, batch_size, input_len,
                                output_len, list(req.arrays), seed=seed,
                                prompt_ids=None if req.prompt_ids is None else req.prompt_ids.tolist())
        for i in range(max(1, repeats)):
            t0 = time.perf_counter()
            try:
                out = await client.infer_arrays(model, req.arrays, names, sequence=io.sequence_batching)
            except ClientError as exc:
                result.error = str(exc)
                return result
            result.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            notes: list[str] = []
            checks = check_response(io, req, out, notes)
            if i == 0:
                result.notes = notes
            if i == 0 or not all(c.ok for c in checks):
                result.checks = checks
                result.sample = _sample(io, req, out)
                result.outputs = {k: (np.ravel(v).astype(str).tolist() if v.dtype == np.object_ else v.tolist())
                                  for k, v in out.items()}
            if not all(c.ok for c in checks):
                break
        return result


def run_identity(endpoint: Endpoint, model: str, **kwargs: Any) -> IdentityResult:
    return asyncio.run(run_identity_async(endpoint, model, **kwargs))


REFERENCE_KEYS = ("model", "style", "batch_size", "input_len", "output_len", "seed", "prompt_ids")


def reference_of(result: IdentityResult) -> dict[str, Any]:
    """What `--save` writes: the request that was sent and the tokens that came back."""
    if not result.ok:
        raise UserError("identity failed, so its outputs are no reference", field="--save",
                        hint="fix the failing checks first")
    ref = {key: getattr(result, key) for key in REFERENCE_KEYS}
    ref["outputs"] = {k: v for k, v in result.outputs.items() if k in ("output_ids", "sequence_length", "OUTPUT_0")}
    return ref


def load_reference(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the reference {path}: {exc}", field="--against",
                        hint="give a file written by `ftcluster client identity --save`") from None
    if not isinstance(data, dict) or "outputs" not in data:
        raise UserError(f"{path} is not an identity reference", field="--against",
                        hint="give a file written by `ftcluster client identity --save`")
    return data


def _rows(outputs: dict[str, Any]) -> list[list[int]] | None:
    """Per batch row, the first beam's tokens up to its sequence_length (T5: generated only)."""
    ids, seq = outputs.get("output_ids"), outputs.get("sequence_length")
    if ids is None or seq is None:
        return None
    arr, lens = np.asarray(ids), np.asarray(seq).reshape(len(ids), -1)[:, 0]
    return [arr[b, 0, : int(lens[b])].astype(np.int64).tolist() for b in range(arr.shape[0])]


def check_against(result: IdentityResult, ref: dict[str, Any], name: str = "the reference") -> Check:
    """Pure: the same request as the reference, and the same tokens (or texts) back."""
    differ = [key for key in REFERENCE_KEYS if key != "model" and ref.get(key) != getattr(result, key)]
    if differ:
        raise UserError(f"{name} was made with another request ({', '.join(differ)} differ)", field="--against",
                        hint="run identity with the reference's --batch-size/--input-len/--output-len/--seed")
    mine, theirs = _rows(result.outputs), _rows(ref["outputs"])
    if mine is None or theirs is None:
        same = result.outputs.get("OUTPUT_0") == ref["outputs"].get("OUTPUT_0")
        return Check(f"same outputs as {name}", same, "" if same else "texts differ")
    bad = []
    for b, (a, r) in enumerate(zip(mine, theirs)):
        if a != r:
            pos = next((i for i, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
            bad.append(f"row {b} from position {pos}: {a[pos:pos + 4]} vs {r[pos:pos + 4]}")
    if len(mine) != len(theirs):
        bad.append(f"{len(mine)} rows vs {len(theirs)}")
    return Check(f"same tokens as {name}", not bad, "; ".join(bad))


def format_identity(result: IdentityResult) -> str:
    lines = [(f"identity {result.model} @ {result.protocol}://{result.url} ({result.style}, batch "
             f"{result.batch_size}, input {result.input_len}, output {result.output_len})"),
             f"  inputs sent: {', '.join(result.inputs_sent)}"]
    for c in result.checks:
        lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}" + (f": {c.detail}" if c.detail and not c.ok else ""))
    lines.extend(f"  note: {note}" for note in result.notes)
    if result.error:
        lines.append(f"  [FAIL] request failed: {result.error}")
    if result.latency_ms:
        lat = result.latency_ms
        lines.append(f"  latency ms: min {lat['min']:.2f}  median {lat['median']:.2f}  max {lat['max']:.2f}"
                     f"  ({len(result.latencies_ms)} requests)")
    lines.append("PASS" if result.ok else "FAIL")
    return "\n".join(lines)
