"""The run's own GPU exporter: every node's latest GPU samples in Prometheus' text format.

For clusters where no DCGM exporter runs (`ports.gpus` set): under FT only rank 0 opens a
metrics port, and Triton's own GPU figures are rank 0's node's alone. The job serves, from the
files the nodes' samplers write (gpu_samples.py), one page with every rank's GPUs, labelled
rank, node, gpu and uuid, at each scrape (no thread of its own besides the server's). A node
whose samples stopped (older than `max_age`) drops out of the page rather than freezing there.
It listens where Triton does: every address with access: cluster; the loopback behind a
private run's proxy, which serves it on ports.gpus with the token (proxy.expose_metrics).
Standard library only: this runs in the job.
"""

from __future__ import annotations

import http.server
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .gpu_samples import events_path, latest, read_events, read_tail, samples_path
from .names import FILES

# A sample's key -> (metric, help, scale): Prometheus' base units (ratios, bytes, hertz).
GAUGES = (
    ("util", "ftcluster_gpu_utilization_ratio", "GPU busy share (nvidia-smi utilization.gpu)", 0.01),
    ("mem_util", "ftcluster_gpu_memory_utilization_ratio", "memory controller busy share", 0.01),
    ("mem_used_mib", "ftcluster_gpu_memory_used_bytes", "GPU memory in use", 1048576.0),
    ("mem_total_mib", "ftcluster_gpu_memory_total_bytes", "GPU memory in all", 1048576.0),
    ("power_w", "ftcluster_gpu_power_watts", "power draw", 1.0),
    ("temp_c", "ftcluster_gpu_temperature_celsius", "GPU temperature", 1.0),
    ("sm_mhz", "ftcluster_gpu_sm_clock_hertz", "SM clock", 1e6),
)
COUNTERS = (
    ("ecc_corrected", "ftcluster_gpu_ecc_corrected_errors_total", "corrected ECC errors since the driver loaded",
     1.0),
    ("ecc_uncorrected", "ftcluster_gpu_ecc_uncorrected_errors_total",
     "uncorrected ECC errors since the driver loaded", 1.0),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(pairs: Dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs.items()) + "}"


def _num(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


def page(state: str, nodes: int, max_age: float, now: Optional[float] = None) -> str:
    """The Prometheus text page of every rank's node's GPUs."""
    now = time.time() if now is None else now
    series: Dict[str, List[str]] = {}
    stamps: List[str] = []
    for rank in range(nodes):
        try:
            with open(os.path.join(state, FILES.rank(rank, "host"))) as f:
                node = f.read().strip()
        except OSError:
            node = ""
        path = samples_path(state, rank)
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            mtime = None
        where = {"rank": str(rank), "node": node}
        if mtime is not None and now - mtime <= max_age:
            stamps.append(f"ftcluster_gpu_sample_timestamp_seconds{_labels(where)} {mtime:.3f}")
            for g in latest(read_tail(path)):
                labels = _labels({**where, "gpu": str(g["index"]), "uuid": str(g["uuid"])})
                for key, name, _, scale in GAUGES + COUNTERS:
                    if g.get(key) is not None:
                        series.setdefault(name, []).append(f"{name}{labels} {_num(g[key] * scale)}")
        counts: Dict[Tuple[str, str, str, str], int] = {}
        for e in read_events(events_path(state, rank)):
            what = ("xid", str(e.data)) if e.kind == "xid" else ("kind", e.kind)
            seen = (str(e.gpu), e.uuid, *what)
            counts[seen] = counts.get(seen, 0) + 1
        for (gpu, uuid, lab, val), n in sorted(counts.items()):
            name = "ftcluster_gpu_xid_events_total" if lab == "xid" else "ftcluster_gpu_ecc_events_total"
            series.setdefault(name, []).append(f"{name}{_labels({**where, 'gpu': gpu, 'uuid': uuid, lab: val})} {n}")
    helps: Dict[str, Tuple[str, str]] = {name: (text, "gauge") for _, name, text, _ in GAUGES}
    helps.update({name: (text, "counter") for _, name, text, _ in COUNTERS})
    helps["ftcluster_gpu_xid_events_total"] = ("NVML XID critical-error events recorded on the node", "counter")
    helps["ftcluster_gpu_ecc_events_total"] = ("NVML ECC error events recorded on the node (ecc_sbe, ecc_dbe)",
                                               "counter")
    out = ["# HELP ftcluster_gpu_sample_timestamp_seconds when the node's GPUs were last sampled",
           "# TYPE ftcluster_gpu_sample_timestamp_seconds gauge", *stamps]
    for name, (text, kind) in helps.items():
        if name in series:
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *series[name]]
    return "\n".join(out) + "\n"


class Exporter:
    """page() over HTTP (GET /metrics) from a thread of the job; stop() ends it."""

    def __init__(self, address: str, port: int, state: str, nodes: int, max_age: float):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = page(outer.state, outer.nodes, outer.max_age).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass   # a scrape every 15 s is no news

        self.state, self.nodes, self.max_age = state, nodes, max_age
        self.server = http.server.ThreadingHTTPServer((address, port), Handler)   # OSError: the port is taken
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
