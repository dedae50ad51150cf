"""`top` for people: readable on a terminal narrower than its 16 columns, and whole when piped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from ftcluster.cli.commands_top import render
from ftcluster.run.store import RunRecord, RunStore

VIEW = {"run_id": "gpt-20261202-101500-ab12", "endpoint": "node1:8000", "runs": [{
    "run_id": "gpt-20261202-101500-ab12", "replica": None, "phase": "serving", "in_rotation": None,
    "restarts": 1, "health": {"consecutive_misses": 0},
    "gpus": {"node1": [{"util": 97.0, "mem_used_mib": 30123.0}, {"util": 95.0, "mem_used_mib": 30011.0}],
             "node2": [{"util": 96.0, "mem_used_mib": 30200.0}]},
    "gpu_events": {},
    "models": [{"model": "fastertransformer", "requests_s": 123.4, "inferences_s": 456.7, "mean_batch": 3.7,
                "failures_s": 0.0, "latency_ms": 21.25, "p50_ms": 19.5, "p99_ms": 123.45, "queue_ms": 1.5,
                "pending": 4.0}]}]}


def _shown(width: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False)
    console.print(render(VIEW, width))
    return console.export_text().splitlines()


def test_a_terminal_narrower_than_the_table_gets_a_block_a_model() -> None:
    lines = _shown(100)
    assert all(len(line) <= 100 for line in lines)
    # Each figure on its own line beside its name, never folded into fragments.
    for name, value in (("p99 ms", "123.45"), ("req/s", "123.4"), ("GPUs (util %, mem MiB)", "node1: 97%/30123, 95%/30011"),
                        ("model", "fastertransformer"), ("restarts", "1")):
        assert any(line.split()[:len(name.split())] == name.split() and value in line for line in lines), (name, lines)


def test_piped_top_is_the_whole_table(tmp_path: Path) -> None:
    run_dir = tmp_path / "run1"
    (run_dir / "state").mkdir(parents=True)
    (run_dir / "state" / "events").write_text("1.0 job_started n1 7\n2.0 serving n1:8000\n")
    state = tmp_path / "state"
    RunStore(state / "runs.sqlite").add(RunRecord(
        run_id="run1", created=time.time(), cluster_name="c", cluster_source="", scheduler="local", style="local",
        run_dir=str(run_dir), nodes=1, model="m", job_id=None, status="SERVING"))
    p = subprocess.run([sys.executable, "-m", "ftcluster", "top", "run1", "--once"], capture_output=True, text=True,
                       env={**os.environ, "FTCLUSTER_STATE_DIR": str(state), "COLUMNS": "80"}, timeout=60)
    assert p.returncode == 0, p.stderr
    # Not cut to 80 columns: every heading whole, on the table's one heading line.
    (heading,) = [line for line in p.stdout.splitlines() if "GPUs (util %, mem MiB)" in line]
    assert len(heading) > 80 and "p99 ms" in heading and "restarts" in heading, p.stdout
