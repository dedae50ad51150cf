"""Liveness while serving, for real: a rank that freezes (alive, silent: every request hangs while
Triton's readiness still says 200) is found by the probe through rank 0 and the run fails naming
it; a slow rank 0 (a probe behind a long request) is not taken for a hang. Locally and on the
Slurm test cluster (bare style), with the test model's FREEZE and SLOW faults."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_launch_slurm import _job_gone, _write_spec
from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for, write_cluster

LIVENESS = {"interval": 1, "deadline": 1, "failures": 2}


def _status(run_id: str) -> dict[str, Any]:
    out = ftcluster("status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _frozen_run_fails_naming_the_hang(cluster: Path, freeze: str) -> dict[str, Any]:
    # rank 1 answers the first probe, then freezes at its second request, alive.
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               env={"FTCLUSTER_TEST_FREEZE_NODE": freeze})
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    assert wait_for(lambda: _status(run_id)["failure"] is not None, 60)
    st = _status(run_id)
    assert st["failure"].startswith("the MPI world is hung: the liveness probe (1 prompt token for 1 output "
                                    "token through fastertransformer) got no answer within 1 s 2 times in a row")
    assert "rank 1 on " in st["failure"] and "TRITONBACKEND_ModelInstanceInitialize" in st["failure"]
    health = st["health"]
    assert health["consecutive_misses"] == 2 and health["last_ok"] is not None and health["probes"] >= 3
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    return st


@pytest.mark.triton
def test_a_frozen_rank_is_found_and_the_run_fails_locally(tmp_path: Path) -> None:
    st = _frozen_run_fails_naming_the_hang(write_cluster(tmp_path, server={"liveness": LIVENESS}), "rank1@2")
    assert st["state"] == "FAILED" and [r["state"] for r in st["ranks"]] == ["ended", "ended"]


@pytest.mark.triton
def test_a_slow_rank0_is_not_a_hang(tmp_path: Path) -> None:
    # Every request takes 1.5 s: each probe misses its 1 s deadline, but completes, so the next
    # one sees progress and the misses never reach 2 in a row.
    cluster = write_cluster(tmp_path, server={"liveness": LIVENESS})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               env={"FTCLUSTER_TEST_SLOW_NODE": "rank0@1.5"})
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    try:
        assert wait_for(lambda: (_status(run_id)["health"] or {}).get("probes", 0) >= 5, 30)
        st = _status(run_id)
        assert st["state"] == "RUNNING" and st["failure"] is None
        assert st["health"]["consecutive_misses"] <= 1
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


@pytest.mark.cluster
def test_a_frozen_rank_is_found_and_the_job_ends_on_slurm(slurm_cluster: Any) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ftc-slurm-test-"))
    cluster = _write_spec(folder, server={"binary": _write_spec_binary(), "ready_timeout": 60, "exit_grace": 5,
                                          "liveness": LIVENESS})
    st = _frozen_run_fails_naming_the_hang(cluster, "rank1@2")
    assert wait_for(lambda: _job_gone(st["job_id"]), 30)


def _write_spec_binary() -> str:
    from ftcluster.triton_local import find_tritonserver

    return str(find_tritonserver())
