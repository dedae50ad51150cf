"""The job supervisor (ftcluster/job, shipped as scripts/ftcluster_job): what each style runs, and
a teardown that runs to its end whatever signal arrives meanwhile.

The argv tests build the supervisor from a rendered run's job.json, as the job does, and ask its
style what it would run; the teardown test runs a real local job (a stand-in tritonserver that
ignores SIGTERM, under a one-rank stand-in mpirun) and signals it the way scancel does, twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftcluster.job.config import JobConfig
from ftcluster.job.supervisor import Job
from ftcluster.render.scripts import RenderedScripts, RenderOptions, render
from tests.unit.test_render import PYTHON, RUN_DIR, render_style


def job_of(files: dict[str, str]) -> Job:
    """The supervisor a run folder's job.json starts."""
    return Job(JobConfig.from_json(files["job.json"]))


def test_job_json_round_trips() -> None:
    for style in ("local", "none", "pyxis", "docker", "ssh_docker"):
        text = render_style(style).files["job.json"]
        assert JobConfig.from_json(text).to_json() == text


def test_pyxis_steps_carry_the_container_flags_and_the_node_steps_never_do() -> None:
    job = job_of(render_style("pyxis").files)
    flags = job.cfg.container_flags
    assert [f.split("=", 1)[0] for f in flags] == ["--container-image", "--container-mounts", "--container-name",
                                                   "--container-workdir"]
    world = job.style.world.srun_world()   # type: ignore[attr-defined]
    assert world[:6] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert world[6:] == flags
    # Nothing re-enters the servers' named container beside them (NVIDIA/pyxis#130: a later step
    # sees the image without its mounts): the node steps run on the hosts.
    every = job.style.every_node("/x/%N.log")
    assert every[:2] == ["srun", "--overlap"] and not any(a.startswith("--container") for a in every)


def test_bare_slurm_steps_have_no_container_flags() -> None:
    job = job_of(render_style("none").files)
    assert not any(a.startswith("--container") for a in job.style.world.srun_world())   # type: ignore[attr-defined]


def test_docker_world_is_mpirun_from_rank0s_container() -> None:
    job = job_of(render_style("docker").files)
    style = job.style
    style.runtime.hosts, style.runtime.rank0_node = ["n1", "n2"], "n1"   # type: ignore[attr-defined]  # what up() finds through Slurm
    node_script = f"{RUN_DIR}/scripts/docker_node.sh"
    # The servers' mpirun gives a failed world the exit grace; the MPI check's and a step's none.
    assert style.world.from_rank0("mpirun", "bash", "X", "rank") == [  # type: ignore[attr-defined]
        "bash", node_script, "exec", "bash", node_script, "mpirun", "n1:1,n2:1", "bash", "X", "rank"]
    assert style.world.mpi_world("python3", "check.py") == [
        "bash", node_script, "exec", "bash", node_script, "mpirun_brief", "n1:1,n2:1", "python3", "check.py"]
    ssh = job_of(render_style("ssh_docker").files)
    ssh.style.runtime.find_hosts()   # type: ignore[attr-defined]
    assert ssh.style.runtime.in_rank0_container("true")[:6] == [      # type: ignore[attr-defined]
        PYTHON, "-m", "ftcluster.hosts.fanout", "--config", f"{RUN_DIR}/scripts/nodes.json", "--hosts"]


# ------------------------------------------------------------------ the teardown runs to its end

STUBBORN_TRITON = """#!/bin/bash
# A loaded tritonserver (FT's instance line: a rank still loading is killed at once) that
# ignores SIGTERM: the job's graceful stop waits for it.
[ "$1" = --help ] && exit 0
trap '' TERM
echo 'I1124 "TRITONBACKEND_ModelInstanceInitialize: m_0 (count 1) (instance_id 0)"'
echo "I1124 started"
exec sleep 600
"""
ONE_RANK_MPIRUN = """#!/bin/bash
# mpirun for one rank: skip the options, start the command as its own process group as mpirun does.
while [ "$1" != bash ]; do shift; done
exec setsid "$@"
"""


def _local_job(tmp_path: Path) -> tuple[RenderedScripts, Path]:
    from tests.helpers_specs import ckpt, cluster, facts, model
    from ftcluster.run.layout import RunPaths
    from ftcluster.engines.fastertransformer.plan import plan_for

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("tritonserver", STUBBORN_TRITON), ("mpirun", ONE_RANK_MPIRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    c = cluster(scheduler="local", gpus_per_node=1, ports={"http": 47100, "grpc": 47101, "metrics": 47102},
                server={"binary": str(bin_dir / "tritonserver"), "exit_grace": 3, "ready_timeout": 60})
    m = model(checkpoint_root="/ckpt")
    plan = plan_for(c, m, facts(), ckpt(tp=1, layers=2), 1, 1)
    run_dir = tmp_path / "run"
    scripts = render(c, m, plan, RunPaths("late", run_dir),
                     RenderOptions(python=sys.executable, mpirun=str(bin_dir / "mpirun")))
    scripts.materialize(run_dir / "scripts")
    return scripts, run_dir


def _events(run_dir: Path) -> list[list[str]]:
    path = run_dir / "state" / "events"
    return [ln.split()[1:] for ln in path.read_text().splitlines()] if path.exists() else []


def _wait_for(what: str, cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_late_signal_does_not_cut_the_teardown_short(tmp_path: Path) -> None:
    """SIGTERM while starting (the job is stopped), then SIGTERM again while the teardown waits
    for rank 0 to go: the teardown still stops every rank, removes what it made and writes done.
    (The bash job of old exited 130 at the teardown's first nap here, skipping both.)"""
    _, run_dir = _local_job(tmp_path)
    tmp = tmp_path / "tmp"   # the job's TMPDIR: where its Open MPI session folder goes
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    job = subprocess.Popen(["bash", str(run_dir / "scripts" / "job.sh")], start_new_session=True, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for("rank 0's pid file", lambda: (run_dir / "state" / "rank0.pid").exists())
        _wait_for("servers_starting", lambda: ["servers_starting", "127.0.0.1"] in _events(run_dir))
        rank0 = int((run_dir / "state" / "rank0.pid").read_text().split()[0])
        # The stubborn server itself must be running (not its wrapper still starting, which a
        # SIGTERM ends at once).
        log = run_dir / "logs" / "server-rank0.log"
        _wait_for("the server", lambda: log.exists() and "I1124 started" in log.read_text())
        assert [p.name[:8] for p in tmp.iterdir()] == ["ftc-mpi."]
        job.send_signal(signal.SIGTERM)
        _wait_for("the interrupt", lambda: ["interrupted"] in _events(run_dir))
        time.sleep(0.5)   # the teardown now waits (exit_grace 3 s) for a rank 0 that ignores SIGTERM
        assert job.poll() is None
        job.send_signal(signal.SIGTERM)
        out = job.communicate(timeout=60)[0].decode()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    kinds = [e[0] for e in _events(run_dir)]
    assert kinds[-2:] == ["servers_stopped", "done"] and _events(run_dir)[-1] == ["done", "130"], (kinds, out)
    assert job.returncode == 130
    # Every rank is gone (its whole process group), and the job's Open MPI session folder too.
    _wait_for("rank 0 to be gone", lambda: not Path(f"/proc/{rank0}").exists(), 10)
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_start_up_ends_the_job_with_130(sig: int, tmp_path: Path) -> None:
    _, run_dir = _local_job(tmp_path)
    job = subprocess.Popen(["bash", str(run_dir / "scripts" / "job.sh")], start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for("servers_starting", lambda: ["servers_starting", "127.0.0.1"] in _events(run_dir))
        job.send_signal(sig)
        assert job.wait(timeout=60) == 130
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert [e[0] for e in _events(run_dir)][-3:] == ["interrupted", "servers_stopped", "done"]


def test_the_shipped_supervisor_is_python_38_and_stdlib_only(tmp_path: Path) -> None:
    """The job host's python3 runs the run folder's copy: no ftcluster, no site-packages."""
    import ast

    scripts = render_style("pyxis")
    shipped = {n: t for n, t in scripts.files.items() if n.startswith("ftcluster_job/")}
    assert shipped
    for name, text in shipped.items():
        ast.parse(text, feature_version=(3, 8), filename=name)
    folder = tmp_path / "scripts"
    scripts.materialize(folder)
    r = subprocess.run([sys.executable, "-I", "-S", "-c",
                        "import sys; sys.path.insert(0, sys.argv[1]); import ftcluster_job.supervisor, "
                        "ftcluster_job.styles; print(sorted(m for m in sys.modules if m.startswith('ftcluster')))",
                        str(folder)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "'ftcluster'" not in r.stdout and "ftcluster_job.names" in r.stdout
    # Its usage line, when started without the run's values.
    r = subprocess.run([sys.executable, "-I", "-S", str(folder / "ftcluster_job")], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2 and "usage: ftcluster_job JOB_JSON" in r.stderr


def test_a_server_log_past_its_cap_is_cut_and_the_writer_goes_on_at_its_start(tmp_path: Path) -> None:
    from ftcluster.job.ranks import RankFiles, cut_server_logs, keep_incarnation

    ranks = RankFiles(str(tmp_path / "state"), str(tmp_path / "logs"), 2)
    os.makedirs(ranks.logs)
    os.makedirs(ranks.state)
    log = Path(ranks.server_log(1))
    # The server's own descriptor, as rank_server.sh's >> opens it.
    with open(log, "ab", buffering=0) as server:
        server.write(b"old line\n" * 1000)
        assert cut_server_logs(ranks, 4096) == [1]
        assert cut_server_logs(ranks, 4096) == []   # now under the cap
        server.write(b"new line\n")
    assert log.read_bytes() == b"new line\n"         # no hole where the old text was
    assert Path(f"{log}.1").read_bytes() == b"old line\n" * 1000
    # A restart keeps both with the incarnation's logs.
    dest = Path(keep_incarnation(ranks.logs, ranks.state, 2, 0))
    assert sorted(p.name for p in dest.iterdir()) == ["server-rank1.log", "server-rank1.log.1"]


# ------------------------------------------------------------------ after a rank's death

def test_no_node_step_when_every_rank_answered_after_a_death(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank's exit line since the death shows its node alive: no probe step. Without them
    (a rank on a lost node writes none), the all-node step asks."""
    from ftcluster.job.ranks import ExitWatch

    job = job_of(render_style("none").files)
    ran: list[list[str]] = []
    monkeypatch.setattr(job, "run", lambda argv, *a, **k: ran.append(list(argv)) or 0)
    monkeypatch.setattr(job.style.scheduler, "job_nodes", lambda: ["n1", "n2"])   # scontrol's, in a job
    (tmp_path / "exits").write_text("")
    job.exits = ExitWatch(str(tmp_path))
    (tmp_path / "exits").write_text("1 137 200.0 died 0\n0 143 200.1 stopped 0\n")
    assert job.exits.died() == (1, "137")   # the serve loop's look
    assert job.node_lost() is False and ran == []
    job.exits.close()
    monkeypatch.setattr("ftcluster.job.supervisor.ANSWERS_S", 0.05)
    (tmp_path / "exits").write_text("")
    job.exits = ExitWatch(str(tmp_path))
    (tmp_path / "exits").write_text("1 137 200.0 died 0\n")   # rank 0's node says nothing
    assert job.exits.died() == (1, "137")
    assert job.node_lost() is False
    assert len(ran) == 1 and ran[0][:2] == ["srun", "--overlap"] and ran[0][-1] == "true"
    job.exits.close()


def test_after_a_death_the_world_is_left_to_end_itself_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """srun (--kill-on-bad-exit) ends the other ranks itself after a death: the step is KILLed
    only if it has not ended within the style's world_ends_s. Without a death (a stop), and
    under mpirun (local), it is KILLed at once."""
    from ftcluster.job.ranks import ExitWatch

    job = job_of(render_style("none").files)
    alive_when_killed: list[bool] = []
    monkeypatch.setattr(job.style, "kill_servers", lambda: alive_when_killed.append(job.style.servers_alive()))
    local = job_of(render_style("local").files)
    monkeypatch.setattr(local.style, "kill_servers", lambda: alive_when_killed.append(local.style.servers_alive()))
    for died, job in ((True, job), (False, job), (True, local)):
        (tmp_path / "exits").write_text("")
        job.exits = ExitWatch(str(tmp_path))
        if died:
            (tmp_path / "exits").write_text("1 137 200.0 died 0\n")
        job.style.servers = subprocess.Popen(["sleep", "0.3"])
        t0 = time.monotonic()
        job.teardown.kill_servers()
        took = time.monotonic() - t0
        job.style.servers.kill()
        job.style.servers.wait()
        job.exits.close()
        assert took >= 0.25 if died and job.style.world_ends_s else took < 0.25
    assert alive_when_killed == [False, True, True]


def test_a_rank_s_last_error_is_what_its_server_said(tmp_path: Path) -> None:
    # Triton's glog lines, as a CPU server that lost the race for its gRPC port writes them; the
    # CUDA complaints every CPU server makes are no cause.
    from ftcluster.job.ranks import LAST_ERROR_BYTES, RankFiles

    ranks = RankFiles(str(tmp_path / "state"), str(tmp_path / "logs"), 3)
    os.makedirs(ranks.logs)
    Path(ranks.server_log(0)).write_text(
        'E1127 10:36:08.633837 28846 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        'I1127 10:36:08.641271 28846 model_lifecycle.cc:472] "loading: fastertransformer:1"\n'
        "E1127 10:36:11.746946754   28839 chttp2_server.cc:1060]                UNKNOWN:No address added\n"
        'E1127 10:36:11.750393 28839 main.cc:245] "failed to start GRPC service: Unavailable - Socket '
        "'0.0.0.0:18001' already in use \"\n"
        "I1127 10:36:11.760000 28839 server.cc:305] Waiting for in-flight requests to complete.\n")
    assert ranks.last_error(0) == "failed to start GRPC service: Unavailable - Socket '0.0.0.0:18001' already in use"
    Path(ranks.server_log(1)).write_text(
        'E1127 10:36:08.633837 28846 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        "I1127 10:36:08.641271 28846 model_lifecycle.cc:472] loading\n")
    assert ranks.last_error(1) is None
    assert ranks.last_error(2) is None   # no log at all
    Path(ranks.server_log(2)).write_text(
        "E1127 10:37:38.1 30300 model_lifecycle.cc:654] \"failed to load 'fastertransformer' version 1: Internal: "
        "RuntimeError: refuses to load\\n\\nAt:\\n  /x/model.py(198): initialize\\n\"\n")
    assert ranks.last_error(2) == "failed to load 'fastertransformer' version 1: Internal: RuntimeError: refuses to load"
    # Only the log's end is read: an error before its last LAST_ERROR_BYTES is history.
    with open(ranks.server_log(1), "a") as f:
        f.write("E1127 10:36:09.000000 1 x.cc:1] early trouble\n" + "I1127 10:36:10.000000 1 y.cc:2] fine\n" * 2000)
    assert os.path.getsize(ranks.server_log(1)) > LAST_ERROR_BYTES
    assert ranks.last_error(1) is None


def test_a_node_whose_gpu_needs_a_reset_is_left_like_a_lost_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a fault, a node whose GPU recorded (NVML, through the node's sampler) an event after
    which it takes no work until reset -- fallen off the bus, a double-bit ECC error -- cannot
    serve a restart: the job moves off it as off a lost node. A contained ECC error (XID 94), or
    an event of an earlier incarnation, is no reason to. Its node steps still run (it answers)."""
    from ftcluster.job.gpu_samples import format_event

    job = job_of(render_style("none", run_dir=tmp_path / "run").files)
    state = Path(job.cfg.state)
    state.mkdir(parents=True)
    for rank, host in enumerate(("n1", "n2")):
        (state / f"rank{rank}.host").write_text(f"{host}\n")
    monkeypatch.setattr(job, "node_lost", lambda: False)   # every node ran its step
    job.incarnation_since = 1000.0
    events = state / "gpu-events-rank1"
    events.write_text(format_event(990.0, 2, "GPU-b", "xid", 79) + format_event(1001.0, 0, "GPU-a", "xid", 94))
    assert job.nodes_to_leave() is None
    events.write_text(events.read_text() + format_event(1002.0, 2, "GPU-b", "xid", 79))
    nodes, why = job.nodes_to_leave() or ([], "")
    assert nodes == ["n2"] and why.startswith("unusable until its GPU is reset: n2: GPU 2 XID 79 (GPU has fallen off "
                                              "the bus) at "), why
    assert job.style.lost == []
    (state / "gpu-events-rank0").write_text(format_event(1003.0, 1, "GPU-c", "ecc_dbe", 0))
    assert (job.nodes_to_leave() or ([], ""))[0] == ["n1", "n2"]


def test_the_proxys_log_is_appended_to_and_cut_while_it_writes(tmp_path: Path) -> None:
    """The proxy's log (Caddy logs each request it could not pass on: an outage under load)
    is cut as the servers' are: the proxy's output is appended to, so a proxy started again
    keeps why the one before ended, and after a cut its next line lands at the new start."""
    from ftcluster.job.ranks import cut_log

    _, run_dir = _local_job(tmp_path)
    job = job_of({"job.json": (run_dir / "scripts" / "job.json").read_text()})
    log, go = tmp_path / "proxy.log", tmp_path / "go"
    log.write_bytes(b"the proxy before ended\n")
    child = job.start(["bash", "-c", f'for i in {{1..500}}; do echo old line; done; '
                                     f'while [ ! -e {go} ]; do sleep 0.01; done; echo new line'],
                      out=str(log), append=True)
    try:
        _wait_for("the proxy's lines", lambda: log.stat().st_size > 4096)
        assert cut_log(str(log), 4096) and not cut_log(str(log), 4096)
        go.touch()
        assert child.wait(30) == 0
    finally:
        child.kill()
    assert log.read_bytes() == b"new line\n"             # no hole where the old text was
    assert Path(f"{log}.1").read_bytes().startswith(b"the proxy before ended\nold line\n")


def test_a_stop_asked_for_ends_the_job_well_and_says_so(tmp_path: Path) -> None:
    """`ftcluster stop` leaves state/stop before its SIGTERM: the job says `stopped` and ends 0
    (a stop asked for is no failure); the same SIGTERM without it is an interruption (130)."""
    _, run_dir = _local_job(tmp_path)
    job = subprocess.Popen(["bash", str(run_dir / "scripts" / "job.sh")], start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for("servers_starting", lambda: ["servers_starting", "127.0.0.1"] in _events(run_dir))
        (run_dir / "state" / "stop").write_text("local:1@1\n")
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    kinds = [e[0] for e in _events(run_dir)]
    assert kinds[kinds.index("interrupted") + 1] == "stopped" and _events(run_dir)[-1] == ["done", "0"], kinds
