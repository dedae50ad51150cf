"""`report`: a serving run's history from its samples, as series and as a plot (the `plot` extra).

Series per model from consecutive samples of one incarnation (requests/s, mean latency and
queue time, p99 where Triton keeps its summaries, the mean batch), each rank's GPUs
(utilization, memory, uncorrected ECC errors), the nodes' XID/ECC events and the restarts
from the run's events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.events import EV, parse_events
from ftcluster.job.gpu_samples import parse_samples, read_events
from ftcluster.job.names import FILES
from ftcluster.observe import rates


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
                                            "p99_ms": [], "mean_batch": []})
            s["t"].append(cur["t"])
            s["requests_s"].append(round(r.requests_s, 3))
            for key in ("latency_ms", "queue_ms", "p99_ms", "mean_batch"):
                v = getattr(r, key)
                s[key].append(None if v is None else round(v, 3))
    gpus: dict[str, dict[str, list[Any]]] = {}
    gpu_events: list[dict[str, Any]] = []
    for rank in range(nodes):
        for rec in parse_samples(_lines(run_dir / "state" / FILES.gpu_samples.format(r=rank))):
            s = gpus.setdefault(f"rank{rank} gpu{rec['index']}", {"time": [], "util": [], "mem_used_mib": [],
                                                                  "ecc_uncorrected": []})
            s["time"].append(rec["timestamp"])
            for key in ("util", "mem_used_mib", "ecc_uncorrected"):
                s[key].append(rec[key])
        gpu_events += [{"rank": rank, **e._asdict(), "words": e.words()}
                       for e in read_events(str(run_dir / "state" / FILES.gpu_events.format(r=rank)))]
    events_file = run_dir / "state" / FILES.events
    events = parse_events(events_file.read_text()) if events_file.is_file() else []
    restarts = [{"t": e.time, "cause": " ".join(e.args[1:])} for e in events if e.kind == EV.restarting]
    return {"samples": len(samples), "models": models, "gpus": gpus, "gpu_events": sorted(gpu_events, key=lambda e: e["t"]),
            "restarts": restarts}


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
        for e in hist.get("gpu_events", []):   # an XID or ECC event: dotted, the GPU panel names it
            ax.axvline(dt.datetime.fromtimestamp(e["t"]), color="darkorange", linestyle=":", linewidth=1)
        ax.legend(loc="upper left", fontsize="small")
        ax.grid(alpha=0.3)
    if hist["gpus"]:
        for e in hist.get("gpu_events", [])[-10:]:
            axes[2].annotate(f"rank {e['rank']}: {e['words']}", (dt.datetime.fromtimestamp(e["t"]), 0),
                             fontsize="x-small", color="darkorange", rotation=90, va="bottom")
    notes = ([f"{len(hist['restarts'])} restart(s), dashed"] if hist["restarts"] else []) + (
        [f"{len(hist['gpu_events'])} GPU event(s), dotted"] if hist.get("gpu_events") else [])
    axes[0].set_title(title + (f" ({'; '.join(notes)})" if notes else ""))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
