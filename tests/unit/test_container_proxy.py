"""ssh + Docker's private runs: the proxy in rank 0's container, the job on the launching machine.
What the job stages and runs for it (never the token), how it waits for the proxy to hold its
ports before a request carries the token, where its probes go, and the node script's own checks
(holds_ports, proxy_stop) run for real in bash. The whole of it on the test bed:
tests/integration/test_access.py."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftcluster.job.config import JobConfig
from ftcluster.job.ranks import DIRECT, Via
from ftcluster.job.supervisor import Failed, Job
from ftcluster.job.runtimes.docker import ContainerProxy, DockerRuntime
from ftcluster.job.schedulers.ssh import SshScheduler
from tests.unit.test_render import PYTHON, render_style

TOKEN = "tok-" + "x" * 40


def _job(run_dir: Path, **spec: Any) -> Job:
    files = render_style("ssh_docker", run_dir=run_dir, **spec).files
    for d in ("state", "logs"):
        (run_dir / d).mkdir(parents=True, exist_ok=True)
    job = Job(JobConfig.from_json(files["job.json"]))
    job.style.runtime.find_hosts()   # type: ignore[attr-defined]
    return job


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_job_stages_caddy_and_the_tls_files_and_passes_no_token(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cert, key, caddy = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "caddy"
    for p, text in ((cert, "CERT"), (key, "KEY"), (caddy, "#!/bin/sh\n")):
        p.write_text(text)
    caddy.chmod(0o755)
    job = _job(run_dir, proxy={"tls_cert": str(cert), "tls_key": str(key)})
    argv, env = job.style.proxy_command(str(caddy), TOKEN)
    # Over ssh to rank 0's node (the first host), the node script's proxy_up; the token nowhere.
    assert argv[:3] == [PYTHON, "-m", "ftcluster.hosts.fanout"] and argv[argv.index("--hosts") + 1] == "dgx01"
    assert argv[-3:] == ["bash", f"{run_dir}/scripts/docker_node.sh", "proxy_up"]
    assert env == {} and TOKEN not in " ".join(argv)
    stage = run_dir / "state" / "proxy-stage"
    assert _mode(stage) == 0o700
    assert {p.name: (_mode(p), p.read_text()) for p in stage.iterdir()} == {
        "caddy": (0o700, "#!/bin/sh\n"), "cert.pem": (0o600, "CERT"), "key.pem": (0o600, "KEY")}
    # Each start stages afresh; the teardown asks rank 0's container to stop Caddy, and what is
    # still staged goes.
    job.style.proxy_command(str(caddy), TOKEN)
    ran: list[list[str]] = []

    def run(argv: list[str], **kw: object) -> int:
        ran.append(list(argv))
        return 0
    job.run = run   # type: ignore[method-assign,assignment]
    job.style.stop_proxy()
    node_script = f"{run_dir}/scripts/docker_node.sh"
    assert ran == [job.style.runtime.in_rank0_container("bash", node_script, "proxy_stop", "5")]   # type: ignore[attr-defined]
    assert not stage.exists()
    job.style.stop_proxy()
    assert len(ran) == 1   # once


def test_a_file_the_proxy_needs_that_cannot_be_copied_is_named(tmp_path: Path) -> None:
    caddy, cert = tmp_path / "caddy", tmp_path / "c.pem"
    caddy.write_text("#!/bin/sh\n")
    caddy.chmod(0o755)
    cert.write_text("CERT")
    job = _job(tmp_path / "run", proxy={"binary": str(caddy), "tls_cert": str(cert), "tls_key": f"{tmp_path}/k.pem"})
    job.doors.proxy_token = TOKEN   # read once, from the run's token file
    with pytest.raises(Failed):
        job.doors.start_proxy()
    events = (tmp_path / "run" / "state" / "events").read_text()
    assert f"the proxy (access: private) cannot start: {tmp_path}/k.pem: No such file or directory" in events, events
    assert job.doors.proxy is None


def _proxy(job: Job, script: str) -> subprocess.Popen[bytes]:
    """A stand-in for the fan-out to proxy_up: its output is the proxy log, as the job's."""
    proc = job.start(["bash", "-c", script], out=job.log_path("proxy.log"))
    job.doors.proxy = proc
    return proc


def test_the_job_waits_until_rank0s_container_says_the_proxy_listens(tmp_path: Path) -> None:
    job = _job(tmp_path / "run")
    style = job.style
    assert isinstance(style.scheduler, SshScheduler) and isinstance(style.runtime, DockerRuntime)
    assert isinstance(style.proxy, ContainerProxy)
    record = Path(style.proxy.proxy_record())
    record.parent.mkdir(parents=True)
    # The container's word comes after a while: the job waits for it, the proxy still running.
    proc = _proxy(job, f"sleep 0.3; echo ok >{record}; exec sleep 30")
    style.wait_proxy_listening(proc)
    assert proc.poll() is None and record.read_text() == "ok\n"
    proc.kill()
    proc.wait()
    # A port someone else holds: Caddy exits, the container says so, the run fails naming it.
    record.unlink()
    proc = _proxy(job, f"echo 'Error: listen tcp :8000: bind: address already in use'; "
                       f"echo 'failed exited 1' >{record}; exit 1")
    with pytest.raises(Failed):
        style.wait_proxy_listening(proc)
    failed = (tmp_path / "run" / "state" / "events").read_text()
    assert "the proxy (access: private) exited 1: Error: listen tcp :8000: bind: address already in use" in failed
    assert "ports.http 8000" in failed and "taken on dgx01" in failed


def test_no_word_from_the_container_fails_the_start_in_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ftcluster.job.runtimes.docker as docker

    monkeypatch.setattr(docker, "PROXY_START_S", 0.5)
    job = _job(tmp_path / "run")
    Path(job.style.proxy.proxy_record()).parent.mkdir(parents=True)   # type: ignore[attr-defined]
    proc = _proxy(job, "exec sleep 30")
    try:
        with pytest.raises(Failed):
            job.style.wait_proxy_listening(proc)
    finally:
        proc.kill()
        proc.wait()
    assert "did not listen in rank 0's container on dgx01 within 0.5 s" in (tmp_path / "run" / "state" /
                                                                             "events").read_text()


def test_the_job_asks_rank0_through_the_proxy_with_the_token(tmp_path: Path) -> None:
    job = _job(tmp_path / "run", proxy={"tls_cert": "/c.pem", "tls_key": "/k.pem"})
    job.doors.proxy_token = TOKEN
    assert job.doors.triton_at() == ("dgx01", 8000) and job.doors.metrics_port() == 8002
    assert job.doors.via() == Via(TOKEN, True)
    assert job.doors.via().headers() == {"Authorization": f"Bearer {TOKEN}"}
    # Beside rank 0 (Slurm + Docker): Triton's own loopback ports, nothing carried.
    beside = Job(JobConfig.from_json(render_style("docker").files["job.json"]))
    beside.doors.proxy_token = TOKEN
    assert beside.doors.triton_at() == ("127.0.0.1", 8100) and beside.doors.metrics_port() == 8102 \
        and beside.doors.via() == DIRECT
    # access: cluster on ssh + Docker: rank 0's own ports.
    open_ = Job(JobConfig.from_json(render_style("ssh_docker", access="cluster").files["job.json"]))
    open_.rank0_host = "dgx01"
    assert open_.doors.triton_at() == ("dgx01", 8000) and open_.doors.metrics_port() == 8002 \
        and open_.doors.via() == DIRECT


# ------------------------------------------------------------------ the node script, for real

def _functions(names: list[str]) -> str:
    """The node script's bash functions of these names, as rendered."""
    lines = render_style("ssh_docker").files["docker_node.sh"].splitlines(keepends=True)
    out = []
    for name in names:
        i = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}() {{"))
        j = i if lines[i].rstrip().endswith("}") else next(j for j in range(i, len(lines)) if lines[j] == "}\n")
        out += lines[i:j + 1]
    return "".join(out)


LISTEN = ("import socket, sys, time; s = socket.socket(socket.AF_INET6 if sys.argv[1] == '6' else socket.AF_INET); "
          "s.bind(('::' if sys.argv[1] == '6' else '127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
          "time.sleep(60)")


@pytest.mark.parametrize("family", ["4", "6"])
def test_holds_ports_is_true_only_for_the_process_that_listens(family: str) -> None:
    if family == "6" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    listener = subprocess.Popen([sys.executable, "-c", LISTEN, family], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        with socket.socket() as s:   # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]

        def holds(pid: int, *ports: int) -> int:
            return subprocess.run(["bash", "-c", _functions(["holds_ports"]) + 'holds_ports "$@"', "_", str(pid),
                                   *map(str, ports)]).returncode
        assert holds(listener.pid, port) == 0
        assert holds(os.getpid(), port) == 1          # another process: not its port
        assert holds(listener.pid, port, free) == 1   # every port, or none
    finally:
        listener.kill()
        listener.wait()


@pytest.mark.parametrize("ignores_term", [False, True])
def test_proxy_stop_ends_the_runs_caddy_and_removes_its_files(tmp_path: Path, ignores_term: bool) -> None:
    """proxy_stop GRACE: SIGTERM to the recorded Caddy (only while it is that binary), SIGKILL
    after the grace; the folder's files go."""
    folder = tmp_path / "proxy"
    folder.mkdir()
    caddy = folder / "caddy"   # a copy of bash stands in: /proc/PID/exe names it
    caddy.write_bytes(Path("/bin/bash").read_bytes())
    caddy.chmod(0o700)
    body = ("trap '' TERM; " if ignores_term else "") + "sleep 60 & wait"
    stand_in = subprocess.Popen([str(caddy), "-c", body], start_new_session=True)
    (folder / "caddy.pid").write_text(f"{stand_in.pid} 1\n")
    (folder / "key.pem").write_text("KEY")
    script = f"IN_PROXY={folder}; CADDY={caddy}; " + _functions(["is_caddy", "proxy_stop"]) + "proxy_stop 1"
    try:
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert stand_in.wait(timeout=5) == (-9 if ignores_term else -15)
        assert list(folder.iterdir()) == []
    finally:
        try:
            os.killpg(stand_in.pid, 9)   # and its sleep
        except ProcessLookupError:
            pass
        stand_in.wait()
    # A pid that is not the run's Caddy (recycled) is never signalled.
    other = subprocess.Popen(["sleep", "60"])
    try:
        (folder / "caddy.pid").write_text(f"{other.pid} 1\n")
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_stop_removes_a_staged_copy_a_killed_job_left(tmp_path: Path) -> None:
    from ftcluster.schedulers.ssh import SshScheduler
    from ftcluster.run.layout import RunPaths
    from ftcluster.hosts.runner import LocalRunner

    paths = RunPaths("r1", tmp_path / "r1")
    stage = paths.state / "proxy-stage"
    stage.mkdir(parents=True)
    (stage / "caddy").write_text("#!/bin/sh\n")
    SshScheduler(LocalRunner()).release_resources(paths)
    assert not stage.exists() and paths.state.is_dir()
