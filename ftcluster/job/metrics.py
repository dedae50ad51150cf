"""Rank 0's Triton metrics while a run serves, sampled by the job into the run folder.

Every `interval` seconds the job reads rank 0's Prometheus metrics (on its own host: the
loopback port behind a private run's proxy; on ssh + Docker through that proxy, with the
token) in a thread of its own, keeps the figures of each served model that tell throughput,
latency and queueing, and appends them as one JSON line to state/metrics.jsonl:

    {"t": EPOCH, "i": INCARNATION, "models": {MODEL: {"ok": N, "fail": N, "inf": N, "exec": N,
     "req_us": N, "queue_us": N, "infer_us": N, "pending": N, "p50_us": N, "p90_us": N,
     "p99_us": N}}, "gpus": {UUID: {"util": F, "mem": BYTES, "power": W}}}

Counters are Triton's own (they restart from 0 with each incarnation: `i` says which); a reader
takes rates from two lines. The pNN_us are Triton's request-time quantiles over its own sliding
window, as they stood at the sample (absent where the server has no summaries, or no request
completed in the window). About 250 bytes a line (bench/sampling_cost.py): 2.1 MB a day at
10 s. Past `max_bytes` the file moves to metrics.jsonl.1 (the one before is dropped), so a run
that serves for days keeps at most twice that. Ranks != 0 never open their metrics port under
FT: every node's GPUs are sampled on the node itself (gpu_samples.py). Standard library only:
this runs in the job (Python 3.8).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Dict, Optional

from .ranks import DIRECT, Via, http_get
from .text import Room, append_line

# Triton's metric -> the short key in a line. Summed over a model's versions.
MODEL_METRICS = {
    "nv_inference_request_success": "ok",
    "nv_inference_request_failure": "fail",
    "nv_inference_count": "inf",
    "nv_inference_exec_count": "exec",
    "nv_inference_request_duration_us": "req_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "infer_us",
    "nv_inference_pending_request_count": "pending",
}
# Triton's request-time summary (rank 0 starts with --metrics-config=summary_latencies=true where
# its Triton has it): quantile -> key, in us over Triton's sliding window. The highest of a
# model's versions (quantiles do not add up).
SUMMARY_METRIC = "nv_inference_request_summary_us"
QUANTILES = {"0.5": "p50_us", "0.9": "p90_us", "0.99": "p99_us"}
GPU_METRICS = {"nv_gpu_utilization": "util", "nv_gpu_memory_used_bytes": "mem", "nv_gpu_power_usage": "power"}
_LINE = re.compile(r'^([a-z_]+)\{([^}]*)\}\s+([0-9.eE+-]+|NaN)\s*$', re.MULTILINE)
_LABEL = re.compile(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Dict[str, Any]:
    """The figures of a Prometheus text page that a line keeps: per model and per GPU."""
    models: Dict[str, Dict[str, float]] = {}
    gpus: Dict[str, Dict[str, float]] = {}
    for name, labels, value in _LINE.findall(text):
        if value == "NaN":
            continue
        lab = dict(_LABEL.findall(labels))
        if name in MODEL_METRICS and "model" in lab:
            fig = models.setdefault(lab["model"], {})
            key = MODEL_METRICS[name]
            fig[key] = fig.get(key, 0.0) + float(value)
        elif name == SUMMARY_METRIC and "model" in lab and lab.get("quantile") in QUANTILES:
            fig = models.setdefault(lab["model"], {})
            key = QUANTILES[lab["quantile"]]
            fig[key] = max(fig.get(key, 0.0), float(value))
        elif name in GPU_METRICS and "gpu_uuid" in lab:
            gpus.setdefault(lab["gpu_uuid"], {})[GPU_METRICS[name]] = float(value)
    return {"models": models, "gpus": gpus}


class Sampler:
    """Rank 0's metrics every `interval` seconds; `tick` once per turn of the job's loop."""

    def __init__(self, host: str, port: int, path: str, interval: float, max_bytes: int, incarnation: int = 0,
                 via: Via = DIRECT, room: Optional[Room] = None):
        self.host, self.port, self.path, self.via = host, port, path, via
        self.room = room or Room()
        self.interval, self.max_bytes, self.incarnation = interval, max_bytes, incarnation
        self.next_at = time.monotonic()
        self.thread: Optional[threading.Thread] = None

    def tick(self) -> None:
        if self.interval <= 0 or time.monotonic() < self.next_at:
            return
        if self.thread is not None and self.thread.is_alive():
            return   # the last read still waits (2 s at most): skip a turn, never pile up
        self.next_at = time.monotonic() + self.interval
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        t = time.time()
        body = http_get(self.host, self.port, "/metrics", 2.0, self.via)
        if body is None:
            return
        line = {"t": round(t, 3), "i": self.incarnation, **parse_metrics(body.decode(errors="replace"))}
        try:
            if os.path.getsize(self.path) > self.max_bytes:
                os.replace(self.path, self.path + ".1")
        except OSError:
            pass
        # A sample that finds no room is skipped: the counters in the next one cover its span.
        self.room.attempt("state/metrics.jsonl", lambda: append_line(self.path, json.dumps(line, separators=(",", ":"))))

