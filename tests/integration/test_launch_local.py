"""`ftcluster launch` with the local launcher, for real: CPU tritonserver ranks, the client,
faults, Ctrl-C, re-attaching with status/stop, and leaving nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ftcluster.client.ready import ours_ready
from tests.launch_helpers import (
    assert_served_like_ft,
    ftcluster,
    launch_json,
    processes_matching,
    wait_for,
    write_cluster,
)

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module", autouse=True)
def _tritonserver_available() -> None:
    from ftcluster.errors import UserError
    from ftcluster.service.triton_local import find_tritonserver

    try:
        find_tritonserver()
    except UserError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))


def _assert_nothing_left(run_id: str) -> None:
    assert wait_for(lambda: not processes_matching(run_id), 15), processes_matching(run_id)


def test_launch_two_local_ranks_runs_client_and_cleans_up(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path)
    tmp = Path(tempfile.gettempdir())
    mpi_tmp_before = set(tmp.glob("ftc-mpi.*")) | set(tmp.glob("ompi.*"))
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 0, err
    assert out["ok"] is True
    # Open MPI's session folder of the run (under its own TMPDIR), which the SIGKILLed mpirun
    # cannot remove, is gone with the run.
    assert set(tmp.glob("ftc-mpi.*")) | set(tmp.glob("ompi.*")) <= mpi_tmp_before
    for phase in ("submitted", "servers_starting", "ready", "client_started", "client_done", "done"):
        assert phase in out["phases"], out["phases"]
    assert out["client"]["ok"] is True
    # The test model returns sequence_length as the real FT does (INT32 under UINT32): a note.
    assert [n.split(":")[0] for n in out["client"]["notes"]] == ["sequence_length"]
    run_dir = Path(out["run_dir"])
    for rank in (0, 1):
        assert (run_dir / "state" / f"rank{rank}.host").read_text().strip() == "127.0.0.1"
    assert_served_like_ft(run_dir, out["run_id"], 2)
    # The prepared config carries the plan: tp = 1 GPU per "node", pp = 2 nodes.
    cfg = (run_dir / "model_repository" / "fastertransformer" / "config.pbtxt").read_text()
    assert 'key: "pipeline_para_size"' in cfg and 'string_value: "2"' in cfg
    # The run's metadata says what served it.
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["run_id"] == out["run_id"] and meta["plan"]["pipeline_para_size"] == 2
    assert meta["model"]["name"] == "fastertransformer" and meta["image"]["built"] is None
    _assert_nothing_left(out["run_id"])
    status = json.loads(ftcluster("status", out["run_id"], "--json").stdout)
    assert status["state"] == "COMPLETED"


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path)
    proc = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "rank_server.sh" in proc.stdout and "would run" in proc.stdout
    assert not (tmp_path / "ws").exists()
    assert json.loads(ftcluster("list", "--json").stdout) == []


def test_rank_that_cannot_start_fails_fast_and_names_it(tmp_path: Path) -> None:
    from ftcluster.service.triton_local import find_tritonserver

    # Rank 1's server cannot start (as with a broken install on one node); rank 0's can.
    wrapper = tmp_path / "tritonserver-rank1-broken"
    wrapper.write_text("#!/bin/bash\n"
                       'if [ "$FTC_RANK" = 1 ]; then echo "error: libtritonserver.so: cannot open" >&2; exit 127; fi\n'
                       f'exec {find_tritonserver()} "$@"\n')
    wrapper.chmod(0o755)
    cluster = write_cluster(tmp_path, server={"binary": str(wrapper)})
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 1
    assert out["ok"] is False
    assert out["failed_rank"]["rank"] == "1" and out["failed_rank"]["exit_code"] == "127"
    assert any("libtritonserver.so: cannot open" in line for line in out["log_tail"]), out["log_tail"]
    assert out["phases"]["done"] < 15
    _assert_nothing_left(out["run_id"])


def test_the_default_cluster_serves_on_ports_free_at_launch(tmp_path: Path) -> None:
    # The embedded default fixes no ports: a listener on 18000 (its old fixed HTTP port, which
    # another user of a shared machine may hold) does not stop a launch, whose ranks serve on a
    # block the launch found free.
    import socket

    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        held.bind(("0.0.0.0", 18000))
        held.listen()
    except OSError:
        pass   # held by something else already: as good
    try:
        env = {k: v for k, v in os.environ.items() if k != "FTCLUSTER_CLUSTER"}
        p = subprocess.run([sys.executable, "-m", "ftcluster", "launch", "--nodes", "2", "--no-client", "--json"],
                           capture_output=True, text=True, timeout=180, check=False,
                           env={**env, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")})
    finally:
        held.close()
    out = json.loads(p.stdout or "{}")
    assert p.returncode == 0 and out["ok"], p.stderr
    assert out["run_dir"].startswith(str(tmp_path)) and not out["endpoint"].endswith(":18000"), out
    _assert_nothing_left(out["run_id"])


def _listen_addresses(port: int) -> set[str]:
    """The addresses something listens on at TCP `port` (IPv4 and IPv6), from /proc/net: "any",
    "loopback" (127.0.0.1, ::1 or ::ffff:127.0.0.1, as gRPC binds) or another, in hex."""
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    found = set()
    for table, any_address in (("tcp", "00000000"), ("tcp6", "0" * 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:   # 0A: LISTEN
                found.add("any" if address == any_address else "loopback" if address in loopback else address)
    return found


def test_a_local_run_serves_this_machine_alone(tmp_path: Path) -> None:
    # The local style runs on one machine: every rank's Triton listens on the loopback, never on
    # the machine's network (access: private is the way to serve it there, behind the proxy).
    cluster = write_cluster(tmp_path)
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    try:
        base = int(out["endpoint"].rpartition(":")[2])
        from ftcluster.plan.facts import LOCAL_PORT_STRIDE

        for k in range(3):   # rank 0's HTTP, gRPC and metrics ports: serving, on the loopback
            assert _listen_addresses(base + k) == {"loopback"}, (base + k, _listen_addresses(base + k))
        # Rank 1 serves rank 0's broadcasts, as FT's do, and opens no port of its own.
        assert all(_listen_addresses(base + LOCAL_PORT_STRIDE + k) <= {"loopback"} for k in range(3))
    finally:
        assert ftcluster("stop", out["run_id"]).returncode == 0
    _assert_nothing_left(out["run_id"])


def test_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A stale server on rank 1's port: refused up front, naming the field, nothing started."""
    from ftcluster.plan.facts import LOCAL_PORT_STRIDE
    from ftcluster.service.triton_local import find_tritonserver

    cluster = write_cluster(tmp_path)
    import yaml

    spec = yaml.safe_load(cluster.read_text())
    ports = {k: v + LOCAL_PORT_STRIDE for k, v in spec["ports"].items()}
    empty_repo = tmp_path / "empty_repo"
    empty_repo.mkdir()
    stale = subprocess.Popen(
        [str(find_tritonserver()), f"--model-repository={empty_repo}", "--id=stale",
         f"--http-port={ports['http']}", f"--grpc-port={ports['grpc']}", f"--metrics-port={ports['metrics']}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def stale_ready() -> bool:
            return ours_ready("127.0.0.1", ports["http"], "stale", timeout=1)

        assert wait_for(stale_ready, 30)
        p = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2")
        assert p.returncode == 3 and "Traceback" not in p.stderr
        assert p.stderr.strip().splitlines()[-1].startswith(
            f"error: ports.http: port {ports['http']} (rank 1) is in use on this machine"), p.stderr
        assert not (Path(spec["workspace"]).exists() and any(Path(spec["workspace"]).iterdir()))
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()


def test_readiness_timeout_fails_cleanly(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path, server={"ready_timeout": 3})
    rc, out, err = launch_json(cluster, "--nodes", "1", env={"FTCLUSTER_TEST_LOAD_DELAY": "60"})
    assert rc == 1
    assert "not ready after 3s" in out["failure"]
    _assert_nothing_left(out["run_id"])


def _events(run_dir: Path) -> str:
    try:
        return (run_dir / "state" / "events").read_text()
    except FileNotFoundError:
        return ""


def _newest_run_dir(ws: Path) -> Path | None:
    runs = sorted(ws.glob("*/state")) if ws.exists() else []
    return runs[-1].parent if runs else None


# The job script's own teardown must run to `done` whenever the TERM lands: bash 5.2 crashed
# (SIGSEGV) in about half of the tries when its trap exited during a `read -t` wait.
# SIGTERM (kill, `timeout`, a CI runner's cancel) is taken as Ctrl-C is: an attached launch
# does not leave its job to serve unwatched.
@pytest.mark.parametrize("sig, pause", [(signal.SIGINT, 0.0), (signal.SIGINT, 0.03), (signal.SIGINT, 0.3),
                                        (signal.SIGTERM, 0.03)])
def test_ctrl_c_cancels_the_run(tmp_path: Path, sig: int, pause: float) -> None:
    cluster = write_cluster(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FTCLUSTER_TEST_LOAD_DELAY": "60"})
    ws = tmp_path / "ws"
    assert wait_for(lambda: (d := _newest_run_dir(ws)) is not None and "servers_starting" in _events(d), 30)
    time.sleep(pause)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    # The README's exit code of an interruption, for SIGTERM too (taken as Ctrl-C).
    assert proc.returncode == 130, (proc.returncode, err)
    assert "interrupted" in err and "cancelled" in err and "Traceback" not in err, err
    run_dir = _newest_run_dir(ws)
    assert run_dir is not None
    _assert_nothing_left(run_dir.name)
    assert "done" in _events(run_dir)


def test_a_running_folder_named_by_path_is_followed_and_stopped(tmp_path: Path) -> None:
    # A run launched with another run store (another FTCLUSTER_STATE_DIR, another login): its
    # folder alone names it. Its job named itself by its pid; the record gets the launcher's id.
    cluster = write_cluster(tmp_path)
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"], err
    run_dir = out["run_dir"]
    other = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp_path / "other-store")}
    st = json.loads(subprocess.run([sys.executable, "-m", "ftcluster", "status", run_dir, "--json"], env=other,
                                   capture_output=True, text=True, timeout=60, check=True).stdout)
    assert st["state"] == "RUNNING" and st["job_id"] == out["run"]["job_id"], st
    stop = subprocess.run([sys.executable, "-m", "ftcluster", "stop", run_dir], env=other, capture_output=True,
                          text=True, timeout=120, check=False)
    assert stop.returncode == 0 and stop.stdout.startswith(f"stopped run {out['run_id']}"), stop.stderr
    _assert_nothing_left(out["run_id"])
    st = json.loads(subprocess.run([sys.executable, "-m", "ftcluster", "status", run_dir, "--json"], env=other,
                                   capture_output=True, text=True, timeout=60, check=True).stdout)
    assert st["job_id"] == out["run"]["job_id"] and st["state"] == "STOPPED", st
    # Named by its folder once more, with a third store, after its job ended: reported, and
    # `stop` has nothing to stop (the id names no process to signal).
    third = {**os.environ, "FTCLUSTER_STATE_DIR": str(tmp_path / "third-store")}
    st = json.loads(subprocess.run([sys.executable, "-m", "ftcluster", "status", run_dir, "--json"], env=third,
                                   capture_output=True, text=True, timeout=60, check=True).stdout)
    # Stopped, told by the run's own events (`stopped`, `done 0`) to a store that never knew it.
    assert st["state"] == "STOPPED" and st["job_id"] == f"{out['run']['job_id'].partition('@')[0]}@0", st
    stop = subprocess.run([sys.executable, "-m", "ftcluster", "stop", run_dir], env=third, capture_output=True,
                          text=True, timeout=60, check=False)
    assert stop.returncode == 0 and "has already ended" in stop.stdout, stop.stderr


def test_killed_launcher_leaves_run_that_status_and_stop_reattach(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2",
                             "--keep-serving", "--no-client"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ws = tmp_path / "ws"
    assert wait_for(lambda: (d := _newest_run_dir(ws)) is not None and "ready" in _events(d), 60)
    proc.kill()
    proc.wait()
    run_dir = _newest_run_dir(ws)
    assert run_dir is not None
    status = json.loads(ftcluster("status", "--json").stdout)
    assert status["run_id"] == run_dir.name
    assert status["state"] == "RUNNING"
    assert [r["state"] for r in status["ranks"]] == ["ready", "loaded"]
    assert processes_matching(run_dir.name)
    stop = ftcluster("stop", run_dir.name)
    assert stop.returncode == 0, stop.stderr
    _assert_nothing_left(run_dir.name)
    assert json.loads(ftcluster("status", "--json").stdout)["state"] != "RUNNING"


def test_weird_workspace_path(weird_tmp_path: Path) -> None:
    cluster = write_cluster(weird_tmp_path)
    rc, out, err = launch_json(cluster, "--nodes", "1")
    assert rc == 0, err
    assert out["run_dir"].startswith(str(weird_tmp_path))
    assert not list(Path.cwd().glob("PWNED*")) and not list(weird_tmp_path.parent.glob("PWNED*"))


def test_env_names_cannot_run_code_and_values_stay_data(tmp_path: Path) -> None:
    """The audit's payloads for real: env NAMES that are the job's variables or bash's are refused
    before anything exists; payload VALUES under ordinary names reach the ranks as strings."""
    payload = "SECONDS[$(touch PWNED)]"
    bad = write_cluster(tmp_path, env={"NODES": payload, "EXIT_GRACE": payload, "BASH_ENV": "$(touch PWNED1)"})
    rc, out, err = launch_json(bad, "--nodes", "1")
    assert rc == 3 and "env" in err and "NODES" in err and "BASH_ENV" in err, err
    assert not (tmp_path / "ws").exists()
    good = write_cluster(tmp_path, env={"MY_SETTING": payload, "NCCL_DEBUG": "$(touch PWNED2)"})
    rc, out, err = launch_json(good, "--nodes", "2")
    assert rc == 0 and out["client"]["ok"] is True, err
    _assert_nothing_left(out["run_id"])
    for root in (tmp_path, Path.cwd(), Path(out["run_dir"])):
        assert not list(root.rglob("PWNED*")), "a payload ran"
