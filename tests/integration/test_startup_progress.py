"""A start-up deadline that follows progress, for real (local style, 2 ranks): a slow load that
moves (the test model reads and logs as it goes, as FT reading its shards does) is not timed out
by server.stall_timeout and `launch` shows each rank's progress; a load that stalls (alive,
reading and logging nothing) fails the launch within the stall limit, naming the rank and what it
had done; nothing is left."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ftcluster.spec.defaults import embedded_model_path
from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for, write_cluster

pytestmark = pytest.mark.triton


def test_a_slow_load_that_moves_is_not_timed_out(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, server={"stall_timeout": 3, "ready_timeout": 120})
    t0 = time.monotonic()
    done = ftcluster("launch", "--cluster", str(cluster), "--model", str(embedded_model_path()), "--nodes", "2",
                     env={"FTCLUSTER_TEST_LOAD_PROGRESS": "9"})
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 > 9   # it did take its 9 s, three times the stall limit
    # `launch` showed each rank's progress while they loaded (figures from their nodes).
    shown = [ln for ln in done.stderr.splitlines() if "loading" in ln and "rank 0: read" in ln]
    assert shown and "rank 1: read" in shown[-1] and " log " in shown[-1], done.stderr
    (run_dir,) = (tmp_path / "ws").iterdir()
    run_id = run_dir.name
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def test_a_stalled_load_fails_within_the_stall_limit_named(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, server={"stall_timeout": 4, "ready_timeout": 300})
    t0 = time.monotonic()
    rc, out, err = launch_json(cluster, "--nodes", "2", env={"FTCLUSTER_TEST_LOAD_DELAY": "120"})
    took = time.monotonic() - t0
    assert rc != 0 and not out["ok"]
    assert took < 40, took   # the stall limit, not ready_timeout's 300 s
    failure = out["failure"]
    assert "made no progress loading for" in failure and "(server.stall_timeout 4 s)" in failure, failure
    assert failure.startswith("rank ") and "it had read " in failure and "its last log line:" in failure
    assert wait_for(lambda: not processes_matching(out["run_id"]), 30), processes_matching(out["run_id"])
