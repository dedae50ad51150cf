"""Remote use: launch, status, logs and stop from a "workstation" through a real sshd acting
as the login node (node1 of the test cluster), host keys checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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
    from ftcluster.service.triton_local import find_tritonserver

    spec = {
        "name": "remote-testbed", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
        "request_gpus": False, "exclusive": False, "workspace": str(d / "ws"), "time_limit": "00:10:00",
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


@pytest.fixture
def workstation(sshd_nodes: Any) -> Any:
    """A machine that reaches the login node's sshd and nothing else: a namespace on the
    cluster's bridge whose every other outgoing packet is refused. Yields the argv prefix that
    runs a command there."""
    net = sshd_nodes.net
    ns, veth, addr = f"{net.tag}-ws", f"{net.tag}vws", f"10.{net.octet}.0.200"
    login = sshd_nodes.ip("node1")
    steps = [["ip", "netns", "add", ns],
             ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
             ["ip", "link", "set", veth, "master", net.bridge, "up"],
             ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"],
             ["ip", "-n", ns, "link", "set", "lo", "up"], ["ip", "-n", ns, "link", "set", "eth0", "up"],
             ["ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"],
             ["ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-d", login, "-p", "tcp", "--dport", "11068",
              "-j", "ACCEPT"],
             ["ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-j", "REJECT"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield ["nsenter", f"--net=/run/netns/{ns}"]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_tunnel_from_a_workstation_that_reaches_only_the_login_node(remote_spec: Path, workstation: Any,
                                                                     tmp_path: Path) -> None:
    """A private run launched through the login node; from the workstation its endpoint is out
    of reach, a tunnel through the login node serves `client identity` with the run's token,
    ends on Ctrl-C, follows the run's hand-over to its successor on other nodes (Slurm's notice
    of the time limit) on the same local port, and ends by itself when the service ends."""
    from tests.integration.test_launch_slurm import _job_gone
    from tests.triton_server import free_ports

    proc = ftcluster("launch", "--cluster", str(remote_spec), "--nodes", "1", "--keep-serving", "--no-client",
                     "--no-mpi-check", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = json.loads(ftcluster("list", "--json").stdout)[-1]["run_id"]
    tunnels: list[subprocess.Popen[str]] = []
    saying: dict[subprocess.Popen[str], Path] = {}
    try:
        status = ftcluster("status", run_id, "--json").stdout
        endpoint = json.loads(status[status.index("{"):])["endpoint"]
        token = ftcluster("token", run_id).stdout.strip()
        assert len(token) >= 40
        direct = subprocess.run([*workstation, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                                 f"http://{endpoint}/v2/health/ready"], capture_output=True, text=True)
        assert direct.stdout == "000"             # the workstation cannot reach the endpoint itself

        def tunnel(port: int) -> subprocess.Popen[str]:
            # What the tunnel says goes to a file, so that a failed wait below can show it.
            said_to = tmp_path / f"tunnel-{port}.err"
            t = subprocess.Popen([*workstation, sys.executable, "-m", "ftcluster", "tunnel", run_id,
                                  "--local-port", str(port), "--check-every", "1"],
                                 stdout=subprocess.DEVNULL, stderr=said_to.open("w"), text=True)
            tunnels.append(t)
            wait_for(lambda: said_to.read_text() or t.poll() is not None, 120, interval=0.2)
            said = said_to.read_text()
            assert said.startswith(f"tunnel: 127.0.0.1:{port} -> {endpoint}"), said
            saying[t] = said_to
            return t

        first, second = free_ports(2)
        t1 = tunnel(first)
        check = subprocess.run([*workstation, sys.executable, "-m", "ftcluster", "client", "identity", "--url",
                                f"127.0.0.1:{first}"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "FTCLUSTER_TOKEN": token})
        assert check.returncode == 0, check.stdout + check.stderr
        t1.send_signal(signal.SIGINT)             # Ctrl-C
        assert t1.wait(timeout=15) == 130
        t2 = tunnel(second)

        # Slurm's notice of the time limit: the run hands over to a successor on another node.
        job = json.loads(status[status.index("{"):])["job_id"]
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)

        def handed_over() -> bool:
            out = ftcluster("status", run_id, "--json").stdout
            return bool((json.loads(out[out.index("{"):])["successor"] or {}).get("handed_over"))
        assert wait_for(handed_over, 150)
        assert wait_for(lambda: _job_gone(job), 60)

        def answers() -> bool:
            got = subprocess.run([*workstation, sys.executable, "-m", "ftcluster", "client", "identity", "--url",
                                  f"127.0.0.1:{second}"], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "FTCLUSTER_TOKEN": token})
            return got.returncode == 0
        t0 = time.monotonic()
        assert wait_for(answers, 30, interval=1), saying[t2].read_text()   # the successor, same local port
        print(f"the successor answered through the tunnel after {time.monotonic() - t0:.1f} s")
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert t2.wait(timeout=60) == 0               # the service ended: so does its tunnel
    said = saying[t2].read_text()
    assert f"tunnel: run {run_id} was succeeded by run " in said and "the tunnel follows it" in said, said
    for t in tunnels:
        if t.poll() is None:
            t.kill()
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
