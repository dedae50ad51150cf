"""A serving run that stays up, for real: a rank that freezes (alive, silent: every request hangs
while Triton's readiness still says 200) is found by the probe through rank 0; a slow rank 0 (a
probe behind a long request) is not taken for a hang; a fault restarts the whole world, which
serves again (the client's check passes); restarts exhausted fail the run naming every cause and
run the on_failure hook; `stop` during a restart leaves nothing. Locally and on the Slurm test
cluster (bare style), with the test model's FREEZE, DIE and SLOW faults (first incarnation only,
unless FTCLUSTER_TEST_FAULTS_ALWAYS)."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ftcluster.run.events import EV, parse_events
from ftcluster.job.names import FILES
from tests.integration.test_launch_slurm import _job_gone, _write_spec
from tests.launch_helpers import (fill, ftcluster, launch_json, processes_matching, small_filesystem, wait_for,
                                  write_cluster)

LIVENESS = {"interval": 1, "deadline": 1, "failures": 2}
NO_RESTARTS = {"liveness": LIVENESS, "restarts": 0}
RESTARTS = {"liveness": LIVENESS, "restarts": 1, "restart_backoff": 1}


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
    # Each rank's last log line: rank 1's is the test model's own word that it froze.
    assert "; rank 1 on " in st["failure"] and "FTCLUSTER_TEST_FREEZE_NODE: rank 1 froze at" in st["failure"]
    health = st["health"]
    assert health["consecutive_misses"] == 2 and health["last_ok"] is not None and health["probes"] >= 3
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    # `report`: the run answered until its first missed probe, not until the verdict (2 probes on).
    events, quiet, report = _hang_reported(st)
    ready, failed = (next(e.time for e in events if e.kind == k) for k in (EV.ready, EV.failed))
    assert health["last_ok"] < quiet and abs(quiet - health["unanswered_since"]) < 0.001 and failed - quiet > 1.0
    assert report["runs"][0]["served_s"] == round(quiet - ready, 3)
    return st


def _hang_reported(st: dict[str, Any]) -> tuple[list[Any], float, dict[str, Any]]:
    """A hung run's events, its first missed probe's time (the `unanswered` event's) and its
    `report --json`."""
    events = parse_events((Path(st["run_dir"]) / "state" / FILES.events).read_text())
    quiet = float(next(e for e in events if e.kind == EV.unanswered).args[0])
    got = ftcluster("report", st["run_id"], "--json")
    assert got.returncode == 0, got.stderr
    return events, quiet, json.loads(got.stdout)


@pytest.mark.triton
def test_a_frozen_rank_is_found_and_the_run_fails_locally(tmp_path: Path) -> None:
    st = _frozen_run_fails_naming_the_hang(write_cluster(tmp_path, server=NO_RESTARTS), "rank1@2")
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
def test_a_frozen_rank_is_found_and_the_job_ends_on_slurm(slurm_cluster: Any, shared_tmp: Path) -> None:
    folder = shared_tmp
    cluster = _write_spec(folder, server={"binary": _write_spec_binary(), "ready_timeout": 60, "exit_grace": 5,
                                          **NO_RESTARTS})
    st = _frozen_run_fails_naming_the_hang(cluster, "rank1@2")
    assert wait_for(lambda: _job_gone(st["job_id"]), 30)


def shm_entries(run_id: str) -> list[str]:
    """What the run's ranks named in /dev/shm (the test bed's nodes share it)."""
    return sorted(p.name for p in Path(FILES.shm_dir).glob(glob.escape(FILES.shm_prefix(run_id)) + "*"))


def restarted_and_serving(launched: tuple[int, dict[str, Any], str], cause: str,
                          env: dict[str, str] | None = None, host_tmp: bool = True) -> dict[str, Any]:
    """A launch with a fault in the first incarnation: restarted once, serving again, and the
    client's check passes against the same endpoint; the first incarnation's logs kept; the
    ranks' shared memory under the run's prefix, all of it gone after `stop`."""
    rc, out, err = launched
    assert rc == 0 and out["ok"], err
    run_id, endpoint = out["run_id"], out["endpoint"]

    def status() -> dict[str, Any]:
        got = ftcluster("status", run_id, "--json", env=env)
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)  # type: ignore[no-any-return]

    def serving_again() -> bool:
        st = status()
        return len(st["restarts"]) == 1 and st["phase"] == "serving" and \
            ((st["health"] or {}).get("last_probe") or {}).get("answered") is True
    try:
        assert wait_for(serving_again, 120), status()
        st = status()
        assert st["state"] == "RUNNING" and st["failure"] is None
        assert st["restarts"][0]["cause"].startswith(cause) and st["restarts"][0]["job_id"] == out["job_id"]
        # The run's endpoint (and its token, where it is private) by --run.
        assert status()["endpoint"] == endpoint
        check = ftcluster("client", "identity", "--run", run_id, "--model", "fastertransformer", env=env)
        assert check.returncode == 0, check.stdout + check.stderr
        kept = Path(out["run_dir"]) / "logs" / "incarnation-0"
        assert (kept / "server-rank1.log").is_file() and (kept / "rank1.host").is_file()
        earlier = ftcluster("logs", run_id, "--incarnation", "0", "--server", "--tail", "3", env=env)
        assert earlier.returncode == 0 and any(line.startswith("[rank1 ") and " #0] " in line
                                               for line in earlier.stdout.splitlines()), earlier.stdout
        current = ftcluster("logs", run_id, "--server", "--tail", "3", env=env)
        assert "earlier incarnations, restarted: 0" in current.stderr and " #0]" not in current.stdout
        assert ftcluster("logs", run_id, "--incarnation", "1", env=env).returncode != 0
        # The python backend's regions of both ranks, under the run's prefix.
        named = shm_entries(run_id)
        assert any(n.startswith(FILES.shm_prefix(run_id, 0, 1) + "py+") for n in named), named
        assert any(n.startswith(FILES.shm_prefix(run_id, 1, 1) + "py+") for n in named), named
        # The killed incarnation's python backend folders went with its restart, not at the run's
        # end (host_tmp: the servers' /tmp is this machine's, not a container's own).
        if host_tmp:
            assert glob.glob(f"/tmp/python_env_*/.ftc+{glob.escape(run_id)}+r*+i1")
            assert glob.glob(f"/tmp/python_env_*/.ftc+{glob.escape(run_id)}+r*+i0") == []
    finally:
        assert ftcluster("stop", run_id, env=env).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    assert shm_entries(run_id) == []
    return st


def _restarted_and_serving(cluster: Path, env: dict[str, str], cause: str) -> dict[str, Any]:
    return restarted_and_serving(launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client", env=env),
                                 cause)


@pytest.mark.triton
def test_a_hung_world_is_restarted_and_serves_again_locally(tmp_path: Path) -> None:
    st = _restarted_and_serving(write_cluster(tmp_path, server=RESTARTS), {"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2"},
                                "the MPI world is hung")
    # One outage, the hang's: from the first missed probe to the restarted world's ready.
    events, quiet, report = _hang_reported(st)
    restarted = next(e.time for e in events if e.kind == EV.restarting)
    again = [e.time for e in events if e.kind == EV.ready][1]
    outages = report["availability"]["outages"]
    assert [(o["from"], o["to"]) for o in outages] == [(quiet, again)] and restarted - quiet > 1.0, outages
    assert outages[0]["cause"].startswith("the MPI world is hung")


def _a_stopped_server_is_found(cluster: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Rank 0's whole server process SIGSTOPped at its 2nd request (a real FT rank: its frontend
    and metrics stop too): found as a hang, every request of the check bounded by the probe's
    deadline (before, the metrics reads waited 2 s each, one probe after another: 10 s here), the
    stopped processes killed, the world restarted and serving."""
    st = _restarted_and_serving(cluster, {"FTCLUSTER_TEST_STOP_NODE": "rank0@2", **(env or {})},
                                "the MPI world is hung")
    events = parse_events((Path(st["run_dir"]) / "state" / "events").read_text())
    missed = float(next(e.args[0] for e in events if e.kind == EV.unanswered))
    restarting = next(e.time for e in events if e.kind == EV.restarting)
    formula = (LIVENESS["failures"] - 1) * LIVENESS["interval"] + LIVENESS["deadline"]
    assert formula - 0.1 < restarting - missed < 7.0, restarting - missed
    log = (Path(st["run_dir"]) / "logs" / "incarnation-0" / "server-rank0.log").read_text()
    assert "FTCLUSTER_TEST_STOP_NODE: rank 0 stopped at" in log
    return st


@pytest.mark.triton
def test_a_whole_server_stopped_is_found_and_restarted_locally(tmp_path: Path) -> None:
    _a_stopped_server_is_found(write_cluster(tmp_path, server=RESTARTS))


@pytest.mark.triton
def test_a_rank_that_dies_while_serving_is_restarted_locally(tmp_path: Path) -> None:
    _restarted_and_serving(write_cluster(tmp_path, server=RESTARTS), {"FTCLUSTER_TEST_DIE_NODE": "rank1@2"},
                           "rank 1 on 127.0.0.1 exited (code 137) while serving")


def _restarted_twice_and_serving(st: dict[str, Any], answered: bool = False) -> bool:
    """One status read per look: its restarts, phase and last probe seen together."""
    probe = (st["health"] or {}).get("last_probe") or {}
    return len(st["restarts"]) == 2 and st["phase"] == "serving" and (not answered or probe.get("answered") is True)


@pytest.mark.triton
def test_a_restart_whose_start_up_fails_counts_as_a_fault_and_is_tried_again(tmp_path: Path) -> None:
    # Incarnation 0 freezes while serving; incarnation 1's rank 1 refuses to load; 2 serves.
    cluster = write_cluster(tmp_path, server={**RESTARTS, "restarts": 2})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               env={"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2", "FTCLUSTER_TEST_BREAK_NODE": "rank1@1"})
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    try:
        assert wait_for(lambda: _restarted_twice_and_serving(_status(run_id), answered=True), 90), _status(run_id)
        st = _status(run_id)
        assert st["failure"] is None and st["state"] == "RUNNING"
        first, second = (r["cause"] for r in st["restarts"])
        assert [r["in_a_row"] for r in st["restarts"]] == [1, 2]
        assert first.startswith("the MPI world is hung"), first
        assert second.startswith("rank 1 on 127.0.0.1 exited") and "during start-up" in second, second
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


@pytest.mark.triton
def test_faults_after_a_healthy_stretch_start_the_count_afresh(tmp_path: Path) -> None:
    # Every incarnation's rank 1 dies 6 s after loading, having served for longer than
    # restart_reset: each fault is the first of its count, so with restarts 1 the run outlives a
    # second fault (counted over its life, it would give up there), restarted after the first
    # back-off each time, in incarnations numbered on.
    cluster = write_cluster(tmp_path, server={**RESTARTS, "restart_reset": 1.5})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               env={"FTCLUSTER_TEST_DIE_NODE": "rank1@6", "FTCLUSTER_TEST_FAULTS_ALWAYS": "1"})
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    try:
        assert wait_for(lambda: _restarted_twice_and_serving(_status(run_id)), 90), _status(run_id)
        st = _status(run_id)
        assert st["failure"] is None and st["state"] == "RUNNING", st["failure"]
        assert all(r["cause"].startswith("rank 1 on 127.0.0.1 exited (code 137) while serving") for r in st["restarts"])
        assert [r["in_a_row"] for r in st["restarts"]] == [1, 1]
        events = (Path(out["run_dir"]) / "state" / FILES.events).read_text().splitlines()
        tries = [line.split()[2] for line in events if line.split()[1] == "restarting"]
        assert tries == ["1", "1"], events
        logs = Path(out["run_dir"]) / "logs"
        assert (logs / "incarnation-0").is_dir() and (logs / "incarnation-1").is_dir()
    finally:
        assert ftcluster("stop", run_id).returncode == 0
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


@pytest.mark.triton
def test_a_full_filesystem_neither_ends_a_serving_run_nor_its_restart(tmp_path: Path) -> None:
    # The workspace on a filesystem of its own, filled while the run serves: the servers serve on
    # through probes whose records find no room; a rank that dies meanwhile is restarted once
    # there is room again (its ranks could not say they are up before), and the events kept
    # meanwhile are written then.
    with small_filesystem(tmp_path / "small", "48m") as small:
        cluster = write_cluster(tmp_path, workspace=str(small / "ws"), server=RESTARTS)
        rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client")
        assert rc == 0 and out["ok"], err
        run_id, url = out["run_id"], f"http://{out['endpoint']}/v2/health/ready"
        try:
            filler = fill(small)
            probes = (_status(run_id)["health"] or {}).get("probes", 0)
            time.sleep(3 * LIVENESS["interval"] + 0.5)   # three probes, each record refused
            st = _status(run_id)
            assert st["state"] == "RUNNING" and st["failure"] is None, st["failure"]
            assert st["room"] and st["room"].startswith("the run folder's filesystem has 0 KiB free"), st["room"]
            assert (st["health"] or {}).get("probes", 0) == probes   # not one written
            assert urllib.request.urlopen(url, timeout=5).status == 200
            [rank1] = [re.search(r"\(pid (\d+),", line).group(1)  # type: ignore[union-attr]
                       for line in processes_matching(run_id) if "tritonserver " in line and f"{run_id}-rank1 " in line]
            os.kill(int(rank1), signal.SIGKILL)
            assert wait_for(lambda: not [p for p in processes_matching(run_id) if "tritonserver " in p], 30)
            time.sleep(RESTARTS["restart_backoff"] + 2)   # the back-off over: no servers without room
            assert not [p for p in processes_matching(run_id) if "tritonserver " in p]
            os.unlink(filler)
            assert wait_for(lambda: len(_status(run_id)["restarts"]) == 1 and _status(run_id)["phase"] == "serving",
                            60), _status(run_id)
            st = _status(run_id)
            assert st["room"] is None and st["failure"] is None
            kinds = [line.split()[1] for line in (Path(out["run_dir"]) / "state" / FILES.events).read_text().splitlines()]
            at = kinds.index("restarting")
            assert kinds[at:at + 6] == ["restarting", "servers_stopped", "records_resumed", "servers_starting", "ready",
                                        "serving"], kinds
            assert urllib.request.urlopen(url, timeout=5).status == 200
        finally:
            assert ftcluster("stop", run_id).returncode == 0
        assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


@pytest.mark.triton
def test_restarts_exhausted_fail_naming_every_cause_and_run_the_hook(tmp_path: Path) -> None:
    alert = tmp_path / "alert.txt"
    hook = ["sh", "-c", f'echo "$FTC_RUN_ID: $FTC_FAILURE" > {alert}']
    cluster = write_cluster(tmp_path, server={**RESTARTS, "on_failure": hook})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               env={"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2", "FTCLUSTER_TEST_FAULTS_ALWAYS": "1"})
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    assert wait_for(lambda: _status(run_id)["failure"] is not None, 90)
    st = _status(run_id)
    assert st["failure"].startswith("gave up after 1 restart(s): (1) the MPI world is hung")
    assert "; (2) the MPI world is hung" in st["failure"] and len(st["restarts"]) == 1
    assert alert.read_text().startswith(f"{run_id}: gave up after 1 restart(s)")
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


@pytest.mark.triton
def test_stop_during_a_restart_leaves_nothing(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, server={**RESTARTS, "restart_backoff": 60})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               env={"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2"})
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    assert wait_for(lambda: _status(run_id)["phase"] == "restarting", 30)
    stop = ftcluster("stop", run_id, timeout=30)
    assert stop.returncode == 0, stop.stderr
    assert not processes_matching(run_id)
    assert shm_entries(run_id) == []
    events = (Path(out["run_dir"]) / "state" / "events").read_text()
    # `stop` asked for it: the job says so and ends well (a stopped run is STOPPED, not FAILED).
    kinds = [line.split()[1] for line in events.splitlines()]
    assert "interrupted" in kinds and "stopped" in kinds and events.rstrip().endswith("done 0"), events


@pytest.mark.cluster
def test_a_hung_world_is_restarted_and_serves_again_on_slurm(slurm_cluster: Any, shared_tmp: Path) -> None:
    folder = shared_tmp
    cluster = _write_spec(folder, server={"binary": _write_spec_binary(), "ready_timeout": 60, "exit_grace": 5,
                                          **RESTARTS})
    st = _restarted_and_serving(cluster, {"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2"}, "the MPI world is hung")
    assert wait_for(lambda: _job_gone(st["job_id"]), 30)


@pytest.mark.cluster
def test_a_whole_server_stopped_is_found_and_restarted_on_slurm(slurm_cluster: Any, shared_tmp: Path) -> None:
    cluster = _write_spec(shared_tmp, server={"binary": _write_spec_binary(), "ready_timeout": 60, "exit_grace": 5,
                                              **RESTARTS})
    st = _a_stopped_server_is_found(cluster)
    assert wait_for(lambda: _job_gone(st["job_id"]), 30)


def _write_spec_binary() -> str:
    from ftcluster.service.triton_local import find_tritonserver

    return str(find_tritonserver())
