"""`ftcluster launch` on the real multi-node Slurm test cluster (srun --mpi=pmix, bare style):
end to end on 2 and 3 nodes, the MPI check, faults, Ctrl-C, re-attaching, partitions."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from ftcluster.job.names import FILES
from ftcluster.job.submit import queue_state
from ftcluster.hosts.runner import CommandResult, LocalRunner
from ftcluster.schedulers.slurm_cli import Slurm
from ftcluster.client.ready import server_id
from tests.launch_helpers import (
    assert_served_like_ft,
    ftcluster,
    launch_json,
    processes_matching,
    wait_for,
)

pytestmark = pytest.mark.cluster


def _write_spec(folder: Path, **overrides: Any) -> Path:
    from ftcluster.service.triton_local import find_tritonserver

    spec: dict[str, Any] = {
        "name": "testbed", "scheduler": "slurm", "partition": "debug", "max_nodes": 8,
        "gpus_per_node": 1, "request_gpus": False, "exclusive": False, "time_limit": "00:10:00",
        # The run folder must be on the shared filesystem: /tmp is shared by the test nodes.
        "workspace": str(folder / "ws"),
        "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5},
    }
    spec.update(overrides)
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def spec_dir(slurm_cluster: Any, shared_tmp: Path) -> Path:
    return shared_tmp


def _job_state(job_id: str) -> str:
    """squeue's state of the job, "" once it has left the queue."""
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def _job_gone(job_id: str) -> bool:
    return _job_state(job_id) == ""


def _node_leftovers(run_id: str) -> list[str]:
    """The run's entries in the nodes' /dev/shm and its marks in python_env folders (the bed's
    nodes share this host's /dev/shm and /tmp)."""
    return sorted(glob.glob(f"/dev/shm/{glob.escape(FILES.shm_prefix(run_id))}*")
                  + glob.glob(f"/tmp/python_env_*/.ftc+{glob.escape(run_id)}+*"))


def _assert_clean(out: dict[str, Any]) -> None:
    job = out["job_id"]
    assert wait_for(lambda: _job_gone(job), 30), f"job {job} still queued"
    # Nodes share the process table here, so this sees every node's processes.
    assert wait_for(lambda: not processes_matching(out["run_id"]), 20), processes_matching(out["run_id"])


def test_submission_sbatch_refuses_leaves_nothing(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, sbatch_args=["--constraint=nosuchfeature"])
    proc = ftcluster("launch", "--cluster", str(cluster), "--nodes", "1")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert "sbatch refused the job" in proc.stderr and "feature" in proc.stderr.lower(), proc.stderr
    assert not any((spec_dir / "ws").iterdir())   # no run folder
    assert json.loads(ftcluster("list", "--json").stdout) == []   # no record


@pytest.mark.parametrize("nodes", [2, 3])
def test_launch_end_to_end(spec_dir: Path, nodes: int) -> None:
    cluster = _write_spec(spec_dir)
    rc, out, err = launch_json(cluster, "--nodes", str(nodes))
    assert rc == 0, err
    assert out["ok"] and out["client"]["ok"]
    # The test model returns sequence_length as the real FT does (INT32 under UINT32): a note.
    assert [n.split(":")[0] for n in out["client"]["notes"]] == ["sequence_length"]
    run_dir = Path(out["run_dir"])
    hosts = [(run_dir / "state" / f"rank{r}.host").read_text().strip() for r in range(nodes)]
    assert len(set(hosts)) == nodes, hosts               # one server per node
    assert out["endpoint"] == f"{hosts[0]}:8000"         # the client asked rank 0
    assert out["mpicheck"]["ok"] and len(out["mpicheck"]["ranks"]) == nodes
    assert sorted(r["host"] for r in out["mpicheck"]["ranks"]) == sorted(hosts)
    assert_served_like_ft(run_dir, out["run_id"], nodes)
    _assert_clean(out)
    # The job's output ends with its verdict, after srun's lines of the servers' stop.
    (slurm_out,) = (run_dir / "logs").glob("slurm-*.out")
    assert slurm_out.read_text().splitlines()[-1].startswith(f"ftcluster: run {out['run_id']} ended well; ")


def test_rank_dying_at_startup_fails_fast_names_it_and_cancels(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    rc, out, err = launch_json(cluster, "--nodes", "2", env={"FTCLUSTER_TEST_BREAK_NODE": "node2"})
    assert rc == 1
    assert out["failed_rank"] == {"rank": "1", "node": "node2", "exit_code": out["failed_rank"]["exit_code"]}
    assert out["failed_rank"]["exit_code"] != "0"
    assert any("refuses to load" in line for line in out["log_tail"]), out["log_tail"]
    # Within a few seconds of the servers starting (the model load fails at once).
    assert out["phases"]["done"] - out["phases"]["servers_starting"] < 15
    _assert_clean(out)


# Not slurmctld: after a restart that follows other crashes it may find the nodes DOWN and
# requeue the running job (the launch then fails naming the requeue: the test below); alone,
# a killed slurmctld during the load was ridden out (rc 0, 2 of 2 runs).
@pytest.mark.parametrize("daemon", ["slurmd-node2"])
def test_launch_survives_a_crashed_daemon(spec_dir: Path, slurm_cluster: Any, daemon: str) -> None:
    """A node's slurmd killed while the ranks load; the bed's supervisor restarts it (as systemd
    would). The steps outlive their slurmd. The launch succeeds and nothing of the run is left."""
    import threading
    import time

    cluster = _write_spec(spec_dir)
    killed: list[int] = []

    def kill_while_loading() -> None:
        ws = spec_dir / "ws"
        if wait_for(lambda: any("servers_starting" in p.read_text() for p in ws.glob("*/state/events")), 60):
            # slurmctld saves the job's start a moment after the allocation; a crash before that
            # makes it requeue the job (test below). Here the crash comes during the load.
            time.sleep(3)
            killed.append(slurm_cluster.crash(daemon))

    killer = threading.Thread(target=kill_while_loading)
    killer.start()
    t0 = time.monotonic()
    try:
        rc, out, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check",
                                   env={"FTCLUSTER_TEST_LOAD_DELAY": "15"})
    finally:
        killer.join()
    assert killed, "the daemon was never killed"
    assert rc == 0, (out.get("failure"), err)
    assert out["ok"] and out["client"]["ok"]
    assert time.monotonic() - t0 < 90
    assert any(r["old_pid"] == killed[0] for r in slurm_cluster.restarts())
    _assert_clean(out)


class _Seen(LocalRunner):
    """The real runner, keeping each command it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[tuple[str, int]] = []

    def run(self, argv: list[str], **kw: Any) -> CommandResult:
        res = super().run(argv, **kw)
        self.ran.append((argv[0], res.returncode))
        return res


def test_an_sbatch_slurmctld_did_not_answer_is_found_not_submitted_twice(slurm_cluster: Any, shared_tmp: Path) -> None:
    """slurmctld frozen while sbatch asks (a controller restarting or overloaded): sbatch gives
    up after MessageTimeout (10 s), but its request waits in the controller's socket and becomes
    a job once the controller reads it. The submission finds that job (by the folder it was
    submitted from) instead of failing with a job left behind, or leaving two.
    And a job's question of the queue (a balancer's of its successor) tells the silence from a
    job squeue no longer lists."""
    folder = shared_tmp / "unanswered"
    folder.mkdir()
    argv = ["sbatch", "--parsable", "-N1", "-p", "debug", "-t", "2", "-o", "/dev/null", "--wrap", "sleep 60"]
    ctld = slurm_cluster.current_pid("slurmctld")
    runner = _Seen()

    def asker(conf: Path) -> Callable[[list[str], str | None, float], tuple[int, str, str]]:
        def run(cmd: list[str], cwd: str | None, timeout: float) -> tuple[int, str, str]:
            r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, "SLURM_CONF": str(conf)})
            return r.returncode, r.stdout, r.stderr
        return run

    # squeue waits out a frozen controller (it answered once thawed); one it cannot reach (here
    # its port closed) it gives up on after ~18 s: "Unable to contact slurm controller". Asked
    # beside the submission, which takes as long.
    unreachable = shared_tmp / "unreachable.conf"
    unreachable.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", slurm_cluster.conf_path.read_text()))
    asked: list[str | None] = []
    while_silent = threading.Thread(target=lambda: asked.append(queue_state(asker(unreachable), "999999")))
    while_silent.start()
    os.kill(ctld, signal.SIGSTOP)
    thaw = threading.Timer(15, os.kill, (ctld, signal.SIGCONT))
    thaw.start()
    try:
        job = Slurm(runner).submit(argv, cwd=str(folder))
    finally:
        thaw.join()
        os.kill(ctld, signal.SIGCONT)
        while_silent.join()
    try:
        assert runner.ran[0][0] == "sbatch" and runner.ran[0][1] != 0, runner.ran   # it did time out
        assert asked == [None]                                      # silent: not "gone"
        run = asker(slurm_cluster.conf_path)
        assert queue_state(run, str(int(job) + 100000)) == ""       # a job squeue does not list: gone
        assert queue_state(run, job) in ("PENDING", "CONFIGURING", "RUNNING")
        listed = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%Z"], capture_output=True, text=True,
                                check=True).stdout.splitlines()
        assert [line.split("|")[0] for line in listed if line.endswith("|" + str(folder))] == [job], listed
    finally:
        for line in subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%Z"], capture_output=True,
                                   text=True).stdout.splitlines():
            if line.endswith("|" + str(folder)):
                subprocess.run(["scancel", line.split("|")[0]], check=False)


def test_a_requeued_job_fails_cleanly(spec_dir: Path, slurm_cluster: Any) -> None:
    """Slurm requeues a started job after a node or slurmctld failure (scontrol requeue here):
    its ranks are killed and it goes back to PENDING. The launch says so and cancels it instead
    of waiting for a re-run that would start from scratch."""
    import threading

    cluster = _write_spec(spec_dir)

    def requeue_while_loading() -> None:
        ws = spec_dir / "ws"
        events = lambda: "".join(p.read_text() for p in ws.glob("*/state/events"))  # noqa: E731
        if wait_for(lambda: "servers_starting" in events(), 60):
            job = next(line.split()[3] for line in events().splitlines() if " job_started " in line)
            slurm_cluster.slurm(["scontrol", "requeue", job])

    requeuer = threading.Thread(target=requeue_while_loading)
    requeuer.start()
    try:
        rc, out, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check",
                                   env={"FTCLUSTER_TEST_LOAD_DELAY": "30"}, timeout=120)
    finally:
        requeuer.join()
    assert rc == 1, err
    # Either Slurm's TERM reached the job script first (it ends, saying it was stopped by a
    # signal) or the launcher saw the job PENDING again; both name the requeue.
    assert "requeue" in out["failure"], out["failure"]
    _assert_clean(out)
    # Slurm ended the steps without the job's teardown. A rank that got to it freed its own
    # /dev/shm entries and python_env folders; one that Slurm killed first (srun, signalled twice,
    # KILLs its tasks) left them: the next run's rank on the node frees them once they are a
    # minute old and no process there serves their run. Aged here rather than waited for.
    left = _node_leftovers(out["run_id"])
    for path in left:
        os.utime(path, (time.time() - 120, time.time() - 120))
    rc, again, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check")
    assert rc == 0, err
    assert _node_leftovers(out["run_id"]) == [], (left, _node_leftovers(out["run_id"]))


def test_readiness_timeout_fails_cleanly(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, server={"binary": "auto", "ready_timeout": 4, "exit_grace": 3})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check",
                               env={"FTCLUSTER_TEST_LOAD_DELAY": "120"})
    assert rc == 1
    assert "not ready after 4s" in out["failure"]
    _assert_clean(out)


def test_stale_server_on_rank0_port_is_not_taken_for_ready(spec_dir: Path, slurm_cluster: Any) -> None:
    from ftcluster.service.triton_local import find_tritonserver

    empty = spec_dir / "empty_repo"
    empty.mkdir()
    # Rank 0 lands on node1 (the first node of the allocation); a stale server holds its ports.
    stale = subprocess.Popen(
        [*slurm_cluster.net.enter("node1"), str(find_tritonserver()), f"--model-repository={empty}",
         "--id=stale-server"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def stale_up() -> bool:
            return server_id("node1", 8000, timeout=1) == "stale-server"

        assert wait_for(stale_up, 30)
        # Triton's own ports on the cluster network (a private run's proxy would find 8000 taken).
        cluster = _write_spec(spec_dir, access="cluster")
        rc, out, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check")
        assert rc == 1
        assert "ready" not in out["phases"]
        assert out["failed_rank"]["rank"] == "0" and out["failed_rank"]["node"] == "node1"
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()
    _assert_clean(out)


def _newest_run(ws: Path) -> Path | None:
    runs = sorted(p.parent for p in ws.glob("*/state")) if ws.exists() else []
    return runs[-1] if runs else None


def _events(run_dir: Path | None) -> str:
    try:
        return (run_dir / "state" / "events").read_text() if run_dir else ""
    except FileNotFoundError:
        return ""


def test_ctrl_c_cancels_the_job(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2",
                             "--no-mpi-check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FTCLUSTER_TEST_LOAD_DELAY": "120"})
    ws = spec_dir / "ws"
    assert wait_for(lambda: "servers_starting" in _events(_newest_run(ws)), 60)
    # Interrupted while the model loads: the python backend stubs are up and stuck in load, so a
    # stub whose tritonserver ends first is orphaned (and must still go).
    run = _newest_run(ws)
    assert run is not None
    assert wait_for(lambda: sum("triton_python_backend_stub" in p for p in processes_matching(run.name)) == 2, 60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130 and "cancelled" in err, (proc.returncode, err)
    run_dir = _newest_run(ws)
    assert run_dir is not None
    status = json.loads(ftcluster("status", run_dir.name, "--json").stdout)
    assert wait_for(lambda: _job_gone(status["job_id"]), 30)
    assert wait_for(lambda: not processes_matching(run_dir.name), 20), processes_matching(run_dir.name)


def test_killed_launcher_leaves_job_that_status_logs_and_stop_reattach(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir)
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2",
                             "--no-mpi-check", "--keep-serving", "--no-client"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ws = spec_dir / "ws"
    assert wait_for(lambda: "ready" in _events(_newest_run(ws)), 60)
    proc.kill()
    proc.wait()
    run_dir = _newest_run(ws)
    assert run_dir is not None
    status = json.loads(ftcluster("status", run_dir.name, "--json").stdout)
    assert status["state"] == "RUNNING" and status["source"] == "squeue"
    assert sorted(status["nodes"]) == ["node1", "node2"]
    assert [r["state"] for r in status["ranks"]] == ["ready", "loaded"]
    logs = ftcluster("logs", run_dir.name, "--server", "--tail", "5")
    assert "[rank0 node1]" in logs.stdout and "[rank1 node2]" in logs.stdout
    follow = subprocess.Popen([sys.executable, "-m", "ftcluster", "logs", run_dir.name, "-f", "--tail", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert ftcluster("stop", run_dir.name).returncode == 0
    # Stopped everywhere alike: Slurm's books, `status`, `list` and the `logs -f` that followed it.
    _, err = follow.communicate(timeout=60)
    assert follow.returncode == 0 and "stopped by `ftcluster stop`" in err, err
    assert wait_for(lambda: _job_gone(status["job_id"]), 30)
    job = subprocess.run(["scontrol", "show", "job", "-o", status["job_id"]], capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in job, (job, [p.read_text() for p in (run_dir / "logs").glob("slurm-*.out")])
    stopped = json.loads(ftcluster("status", run_dir.name, "--json").stdout)
    assert (stopped["state"], stopped["reason"]) == ("STOPPED", "stopped by `ftcluster stop`"), stopped
    assert [r["status"] for r in json.loads(ftcluster("list", "--json").stdout) if r["run_id"] == run_dir.name] == \
        ["STOPPED"]
    said = [line.split()[1:] for line in _events(run_dir).splitlines()]
    assert ["stopped"] in said and said[-1] == ["done", "0"], said
    assert not (run_dir / "state" / "stop").exists()
    assert wait_for(lambda: _job_gone(status["job_id"]), 30)
    assert wait_for(lambda: not processes_matching(run_dir.name), 20), processes_matching(run_dir.name)


def test_more_nodes_than_the_partition_has_is_refused_before_submit(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, partition="small")
    proc = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2")
    assert proc.returncode == 3
    assert "partition 'small' has 1" in proc.stderr and "Traceback" not in proc.stderr
    assert not (spec_dir / "ws").exists()
    # A dry run checks what a launch checks.
    dry = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2", "--dry-run")
    assert (dry.returncode, dry.stderr, dry.stdout) == (3, proc.stderr, "")


def test_unknown_partition_is_refused_before_submit(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, partition="nosuchpart")
    proc = ftcluster("launch", "--cluster", str(cluster), "--nodes", "1")
    assert proc.returncode == 3
    assert "unknown partition 'nosuchpart'" in proc.stderr and "debug" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (spec_dir / "ws").exists()
    dry = ftcluster("launch", "--cluster", str(cluster), "--nodes", "1", "--dry-run")
    assert (dry.returncode, dry.stderr, dry.stdout) == (3, proc.stderr, "")


@pytest.mark.parametrize("nodes", [2, 3])
def test_mpi_check_alone_passes(spec_dir: Path, nodes: int) -> None:
    cluster = _write_spec(spec_dir)
    proc = ftcluster("check", "--cluster", str(cluster), "--nodes", str(nodes), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    mpi = out["mpicheck"]
    assert mpi["ok"] and mpi["problems"] == []
    assert sorted(r["host"] for r in mpi["ranks"]) == [f"node{i}" for i in range(1, nodes + 1)]
    assert len({r["tritonserver_sha256"] for r in mpi["ranks"]}) == 1
    assert "servers_starting" not in out["phases"]     # only the check ran
    _assert_clean(out)


# Rank 1 of the MPI check dies by SIGSEGV while the count in its file lasts, one a start: as
# Open MPI 5 under srun's PMIx now and then crashes in MPI_Init (open-mpi/ompi#12495).
_CRASH_SITE = """
import os, signal, sys
if os.environ.get("SLURM_PROCID") == "1" and sys.argv[0].endswith("mpicheck.py"):
    with open({count!r}, "r+") as f:
        left = int(f.read() or 0)
        if left > 0:
            f.seek(0); f.truncate(); f.write(str(left - 1)); f.flush()
            os.kill(os.getpid(), signal.SIGSEGV)
"""


@pytest.mark.parametrize("crashes", [1, 2])
def test_mpi_check_whose_rank_crashed_runs_once_more(spec_dir: Path, crashes: int) -> None:
    site = spec_dir / f"crash-site-{crashes}"
    site.mkdir()
    count = site / "count"
    count.write_text(str(crashes))
    (site / "sitecustomize.py").write_text(_CRASH_SITE.format(count=str(count)))
    cluster = _write_spec(spec_dir, env={"PYTHONPATH": str(site)})
    proc = ftcluster("check", "--cluster", str(cluster), "--nodes", "2", "--json")
    out = json.loads(proc.stdout)
    assert count.read_text() == "0"     # both crashes happened: the check ran twice
    logs = Path(out["run_dir"]) / "logs"
    first = (logs / FILES.mpicheck_crash_log).read_text()
    assert re.search(r"^srun: error: node\d: task 1: Segmentation fault", first, re.MULTILINE), first
    said = next(logs.glob("slurm-*.out")).read_text()
    assert re.search(r"a rank of the MPI check crashed, rank 1 on node\d \(Segmentation fault\); .*checking once more", said), said
    events = (Path(out["run_dir"]) / "state" / "events").read_text()
    assert len(re.findall(r" mpicheck_again rank_1_on_node\d_\(Segmentation_fault\)$", events, re.MULTILINE)) == 1, events
    if crashes == 1:
        assert proc.returncode == 0, proc.stderr
        assert out["mpicheck"]["ok"] and len(out["mpicheck"]["ranks"]) == 2
        assert "mpicheck_ok" in out["phases"]
    else:   # the second check crashed too: no third
        assert proc.returncode == 1
        assert re.match(r"MPI check failed: rank 1 on node\d \(Segmentation fault\)", out["failure"]), out["failure"]
        assert "mpicheck_ok" not in out["phases"]
    _assert_clean(out)


def test_mpi_check_with_a_wrong_plugin_fails_and_lists_plugins(spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, mpi="pmix_nosuch")
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 1
    assert "MPI check failed" in out["failure"]
    slurm_out = next((Path(out["run_dir"]) / "logs").glob("slurm-*.out")).read_text()
    assert "MPI plugins this cluster offers" in slurm_out and "pmix" in slurm_out
    assert "servers_starting" not in out["phases"]
    _assert_clean(out)


@pytest.mark.parametrize(("override", "named"), [
    ({"env": {"FTC_LIBMPI": "/nonexistent/libmpi.so.40"}},
     "rank [01] on node\\d cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi\\.so\\.40: no such file"),
    # Debian's Open MPI needs PMIx from srun: no plugin, or one it was not built with.
    ({"mpi": "none"}, "rank [01] on node\\d cannot join a world: srun started 2 tasks with --mpi=none"),
    ({"mpi": "pmi2"}, "rank [01] on node\\d: its MPI made a world of 1, but 2 tasks were started \\(--mpi=pmi2\\)"),
])
def test_mpi_check_fails_cleanly_when_the_world_cannot_form(spec_dir: Path, override: dict[str, Any],
                                                            named: str) -> None:
    cluster = _write_spec(spec_dir, **override)
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 1
    assert out["failure"].startswith("MPI check failed: "), out["failure"]
    assert re.search(named, out["failure"]), out["failure"]
    assert "mpicheck_ok" not in out["phases"] and "servers_starting" not in out["phases"]
    _assert_clean(out)


def test_port_in_use_on_a_node_is_named(spec_dir: Path, slurm_cluster: Any) -> None:
    """Ports are on the compute nodes, so only the rank can see one in use: it says which."""
    tb = slurm_cluster
    squatters = []
    try:
        for node in tb.nodes:   # whichever nodes Slurm picks, the HTTP port is taken there
            sq = subprocess.Popen(
                [*tb.net.enter(node), sys.executable, "-c",
                 "import socket, time\n"
                 "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                 "s.bind(('0.0.0.0', 18700)); s.listen(); print('ok', flush=True); time.sleep(300)"],
                stdout=subprocess.PIPE, text=True)
            squatters.append(sq)
            assert sq.stdout is not None and sq.stdout.readline().strip() == "ok"
        # A private run (the default): Triton listens proxy.loopback_offset (100) above the spec's
        # ports, behind the proxy. The message names the port the user wrote, and the shift.
        cluster = _write_spec(spec_dir, ports={"http": 18600, "grpc": 18601, "metrics": 18602})
        rc, out, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check")
    finally:
        for sq in squatters:
            sq.kill()
            sq.wait()
    assert rc == 1 and out["ok"] is False
    said = "ports.http: 18600 + proxy.loopback_offset 100 = port 18700 (Triton behind the proxy) is in use on node"
    assert out["failure"].startswith(said), out["failure"]
    assert "choose other ports or another proxy.loopback_offset" in out["failure"]
    # The job's output says why, not "last lines of its log:" over nothing (the rank wrote none).
    (slurm_out,) = Path(out["run_dir"], "logs").glob("slurm-*.out")
    assert re.search(r"rank \d on node\d exited before its server wrote a line: " + re.escape(said),
                     slurm_out.read_text()), slurm_out.read_text()
    _assert_clean(out)


def test_weird_workspace_path(weird_tmp_path: Path, slurm_cluster: Any) -> None:
    """Spaces, quotes and `'; touch` in the run folder's path survive sbatch and srun --mpi=pmix."""
    cluster = _write_spec(weird_tmp_path)
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 0 and out["client"]["ok"], err
    assert out["run_dir"].startswith(str(weird_tmp_path))
    assert not list(weird_tmp_path.parent.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    _assert_clean(out)


def test_a_rendered_folder_submitted_by_hand_is_followed(spec_dir: Path, tmp_path: Path) -> None:
    """`render --out DIR`, then plain `sbatch DIR/scripts/job.sbatch` from another directory (a
    Slurm user's way): the job runs in its folder, and `status`, `logs` and `stop DIR` follow it."""
    from ftcluster.spec.defaults import embedded_model_path

    cluster = _write_spec(spec_dir, setup=["export FTC_SITE_SETUP=ran"])
    out = spec_dir / "by-hand"
    rendered = ftcluster("render", "--cluster", str(cluster), "--model", str(embedded_model_path()), "--nodes", "2",
                         "--keep-serving", "--no-client", "--out", str(out))
    assert rendered.returncode == 0, rendered.stderr
    sub = subprocess.run(["sbatch", "--parsable", str(out / "scripts" / "job.sbatch")], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    job = sub.stdout.strip().split(";")[0]
    try:
        def serving() -> bool:
            st = ftcluster("status", str(out), "--json")
            return st.returncode == 0 and json.loads(st.stdout)["phase"] == "serving"
        assert wait_for(serving, 90, interval=1), (ftcluster("status", str(out)).stdout
                                                   + ftcluster("status", str(out)).stderr
                                                   + "".join(p.read_text()[-2000:] for p in (out / "logs").glob("*")))
        st = json.loads(ftcluster("status", str(out), "--json").stdout)
        assert st["job_id"] == job and st["state"] == "RUNNING" and st["run_dir"] == str(out.resolve())
        assert list((out / "logs").glob(f"slurm-{job}.out"))   # its log in its own folder
        logs = ftcluster("logs", str(out), "--server", "--tail", "3")
        assert logs.returncode == 0 and "[rank0 " in logs.stdout, logs.stderr
        # The setup lines ran in the job; srun passed their environment on to the ranks.
        env0 = subprocess.run(["bash", "-c", f"cat /proc/$(cut -d' ' -f1 {out}/state/rank0.pid)/environ"],
                              capture_output=True, check=False).stdout
        assert b"FTC_SITE_SETUP=ran" in env0
        stopped = ftcluster("stop", str(out))
        assert stopped.returncode == 0 and "stopped run" in stopped.stdout, stopped.stderr
        assert wait_for(lambda: _job_gone(job), 30)
    finally:
        subprocess.run(["scancel", job], check=False)
    assert wait_for(lambda: not processes_matching(str(out)), 20), processes_matching(str(out))
