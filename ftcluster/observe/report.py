"""`report`: a service's history from its samples, as series and as a plot (the `plot` extra).

Series per model from consecutive samples of one incarnation (requests/s, mean latency and
queue time, p99 where Triton keeps its summaries, the mean batch), each rank's GPUs
(utilization, memory, uncorrected ECC errors), the nodes' XID/ECC events and the restarts
from the run's events. A service that moved (a time limit's hand-over, a lost node) is the
chain of its runs: their series joined, each point naming its run, the moves, and when the
service answered (from each run's `ready` to the event that ended it) and when it did not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.run.events import EV, Event, parse_events
from ftcluster.job.gpu_samples import parse_samples, read_events
from ftcluster.job.names import FILES
from ftcluster.observe.samples import rates


def _lines(path: Path) -> list[str]:
    """A rolled file's lines, the kept older part (.1) first."""
    out: list[str] = []
    for p in (path.with_name(path.name + ".1"), path):
        try:
            out += p.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return [ln for ln in out if ln.strip() and not ln.startswith("#")]


def _epoch(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def _samples(run_dir: Path) -> list[dict[str, Any]]:
    """Rank 0's metrics samples, the kept older part first."""
    samples = []
    for line in _lines(run_dir / "state" / FILES.metrics):
        try:
            samples.append(json.loads(line))
        except ValueError:
            continue
    return samples


def history(run_dir: Path, nodes: int) -> dict[str, Any]:
    """The `report` object's body: series over time (epoch seconds)."""
    return _history(run_dir, nodes, _samples(run_dir), _events(run_dir))


def _history(run_dir: Path, nodes: int, samples: list[dict[str, Any]], events: list[Event]) -> dict[str, Any]:
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
    restarts = [{"t": e.time, "cause": " ".join(e.args[1:])} for e in events if e.kind == EV.restarting]
    return {"samples": len(samples), "models": models, "gpus": gpus, "gpu_events": sorted(gpu_events, key=lambda e: e["t"]),
            "restarts": restarts}


# What ends a run's serving span: a rank's death or freeze (its restart), the job's end or stop,
# a lost node, the hand-over to a successor (which serves by then).
_ENDS_SERVING = (EV.rank_failed, EV.restarting, EV.failed, EV.interrupted, EV.node_lost, EV.handed_over, EV.done)


def _words(e: Event) -> str:
    """Why serving ended, in words."""
    a = e.args
    if e.kind == EV.rank_failed and len(a) >= 3:
        return f"rank {a[0]} on {a[1]} exited ({a[2]})"
    if e.kind == EV.restarting:
        return " ".join(a[1:]) or "a restart"
    if e.kind == EV.node_lost:
        return f"node lost: {', '.join(a)}"
    if e.kind == EV.interrupted:
        return "the job was told to stop (stop, preemption or requeue)"
    if e.kind == EV.done:
        return f"the job ended (exit {' '.join(a)})"
    if e.kind == EV.handed_over:
        return f"handed over to run {a[0]}" if a else "handed over"
    return " ".join(a) or e.kind


def serving_spans(events: list[Event], until: float | None, alive: Sequence[float] = (),
                  starts: tuple[str, ...] = (EV.ready,),
                  ends: tuple[str, ...] = _ENDS_SERVING) -> list[tuple[float, float, str]]:
    """When the run answered: (from its `ready`, to the event that ended it, that event in
    words; a hung world's end is its first missed probe, `unanswered`); a span still open ends
    at `until` (None: left out). A job that started again with a span open (Slurm requeued it
    after its batch host was lost: nothing could say so) ended unheard: at its last sign of
    life, the latest of its events and `alive` (its metrics samples' times) before the new
    start. Another job of the run starting (a balancer's hand-over in place) ends nothing."""
    spans: list[tuple[float, float, str]] = []
    since: float | None = None
    quiet: float | None = None   # a hung world's first missed probe: it answered nothing since
    last, job = 0.0, ""
    for e in events:
        if e.kind in starts and since is None:
            since, quiet = e.time, None
        elif e.kind == EV.unanswered and since is not None and e.args:
            quiet = _epoch(e.args[0])
        elif e.kind in ends and since is not None:
            spans.append((since, e.time if quiet is None else min(e.time, max(since, quiet)), _words(e)))
            since = None
        elif e.kind == EV.job_started:
            if since is not None and e.args[1:2] == (job,):
                end = max([last, since] + [t for t in alive if t < e.time])
                spans.append((since, end, "the job ended unheard (its batch host lost); Slurm requeued it"))
                since = None
            job = e.args[1] if len(e.args) > 1 else ""
        last = e.time
    if since is not None and until is not None:
        spans.append((since, max(since, until), "still serving"))
    return spans


# A replica set's balancer serves from its step's start to that step's end, or its job's stop,
# end or requeue (its node lost).
_FRONT_ENDS = (EV.step_done, EV.interrupted, EV.done, EV.failed)


def last_alive(run_dir: Path) -> list[float]:
    """The last signs of life of a run's earlier attempts, kept when it started again."""
    times = (_epoch(line.split()[0]) for line in _lines(run_dir / "state" / FILES.last_alive))
    return [t for t in times if t is not None]


def front_spans(set_dir: Path, until: float | None) -> list[tuple[float, float, str]]:
    """When a replica set's balancer served, from its run's events and the last look of a
    balancer before each start (state/last-alive); an open span ends at `until`, else at its
    last sign of life."""
    events, alive = _events(set_dir), last_alive(set_dir)
    end = until if until is not None else max([e.time for e in events] + alive + [0.0])
    spans = serving_spans(events, end, alive, starts=(EV.step_started,), ends=_FRONT_ENDS)
    return [(s, e, "the balancer: " + why) for s, e, why in spans]


def within(spans: list[tuple[float, float, str]],
           gate: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The parts of `spans` inside `gate`'s; each part ends with the words of whichever ended it."""
    out = []
    for s, e, why in spans:
        for gs, ge, gwhy in gate:
            lo, hi = max(s, gs), min(e, ge)
            if lo < hi:
                out.append((lo, hi, why if e <= ge else gwhy))
    return out


def availability(spans: list[tuple[float, float, str]], until: float | None) -> dict[str, Any]:
    """The service's spans joined (runs overlap at a hand-over): the time it answered from its
    first `ready` to `until` (None: an ended service, to its last span's end), and each gap
    with the words of what opened it."""
    if not spans:
        return {"since": None, "until": until, "served_s": 0.0, "span_s": 0.0, "fraction": None, "outages": []}
    spans = sorted(spans)
    served, outages = 0.0, []
    start, end, why = spans[0]

    def gap(to: float) -> None:
        outages.append({"from": end, "to": to, "seconds": round(to - end, 3), "cause": why})

    for s, e, w in spans[1:]:
        if s > end:
            served += end - start
            gap(s)
            start, end, why = s, e, w
        elif e > end:
            end, why = e, w
    served += end - start
    if until is not None and until > end:   # not answering now
        gap(until)
    until = max(until or end, end)
    span = until - spans[0][0]
    return {"since": spans[0][0], "until": until, "served_s": round(served, 3), "span_s": round(span, 3),
            "fraction": round(served / span, 6) if span > 0 else None, "outages": outages}


Run = tuple[str, Path, int]   # a run's id, folder and node count


def service_history(chains: list[tuple[list[Run], bool]], now: float,
                    gate: list[tuple[float, float, str]] | None = None) -> dict[str, Any]:
    """`report` of a service: each chain of runs (oldest first) with whether its last run
    still has a job (its open span runs to `now`; an ended run's to the last thing it wrote).
    One chain for a run that moved; a replica set's members, one chain each: the set answers
    while any one does, and its balancer (`gate`, its spans) does."""
    joined: dict[str, Any] = {"samples": 0, "models": {}, "gpus": {}, "gpu_events": [], "restarts": [],
                              "runs": [], "moves": []}
    spans: list[tuple[float, float, str]] = []
    for runs, live in chains:
        for k, (run_id, run_dir, nodes) in enumerate(runs):
            samples, events = _samples(run_dir), _events(run_dir)
            hist = _history(run_dir, nodes, samples, events)
            alive = [x["t"] for x in samples if isinstance(x.get("t"), (int, float))] + last_alive(run_dir)
            until = now if live and k == len(runs) - 1 else max([e.time for e in events] + alive + [0.0])
            mine = serving_spans(events, until, alive)
            spans += mine
            joined["runs"].append({"run_id": run_id, "from": events[0].time if events else None, "to": until,
                                   "served_s": round(sum(e - s for s, e, _ in mine), 3)})
            joined["samples"] += hist["samples"]
            for key in ("models", "gpus"):
                for name, series in hist[key].items():
                    into = joined[key].setdefault(name, {k2: [] for k2 in series} | {"run": []})
                    for k2, values in series.items():
                        into[k2] += values
                    into["run"] += [run_id] * len(next(iter(series.values())))
            joined["gpu_events"] += [{**e, "run": run_id} for e in hist["gpu_events"]]
            joined["restarts"] += [{**r, "run": run_id} for r in hist["restarts"]]
            if k + 1 < len(runs):
                moved = [e for e in events if e.kind in (EV.handed_over, EV.node_lost, EV.successor_submitted)]
                at = next((e for e in moved if e.kind != EV.successor_submitted), moved[-1] if moved else None)
                joined["moves"].append({"t": at.time if at else None, "from": run_id, "to": runs[k + 1][0],
                                        "cause": "time limit" if at is None or at.kind != EV.node_lost else _words(at)})
    joined["gpu_events"].sort(key=lambda e: e["t"])
    if gate is not None:
        spans = within(spans, gate)
    joined["availability"] = availability(spans, now if any(live for _, live in chains) else None)
    return joined


def _events(run_dir: Path) -> list[Event]:
    events_file = run_dir / "state" / FILES.events
    return parse_events(events_file.read_text(errors="replace")) if events_file.is_file() else []


def duration(seconds: float) -> str:
    """3 d 4 h, 2 h 5 min, 4 min 10 s, 12 s."""
    s = int(round(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{s} s"


def summary(run_id: str, hist: dict[str, Any]) -> list[str]:
    """`report`'s words: the service's runs and moves, how long it answered, its outages."""
    runs, av = hist["runs"], hist["availability"]
    lines = [f"run {run_id}: {hist['samples']} samples; models {', '.join(hist['models']) or 'none yet'}; "
             f"{len(hist['restarts'])} restarts" + (f"; {len(runs)} runs, {len(hist['moves'])} moves "
                                                     f"({', '.join(m['cause'] for m in hist['moves'])})"
                                                     if len(runs) > 1 else "")]
    if av["fraction"] is not None:
        lines.append(f"answered {duration(av['served_s'])} of {duration(av['span_s'])} since its first ready "
                     f"({100 * av['fraction']:.2f}%); {len(av['outages'])} outage(s)"
                     + (":" if av["outages"] else ""))
        for o in av["outages"][-10:]:
            lines.append(f"  {duration(o['seconds'])} from {_clock(o['from'])}: {o['cause']}")
    return lines


def _clock(t: float) -> str:
    # startup: datetime only when times are shown as clock times
    import datetime as dt

    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def plot(hist: dict[str, Any], title: str, path: str) -> None:
    """Throughput, latency and GPU use over time, restarts marked, into a PNG, SVG or PDF."""
    if not path.lower().endswith((".png", ".svg", ".pdf")):
        raise UserError(f"{path}: matplotlib writes .png, .svg or .pdf", field="--plot", hint="name a .png file")
    try:
        # optional extra: plot (matplotlib)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional extra: plot (after the backend is chosen)
    except ImportError:
        raise UserError("--plot needs matplotlib", field="--plot", hint="pip install 'ftcluster[plot]'") from None
    if not hist["models"]:
        raise UserError("the run has fewer than two samples of one incarnation: nothing to plot yet", field="RUN",
                        hint="wait a few server.metrics_interval (or set it lower)")
    # startup: datetime only when times are shown as clock times
    import datetime as dt

    def when(ts: list[float]) -> list[dt.datetime]:
        return [dt.datetime.fromtimestamp(t) for t in ts]

    def gaps(values: list[float | None]) -> list[float]:
        """A missing figure as a gap in the line."""
        return [v if v is not None else float("nan") for v in values]

    def by_run(series: dict[str, list[Any]], key: str) -> list[tuple[int, dict[str, list[Any]]]]:
        """A series cut at each change of run (runs overlap at a hand-over: no line joins
        them); each piece with its run's place in the chain."""
        runs = series.get("run") or [""] * len(series[key])
        order = list(dict.fromkeys(runs))
        return [(order.index(r), {k: [v for v, rr in zip(vals, runs) if rr == r] for k, vals in series.items()})
                for r in order]

    panels = 3 if hist["gpus"] else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 2.6 * panels), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for m, (model, whole) in enumerate(hist["models"].items()):
        c = colors[m % len(colors)]
        for k, s in by_run(whole, "t"):
            one = k == 0   # one legend entry per model
            axes[0].plot(when(s["t"]), s["requests_s"], color=c, label=model if one else None)
            axes[1].plot(when(s["t"]), gaps(s["latency_ms"]), color=c, label=f"{model} mean" if one else None)
            axes[1].plot(when(s["t"]), gaps(s["queue_ms"]), ":", color=c, label=f"{model} queue" if one else None)
            if any(v is not None for v in s["p99_ms"]):
                axes[1].plot(when(s["t"]), gaps(s["p99_ms"]), "--", color=c, label=f"{model} p99" if one else None)
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("ms")
    if hist["gpus"]:
        for g, (name, whole) in enumerate(hist["gpus"].items()):
            for k, s in by_run(whole, "time"):
                t = [dt.datetime.strptime(x.split(".")[0], "%Y/%m/%d %H:%M:%S") for x in s["time"]]
                axes[2].plot(t, gaps(s["util"]), color=colors[g % len(colors)], label=name if k == 0 else None)
        axes[2].set_ylabel("GPU util %")
    for ax in axes:
        for mv in hist.get("moves", []):   # a hand-over or a lost node's move: solid green
            if mv["t"] is not None:
                ax.axvline(dt.datetime.fromtimestamp(mv["t"]), color="green", linewidth=1)
        for o in (hist.get("availability") or {}).get("outages", []):   # not answering: shaded
            ax.axvspan(dt.datetime.fromtimestamp(o["from"]), dt.datetime.fromtimestamp(o["to"]), color="red",
                       alpha=0.12, linewidth=0)
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
        [f"{len(hist['gpu_events'])} GPU event(s), dotted"] if hist.get("gpu_events") else []) + (
        [f"{len(hist['moves'])} move(s), green"] if hist.get("moves") else []) + (
        ["outages shaded"] if (hist.get("availability") or {}).get("outages") else [])
    axes[0].set_title(title + (f" ({'; '.join(notes)})" if notes else ""))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
