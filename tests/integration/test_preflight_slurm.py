"""`ftcluster preflight` on the real Slurm test cluster: the srun --mpi=pmix path with one rank
per node. The test nodes have no GPUs, so this checks the world, the gathering and the report;
the bandwidth itself is measured on GPU machines (bench/preflight_allreduce.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.launch_helpers import ftcluster

pytestmark = pytest.mark.cluster


def _spec(d: Path) -> Path:
    spec = {"name": "testbed", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
            "request_gpus": False, "exclusive": False, "time_limit": "00:05:00", "workspace": str(d / "ws")}
    (d / "cluster.yaml").write_text(yaml.safe_dump(spec))
    return d / "cluster.yaml"


def test_preflight_gathers_one_rank_per_node(slurm_cluster: Any, shared_tmp: Path) -> None:
    spec = _spec(shared_tmp)
    p = ftcluster("preflight", "--cluster", str(spec), "--nodes", "3", "--allow-no-gpu", "--json",
                  env=slurm_cluster.env, timeout=120)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    assert sorted(r["host"] for r in ranks) == sorted(slurm_cluster.nodes)   # one per node
    assert all(r["world_size"] == 3 for r in ranks)                          # one pmix world
    assert report["no_gpu_ranks"] == [0, 1, 2] and report["errors"] == []


def test_preflight_without_gpus_fails_naming_the_nodes(slurm_cluster: Any, shared_tmp: Path) -> None:
    spec = _spec(shared_tmp)
    p = ftcluster("preflight", "--cluster", str(spec), "--nodes", "2", "--no-bandwidth",
                  env=slurm_cluster.env, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: preflight failed: no GPU on rank 0 (node"), last
    assert "rank 1 (node" in last
