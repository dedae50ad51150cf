"""A serving run outlives its job's time limit, for real on the Slurm test cluster: Slurm's
notice before the limit (--signal=B:USR1@lead) makes the job submit a successor of the same plan
on other nodes; once it serves, the old job ends by itself before its limit and the endpoint
moves. A successor that stays pending leaves the old job serving to its end, and status says so.
`stop` of the first run stops the chain; nothing is left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_launch_slurm import _job_gone, _job_state, _write_spec
from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for

pytestmark = pytest.mark.cluster

# A 2-minute limit: the 90 s lead is cut to half the limit, so the notice comes about a minute
# after the start (Slurm's periodic check sends it a few seconds early), and the old job would
# end at 2 minutes.
HANDOVER: dict[str, Any] = {"time_limit": "2", "server_handover_lead": 90}


def _status(run_id: str) -> dict[str, Any]:
    out = ftcluster("status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _first_token(run_id: str) -> dict[str, str]:
    """The first run's token: a private run's successors keep it, so its clients keep working."""
    got = ftcluster("token", run_id)
    assert got.returncode == 0, got.stderr
    return {"FTCLUSTER_TOKEN": got.stdout.strip()}


def _spec(folder: Path, time_limit: str = HANDOVER["time_limit"], **values: Any) -> Path:
    from ftcluster.service.triton_local import find_tritonserver

    server = {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5,
              "handover_lead": HANDOVER["server_handover_lead"], "liveness": {"interval": 1, "deadline": 2}}
    return _write_spec(folder, time_limit=time_limit, server=server, **values)


def _job_over(job_id: str) -> bool:
    """Gone from the queue, or COMPLETING: its batch script has ended (its processes are the
    test's own check)."""
    return _job_state(job_id) in ("", "COMPLETING")


def _stop_chain(run_id: str) -> None:
    """Stop the run and its successors, until no run of the chain is live (a successor may hand
    over in turn while the test looks)."""
    def chain_live() -> list[str]:
        st, live = _status(run_id), []
        while st["successor"] and st["successor"]["run_id"]:
            st = _status(st["successor"]["run_id"])
            if not _job_over(st["job_id"]):
                live.append(st["run_id"])
        return live
    for _ in range(3):
        # A run the test stopped already, its chain over, has nothing left to stop.
        if _job_over(_status(run_id)["job_id"]) and not chain_live():
            return
        assert ftcluster("stop", run_id).returncode == 0
        if wait_for(lambda: not chain_live(), 30):
            return
    raise AssertionError(f"runs of the chain still live: {chain_live()}")


def _restarting_spec(folder: Path) -> Path:
    """A serving run that restarts (twice in a row at most), its probe seeing a hang in 2 s."""
    from ftcluster.service.triton_local import find_tritonserver

    return _write_spec(folder, server={"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5,
                                       "restarts": 2, "restart_backoff": 1,
                                       "liveness": {"interval": 1, "deadline": 1, "failures": 2}})


def _assert_answers(run_id: str, endpoint: str) -> None:
    """The client's check passes against `endpoint` with the run's (first) token."""
    check = ftcluster("client", "identity", "--url", endpoint, "--model", "fastertransformer",
                      env=_first_token(run_id))
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_successor_serves_before_the_time_limit_and_the_endpoint_moves(slurm_cluster: Any, shared_tmp: Path) -> None:
    folder = shared_tmp
    # The time limit and the partition from the command line, which the spec file says otherwise
    # ("small" is node1 alone: a successor there, without the run's node, could never start);
    # the file moved away once launched. The successor is made from what the run was launched with.
    spec = _spec(folder, time_limit="10", partition="small")
    rc, out, err = launch_json(spec, "--nodes", "1", "--keep-serving", "--no-client",
                               "--time", HANDOVER["time_limit"], "--partition", "debug")
    assert rc == 0 and out["ok"], err
    spec.rename(folder / "moved.yaml")
    run_id, old_endpoint = out["run_id"], out["endpoint"]
    # `logs -f` of the first run follows the service: on into the successor at the hand-over.
    follow = subprocess.Popen([sys.executable, "-m", "ftcluster", "logs", run_id, "-f", "--rank", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: (_status(run_id)["successor"] or {}).get("handed_over"), 110), _status(run_id)
        st = _status(run_id)
        successor = st["successor"]
        assert successor["endpoint"] != old_endpoint and successor["excluded"] == [old_endpoint.split(":")[0]]
        new = _status(successor["run_id"])
        assert new["predecessor"] == run_id and new["phase"] == "serving" and new["state"] == "RUNNING"
        limit_and_partition = subprocess.run(["squeue", "-h", "-j", new["job_id"], "-o", "%l %P"],
                                             capture_output=True, text=True).stdout.split()
        assert limit_and_partition == ["2:00", "debug"], limit_and_partition
        assert new["endpoint"] == successor["endpoint"]
        _assert_answers(run_id, successor["endpoint"])
        # The old job drained and ended by itself, well before its limit: not TIMEOUT.
        assert wait_for(lambda: _job_gone(out["job_id"]), 30)
        events = (Path(out["run_dir"]) / "state" / "events").read_text()
        assert events.rstrip().endswith("done 0"), events
        text = ftcluster("status", run_id)
        assert "handed over to run" in text.stdout and successor["endpoint"] in text.stdout
        # `top` of the first run shows the service: the successor that serves it now.
        top = ftcluster("top", run_id, "--json")
        assert top.returncode == 0 and json.loads(top.stdout)["run_id"] == successor["run_id"], top.stdout + top.stderr
        # `report` of the first run: both runs, one move, and no outage (they overlapped).
        rep = json.loads(ftcluster("report", run_id, "--json").stdout)
        assert [r["run_id"] for r in rep["runs"]] == [run_id, successor["run_id"]], rep["runs"]
        assert rep["moves"][0]["cause"] == "time limit" and rep["availability"]["outages"] == [], rep
        assert rep["availability"]["fraction"] == 1.0, rep["availability"]
    finally:
        _stop_chain(run_id)
        try:
            followed, said = follow.communicate(timeout=60)
        finally:
            follow.kill()
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    # Both runs' rank 0 logs, the first's then its successor's, in one stream that ended with the
    # chain's last job.
    assert f"(run {run_id} was succeeded by run {successor['run_id']}: following it)" in said, said
    assert followed.count("Started HTTPService") >= 2, followed[-3000:]


def test_a_successor_that_stays_pending_leaves_the_old_job_serving_to_its_end(slurm_cluster: Any, shared_tmp: Path) -> None:
    folder = shared_tmp
    # Two nodes taken whole first, so the run gets the third and its successor (which must not
    # use the run's node) waits, whenever Slurm's notice comes.
    blocker = subprocess.run(["sbatch", "--parsable", "-N2", "-w", "node2,node3", "--exclusive",
                              "-p", "debug", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300"],
                             capture_output=True, text=True, check=True).stdout.strip()
    run_id = ""
    try:
        assert wait_for(lambda: subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True,
                                               text=True).stdout.strip() == "RUNNING", 30)
        # A 1-minute limit: the notice comes at about half of it (the lead is cut to half the limit).
        rc, out, err = launch_json(_spec(folder, time_limit="1"), "--nodes", "1", "--keep-serving", "--no-client")
        assert rc == 0 and out["ok"], err
        run_id = out["run_id"]
        assert out["endpoint"].split(":")[0] == "node1"
        assert wait_for(lambda: ((_status(run_id)["successor"] or {}).get("state") == "PENDING"), 80), \
            _status(run_id)
        st = _status(run_id)
        assert st["state"] == "RUNNING" and st["phase"] == "serving" and st["successor"]["reason"]
        assert "is starting; this run serves until it does" in ftcluster("status", run_id).stdout
        # The old job serves to its limit (1 minute; Slurm's check comes up to 30 s late), then
        # Slurm ends it.
        assert wait_for(lambda: _job_gone(out["job_id"]), 150)
        assert "DUE TO TIME LIMIT" in "".join(p.read_text() for p in (Path(out["run_dir"]) / "logs").glob("slurm-*"))
        assert _status(run_id)["successor"]["state"] == "PENDING"
    finally:
        subprocess.run(["scancel", blocker], check=False)
        if run_id:
            _stop_chain(run_id)
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def _serving_chain_member(run_id: str) -> dict[str, Any] | None:
    """The status of the run of the chain that serves now, if one does."""
    st = _status(run_id)
    while st["successor"] and st["successor"]["run_id"]:
        st = _status(st["successor"]["run_id"])
    health = (st.get("health") or {}).get("last_probe") or {}
    return st if st["phase"] == "serving" and st["state"] == "RUNNING" and health.get("answered") else None


def test_a_lost_node_moves_the_service_to_a_new_job_without_it(slurm_cluster: Any, shared_tmp: Path) -> None:
    """Rank 1's machine lost (its slurmd silent, the job's processes there gone): the probe
    finds the world hung, a step no longer runs on that node, so no restart in this allocation
    can work; the job submits a successor without it and ends, and the successor serves."""
    spec = _restarting_spec(shared_tmp)
    rc, out, err = launch_json(spec, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    nodes = _status(run_id)["nodes"]
    lost = nodes[1]
    try:
        with slurm_cluster.node_lost(lost, out["job_id"]):
            # Not the run itself: until its probe misses, its last answered probe says it serves.
            def moved() -> bool:
                member = _serving_chain_member(run_id)
                return member is not None and member["run_id"] != run_id
            assert wait_for(moved, 120), _status(run_id)
            new = _serving_chain_member(run_id)
            assert new is not None and lost not in new["nodes"] and new["run_id"] != run_id
            successor = _status(run_id)["successor"]
            assert successor["excluded"] == [lost] and not successor["handed_over"]
            events = (Path(out["run_dir"]) / "state" / "events").read_text()
            assert f"node_lost {lost}" in events and events.rstrip().endswith("done 0"), events
            # The successor has the run's own restarts and counts on from the lost node's fault.
            job = json.loads((Path(new["run_dir"]) / "scripts" / "job.json").read_text())
            assert job["restarts"] == 2 and len(job["carried_faults"]) == 1, job["carried_faults"]
            assert job["carried_faults"][0].endswith(f"(node {lost} lost)"), job["carried_faults"]
            assert job["service"] == run_id   # its metrics targets' ftcluster_service: the first run's
            _assert_answers(run_id, new["endpoint"])
            # `report` of the first run: the service's two runs, its move, its one outage.
            rep = json.loads(ftcluster("report", run_id, "--json").stdout)
            assert [r["run_id"] for r in rep["runs"]] == [run_id, new["run_id"]], rep["runs"]
            assert rep["moves"][0]["cause"] == f"node lost: {lost}", rep["moves"]
            (outage,) = rep["availability"]["outages"]
            assert 0 < outage["seconds"] < 120 and rep["availability"]["fraction"] < 1, rep["availability"]
    finally:
        _stop_chain(run_id)
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def test_a_lost_batch_host_is_requeued_by_slurm_and_serves_again(slurm_cluster: Any, shared_tmp: Path) -> None:
    """The machine running the job's supervisor lost: nothing of the job can act, so a serving
    job is submitted with --requeue; Slurm requeues it once it declares the node down
    (SlurmdTimeout), the job starts again on other nodes as a restart of the same run, and
    serves."""
    spec = _restarting_spec(shared_tmp)
    rc, out, err = launch_json(spec, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    batch_host = _status(run_id)["nodes"][0]
    try:
        with slurm_cluster.node_lost(batch_host, out["job_id"]):
            def serving_again() -> bool:
                st = _status(run_id)
                return bool(st["restarts"]) and st["phase"] == "serving" and st["state"] == "RUNNING" and \
                    bool(((st["health"] or {}).get("last_probe") or {}).get("answered"))
            # SlurmdTimeout (20 s here) until Slurm declares the node down and requeues the job,
            # then cred_expire (15 s here; 120 s by default) before it may start again.
            assert wait_for(serving_again, 150), _status(run_id)
            st = _status(run_id)
            assert batch_host not in st["nodes"] and st["job_id"] == out["job_id"]
            assert st["restarts"][-1]["cause"].startswith("Slurm requeued the job (restart 1): its batch host was lost")
            _assert_answers(run_id, st["endpoint"])
            assert (Path(out["run_dir"]) / "logs" / "incarnation-0" / "rank0.host").is_file()
            # `report`: one outage, from the lost attempt's last sign of life to the new ready.
            rep = json.loads(ftcluster("report", run_id, "--json").stdout)
            (outage,) = rep["availability"]["outages"]
            assert outage["cause"].startswith("the job ended unheard") and 20 < outage["seconds"] < 150, outage
    finally:
        _stop_chain(run_id)
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)


def test_a_preempted_serving_job_is_requeued_and_serves_again(slurm_cluster: Any, shared_tmp: Path) -> None:
    """Preemption on a partition that requeues (PreemptMode=REQUEUE; `scontrol requeue` does the
    same): Slurm TERMs the job, which stops its world and ends, and puts it back in the queue;
    `status` says so while it waits, and once it starts again it serves as a restart of the same
    run, its cause naming the preemption. A `logs -f` following the run goes on into the new
    attempt."""
    spec = _restarting_spec(shared_tmp)
    rc, out, err = launch_json(spec, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    follow = subprocess.Popen([sys.executable, "-m", "ftcluster", "logs", run_id, "-f", "--rank", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        slurm_cluster.slurm(["scontrol", "requeue", out["job_id"]])
        assert wait_for(lambda: _status(run_id)["state"] == "PENDING", 60), _status(run_id)
        st = _status(run_id)
        assert st["phase"] == "requeued" and st["phase_label"] == "requeued: waiting to start again", st

        def serving_again() -> bool:
            st = _status(run_id)
            return bool(st["restarts"]) and st["phase"] == "serving" and st["state"] == "RUNNING"
        assert wait_for(serving_again, 150), _status(run_id)   # Slurm holds a requeued job ~cred_expire
        st = _status(run_id)
        assert st["job_id"] == out["job_id"] and len(st["restarts"]) == 1
        assert st["restarts"][0]["cause"] == ("Slurm requeued the job (restart 1): it was preempted or requeued by "
                                              "hand (the earlier attempt was told to stop)")
        _assert_answers(run_id, st["endpoint"])
        assert follow.poll() is None, follow.communicate()
    finally:
        _stop_chain(run_id)
        try:
            followed, said = follow.communicate(timeout=60)
        finally:
            follow.kill()
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
    # One stream: rank 0's log of each attempt, ended by the stop.
    assert f"(run {run_id}: the job was requeued by Slurm: following its next start)" in said, said
    assert followed.count("Started HTTPService") >= 2, followed[-3000:]


def test_a_fault_while_slurmctld_is_silent_is_restarted_in_place_once_it_answers(slurm_cluster: Any,
                                                                                  shared_tmp: Path) -> None:
    """slurmctld frozen (a controller's restart or overload) when a rank dies: no step runs on
    any node, the batch host's own neither, which loses no node. The job waits for the
    controller, then restarts the world in its allocation (before: both nodes taken for lost, a
    successor refused, the service ended)."""
    spec = _restarting_spec(shared_tmp)
    rc, out, err = launch_json(spec, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    events = Path(out["run_dir"]) / "state" / "events"
    ctld = slurm_cluster.current_pid("slurmctld")
    try:
        os.kill(ctld, signal.SIGSTOP)
        try:
            [rank1] = [re.search(r"\(pid (\d+),", line).group(1)  # type: ignore[union-attr]
                       for line in processes_matching(run_id) if "tritonserver " in line and f"{run_id}-rank1 " in line]
            os.kill(int(rank1), signal.SIGKILL)
            assert wait_for(lambda: " slurm_unanswered " in events.read_text(), 60), events.read_text()
            # status answers meanwhile, from the run's own files, saying Slurm did not.
            st = _status(run_id)
            assert st["state"] == "UNKNOWN" and st["reason"].startswith("Slurm did not answer (")
            assert st["phase_label"] == "waiting for slurmctld to answer"
        finally:
            os.kill(ctld, signal.SIGCONT)

        def serving_again() -> bool:
            st = _status(run_id)
            return len(st["restarts"]) == 1 and st["phase"] == "serving" and st["state"] == "RUNNING"
        assert wait_for(serving_again, 90), _status(run_id)
        st = _status(run_id)
        assert st["job_id"] == out["job_id"] and st["successor"] is None and " node_lost " not in events.read_text()
        assert st["restarts"][0]["cause"].startswith("rank 1 on ") and "while serving" in st["restarts"][0]["cause"]
        _assert_answers(run_id, st["endpoint"])
        # The step whose end a node could not report while slurmctld was frozen keeps the job
        # COMPLETING for a minute (its slurmstepd's retries): `stop` ends with the job's own
        # `done`, every rank stopped, not with Slurm's bookkeeping.
        began = time.monotonic()
        stopped = ftcluster("stop", run_id)
        assert stopped.returncode == 0 and time.monotonic() - began < 30, (time.monotonic() - began, stopped.stderr)
        # Asked to stop, the job says so and ends well (a stopped run is STOPPED, not FAILED).
        kinds = [line.split()[1] for line in events.read_text().splitlines()]
        assert "stopped" in kinds and events.read_text().rstrip().endswith(" done 0"), events.read_text()[-500:]
        # A second `stop` while Slurm still holds the job COMPLETING: stopped already, at once.
        if _job_state(out["job_id"]) == "COMPLETING":
            began = time.monotonic()
            again = ftcluster("stop", run_id)
            assert again.returncode == 0 and time.monotonic() - began < 10, (time.monotonic() - began, again.stderr)
    finally:
        _stop_chain(run_id)
    assert wait_for(lambda: not processes_matching(run_id), 30), processes_matching(run_id)
