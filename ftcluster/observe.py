"""What a serving run's samples say: rates from its job's metrics lines, its nodes' GPUs, for
`ftcluster top`. Pure but for reading the run folder's files (state/metrics.jsonl, written by
ftcluster/job/metrics.py; state/gpu-rank<R>.csv, by the rank wrapper)."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ftcluster.job.names import FILES


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
    inferences_s: float        # batch items a second
    failures_s: float
    latency_ms: float | None   # mean request time (Triton's, queue and compute) between the samples
    queue_ms: float | None     # mean time in the queue
    pending: float             # requests waiting now
    seconds: float             # between the two samples
    p50_ms: float | None       # request time quantiles, Triton's over its sliding window at the
    p90_ms: float | None       # later sample (None: no summaries, or no request in the window)
    p99_ms: float | None

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
        ok = d("ok")
        out.append(ModelRates(model, ok / dt, d("inf") / dt, d("fail") / dt,
                              d("req_us") / ok / 1000 if ok else None, d("queue_us") / ok / 1000 if ok else None,
                              float(c.get("pending", 0.0)), dt, ms("p50_us"), ms("p90_us"), ms("p99_us")))
    return out


GPU_FIELDS = ("timestamp", "index", "uuid", "util", "mem_util", "mem_used_mib", "mem_total_mib", "power_w",
              "temp_c", "sm_mhz")


def gpus(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """The last sample of each GPU on a rank's node (nvidia-smi's CSV lines); [] without one."""
    lines = [ln for ln in last_lines(run_dir / "state" / FILES.gpu_samples.format(r=rank), 64) if not ln.startswith("#")]
    last: dict[str, dict[str, Any]] = {}
    for row in csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True):
        if len(row) != len(GPU_FIELDS):
            continue
        rec: dict[str, Any] = dict(zip(GPU_FIELDS, row))
        for key in GPU_FIELDS[3:]:
            try:
                rec[key] = float(rec[key])
            except ValueError:
                rec[key] = None   # "[N/A]" on GPUs that do not report it
        last[rec["index"]] = rec
    return [last[k] for k in sorted(last, key=lambda k: int(k) if k.isdigit() else 0)]


def run_view(run_dir: Path, nodes: int) -> dict[str, Any]:
    """One run's figures now: its models' rates between its last two samples, each rank's GPUs."""
    found = samples(run_dir, 2)
    models = [r.to_dict() for r in rates(found[0], found[1])] if len(found) == 2 else []
    return {"sampled": found[-1]["t"] if found else None, "models": models,
            "gpus": {r: gpus(run_dir, r) for r in range(nodes)}}
