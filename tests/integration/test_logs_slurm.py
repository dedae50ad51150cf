"""`ftcluster logs` on the real Slurm test cluster, and `sbatch --test-only` of rendered scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_launch_slurm import _write_spec
from tests.launch_helpers import ftcluster, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def spec_dir(slurm_cluster: Any) -> Path:
    return Path(tempfile.mkdtemp(prefix="ftc-logs-test-"))


def test_follow_a_two_node_run_while_it_starts_until_the_job_ends(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    # The servers load slowly, so following starts before any rank log exists.
    launch = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2", "--detach", "--no-mpi-check",
                       "--json", env={"FTCLUSTER_TEST_LOAD_DELAY": "2"})
    assert launch.returncode == 0, launch.stderr
    run_id = json.loads(launch.stdout)["run_id"]
    follow = subprocess.run([sys.executable, "-m", "ftcluster", "logs", run_id, "-f"], capture_output=True,
                            text=True, timeout=120)
    # Exit code 0: the job completed (the client passed); following stopped by itself.
    assert follow.returncode == 0, follow.stderr
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
