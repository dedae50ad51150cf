"""A serving run outlives its own supervisor and a run folder that takes no writes, for real on
the bare Slurm test cluster (private access: Caddy in front of rank 0 with the run's token).

- The supervisor SIGKILLed on the batch host (by hand, the OOM killer): its proxy dies with it
  (no orphan keeps the endpoint's ports with the old token), and the job's entry script starts it
  again in the same job: serving again with the same token and endpoint, status naming the cause.
- state/ read-only while serving: the service answers throughout, the job's log says why its
  records wait, and its events are written in order once state/ takes writes again."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_launch_slurm import _write_spec
from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for

pytestmark = pytest.mark.cluster


def _spec(folder: Path) -> Path:
    from ftcluster.service.triton_local import find_tritonserver

    return _write_spec(folder, server={"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5,
                                       "restarts": 2, "liveness": {"interval": 1, "deadline": 2}})


def _status(run_id: str) -> dict[str, Any]:
    out = ftcluster("status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _answers(endpoint: str, token: str) -> bool:
    """The endpoint passes a request on to a ready rank 0 with the run's token."""
    req = urllib.request.Request(f"http://{endpoint}/v2/health/ready", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def serving(slurm_cluster: Any, shared_tmp: Path) -> Any:
    rc, out, err = launch_json(_spec(shared_tmp), "--nodes", "1", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    token = ftcluster("token", out["run_id"]).stdout.strip()
    try:
        yield out, token
    finally:
        assert ftcluster("stop", out["run_id"]).returncode == 0
        assert wait_for(lambda: not processes_matching(out["run_id"]), 30), processes_matching(out["run_id"])


def test_a_killed_supervisor_is_started_again_in_its_job_and_leaves_no_proxy_behind(serving: Any) -> None:
    out, token = serving
    run_dir, endpoint = out["run_dir"], out["endpoint"]
    (supervisor,) = _pids(f"ftcluster_job {run_dir}/scripts/job.json")
    (proxy,) = _pids(f"caddy run --config {run_dir}/scripts/proxy.json")
    subprocess.run(["kill", "-KILL", str(supervisor)], check=True)
    # The proxy went with it at once: no listener with the run's token is left behind.
    assert wait_for(lambda: proxy not in _pids(f"caddy run --config {run_dir}/scripts/proxy.json"), 2)
    # The entry script started it again: the same job serves again, with the same token and endpoint.
    events = Path(run_dir, "state", "events")
    assert wait_for(lambda: events.read_text().splitlines()[-1].split()[1:2] == ["serving"]
                    and "supervisor died" in events.read_text(), 60), events.read_text()
    st = _status(out["run_id"])
    assert st["job_id"] == out["job_id"] and st["state"] == "RUNNING" and st["phase"] == "serving", st
    assert st["endpoint"] == endpoint and _answers(endpoint, token)
    assert any("the job's supervisor died (SIGKILL); started again in the same job" in r["cause"]
               for r in st["restarts"]), st["restarts"]
    (again,) = _pids(f"ftcluster_job {run_dir}/scripts/job.json")
    assert again != supervisor and len(_pids(f"caddy run --config {run_dir}/scripts/proxy.json")) == 1
    # Nothing of the world before is left: one tritonserver, the new incarnation's.
    servers = [c for c in processes_matching(out["run_id"]) if Path(c.split()[0]).name == "tritonserver"]
    assert len(servers) == 1, servers


def test_a_read_only_state_folder_leaves_the_service_up_and_its_events_in_order(serving: Any) -> None:
    out, token = serving
    run_dir, endpoint = Path(out["run_dir"]), out["endpoint"]
    state = run_dir / "state"
    (supervisor,) = _pids(f"ftcluster_job {run_dir}/scripts/job.json")
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        # Several probes' and samples' records refused (FTC_TEST_READ_ONLY_S: a longer window).
        until = time.monotonic() + float(os.environ.get("FTC_TEST_READ_ONLY_S", "6"))
        while time.monotonic() < until:
            assert _answers(endpoint, token)
            time.sleep(0.5)
    finally:
        subprocess.run(["umount", str(state)], check=True)
    writable = time.monotonic()
    events = state / "events"
    assert wait_for(lambda: "records_resumed" in events.read_text(), 10), events.read_text()
    assert time.monotonic() - writable < 10
    times = [float(line.split()[0]) for line in events.read_text().splitlines()]
    assert times == sorted(times)
    log = (run_dir / "logs" / f"slurm-{out['job_id']}.out").read_text()
    assert "the run folder's filesystem refuses the job's writes" in log and "Read-only file system" in log, log
    assert _pids(f"ftcluster_job {run_dir}/scripts/job.json") == [supervisor] and _answers(endpoint, token)
    assert _status(out["run_id"])["phase"] == "serving"
