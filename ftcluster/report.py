"""`report`: a serving run's history from its samples, as series and as a plot (the `plot` extra).

Series per model from consecutive samples of one incarnation (requests/s, mean latency and
queue time, p99 where Triton keeps its summaries), each rank's GPUs (utilization, memory), and
the restarts from the run's events.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.events import EV, parse_events
from ftcluster.job.names import FILES
from ftcluster.observe import GPU_FIELDS, rates


def _lines(path: Path) -> list[str]:
    """A rolled file's lines, the kept older part (.1) first."""
    out: list[str] = []
    for p in (path.with_name(path.name + ".1"), path):
        try:
            out += p.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return [ln for ln in out if ln.strip() and not ln.startswith("#")]


def history(run_dir: Path, nodes: int) -> dict[str, Any]:
    """The `report` object's body: series over time (epoch seconds)."""
    samples = []
    for line in _lines(run_dir / "state" / FILES.metrics):
        try:
            samples.append(json.loads(line))
        except ValueError:
            continue
    models: dict[str, dict[str, list[Any]]] = {}
    for prev, cur in zip(samples, samples[1:]):
        for r in rates(prev, cur):
            s = models.setdefault(r.model, {"t": [], "requests_s": [], "latency_ms": [], "queue_ms": [],
                                            "p99_ms": []})
            s["t"].append(cur["t"])
            s["requests_s"].append(round(r.requests_s, 3))
            for key in ("latency_ms", "queue_ms", "p99_ms"):
                v = getattr(r, key)
                s[key].append(None if v is None else round(v, 3))
    gpus: dict[str, dict[str, list[Any]]] = {}
    for rank in range(nodes):
        for row in csv.reader(io.StringIO("\n".join(_lines(run_dir / "state" / FILES.gpu_samples.format(r=rank)))),
                              skipinitialspace=True):
            if len(row) != len(GPU_FIELDS):
                continue
            rec = dict(zip(GPU_FIELDS, row))
            s = gpus.setdefault(f"rank{rank} gpu{rec['index']}", {"time": [], "util": [], "mem_used_mib": []})
            s["time"].append(rec["timestamp"])
            for key in ("util", "mem_used_mib"):
                try:
                    s[key].append(float(rec[key]))
                except ValueError:
                    s[key].append(None)
    events_file = run_dir / "state" / FILES.events
    events = parse_events(events_file.read_text()) if events_file.is_file() else []
    restarts = [{"t": e.time, "cause": " ".join(e.args[1:])} for e in events if e.kind == EV.restarting]
    return {"samples": len(samples), "models": models, "gpus": gpus, "restarts": restarts}


def plot(hist: dict[str, Any], title: str, path: str) -> None:
    """Throughput, latency and GPU use over time, restarts marked, into a PNG, SVG or PDF."""
    if not path.lower().endswith((".png", ".svg", ".pdf")):
        raise UserError(f"{path}: matplotlib writes .png, .svg or .pdf", field="--plot", hint="name a .png file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib", field="--plot", hint="pip install 'ftcluster[plot]'") from None
    if not hist["models"]:
        raise UserError("the run has fewer than two samples of one incarnation: nothing to plot yet", field="RUN",
                        hint="wait a few server.metrics_interval (or set it lower)")
    import datetime as dt

    def when(ts: list[float]) -> list[dt.datetime]:
        return [dt.datetime.fromtimestamp(t) for t in ts]

    def gaps(values: list[float | None]) -> list[float]:
        """A missing figure as a gap in the line."""
        return [v if v is not None else float("nan") for v in values]

    panels = 3 if hist["gpus"] else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 2.6 * panels), sharex=True)
    for model, s in hist["models"].items():
        axes[0].plot(when(s["t"]), s["requests_s"], label=model)
        axes[1].plot(when(s["t"]), gaps(s["latency_ms"]), label=f"{model} mean")
        axes[1].plot(when(s["t"]), gaps(s["queue_ms"]), ":", label=f"{model} queue")
        if any(v is not None for v in s["p99_ms"]):
            axes[1].plot(when(s["t"]), gaps(s["p99_ms"]), "--", label=f"{model} p99")
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("ms")
    if hist["gpus"]:
        for name, s in hist["gpus"].items():
            t = [dt.datetime.strptime(x.split(".")[0], "%Y/%m/%d %H:%M:%S") for x in s["time"]]
            axes[2].plot(t, gaps(s["util"]), label=name)
        axes[2].set_ylabel("GPU util %")
    for ax in axes:
        for r in hist["restarts"]:
            ax.axvline(dt.datetime.fromtimestamp(r["t"]), color="red", linestyle="--", linewidth=1)
        ax.legend(loc="upper left", fontsize="small")
        ax.grid(alpha=0.3)
    axes[0].set_title(title + (f" ({len(hist['restarts'])} restart(s), dashed)" if hist["restarts"] else ""))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
