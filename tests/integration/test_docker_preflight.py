"""`ftcluster preflight` on Slurm + Docker, for real: the ranks run in one container per node of
the stock-like test image (its python3, no ftcluster inside), started by mpirun over ssh from
rank 0's container as the servers are, and every container and key of the run is gone after."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from tests.docker.daemons import DockerNodes
from tests.docker.launching import assert_nothing_left, events, write_spec
from tests.launch_helpers import ftcluster

pytestmark = [pytest.mark.docker, pytest.mark.cluster]


def test_preflight_runs_in_the_containers(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    p = ftcluster("preflight", "--cluster", str(write_spec(tmp_path, dn)), "--nodes", "2", "--allow-no-gpu",
                  "--json", env=dn.tb.env, timeout=300)  # type: ignore[attr-defined]
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["host"] for r in ranks} <= set(dn.nodes)
    assert len({r["host"] for r in ranks}) == 2 and all(r["world_size"] == 2 for r in ranks)
    for r in ranks:
        # The image's python3 and its tritonserver on the image's PATH, no GPU in the containers.
        assert r["python"] != platform.python_version() and r["tritonserver"], r
        assert r["gpus"] == [] and r["note"], r
    run_dir = Path(report["logs"]).parent
    kinds = [e[0] for e in events(run_dir)]
    for kind in ("containers_ready", "step_started", "step_done", "containers_stopped", "done"):
        assert kind in kinds, kinds
    assert_nothing_left(dn, run_dir)
