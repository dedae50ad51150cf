"""A local run asks for no more GPUs than this machine has (scheduler local: every node is a
process group here, rank r on slice r of the GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.schedulers.host_gpus import host_gpus, local_gpu_problem


def test_host_gpus_counts_the_drivers_folders(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    assert host_gpus(gpus) == 0           # no NVIDIA driver: no folder
    gpus.mkdir()
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (gpus / bus).mkdir()
    assert host_gpus(gpus) == 2


@pytest.mark.parametrize(("nodes", "per_node", "visible", "host", "says"), [
    (2, 1, None, 1, "2 nodes x 1 GPUs need 2 GPUs (scheduler local: every node is a process group on this "
                    "machine), this machine has 1"),
    (2, 2, "0,1", 4, "CUDA_VISIBLE_DEVICES='0,1' gives 2"),
    (1, 2, "0", 8, "CUDA_VISIBLE_DEVICES='0' gives 1"),
    (2, 1, "", 2, "CUDA_VISIBLE_DEVICES='' gives 0"),
    (3, 1, "0,1,2,3", 2, "this machine has 2"),
])
def test_too_few_gpus_are_refused_naming_the_count(nodes: int, per_node: int, visible: str | None, host: int,
                                                   says: str) -> None:
    problem = local_gpu_problem(nodes, per_node, visible, host)
    assert problem is not None and says in problem, problem


@pytest.mark.parametrize(("nodes", "per_node", "visible", "host"), [
    (2, 1, None, 0),          # CPU-only machine: the CPU test model runs on any count
    (2, 1, None, 2),
    (2, 2, "3,2,1,0", 4),
    (1, 1, "1", 2),
    (8, 1, None, 8),
])
def test_enough_gpus_pass(nodes: int, per_node: int, visible: str | None, host: int) -> None:
    assert local_gpu_problem(nodes, per_node, visible, host) is None


def test_a_local_launch_past_the_machines_gpus_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The launch itself, this machine stood in for by a driver folder of one GPU: exit 3, one
    line naming --nodes, no run folder, no job."""
    gpus = tmp_path / "gpus"
    (gpus / "0000:18:00.0").mkdir(parents=True)
    cluster = tmp_path / "local.yaml"
    cluster.write_text(f"name: one-gpu\nscheduler: local\ngpus_per_node: 1\nworkspace: {tmp_path / 'ws'}\n")
    code = ("import sys, pathlib, ftcluster.schedulers.host_gpus as h; h.NVIDIA_GPUS = pathlib.Path(sys.argv[1]); "
            "from ftcluster.cli import main; sys.argv = ['ftcluster', 'launch', '--cluster', sys.argv[2], "
            "'--nodes', '2']; main()")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", code, str(gpus), str(cluster)], capture_output=True, text=True,
                         timeout=120, check=False, env=env)
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("\n") == 1 and "--nodes: 2 nodes x 1 GPUs need 2 GPUs" in out.stderr, out.stderr
    assert "this machine has 1" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").iterdir())
