"""`top`: a serving run's figures now, from the samples its job writes (a replica set: each member)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ftcluster.cli import cli
from ftcluster.cli.commands_runs import forward_record
from ftcluster.cli.numbers import seconds
from ftcluster.cli.output import complete_run, echo_json
from ftcluster.cli.output import console as make_console
from ftcluster.observe.documents import document
from ftcluster.run.store import RunRecord, RunStore


def top_view(rec: RunRecord) -> tuple[RunRecord, dict[str, Any]]:
    """The `top` object: per serving run (each member of a set), its state, health, restarts,
    models' rates and GPUs. Of the service: a run that handed over (its time limit, a lost node)
    is shown as its successor; with the run shown."""
    # startup: the status and samples readers only when the command runs, not for its --help
    from ftcluster.observe.samples import run_view
    from ftcluster.observe.status import moved_to, run_status

    store = RunStore()
    st = run_status(rec)
    seen = {rec.run_id}
    while (nxt := moved_to(st)) is not None and nxt not in seen:
        later = store.exact(nxt)
        if later is None:
            break
        seen.add(nxt)
        rec, st = later, run_status(later)
    runs = []
    members = st["replicas"] if st.get("replicas") is not None else [
        {"replica": None, "run_id": rec.run_id, "in_rotation": None}]
    for m in members:
        mrec = store.exact(str(m["run_id"])) or rec
        ms = run_status(mrec) if mrec is not rec else st
        view = run_view(Path(mrec.run_dir), mrec.nodes)
        runs.append({"run_id": mrec.run_id, "replica": m.get("replica"), "state": ms["state"], "phase": ms["phase"],
                     "in_rotation": m.get("in_rotation"), "nodes": ms["nodes"], "restarts": len(ms["restarts"]),
                     "health": ms["health"], **view})
    return rec, document("top", {"run_id": rec.run_id, "endpoint": st["endpoint"], "time": time.time(), "runs": runs})


# No tokens/s: Triton's metrics do not count FT's tokens (ftcluster/observe/samples.py); inf/s are
# sequences, batch the mean inferences per execution.
COLUMNS = ("member", "state", "model", "req/s", "inf/s", "batch", "fail/s", "mean ms", "p50 ms", "p99 ms",
           "queue ms", "pending", "GPUs (util %, mem MiB)", "GPU events", "health", "restarts")
# Narrower than this, the one-row-a-model table squeezes its 16 columns into folded fragments:
# each model is a block of `figure value` rows instead.
WIDE = 200


def render(view: dict[str, Any], width: int = WIDE) -> Any:
    """`top`'s view: one row a model where `width` columns hold it, else a block a model."""
    # startup: rich only when a table is drawn (not under --json)
    from rich.console import Group
    from rich.table import Table

    title = f"run {view['run_id']} at {view['endpoint'] or '-'}  ({time.strftime('%H:%M:%S')})"
    rows = top_rows(view)
    if width < WIDE:
        blocks: list[Any] = []
        for row in rows:
            t = Table(show_header=False, box=None, padding=(0, 1))
            t.add_column(style="bold", no_wrap=True)
            t.add_column(overflow="fold")
            for key, value in zip(COLUMNS, row):
                if value:
                    t.add_row(key, value)
            blocks += [t, ""]
        return Group(title, "", *blocks)
    t = Table(title=title)
    for col in COLUMNS:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*row)
    return t


def top_rows(view: dict[str, Any]) -> list[tuple[str, ...]]:
    """The view's rows, one a model of each run (COLUMNS); a run's own cells on its first row."""
    rows: list[tuple[str, ...]] = []
    for r in view["runs"]:
        who = r["run_id"] if r["replica"] is None else f"#{r['replica']} {r['run_id']}"
        state = r["phase"] + ("" if r["in_rotation"] in (None, True) else " (out of rotation)")
        gpu = "; ".join(f"{node}: " + ", ".join(gpu_cell(g) for g in gs) for node, gs in r["gpus"].items() if gs) or "-"
        events = "; ".join(f"{node}: {evs[-1]['words']}" + (f" (+{len(evs) - 1})" if len(evs) > 1 else "")
                           for node, evs in r.get("gpu_events", {}).items() if evs) or "-"
        h = r["health"] or {}
        health = f"{h.get('consecutive_misses', 0)} missed" if h else "-"
        models = r["models"] or [None]
        for m in models:
            def f(key: str, fmt: str = ".1f") -> str:
                v = None if m is None else m.get(key)
                return "-" if v is None else format(v, fmt)
            rows.append((who, state, m["model"] if m else "(no samples yet)", f("requests_s"), f("inferences_s"),
                         f("mean_batch"), f("failures_s"), f("latency_ms", ".2f"), f("p50_ms", ".2f"),
                         f("p99_ms", ".2f"), f("queue_ms", ".2f"), f("pending", ".0f"), gpu, events, health,
                         str(r["restarts"])))
            who, state, gpu, events, health = "", "", "", "", ""
    return rows


def gpu_cell(g: dict[str, Any]) -> str:
    """One GPU in `top`: util %/MiB, and its uncorrected ECC errors where there are any."""
    util = "?" if g["util"] is None else f"{g['util']:.0f}"
    ecc = f" ECC {g['ecc_uncorrected']:.0f}!" if g.get("ecc_uncorrected") else ""
    return f"{util}%/{g['mem_used_mib'] or 0:.0f}{ecc}"


@cli.command("top")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--once", is_flag=True, help="Print the figures once and exit.")
@click.option("--every", "every", type=seconds(), default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--json", "as_json", is_flag=True, help="Print the `top` object once as JSON.")
def top_cmd(run: str | None, once: bool, every: float, as_json: bool) -> None:
    """A serving run's requests/s, latency (mean, p50, p99), queue, GPUs, health and restarts, refreshed (default: the newest run).

    The figures come from the samples the run's job writes every server.metrics_interval
    seconds (rank 0's Triton metrics; every node's GPUs where nvidia-smi is, and their XID/ECC
    events where NVML is), so `top` asks no server and works for a detached run. A replica set
    shows each member; a run that handed over is shown as its successor. inf/s counts sequences and batch is the mean inferences per execution:
    Triton's metrics hold no token counts for FT, so there is no tokens/s here (`client bench`
    measures it).

    \b
    Examples:
      ftcluster top
      ftcluster top gpt-20261121-101500-ab12 --once
    """
    rec = RunStore().get(run)
    if forward_record(rec, ["top", rec.run_id] + (["--once"] if once or as_json else []) + (["--json"] if as_json else [])):
        return
    rec, view = top_view(rec)
    if as_json:
        echo_json(view)
        return
    # startup: rich only when a table is drawn (not under --json)
    from rich.live import Live

    # Piped or redirected: lines as long as their values (never cut at 80 columns), the wide table.
    out = make_console()
    if once:
        out.print(render(view, out.width))
        return
    with Live(render(view, out.width), console=out, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(every)
                rec, view = top_view(rec)   # from the run shown last: a hand-over moves it on
                live.update(render(view, out.width), refresh=True)
        except KeyboardInterrupt:
            pass
