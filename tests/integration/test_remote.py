"""Remote use: launch, status, logs and stop from a "workstation" through a real sshd acting
as the login node (node1 of the test cluster), host keys checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.launch_helpers import ftcluster, processes_matching, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def remote_spec(sshd_nodes: Any, shared_tmp: Path) -> Path:
    tb = sshd_nodes
    d = shared_tmp
    ip = tb.ip("node1")
    scan = subprocess.run(["ssh-keyscan", "-p", "11068", "-t", "ed25519", ip], capture_output=True, text=True)
    assert scan.returncode == 0 and scan.stdout.strip(), scan.stderr
    known = d / "known_hosts"
    known.write_text(scan.stdout)
    (d / "empty_known_hosts").write_text("")
    from ftcluster.triton_local import find_tritonserver

    spec = {
        "name": "remote-testbed", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
        "request_gpus": False, "exclusive": False, "workspace": str(d / "ws"),
        "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5},
        "login_host": f"root@{ip}:11068",
        "login_identity_file": str(tb.key_path),
        "login_known_hosts": str(known),
        # The login node's own run store, apart from the workstation's (they share a disk here).
        "login_command": f"env FTCLUSTER_STATE_DIR={d / 'login-state'} {sys.executable} -m ftcluster",
    }
    path = d / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_launch_status_logs_stop_through_the_login_node(remote_spec: Path) -> None:
    proc = ftcluster("launch", "--cluster", str(remote_spec), "--nodes", "2", "--keep-serving", "--no-client",
                     "--no-mpi-check", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Progress and the report were streamed from the login node over the one connection.
    assert "rank 0 ready" in proc.stdout and "serving at" in proc.stdout
    runs = json.loads(ftcluster("list", "--json").stdout)
    assert len(runs) == 1 and runs[0]["scheduler"] == "remote"
    run_id = runs[0]["run_id"]
    status = ftcluster("status", run_id, "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout[status.stdout.index("{"):])
    assert st["state"] == "RUNNING" and sorted(st["nodes"]) == ["node1", "node2"]
    logs = ftcluster("logs", run_id, "--server", "--tail", "3")
    assert "[rank0 node1]" in logs.stdout and "[rank1 node2]" in logs.stdout
    stop = ftcluster("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def test_unknown_host_key_is_refused_not_added(remote_spec: Path) -> None:
    spec = yaml.safe_load(remote_spec.read_text())
    empty = remote_spec.parent / "empty_known_hosts"
    spec["login_known_hosts"] = str(empty)
    remote_spec.write_text(yaml.safe_dump(spec))
    proc = ftcluster("launch", "--cluster", str(remote_spec), "--nodes", "1", env={"HOME": str(remote_spec.parent)})
    assert proc.returncode == 3
    assert "login_host" in proc.stderr and "known_hosts" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert empty.read_text() == ""          # nothing was added silently
    assert not (remote_spec.parent / "ws").exists()
