"""Nothing a run leaves in /dev/shm or /tmp, counted before and after: a run that served, one
that failed and one that was stopped while serving, locally and on Slurm (the test bed's nodes
share both folders, so this sees every node). Ranks are SIGKILLed by design; what they named
there (the python backend's regions, Open MPI's segments and session folders) is the run's own
teardown's to remove. Locally also a run whose job was SIGKILLed while serving: its guard
removes them, and ends its processes."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for, write_cluster

SHM = Path("/dev/shm")
TMP = Path(tempfile.gettempdir())


def _entries(own: Path) -> set[str]:
    names = {str(SHM / n) for n in os.listdir(SHM)} | {str(TMP / n) for n in os.listdir(TMP)}
    return names - {str(own)}


def _slurm_spec(folder: Path) -> Path:
    from ftcluster.service.triton_local import find_tritonserver

    spec = {"name": "testbed", "scheduler": "slurm", "partition": "debug", "max_nodes": 8, "gpus_per_node": 1,
            "request_gpus": False, "exclusive": False, "time_limit": "00:10:00", "workspace": str(folder / "ws"),
            "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5}}
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _served(cluster: Path) -> str:
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 0 and out["ok"], err
    return str(out["run_id"])


def _failed(cluster: Path) -> str:
    # Rank 1's model refuses to load (the test model's fault on the second node or rank).
    rc, out, err = launch_json(cluster, "--nodes", "2", env={"FTCLUSTER_TEST_BREAK_NODE": "rank1"})
    assert rc == 1 and out["failed_rank"]["rank"] == "1", err
    return str(out["run_id"])


def _stopped(cluster: Path) -> str:
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--detach", "--no-client")
    assert rc == 0, err
    run_id = str(out["run_id"])

    def serving() -> bool:
        st = json.loads(ftcluster("status", run_id, "--json").stdout)
        return st["phase"] == "serving"
    assert wait_for(serving, 90, interval=0.5)
    assert ftcluster("stop", run_id).returncode == 0
    return run_id


def _killed(cluster: Path) -> str:
    # The job's supervisor SIGKILLed while serving (the OOM killer, a kill -9): no teardown of its
    # own runs; its guard ends the rest (a job beside its launcher: no scheduler does).
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--detach", "--no-client")
    assert rc == 0, err
    run_id = str(out["run_id"])
    assert wait_for(lambda: json.loads(ftcluster("status", run_id, "--json").stdout)["phase"] == "serving", 90,
                    interval=0.5)
    pid = int(out["job_id"].split(":")[1].split("@")[0])
    assert run_id in Path(f"/proc/{pid}/cmdline").read_text(), "not the run's job"
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: json.loads(ftcluster("status", run_id, "--json").stdout)["state"] == "FAILED", 30)
    return run_id


RUNS: dict[str, Callable[[Path], str]] = {"served": _served, "failed": _failed, "stopped": _stopped}


def _nothing_new(before: set[str], own: Path, run_id: str) -> None:
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    assert wait_for(lambda: not (_entries(own) - before), 15), sorted(_entries(own) - before)


@pytest.mark.triton
@pytest.mark.parametrize("how", [*RUNS, "killed"])
def test_a_local_run_leaves_nothing_in_shm_or_tmp(how: str, tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path)
    before = _entries(tmp_path)
    run_id = {**RUNS, "killed": _killed}[how](cluster)
    _nothing_new(before, tmp_path, run_id)


@pytest.mark.cluster
@pytest.mark.parametrize("how", list(RUNS))
def test_a_slurm_run_leaves_nothing_in_shm_or_tmp(how: str, slurm_cluster: Any, shared_tmp: Path) -> None:
    cluster = _slurm_spec(shared_tmp)
    before = _entries(shared_tmp)
    run_id = RUNS[how](cluster)
    _nothing_new(before, shared_tmp, run_id)
