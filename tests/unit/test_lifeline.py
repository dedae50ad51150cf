"""What the job starts dies with it (lifeline: PR_SET_PDEATHSIG), whatever kills the supervisor;
and a proxy is never started on a port that a listener the job did not start holds (Caddy binds
with SO_REUSEPORT, which would split the clients between the two)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftcluster.job.config import JobConfig
from ftcluster.job.listeners import taken_ports
from ftcluster.job.supervisor import Failed, Job
from tests.launch_helpers import alive, free_port_base, wait_for
from tests.unit.test_render import render_style

REPO = Path(__file__).resolve().parents[2]



def _job(state: Path, style: str = "local") -> Job:
    cfg = JobConfig.from_json(render_style(style).files["job.json"])
    return Job(cfg._replace(state=str(state), logs=str(state)))


def test_a_child_of_the_job_dies_with_a_supervisor_killed_without_its_teardown(tmp_path: Path) -> None:
    # A supervisor of its own (a process: the one SIGKILLed), whose child is started as the
    # job starts every child.
    code = ("import sys, time; sys.path[:0] = sys.argv[1:2]\n"
            "from tests.unit.test_lifeline import _job\n"
            "from pathlib import Path\n"
            "child = _job(Path(sys.argv[2])).start(['sleep', '300'])\n"
            "print(child.pid, flush=True); time.sleep(300)\n")
    sup = subprocess.Popen([sys.executable, "-c", code, str(REPO), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert sup.stdout is not None
        child = int(sup.stdout.readline())
        assert alive(child)
        sup.kill()
        sup.wait()
        assert wait_for(lambda: not alive(child), 5), "the child outlived its supervisor"
    finally:
        sup.kill()
        sup.wait()


LISTENER = ("import socket, sys, time\n"
            "s = socket.socket(socket.AF_INET6)\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
            "s.bind(('::', int(sys.argv[1]))); s.listen(); print('up', flush=True); time.sleep(300)\n")


def _listener(port: int, folder: Path) -> subprocess.Popen[str]:
    """A listener of another program's on `port`, bound as Caddy binds (SO_REUSEPORT)."""
    script = folder / "ftc_other_listener.py"
    script.write_text(LISTENER)
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


def test_a_port_held_by_another_listener_is_named_with_its_holder(tmp_path: Path) -> None:
    port = free_port_base()
    assert taken_ports([port]) == []
    other = _listener(port, tmp_path)
    try:
        (said,) = taken_ports([port, port + 1])
        assert said == f"{port} (pid {other.pid}: {sys.executable} {tmp_path}/ftc_other_listener.py {port})"
        # One of the job's own (a proxy that drains) is no other's.
        assert taken_ports([port], ours=[other.pid]) == []
        # A connection in TIME_WAIT is no listener.
        with socket.create_connection(("127.0.0.1", port)):
            pass
    finally:
        other.kill()
        other.wait()
    assert taken_ports([port]) == []


def test_the_proxy_is_not_started_beside_a_listener_it_did_not_start(tmp_path: Path) -> None:
    port = free_port_base()
    scripts = render_style("none")
    config = json.loads(scripts.files["proxy.json"])
    servers = config["apps"]["http"]["servers"]
    servers["http"]["listen"], servers["grpc"]["listen"] = [f":{port}"], [f":{port + 1}"]
    (tmp_path / "proxy.json").write_text(json.dumps(config))
    job = _job(tmp_path, "none")
    assert job.cfg.proxy is not None
    job.cfg = job.cfg._replace(proxy=job.cfg.proxy._replace(config=str(tmp_path / "proxy.json")))
    job.doors.check_proxy_ports()   # free: nothing to say
    other = _listener(port + 1, tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(Failed):
            job.doors.check_proxy_ports()
        assert time.monotonic() - t0 < 10
    finally:
        other.kill()
        other.wait()
    failed = (tmp_path / "events").read_text().split(" ", 2)[2]
    assert f"access: private: the proxy cannot listen on {socket.gethostname()}: a process this job did not start " \
           f"holds ports.grpc {port + 1} (pid {other.pid}: {sys.executable} {tmp_path}/ftc_other_listener.py " \
           f"{port + 1}); a proxy beside it would share the port" in failed, failed


# A stand-in for the supervisor's Python in the entry script (the spec's `python`): it records
# each start with what the script passed it, then dies by SIGKILL (its first start, or once it is
# told to stop: a supervisor killed during its teardown) or ends by itself.
STUB = """#!/bin/bash
echo "start ${FTC_SUPERVISOR_DIED:-first}" >> "$STARTS"
trap 'echo term >> "$STARTS"; kill -KILL $$' TERM
[[ -n $FTC_SUPERVISOR_DIED ]] && exit 0
[[ -n $WAIT_FOR_TERM ]] && { while :; do sleep 0.05; done; }
kill -KILL $$
"""


def _entry_script(tmp_path: Path) -> Path:
    from ftcluster.render.scripts import RenderOptions, RunPaths, render
    from tests.unit.test_render import SPECS, _model, _plan, cluster

    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    # No probe: the test model's config.pbtxt is not there to make one from.
    server = {**SPECS["none"]["server"], "restarts": 2, "liveness": {"interval": 0}}  # type: ignore[dict-item]
    c = cluster(**{**SPECS["none"], "server": server})
    scripts = render(c, _model(), _plan(c, 2), RunPaths("gpt-2n", tmp_path / "run"),
                     RenderOptions(python=str(stub), keep_serving=True))
    script = tmp_path / "job.sbatch"
    script.write_text(scripts.files["job.sbatch"])
    return script


def test_the_entry_script_starts_a_supervisor_that_died_by_a_signal_again(tmp_path: Path) -> None:
    script = _entry_script(tmp_path)
    starts = tmp_path / "starts"
    r = subprocess.run(["bash", str(script)], env={**os.environ, "STARTS": str(starts)}, timeout=30)
    assert r.returncode == 0 and starts.read_text().split("\n")[:2] == ["start first", "start 137"]


def test_the_entry_script_does_not_start_a_supervisor_told_to_stop_again(tmp_path: Path) -> None:
    script = _entry_script(tmp_path)
    starts = tmp_path / "starts"
    proc = subprocess.Popen(["bash", str(script)], env={**os.environ, "STARTS": str(starts), "WAIT_FOR_TERM": "1"})
    assert wait_for(lambda: starts.exists(), 10)
    proc.send_signal(signal.SIGTERM)   # scancel, stop: passed on to the supervisor, which dies by SIGKILL
    assert proc.wait(timeout=10) == 137 and starts.read_text() == "start first\nterm\n"
