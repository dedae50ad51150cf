"""`ftcluster logs` on the real Slurm test cluster, and `sbatch --test-only` of rendered scripts."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_launch_slurm import _write_spec
from tests.launch_helpers import ftcluster, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def spec_dir(slurm_cluster: Any, shared_tmp: Path) -> Path:
    return shared_tmp


def counting_path(folder: Path) -> tuple[dict[str, str], Path]:
    """An env whose PATH puts wrappers of squeue, sacct and scontrol first: each appends its
    argv to the returned log, then runs the real command."""
    wrappers, log = folder / "wrappers", folder / "queries.log"
    wrappers.mkdir()
    for tool in ("squeue", "sacct", "scontrol"):
        real = shutil.which(tool)
        assert real, tool
        script = wrappers / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {shlex.quote(str(log))}\nexec {shlex.quote(real)} "$@"\n')
        script.chmod(0o755)
    return {"PATH": f"{wrappers}:{os.environ['PATH']}"}, log


def queries(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_follow_a_two_node_run_while_it_starts_until_the_job_ends(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    # The servers load slowly, so following starts before any rank log exists.
    launch = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2", "--detach", "--no-mpi-check",
                       "--json", env={"FTCLUSTER_TEST_LOAD_DELAY": "2"})
    assert launch.returncode == 0, launch.stderr
    run_id = json.loads(launch.stdout)["run_id"]
    env, log = counting_path(spec_dir)
    follow = subprocess.run([sys.executable, "-m", "ftcluster", "logs", run_id, "-f"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, **env})
    # Exit code 0: the job completed (the client passed); following stopped by itself, at the
    # job's `done`: Slurm was asked on the back-off (every 0.5 s before: ~2 a second).
    assert follow.returncode == 0, follow.stderr
    assert len(queries(log)) <= 16, queries(log)
    lines = follow.stdout.splitlines()
    assert any(line.startswith("[rank0 node1] ") for line in lines), lines[:5]
    assert any(line.startswith("[rank1 node2] ") for line in lines), lines[:5]
    assert any(line.startswith("[client] ") and "PASS" in line for line in lines)
    # Lines came from the start of each log: rank 0's model table, and rank 1's FT
    # instance-initialisation line (FT's ranks != 0 never finish loading, so print no table).
    assert sum("| fastertransformer | 1" in line for line in lines) == 1
    assert any(line.startswith("[rank1 node2] ") and "(count 1) (instance_id 0)" in line for line in lines)


def test_follow_exit_code_tells_a_failed_job(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    launch = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2", "--detach", "--no-mpi-check",
                       "--json", env={"FTCLUSTER_TEST_BREAK_NODE": "node2"})
    run_id = json.loads(launch.stdout)["run_id"]
    follow = ftcluster("logs", run_id, "-f", "--rank", "1", timeout=120)
    assert follow.returncode == 1
    assert "refuses to load" in follow.stdout
    assert not follow.stdout.startswith("[")      # one log: no labels


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_sbatch_test_only_accepts_rendered_bare_scripts(spec_dir: Path, nodes: int) -> None:
    cluster = _write_spec(spec_dir)
    out = spec_dir / f"render-{nodes}"
    proc = ftcluster("render", "--cluster", str(cluster), "--nodes", str(nodes), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    test = subprocess.run(["sbatch", "--test-only", "scripts/job.sbatch"], cwd=out, capture_output=True, text=True)
    assert test.returncode == 0, test.stderr
    assert "to start at" in test.stderr
    assert wait_for(lambda: not list((out / "logs").glob("slurm-*.out")), 1)   # nothing ran


def test_list_asks_slurm_once_for_all_its_live_runs(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    runs = []
    for _ in range(2):
        launch = ftcluster("launch", "--cluster", str(cluster), "--nodes", "1", "--detach", "--no-mpi-check",
                           "--keep-serving", "--no-client", "--json")
        assert launch.returncode == 0, launch.stderr
        runs.append(json.loads(launch.stdout))
    try:
        env, log = counting_path(spec_dir)
        listed = ftcluster("list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        # One squeue for both jobs (the real squeue takes the list), and the live state of each.
        asked = queries(log)
        assert len(asked) == 1 and asked[0].startswith("squeue "), asked
        assert sorted(asked[0].split(" -j ")[1].split()[0].split(",")) == sorted(r["job_id"] for r in runs)
        states = {r["run_id"]: r["state"] for r in json.loads(listed.stdout)}
        assert all(states[r["run_id"]] in ("PENDING", "RUNNING") for r in runs), states
    finally:
        for r in runs:
            ftcluster("stop", r["run_id"])
    # Stopped: recorded as such, and not asked about again.
    log.unlink()
    listed = ftcluster("list", "--json", env=env)
    assert all(r["state"] is None and r["status"] == "STOPPED" for r in json.loads(listed.stdout))
    assert queries(log) == []
