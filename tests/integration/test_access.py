"""Who may use a served model (access: private), for real: Triton on rank 0's loopback, Caddy
beside it on the endpoint's ports with the run's token. Locally (where a user tries it on one
machine) and on the Slurm test cluster, where another node reaches the proxy but not Triton."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftcluster.spec.defaults import embedded_model_path
from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for, write_cluster

pytestmark = pytest.mark.triton


def _serving(run_id: str) -> dict[str, Any]:
    st: dict[str, Any] = {}

    def ready() -> bool:
        nonlocal st
        st = json.loads(ftcluster("status", run_id, "--json").stdout)
        return st["phase"] == "serving"
    assert wait_for(ready, 90, interval=0.3), st
    return st


def _http_status(host: str, port: int, path: str, token: str | None = None, method: str = "GET") -> int:
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        return conn.getresponse().status
    finally:
        conn.close()


def _grpc_live(url: str, token: str | None) -> str:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        return "live" if client.is_server_live(headers={"authorization": f"Bearer {token}"} if token else None) \
            else "not live"
    except InferenceServerException as exc:
        return f"refused: {exc.message()}"
    finally:
        client.close()


def _grpc_unload(url: str, token: str) -> str:
    """What the proxy answers to gRPC's RepositoryModelUnload with the token."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        client.unload_model("fastertransformer", headers={"authorization": f"Bearer {token}"})
        return "unloaded"
    except InferenceServerException as exc:
        return f"refused: {exc.message()}"
    finally:
        client.close()


def _token_held_only_by_its_file(run_dir: Path, token: str) -> None:
    token_file = run_dir / "scripts" / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    holders = [str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
               if p.is_file() and token.encode() in p.read_bytes()]
    assert holders == ["scripts/token"], holders


def test_a_private_local_run_serves_through_its_proxy_with_the_token_only(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, access="private")
    ports = yaml.safe_load(cluster.read_text())["ports"]
    launched = ftcluster("launch", "--cluster", str(cluster), "--model", str(embedded_model_path()), "--nodes", "2",
                         "--keep-serving", "--detach", "--no-client")
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.split("submitted run ", 1)[1].split()[0]
    run_dir = Path(json.loads(ftcluster("status", run_id, "--json").stdout)["run_dir"])
    try:
        st = _serving(run_id)
        assert st["access"] == "private" and st["endpoint"] == f"127.0.0.1:{ports['http']}"
        # This machine's other users share its loopback: launch and status say they can reach
        # Triton directly, in one line each.
        assert "this machine's other users share" in st["same_host"], st["same_host"]
        assert launched.stderr.splitlines().count(f"note: {st['same_host']}") == 1, launched.stderr
        assert f"note: {st['same_host']}" in ftcluster("status", run_id).stdout.splitlines()
        token = ftcluster("token", run_id).stdout.strip()
        assert len(token) >= 40
        # Triton itself on the loopback, 100 above; the proxy on the endpoint's ports.
        assert _http_status("127.0.0.1", ports["http"] + 100, "/v2/health/ready") == 200
        assert _http_status("127.0.0.1", ports["http"], "/v2/health/ready") == 401
        assert _http_status("127.0.0.1", ports["http"], "/v2/health/ready", "wrong") == 401
        assert _http_status("127.0.0.1", ports["http"], "/v2/health/ready", token) == 200
        assert _http_status("127.0.0.1", ports["http"], "/v2/repository/index", token, "POST") == 403
        for path in ("/v2/repository/models/fastertransformer/unload", "/v2/models/fastertransformer/trace/setting",
                     "/v2/trace/setting", "/v2/logging", "/v2/systemsharedmemory/region/x/register"):
            assert _http_status("127.0.0.1", ports["http"], path, token, "POST") == 403, path
        # Inference and the model's own endpoints pass.
        assert _http_status("127.0.0.1", ports["http"], "/v2/models/fastertransformer/config", token) == 200
        assert _grpc_live(f"127.0.0.1:{ports['grpc']}", token) == "live"
        assert "403" in _grpc_unload(f"127.0.0.1:{ports['grpc']}", token)
        assert _grpc_live(f"127.0.0.1:{ports['grpc']}", None).startswith("refused")
        # Clients: the run's endpoint and token by --run, over HTTP and gRPC; without it, one line.
        for protocol in ("http", "grpc"):
            ok = ftcluster("client", "identity", "--run", run_id, "--protocol", protocol)
            assert ok.returncode == 0, ok.stdout + ok.stderr
        bare = ftcluster("client", "identity", "--url", st["endpoint"])
        assert bare.returncode == 3 and "wants the run's token" in bare.stderr and "Traceback" not in bare.stderr
        env_ok = ftcluster("client", "identity", "--url", st["endpoint"], env={"FTCLUSTER_TOKEN": token})
        assert env_ok.returncode == 0, env_ok.stderr
        _token_held_only_by_its_file(run_dir, token)
        # The token is in no output: status, logs, the run's JSON.
        shown = ftcluster("status", run_id, "--json").stdout + ftcluster("logs", run_id).stdout + \
            ftcluster("list", "--json").stdout
        assert token not in shown
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    with socket.socket() as s:   # the proxy's port is free again
        s.bind(("0.0.0.0", ports["http"]))


@pytest.mark.parametrize("taken,field", [(0, "ports.grpc"), (100, "proxy.loopback_offset")])
def test_a_taken_port_of_the_proxy_or_of_triton_is_refused_naming_it(taken: int, field: str, tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, access="private")
    port = yaml.safe_load(cluster.read_text())["ports"]["grpc"] + taken
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
        s.listen()
        rc, out, err = launch_json(cluster, "--nodes", "1")
    assert rc == 3 and err.startswith(f"error: {field}: port {port} (") and "Traceback" not in err, err
    assert not list((tmp_path / "ws").glob("*")) if (tmp_path / "ws").exists() else True


@pytest.mark.cluster
def test_on_slurm_another_node_reaches_the_proxy_but_not_triton(slurm_cluster: Any, shared_tmp: Path) -> None:
    """Bare Slurm, private by default: from another node of the cluster, rank 0's own Triton
    ports answer nothing, the proxy answers 401 without the token and serves with it."""
    from tests.integration.test_launch_slurm import _write_spec

    cluster = _write_spec(shared_tmp, server={"binary": _tritonserver(), "ready_timeout": 60, "exit_grace": 5})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--detach", "--no-client")
    assert rc == 0, err
    run_id = out["run_id"]
    try:
        st = _serving(run_id)
        assert st["access"] == "private"
        host, port = st["endpoint"].split(":")
        other = next(n for n in slurm_cluster.nodes if n != host)
        token = ftcluster("token", run_id).stdout.strip()

        def from_other(port_: int, auth: bool) -> str:
            header = f"-H 'Authorization: Bearer {token}' " if auth else ""
            cmd = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {header}http://{host}:{port_}/v2/health/ready"
            return str(slurm_cluster.node_exec(other, ["bash", "-c", cmd]).stdout.strip())
        assert from_other(int(port) + 100, True) == "000"      # Triton: the loopback only
        assert from_other(int(port), False) == "401"
        assert from_other(int(port), True) == "200"
        # ... but on rank 0's own node, which this job shares (exclusive: false), Triton answers
        # without the token: status says so.
        same = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.1:{int(port) + 100}/v2/health/ready"
        assert str(slurm_cluster.node_exec(host, ["bash", "-c", same]).stdout.strip()) == "200"
        assert "other jobs on that node (exclusive: false) share" in (st["same_host"] or ""), st["same_host"]
        ok = ftcluster("client", "identity", "--run", run_id)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        _token_held_only_by_its_file(Path(out["run_dir"]), token)
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def self_signed(folder: Path, names: list[str]) -> tuple[Path, Path]:
    """A certificate for `names` (and its key, 0600), as a user brings their own."""
    import subprocess

    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=ftcluster test",
                    "-addext", "subjectAltName=" + ",".join(f"DNS:{n}" for n in names)], check=True, capture_output=True)
    key.chmod(0o600)
    return cert, key


@pytest.mark.cluster
def test_on_slurm_a_tls_endpoint_serves_https_and_grpcs_with_the_token(slurm_cluster: Any, shared_tmp: Path) -> None:
    """proxy.tls_cert/tls_key: the proxy serves HTTPS and gRPC over TLS with the user's
    certificate. The job's own client checks the run through it, clients with --run trust the
    run's certificate, plain HTTP gets no answer, and a client that does not trust it fails."""
    from tests.integration.test_launch_slurm import _write_spec

    cert, key = self_signed(shared_tmp, list(slurm_cluster.nodes))
    cluster = _write_spec(shared_tmp, server={"binary": _tritonserver(), "ready_timeout": 60, "exit_grace": 5},
                          proxy={"tls_cert": str(cert), "tls_key": str(key)})
    rc, out, err = launch_json(cluster, "--nodes", "2")   # serves, the job's client check, ends
    assert rc == 0 and out["client"]["ok"], (out, err)
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--detach", "--no-client")
    assert rc == 0, err
    run_id = out["run_id"]
    try:
        st = _serving(run_id)
        host, port = st["endpoint"].split(":")
        token = ftcluster("token", run_id).stdout.strip()
        for protocol in ("http", "grpc"):
            ok = ftcluster("client", "identity", "--run", run_id, "--protocol", protocol)
            assert ok.returncode == 0, ok.stdout + ok.stderr
        url = f"https://{host}:{port}"
        with_ca = ftcluster("client", "identity", "--url", url, "--ca", str(cert), "--token", token)
        assert with_ca.returncode == 0, with_ca.stdout + with_ca.stderr
        untrusted = ftcluster("client", "identity", "--url", url, "--token", token)
        assert untrusted.returncode != 0 and "certificate" in (untrusted.stdout + untrusted.stderr).lower()
        assert _http_status(host, int(port), "/v2/health/ready", token) == 400   # plain HTTP to a TLS port
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def _tritonserver() -> str:
    from ftcluster.service.triton_local import find_tritonserver

    return str(find_tritonserver())



@pytest.mark.cluster
def test_on_slurm_a_taken_proxy_port_on_the_node_fails_the_run_naming_it(slurm_cluster: Any, shared_tmp: Path) -> None:
    """Bare Slurm, private: the endpoint's HTTP port is taken on the node (by someone else's
    process there), which no check before submission can see. The job starts no proxy beside it
    (Caddy's SO_REUSEPORT would share the port): the run fails at once naming the port, the
    node and the process that holds it, and leaves nothing running."""
    import subprocess
    import sys

    from tests.integration.test_launch_slurm import _job_gone, _write_spec

    cluster = _write_spec(shared_tmp, server={"binary": _tritonserver(), "ready_timeout": 60, "exit_grace": 5})
    port = int(yaml.safe_load(cluster.read_text()).get("ports", {}).get("http", 8000))
    # SO_REUSEADDR: a port an earlier test's proxy served on may still have connections in
    # TIME_WAIT, which refuse a plain bind; a listener holds the port all the same.
    listen = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('listening', flush=True); time.sleep(300)")
    holders = [subprocess.Popen([*slurm_cluster.net.enter(n), sys.executable, "-c", listen, str(port)],
                                stdout=subprocess.PIPE, text=True) for n in slurm_cluster.nodes]
    try:
        for h in holders:
            assert h.stdout is not None and h.stdout.readline().strip() == "listening"
        rc, out, err = launch_json(cluster, "--nodes", "1", "--keep-serving", "--no-client")
        assert rc != 0 and out.get("ok") is False, (out, err)
        failure = str(out.get("failure", "")) + err
        assert "the proxy cannot listen on node" in failure and f"ports.http {port} (pid " in failure, failure
        assert "Traceback" not in err
        assert wait_for(lambda: _job_gone(str(out["job_id"])), 30)
        assert wait_for(lambda: not processes_matching(str(out["run_id"])), 30), processes_matching(str(out["run_id"]))
    finally:
        for h in holders:
            h.kill()
            h.wait()


# ------------------------------------------------------------------ ssh + Docker: the proxy in rank 0's container

def _cmdlines_with(text: str) -> list[str]:
    """Live processes whose command line holds `text` (every node's: they share this process table)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{cmd[:200]} (pid {pid})")
    return found


def _ssh_private_spec(tmp_path: Path, dn: Any, server: dict[str, Any] | None = None, **top: Any) -> Path:
    """The test bed's ssh + Docker spec, private by default: nothing about access in it."""
    from tests.integration.test_ssh_docker_launch import ssh_spec

    spec = ssh_spec(tmp_path, dn)
    data = yaml.safe_load(spec.read_text())
    assert "access" not in data
    data["server"] = {**data["server"], **(server or {})}
    spec.write_text(yaml.safe_dump({**data, **top}))
    return spec


def _container_proxy(dn: Any, node: str, run_id: str, *argv: str) -> str:
    (c,) = dn.containers(node, f"org.ftcluster.run={run_id}")
    return str(dn.docker(node, ["exec", c, *argv]).stdout.strip())


@pytest.mark.docker
@pytest.mark.cluster
def test_on_ssh_docker_the_proxy_in_rank0s_container_serves_with_the_token_only(
        tmp_path: Path, docker_nodes: Any, sshd_nodes: Any) -> None:
    """ssh + Docker, private by default: the job runs here, Caddy in rank 0's container. From
    another node rank 0's own Triton ports answer nothing, the proxy answers 401 without the
    token and serves with it (HTTP, gRPC, the metrics the job reads); the job's probes and
    clients with --run go through it; the token is on no command line, in no docker option and
    no other file; `stop` leaves no Caddy, no copy of it and no container."""
    from tests.docker.launching import assert_nothing_left, serve_detached, stop

    dn = docker_nodes
    tb = dn.tb
    out, run_dir = serve_detached(dn, _ssh_private_spec(tmp_path, dn, {"liveness": {"interval": 1, "deadline": 5},
                                                                        "metrics_interval": 1}))
    run_id, rank0, other = out["run_id"], dn.nodes[0], dn.nodes[1]
    try:
        st = _serving(run_id)
        assert st["access"] == "private" and st["endpoint"] == f"{rank0}:8000", st
        token = ftcluster("token", run_id).stdout.strip()
        assert len(token) >= 40

        def from_other(port: int, auth: bool, path: str = "/v2/health/ready") -> str:
            header = ["-H", f"Authorization: Bearer {token}"] if auth else []
            got = tb.node_exec(other, ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                                       *header, f"http://{rank0}:{port}{path}"])
            return str(got.stdout.strip())
        for port in (8100, 8101, 8102):   # Triton itself: rank 0's loopback only
            assert from_other(port, True) == "000", port
        assert from_other(8000, False) == "401" and from_other(8000, True) == "200"
        assert from_other(8002, False, "/metrics") == "401" and from_other(8002, True, "/metrics") == "200"
        assert _http_status(rank0, 8000, "/v2/repository/index", token, "POST") == 403
        assert _grpc_live(f"{rank0}:8001", token) == "live"
        assert _grpc_live(f"{rank0}:8001", None).startswith("refused")
        assert "403" in _grpc_unload(f"{rank0}:8001", token)
        for protocol in ("http", "grpc"):
            ok = ftcluster("client", "identity", "--run", run_id, "--protocol", protocol)
            assert ok.returncode == 0, ok.stdout + ok.stderr
        # The job's own requests went through the proxy: the liveness probe answered, the metrics
        # were sampled (a line is written only for an answer).
        def probed() -> bool:
            health = json.loads(ftcluster("status", run_id, "--json").stdout)["health"] or {}
            return bool((health.get("last_probe") or {}).get("answered"))
        assert wait_for(probed, 30, interval=0.5)
        assert wait_for(lambda: (run_dir / "state" / "metrics.jsonl").is_file(), 30)
        # Caddy runs from its copy in the container, as you; the staged copy is gone already.
        assert not (run_dir / "state" / "proxy-stage").exists()
        pid = _container_proxy(dn, rank0, run_id, "cat", "/run/ftcluster-proxy/caddy.pid").split()[0]
        assert _container_proxy(dn, rank0, run_id, "readlink", f"/proc/{pid}/exe") == "/run/ftcluster-proxy/caddy"
        _token_held_only_by_its_file(run_dir, token)
        assert _cmdlines_with(token) == []
        for node in dn.nodes[:2]:
            (c,) = dn.containers(node, f"org.ftcluster.run={run_id}")
            assert token not in dn.docker(node, ["inspect", c], check=True).stdout
    finally:
        stop(dn, run_id)
    assert_nothing_left(dn, run_dir)
    assert _cmdlines_with("/run/ftcluster-proxy/caddy") == []
    assert not (run_dir / "state" / "proxy-stage").exists()
    with socket.socket() as s:   # the proxy's port on rank 0's node is free again: nothing answers
        assert s.connect_ex((rank0, 8000)) != 0


@pytest.mark.docker
@pytest.mark.cluster
def test_on_ssh_docker_a_restart_of_the_world_keeps_the_proxy(tmp_path: Path, docker_nodes: Any,
                                                              sshd_nodes: Any) -> None:
    """Rank 1 freezes while serving: the liveness probe (through the proxy, with the token) finds
    the hung world, every process of it in the containers is reaped but the proxy, which serves
    the restarted world on: the same Caddy, and clients with --run pass."""
    from tests.docker.launching import assert_nothing_left, launch, stop
    from tests.integration.test_liveness import RESTARTS

    dn = docker_nodes
    spec = _ssh_private_spec(tmp_path, dn, RESTARTS, env={"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2"})
    rc, out, err = launch(dn, spec, "--nodes", "2", "--keep-serving", "--no-client", "--no-mpi-check")
    assert rc == 0 and out["ok"], (out, err)
    run_id, run_dir, rank0 = out["run_id"], Path(out["run_dir"]), dn.nodes[0]
    try:
        caddy = _container_proxy(dn, rank0, run_id, "cat", "/run/ftcluster-proxy/caddy.pid")

        def serving_again() -> bool:
            st = json.loads(ftcluster("status", run_id, "--json").stdout)
            return len(st["restarts"]) == 1 and st["phase"] == "serving" and \
                ((st["health"] or {}).get("last_probe") or {}).get("answered") is True
        assert wait_for(serving_again, 120, interval=0.5), ftcluster("status", run_id, "--json").stdout
        st = json.loads(ftcluster("status", run_id, "--json").stdout)
        assert st["restarts"][0]["cause"].startswith("the MPI world is hung"), st["restarts"]
        assert _container_proxy(dn, rank0, run_id, "cat", "/run/ftcluster-proxy/caddy.pid") == caddy
        ok = ftcluster("client", "identity", "--run", run_id, "--model", "fastertransformer")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        started = [ln for ln in (run_dir / "state" / "events").read_text().splitlines() if " proxy_started " in ln]
        assert len(started) == 1, started   # the job never had to start it again
    finally:
        stop(dn, run_id)
    assert_nothing_left(dn, run_dir)
    assert _cmdlines_with("/run/ftcluster-proxy/caddy") == []


@pytest.mark.docker
@pytest.mark.cluster
def test_on_ssh_docker_a_tls_endpoint_is_checked_and_used_by_the_job(tmp_path: Path, docker_nodes: Any,
                                                                     sshd_nodes: Any) -> None:
    """proxy.tls_cert/tls_key on ssh + Docker: the job copies them beside Caddy in rank 0's
    container; its readiness and liveness go there over TLS with the token, its client with the
    run's certificate. Plain HTTP to the TLS port is refused."""
    from tests.docker.launching import assert_nothing_left, launch

    dn = docker_nodes
    cert, key = self_signed(tmp_path, list(dn.nodes))
    spec = _ssh_private_spec(tmp_path, dn, proxy={"tls_cert": str(cert), "tls_key": str(key)})
    rc, out, err = launch(dn, spec, "--nodes", "2", "--no-mpi-check")   # serves, the job's client check, ends
    assert rc == 0 and out["client"]["ok"], (out, err)
    assert_nothing_left(dn, Path(out["run_dir"]))
    assert _cmdlines_with("/run/ftcluster-proxy/caddy") == []


@pytest.mark.docker
@pytest.mark.cluster
def test_on_ssh_docker_a_taken_proxy_port_fails_the_run_and_gets_no_token(tmp_path: Path, docker_nodes: Any,
                                                                          sshd_nodes: Any) -> None:
    """Someone else's process holds the endpoint's HTTP port on rank 0's node: Caddy cannot
    listen, the run fails at once naming the port and the node, and the holder never sees the
    run's token (the job sends it only once Caddy holds the ports)."""
    import subprocess
    import sys

    from tests.docker.launching import assert_nothing_left, launch

    dn = docker_nodes
    rank0 = dn.nodes[0]
    # Answers 200 to anything and prints every request it gets.
    hold = ("import http.server, socketserver, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        print(self.path, dict(self.headers), flush=True); self.send_response(200); self.end_headers()\n"
            "    do_POST = do_GET\n"
            "socketserver.TCPServer.allow_reuse_address = True\n"
            "s = socketserver.TCPServer(('0.0.0.0', 8000), H); print('listening', flush=True); s.serve_forever()\n")
    holder = subprocess.Popen([*dn.tb.net.enter(rank0), sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "listening"
        rc, out, err = launch(dn, _ssh_private_spec(tmp_path, dn), "--nodes", "2", "--no-mpi-check")
    finally:
        holder.kill()
        seen, _ = holder.communicate(timeout=10)
    assert rc != 0 and out["ok"] is False, (out, err)
    failure = str(out.get("failure"))
    assert "the proxy (access: private) exited" in failure and "ports.http 8000" in failure, failure
    assert f"taken on {rank0}" in failure and "address already in use" in failure, failure
    assert "Bearer" not in seen and "Authorization" not in seen, seen
    run_dir = Path(out["run_dir"])
    assert "servers_starting" not in (run_dir / "state" / "events").read_text()
    assert_nothing_left(dn, run_dir)
    assert _cmdlines_with("/run/ftcluster-proxy/caddy") == []
    assert not (run_dir / "state" / "proxy-stage").exists()
