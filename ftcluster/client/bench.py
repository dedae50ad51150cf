"""Load test: closed-loop concurrency sweep and open-loop Poisson request rates.

Each step runs a warm-up, then a fixed-duration measurement window; only requests that finish
inside the window count. The window is cut into sub-windows whose throughputs give the
stability check (like perf_analyzer's: all within `stability` of their mean).

Why asyncio and pre-encoded requests: a Python load generator is limited by its own
per-request CPU work. One event loop keeps all requests of a step in flight without threads,
and encoding the request once (the load test sends the same one) roughly halves that work.
`processes > 1` splits each step over worker processes (concurrency split as evenly as it
goes, rate split evenly; a sum of Poisson streams is Poisson), for clients with spare cores.
Steps are aligned across processes by CLOCK_MONOTONIC (time.perf_counter on Linux).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from ftcluster.client.endpoint import AsyncTriton, ClientError, Endpoint
from ftcluster.client.modelio import build_request, output_names, parse_config
from ftcluster.errors import UserError

Mode = Literal["concurrency", "rate"]
_STEP_GAP_S = 0.3     # between steps, for the previous step's last requests to drain


@dataclass(frozen=True)
class Step:
    mode: Mode
    value: float      # concurrency level, or offered request rate (req/s)

    @property
    def label(self) -> str:
        return f"c={int(self.value)}" if self.mode == "concurrency" else f"rate={self.value:g}/s"


@dataclass(frozen=True)
class LoadSpec:
    """What each load process needs (picklable)."""

    endpoint: Endpoint
    model: str
    arrays: dict[str, np.ndarray]
    output_names: list[str]
    warmup_s: float
    duration_s: float
    max_inflight: int = 1024        # open loop: arrivals beyond this many in flight are dropped
    sequence: bool = False          # sequence batching: a correlation id per request

    @property
    def slot_s(self) -> float:
        return self.warmup_s + self.duration_s + _STEP_GAP_S


@dataclass
class Records:
    """Raw outcomes of one step in one process; perf_counter seconds."""

    end: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    errors_end: list[float] = field(default_factory=list)
    dropped: int = 0
    first_error: str | None = None

    def merge(self, other: Records) -> None:
        self.end += other.end
        self.latency += other.latency
        self.errors_end += other.errors_end
        self.dropped += other.dropped
        self.first_error = self.first_error or other.first_error


@dataclass(frozen=True)
class Latency:
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @staticmethod
    def of(seconds: list[float]) -> Latency:
        if not seconds:
            nan = float("nan")
            return Latency(nan, nan, nan, nan, nan)
        ms = np.asarray(seconds) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return Latency(float(p50), float(p90), float(p99), float(ms.max()), float(ms.mean()))


@dataclass
class StepResult:
    mode: Mode
    value: float
    duration_s: float
    requests: int
    errors: int
    dropped: int
    req_per_s: float
    seq_per_s: float           # req/s x batch size (perf_analyzer's infer/s)
    tokens_per_s: float        # seq/s x requested output length (encoders: input length)
    latency_ms: Latency
    window_req_per_s: list[float]
    stable: bool
    first_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchResult:
    url: str
    protocol: str
    model: str
    style: str
    batch_size: int
    input_len: int
    output_len: int
    warmup_s: float
    duration_s: float
    processes: int
    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.errors == 0 and s.requests > 0 for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def csv_rows(self) -> list[dict[str, Any]]:
        rows = []
        for s in self.steps:
            rows.append({
                "protocol": self.protocol, "model": self.model, "batch_size": self.batch_size,
                "input_len": self.input_len, "output_len": self.output_len, "mode": s.mode,
                "value": s.value, "requests": s.requests, "errors": s.errors, "dropped": s.dropped,
                "req_per_s": round(s.req_per_s, 3), "seq_per_s": round(s.seq_per_s, 3),
                "tokens_per_s": round(s.tokens_per_s, 3),
                **{f"latency_{k}_ms": round(v, 3) for k, v in asdict(s.latency_ms).items()},
                "stable": s.stable,
            })
        return rows


# --- the load loops (run inside each load process) ---------------------------------------

async def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def _closed_loop(send: Any, concurrency: int, start: float, stop: float) -> Records:
    rec = Records()

    async def worker() -> None:
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            try:
                await send()
            except ClientError as exc:
                rec.errors_end.append(time.perf_counter())
                rec.first_error = rec.first_error or str(exc)
                await asyncio.sleep(0.01)  # do not spin on a dead server
                continue
            t1 = time.perf_counter()
            rec.end.append(t1)
            rec.latency.append(t1 - t0)

    await _sleep_until(start)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return rec


async def _open_loop(send: Any, rate: float, start: float, stop: float, max_inflight: int,
                     seed: int) -> Records:
    rec = Records()
    rng = np.random.default_rng(seed)
    inflight: set[asyncio.Task[None]] = set()

    async def one(arrival: float) -> None:
        try:
            await send()
        except ClientError as exc:
            rec.errors_end.append(time.perf_counter())
            rec.first_error = rec.first_error or str(exc)
            return
        t1 = time.perf_counter()
        rec.end.append(t1)
        rec.latency.append(t1 - arrival)   # from the scheduled arrival: client lag counts

    arrival = start
    while True:
        arrival += float(rng.exponential(1.0 / rate))
        if arrival >= stop:
            break
        await _sleep_until(arrival)
        if len(inflight) >= max_inflight:
            rec.dropped += 1
            continue
        task = asyncio.create_task(one(arrival))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.gather(*inflight)
    return rec


async def _run_share(spec: LoadSpec, shares: list[tuple[Step, float]], t0: float, seed: int) -> list[Records]:
    """Run this process's share of every step; step i starts at t0 + i * slot."""
    out = []
    conns = max(1, int(max((v for s, v in shares if s.mode == "concurrency"), default=1)))
    async with AsyncTriton(spec.endpoint, max_connections=max(conns, 100)) as client:
        send = client.fast_sender(spec.model, spec.arrays, spec.output_names, spec.sequence)
        for i, (step, share) in enumerate(shares):
            start = t0 + i * spec.slot_s
            stop = start + spec.warmup_s + spec.duration_s
            if share <= 0:
                out.append(Records())
            elif step.mode == "concurrency":
                out.append(await _closed_loop(send, int(share), start, stop))
            else:
                out.append(await _open_loop(send, share, start, stop, spec.max_inflight, seed * 1000 + i))
    return out


def _process_main(spec: LoadSpec, shares: list[tuple[Step, float]], t0: float, seed: int) -> list[Records]:
    return asyncio.run(_run_share(spec, shares, t0, seed))


def _split(step: Step, processes: int) -> list[float]:
    if step.mode == "rate":
        return [step.value / processes] * processes
    c = int(step.value)
    return [float(c // processes + (1 if p < c % processes else 0)) for p in range(processes)]


def summarize(step: Step, rec: Records, window_start: float, spec: LoadSpec, batch_size: int,
              output_len: int, windows: int, stability: float) -> StepResult:
    """Pure: throughput, latency and stability of one step from its raw records."""
    dur = spec.duration_s
    w_end = window_start + dur
    ends = np.asarray(rec.end)
    lat = np.asarray(rec.latency)
    inside = (ends >= window_start) & (ends < w_end)
    n = int(inside.sum())
    errors = sum(1 for t in rec.errors_end if window_start <= t < w_end)
    edges = np.linspace(window_start, w_end, windows + 1)
    counts, _ = np.histogram(ends[inside], bins=edges) if n else (np.zeros(windows), edges)
    per_window = [float(c) / (dur / windows) for c in counts]
    mean = statistics.fmean(per_window) if per_window else 0.0
    stable = mean > 0 and all(abs(w - mean) <= stability * mean for w in per_window)
    rps = n / dur
    return StepResult(step.mode, step.value, dur, n, errors, rec.dropped, rps, rps * batch_size,
                      rps * batch_size * output_len, Latency.of(lat[inside].tolist()), per_window,
                      stable, rec.first_error)


def parse_steps(concurrency: str | None, rate: str | None) -> list[Step]:
    """'1,4,16' and/or '100,200' -> steps; UserError on anything else."""
    steps: list[Step] = []
    for text, mode, opt in ((concurrency, "concurrency", "--concurrency"), (rate, "rate", "--rate")):
        if not text:
            continue
        for part in text.split(","):
            try:
                value = float(part) if mode == "rate" else float(int(part))
            except ValueError:
                raise UserError(f"{part!r} is not a number", field=opt, hint="a comma-separated list, e.g. 1,4,16") from None
            if value <= 0:
                raise UserError(f"{part!r} must be positive", field=opt)
            steps.append(Step(mode, value))  # type: ignore[arg-type]
    if not steps:
        raise UserError("nothing to run", field="--concurrency", hint="give --concurrency and/or --rate")
    return steps


async def prepare_load(endpoint: Endpoint, model: str, batch_size: int, input_len: int,
                       output_len: int, seed: int,
                       hidden_size: int | None = None) -> tuple[str, dict[str, np.ndarray], list[str], bool]:
    """(style, request arrays, output names, sequence batching) for the model; one request is
    sent as a check."""
    async with AsyncTriton(endpoint) as client:
        await client.check_model(model)
        io = parse_config(await client.model_config(model))
        req = build_request(io, batch_size, input_len, output_len, seed=seed, hidden_size=hidden_size)
        names = output_names(io)
        try:  # one request first: a model that rejects it should fail here, not in every step
            await client.infer_arrays(model, req.arrays, names, sequence=io.sequence_batching)
        except ClientError as exc:
            raise UserError(f"the first request failed: {exc}", field="--model") from None
        return io.style, req.arrays, names, io.sequence_batching


def run_bench(endpoint: Endpoint, model: str, steps: list[Step], *, batch_size: int = 1,
              input_len: int = 8, output_len: int = 8, warmup_s: float = 1.0, duration_s: float = 5.0,
              windows: int = 3, stability: float = 0.1, processes: int = 1, seed: int = 0,
              max_inflight: int = 1024, hidden_size: int | None = None) -> BenchResult:
    if duration_s <= 0 or warmup_s < 0 or windows < 1 or processes < 1:
        raise UserError("duration must be > 0, warm-up >= 0, windows and processes >= 1")
    style, arrays, names, sequence = asyncio.run(
        prepare_load(endpoint, model, batch_size, input_len, output_len, seed, hidden_size))
    spec = LoadSpec(endpoint, model, arrays, names, warmup_s, duration_s, max_inflight, sequence)
    shares = [[(s, _split(s, processes)[p]) for s in steps] for p in range(processes)]
    if processes == 1:
        t0 = time.perf_counter() + 0.05
        per_process = [asyncio.run(_run_share(spec, shares[0], t0, seed))]
    else:
        # spawn: forking a process with grpc/asyncio state is unsafe. Workers need a moment
        # to start and import, hence the lead time before the first step.
        ctx = multiprocessing.get_context("spawn")
        t0 = time.perf_counter() + 3.0
        with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx) as pool:
            futures = [pool.submit(_process_main, spec, shares[p], t0, seed + p) for p in range(processes)]
            per_process = [f.result() for f in futures]
    result = BenchResult(endpoint.url, endpoint.protocol, model, style, batch_size, input_len, output_len,
                         warmup_s, duration_s, processes)
    for i, step in enumerate(steps):
        merged = Records()
        for recs in per_process:
            merged.merge(recs[i])
        window_start = t0 + i * spec.slot_s + warmup_s
        # An encoder (T5-Encoder, bert) generates nothing: its tokens are the ones it read.
        tokens = input_len if style == "encoder" else output_len
        result.steps.append(summarize(step, merged, window_start, spec, batch_size, tokens,
                                      windows, stability))
    return result


# --- output ----------------------------------------------------------------------------------

def format_table(result: BenchResult) -> str:
    head = (f"bench {result.model} @ {result.protocol}://{result.url}  batch {result.batch_size}, "
            f"input {result.input_len}, output {result.output_len}; warm-up {result.warmup_s:g}s, "
            f"window {result.duration_s:g}s, {result.processes} process(es)")
    cols = ["step", "req/s", "seq/s", "tok/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors", "stable"]
    rows = []
    for s in result.steps:
        lat = s.latency_ms
        label = Step(s.mode, s.value).label
        errs = f"{s.errors}" + (f" +{s.dropped} dropped" if s.dropped else "")
        rows.append([label, f"{s.req_per_s:.1f}", f"{s.seq_per_s:.1f}", f"{s.tokens_per_s:.0f}",
                     f"{lat.p50:.2f}", f"{lat.p90:.2f}", f"{lat.p99:.2f}", f"{lat.max:.2f}", errs,
                     "yes" if s.stable else "NO"])
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    errors = [s.first_error for s in result.steps if s.first_error]
    if errors:
        lines.append(f"first error: {errors[0]}")
    return "\n".join(lines)


def write_csv(result: BenchResult, path: str) -> None:
    # startup: only --csv writes one
    import csv

    rows = result.csv_rows()
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["mode"])
        writer.writeheader()
        writer.writerows(rows)


def write_plot(result: BenchResult, path: str) -> None:
    """Latency (p50, p99) against throughput, one line per mode; needs matplotlib."""
    try:
        # optional extra: plot (matplotlib)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional extra: plot (after the backend is chosen)
    except ImportError:
        raise UserError("--plot needs matplotlib", field="--plot", hint="pip install 'ftcluster[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in ("concurrency", "rate"):
        steps = [s for s in result.steps if s.mode == mode]
        if not steps:
            continue
        x = [s.req_per_s for s in steps]
        for pct, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(x, [getattr(s.latency_ms, pct) for s in steps], style, label=f"{mode} {pct}")
        for s in steps:
            ax.annotate(Step(s.mode, s.value).label, (s.req_per_s, s.latency_ms.p50), fontsize=7)
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{result.model} ({result.protocol}), batch {result.batch_size}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
