"""What a serving run's samples say: rates from its job's metrics lines, its nodes' GPUs and
their XID/ECC events, for `ftcluster top`. Pure but for reading the run folder's files
(state/metrics.jsonl, written by ftcluster/job/metrics.py; state/gpu-rank<R>.csv and
gpu-events-rank<R>, by each node's sampler: ftcluster/job/gpu_samples.py).

Tokens/s is not among the rates: Triton's metrics count requests, inferences (the sequences of
a batch) and executions (batches), and neither Triton nor FT's backend counts the tokens it
generates (the output length is a request's input tensor, the tokens an output tensor). What
is derived instead: sequences/s and the mean batch (inferences per execution). `client bench`
measures tokens/s at the client.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ftcluster.job.gpu_samples import FIELDS, latest, read_events
from ftcluster.job.names import FILES

GPU_FIELDS = FIELDS   # the keys of a GPU's sample (report.py)
EVENTS_SHOWN = 5      # a node's latest XID/ECC events in `top`


def last_lines(path: Path, n: int, block: int = 8192) -> list[str]:
    """The file's last `n` whole lines, read from its end (a file of days is not read whole)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            end = pos = f.tell()
            data = b""
            while pos > 0 and data.count(b"\n") <= n:
                pos = max(0, pos - block)
                f.seek(pos)
                data = f.read(end - pos)
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if pos > 0:
        lines = lines[1:]   # the first may be cut
    return [ln for ln in lines if ln.strip()][-n:]


def samples(run_dir: Path, n: int = 2) -> list[dict[str, Any]]:
    out = []
    for line in last_lines(run_dir / "state" / FILES.metrics, n):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            out.append(found)
    return out


@dataclass(frozen=True)
class ModelRates:
    model: str
    requests_s: float          # completed requests a second
    inferences_s: float        # batch items (sequences) a second
    failures_s: float
    latency_ms: float | None   # mean request time (Triton's, queue and compute) between the samples
    queue_ms: float | None     # mean time in the queue
    pending: float             # requests waiting now
    seconds: float             # between the two samples
    p50_ms: float | None       # request time quantiles, Triton's over its sliding window at the
    p90_ms: float | None       # later sample (None: no summaries, or no request in the window)
    p99_ms: float | None
    batches_s: float = 0.0             # model executions a second
    mean_batch: float | None = None    # inferences per execution: how full FT's batches ran

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rates(prev: dict[str, Any], cur: dict[str, Any]) -> list[ModelRates]:
    """Per model, the rates between two samples of one incarnation (none across a restart,
    whose counters start again)."""
    dt = float(cur.get("t", 0)) - float(prev.get("t", 0))
    if dt <= 0 or prev.get("i") != cur.get("i"):
        return []
    out = []
    for model, c in sorted(cur.get("models", {}).items()):
        p = prev.get("models", {}).get(model, {})

        def d(key: str) -> float:
            return max(0.0, float(c.get(key, 0.0)) - float(p.get(key, 0.0)))
        def ms(key: str) -> float | None:
            return float(c[key]) / 1000 if key in c else None
        ok, execs = d("ok"), d("exec")
        out.append(ModelRates(model, ok / dt, d("inf") / dt, d("fail") / dt,
                              d("req_us") / ok / 1000 if ok else None, d("queue_us") / ok / 1000 if ok else None,
                              float(c.get("pending", 0.0)), dt, ms("p50_us"), ms("p90_us"), ms("p99_us"),
                              execs / dt, d("inf") / execs if execs else None))
    return out


def gpus(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """The last sample of each GPU on a rank's node (the sampler's CSV lines); [] without one."""
    return latest(last_lines(run_dir / "state" / FILES.gpu_samples.format(r=rank), 64))


def gpu_events(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """A rank's node's latest XID and ECC events (NVML's, as its sampler recorded them)."""
    return [{**e._asdict(), "words": e.words()}
            for e in read_events(str(run_dir / "state" / FILES.gpu_events.format(r=rank)))[-EVENTS_SHOWN:]]


def run_view(run_dir: Path, nodes: int) -> dict[str, Any]:
    """One run's figures now: its models' rates between its last two samples, each rank's GPUs
    and their events."""
    found = samples(run_dir, 2)
    models = [r.to_dict() for r in rates(found[0], found[1])] if len(found) == 2 else []
    events = {r: gpu_events(run_dir, r) for r in range(nodes)}
    return {"sampled": found[-1]["t"] if found else None, "models": models,
            "gpus": {r: gpus(run_dir, r) for r in range(nodes)},
            "gpu_events": {r: ev for r, ev in events.items() if ev}}
