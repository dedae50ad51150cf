"""What a rank leaves in /dev/shm and /tmp, on real files: the rendered rank_server.sh with a
stand-in tritonserver that makes what Triton's python backend makes (a shm region under the
prefix it is given, a /tmp/python_env_XXXXXX folder) and never removes them, as a SIGKILLed
server does not. The wrapper frees its own when the server has ended; a rank starting later
frees what runs that no process serves any more left (a job Slurm ended without its teardown)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from ftcluster.job.names import FILES
from ftcluster.render.scripts import RenderedScripts
from tests.unit.test_render import HOSTILE, SPECS, _hostile_render, _no_pwned, render_style, shlex_quote

SHM = Path(FILES.shm_dir)
PID = os.getpid()
RUN = "gpt-2n"   # render_style's run id


def _server(seconds: float) -> str:
    """A tritonserver stand-in: a region under the python backend's prefix, a python_env folder."""
    return ("#!/bin/bash\n"
            "for a; do case $a in --backend-config=python,shm-region-prefix-name=*) "
            "p=${a#*=}; p=${p#*=}; : > \"/dev/shm/${p}region\";; esac; done\n"
            "mktemp -d /tmp/python_env_XXXXXX >/dev/null\n"
            f"sleep {seconds}\n"
            "exit 3\n")


def _wrapper_of(tmp: Path, server: str, incarnation: int = 0) -> tuple[Path, dict[str, str]]:
    """Rank 1's rendered wrapper with `server` (a script) as its tritonserver: the run folder and
    the wrapper's environment."""
    binary = tmp / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text(server)
    binary.chmod(0o755)
    run_dir = tmp / "run"
    scripts: RenderedScripts = render_style("local", run_dir=run_dir, workspace=str(tmp / "ws"),
                                            server={**SPECS["local"]["server"], "binary": str(binary)})  # type: ignore[dict-item]
    scripts.materialize(run_dir / "scripts")
    return run_dir, {**os.environ, "FTC_RANK": "1", "FTC_RANK_HOST": "127.0.0.1", "FTC_INCARNATION": str(incarnation)}


def _run(tmp: Path, seconds: float, incarnation: int = 0) -> tuple[subprocess.CompletedProcess[str], Path]:
    run_dir, env = _wrapper_of(tmp, _server(seconds), incarnation)
    r = subprocess.run(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=60)
    return r, run_dir


def _ours() -> list[str]:
    return sorted(p.name for p in SHM.glob(FILES.shm_prefix(RUN) + "*"))


@pytest.fixture
def clean() -> Iterator[list[Path]]:
    """Entries a test makes outside its tmp_path, removed whatever happens."""
    made: list[Path] = []
    envs_before = set(Path("/tmp").glob("python_env_*"))
    yield made
    for p in [*made, *SHM.glob(FILES.shm_prefix(RUN) + "*")]:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    for d in set(Path("/tmp").glob("python_env_*")) - envs_before:
        if any(m.name.startswith(f".ftc+{RUN}+") for m in d.iterdir()):
            shutil.rmtree(d, ignore_errors=True)


def test_a_rank_frees_its_own_entries_when_its_server_ends(tmp_path: Path, clean: list[Path]) -> None:
    envs_before = set(Path("/tmp").glob("python_env_*"))
    r, run_dir = _run(tmp_path, 2.5, incarnation=2)
    assert r.returncode == 3, r.stdout + r.stderr
    # The stand-in made them under this incarnation's prefix, and the rank noted its folder
    # (at a look of the load's progress, every 2 s) ...
    noted = (run_dir / "state" / FILES.python_envs).read_text().split()
    assert len(noted) == 1 and noted[0].startswith("/tmp/python_env_"), noted
    # ... and both went when the server had ended, before the rank's exit record.
    assert _ours() == []
    assert set(Path("/tmp").glob("python_env_*")) - envs_before == set()
    assert (run_dir / "state" / "rank1.exit").read_text().split()[2] == "died"


def _python_env() -> Path:
    """A folder named as Triton's python backend names its own (mkdtemp /tmp/python_env_XXXXXX)."""
    out = subprocess.run(["mktemp", "-d", "/tmp/python_env_XXXXXX"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _aged(path: Path, seconds: float) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def test_a_starting_rank_frees_what_dead_runs_left_on_its_node(tmp_path: Path, clean: list[Path]) -> None:
    # Left by "gone-<pid>": a job Slurm ended without its teardown (no process carries its mark).
    gone, live = f"gone-{PID}", f"live-{PID}"
    old_region = SHM / f"ftc+{gone}+r0+i0+py+region"
    old_mpi = SHM / f"ftc+{gone}+r1+i3+mpi"
    young = SHM / f"ftc+{gone}x+r0+i0+py+region"   # just made: a run starting here now
    live_region = SHM / f"ftc+{live}+r0+i0+py+region"
    old_env, shared_env = _python_env(), _python_env()
    clean.extend([old_region, old_mpi, young, live_region, old_env, shared_env])
    for f in (old_region, young, live_region):
        f.write_text("")
    old_mpi.mkdir()
    (old_mpi / "segment").write_text("")
    (old_env / f".ftc+{gone}+r0+i0").write_text("")
    # A folder both the dead run and a live one claimed: only the dead run's mark goes.
    for m in (f".ftc+{gone}+r1+i0", f".ftc+{live}+r0+i0"):
        (shared_env / m).write_text("")
    for p in (old_region, old_mpi, live_region, old_env / f".ftc+{gone}+r0+i0", *shared_env.iterdir()):
        _aged(p, 120)
    # The live run: a process of this node carries its server mark.
    server = subprocess.Popen(["sleep", "60"], env={**os.environ, "FTC_SERVER_OF": f"{live}/rank0/1"})
    try:
        r, _ = _run(tmp_path, 1.5)
    finally:
        server.kill()
        server.wait()
    assert r.returncode == 3, r.stdout + r.stderr
    assert wait_gone([old_region, old_mpi, old_env]), [p for p in (old_region, old_mpi, old_env) if p.exists()]
    assert young.exists() and live_region.exists()
    assert sorted(p.name for p in shared_env.iterdir()) == [f".ftc+{live}+r0+i0"]


def wait_gone(paths: list[Path], timeout: float = 5.0) -> bool:
    """The sweep runs beside the server, in the background: it may end just after the rank."""
    end = time.monotonic() + timeout
    while any(p.exists() for p in paths):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_the_sweep_reads_run_ids_as_data(tmp_path: Path, clean: list[Path]) -> None:
    """An entry whose name holds shell syntax where a run id would be is left alone, unevaluated."""
    odd = SHM / "ftc+$(touch PWNED)+r0+i0+py"
    gone = SHM / f"ftc+gone-{PID}+r0+i0+py"   # a sound one beside it, which does go
    # A name that would read as a second "RUN PATH" line, naming a file of the user's (relative
    # to the rank's working directory, the run folder: a name holds no '/').
    victim = tmp_path / "run" / "keep"
    victim.parent.mkdir()
    victim.write_text("")
    _aged(victim, 120)
    split = SHM / f"ftc+gone-{PID}n+r0+py\ngone-{PID}m keep"
    clean.extend([odd, gone, split])
    for f in (odd, gone, split):
        f.write_text("")
        _aged(f, 120)
    r, run_dir = _run(tmp_path, 1.0)
    assert r.returncode == 3, r.stdout + r.stderr
    assert wait_gone([gone])
    assert odd.exists() and victim.exists()
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_a_server_that_fails_at_once_is_recorded_with_its_own_code(tmp_path: Path, clean: list[Path]) -> None:
    """A server gone before the wrapper waits on it (bash has reaped it already): its own code
    (127, a missing library) is recorded, not the 1 that stands for a code unknown."""
    run_dir, env = _wrapper_of(tmp_path, "#!/bin/sh\nexit 127\n")
    for _ in range(20):
        r = subprocess.run(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 127, r.stdout + r.stderr
        assert (run_dir / "state" / "rank1.exit").read_text().split()[::2] == ["127", "died"]


def test_a_rank_killed_early_has_noted_its_python_env(tmp_path: Path, clean: list[Path]) -> None:
    """The python backend makes its folder in the server's first second; a world SIGKILLed then
    (another rank failed at once) kills the wrapper before its load's next look (2 s): the
    folder was noted all the same, for the teardown to free."""
    import signal

    run_dir, env = _wrapper_of(tmp_path, "#!/bin/bash\nsleep 0.4\nmktemp -d /tmp/python_env_XXXXXX\nexec sleep 30\n")
    p = subprocess.Popen(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    made = None
    try:
        deadline = time.monotonic() + 10
        log = run_dir / "logs" / "server-rank1.log"
        while made is None and time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            made = next((ln.strip() for ln in text.splitlines() if ln.startswith("/tmp/python_env_")), None)
            time.sleep(0.05)
        assert made is not None
        clean.append(Path(made))
        time.sleep(0.6)   # well within the load's 2 s between looks
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    noted = (run_dir / "state" / FILES.python_envs).read_text().split()
    assert noted == [made]


def _counting_grep(tmp: Path) -> tuple[dict[str, str], Path]:
    """PATH with a grep that logs each call's arguments (a line each) before the real one runs."""
    shim, calls = tmp / "shim", tmp / "grep-calls"
    shim.mkdir()
    real = shutil.which("grep")
    (shim / "grep").write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >>{calls}\nexec {real} "$@"\n')
    (shim / "grep").chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}"}, calls


@pytest.mark.parametrize("others", [False, True])
def test_the_sweep_looks_at_the_nodes_processes_only_for_another_runs_entries(
        tmp_path: Path, clean: list[Path], others: bool) -> None:
    """What the run's other ranks on this node made (rank 0's entries, old ones: a restart keeps
    the run) is nothing to sweep: the starting rank does not read every process's environment for
    it, which cost every rank's start on a busy node. Another run's entry is still looked into."""
    own_mpi = SHM / f"ftc+{RUN}+r0+i0+mpi"
    own_env = _python_env()
    clean.extend([own_mpi, own_env])
    own_mpi.mkdir()
    (own_env / f".ftc+{RUN}+r0+i0").write_text("")
    _aged(own_mpi, 120)
    _aged(own_env / f".ftc+{RUN}+r0+i0", 120)
    if others:
        gone = SHM / f"ftc+gone-{PID}+r0+i0+py"
        clean.append(gone)
        gone.write_text("")
        _aged(gone, 120)
    run_dir, env = _wrapper_of(tmp_path, _server(1.0))
    path, calls = _counting_grep(tmp_path)
    r = subprocess.run(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp_path, env={**env, **path},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    if others:
        assert wait_gone([gone])
    sweeps = [c for c in calls.read_text().splitlines() if "FTC_SERVER_OF=[^/]*/" in c]
    assert len(sweeps) == (1 if others else 0), calls.read_text()
    # The wrapper's own search for what its server left ran all the same: the shim was in use.
    assert any("-lzxF" in c for c in calls.read_text().splitlines())
    assert own_mpi.exists() and (own_env / f".ftc+{RUN}+r0+i0").exists()


def _session(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(sid)], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "<defunct>" not in ln]


def test_a_rank_stopped_as_its_server_starts_frees_what_the_server_made(tmp_path: Path, clean: list[Path]) -> None:
    """A TERM the moment the server has started (another rank failed at once: srun ends the step)
    used to end the wrapper alone, before its trap was set: its server, unwatched, made its
    python_env folder and nobody noted or freed it. The wrapper now stops its server and frees it."""
    # The stand-in makes its folder in its own process, as the backend does (mkdtemp), after the TERM.
    server = "#!/bin/sh\nkill -TERM $PPID\nexec mktemp -d /tmp/python_env_XXXXXX\n"
    run_dir, env = _wrapper_of(tmp_path, server)
    envs_before = set(Path("/tmp").glob("python_env_*"))
    for _ in range(5):
        p = subprocess.Popen(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            p.wait(timeout=20)
            # The wrapper's helpers end within a second of its server; the server must be gone.
            deadline = time.monotonic() + 3
            while (left := _session(p.pid)) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
        made = set(Path("/tmp").glob("python_env_*")) - envs_before
        clean.extend(made)
        assert not left, f"outlived the wrapper: {left}"
        assert not made, f"left {sorted(made)}"
        assert (run_dir / "state" / "rank1.exit").read_text().split()[::2] [1] == "stopped"


def test_hostile_rank_server_runs_a_fake_tritonserver(weird_tmp_path: Path) -> None:
    """Run the rendered rank_server.sh with a fake tritonserver that records its argv."""
    scripts, run_dir = _hostile_render("local", weird_tmp_path)
    fake = weird_tmp_path / "bin" / "triton $(touch PWNED)"
    fake.parent.mkdir()
    argv_file = weird_tmp_path / "argv"
    cwd_file = weird_tmp_path / "cwd"
    # It prints FT's instance-initialisation line, then ends by itself (a rank that died).
    fake.write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" > {shlex_quote(str(argv_file))}\n"
                    f"pwd > {shlex_quote(str(cwd_file))}\n"
                    "echo 'I1123 model.py:1] \"TRITONBACKEND_ModelInstanceInitialize: m_0 (count 1) (instance_id 0)\"'\n")
    fake.chmod(0o755)
    sd = run_dir / "scripts"
    scripts.materialize(sd)
    env = {**os.environ, "FTC_RANK": "1", "FTC_RANK_HOST": "127.0.0.1"}
    try:
        r = subprocess.run(["bash", str(sd / "rank_server.sh")], cwd=weird_tmp_path, env=env,
                           capture_output=True, text=True, timeout=30)
    finally:   # the rank's shared-memory folder, which the job's teardown would remove
        for left in Path("/dev/shm").glob("ftc+gpt-2n+*"):
            shutil.rmtree(left, ignore_errors=True)
    assert r.returncode == 1, r.stdout + r.stderr   # a server that ends unasked fails its rank
    argv = argv_file.read_bytes().decode().split("\0")[:-1]
    # The repository is given relative to the run folder, the server's working directory.
    repo_arg = next(a for a in argv if a.startswith("--model-repository="))
    assert Path(cwd_file.read_text().rstrip("\n"), repo_arg.split("=", 1)[1]) == run_dir / "model_repository"
    assert "--id=ftc-gpt-2n-rank1" in argv
    assert "TRITONBACKEND_ModelInstanceInitialize" in (run_dir / "logs" / "server-rank1.log").read_text()
    assert (run_dir / "state" / "rank1.loaded").exists()
    assert f"--http-port={18000 + 10}" in argv            # local ranks get distinct ports
    assert argv[-2:] == ["--model-control-mode=none", HOSTILE]
    code, _, how = (run_dir / "state" / "rank1.exit").read_text().split()
    assert (code, how) == ("1", "died")
    assert (run_dir / "state" / "rank1.host").read_text().strip() == "127.0.0.1"
    _no_pwned(weird_tmp_path.parent)


def _server_of(wrapper: int, deadline: float) -> int:
    """The wrapper's server: its child that carries the run's server mark."""
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split():
            try:
                if b"FTC_SERVER_OF=" in Path(f"/proc/{child}/environ").read_bytes():
                    return int(child)
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError("the server did not start")


@pytest.mark.parametrize("wrapper_too", [True, False])
def test_a_server_signalled_before_its_wrapper_is_stopped_not_dead(tmp_path: Path, clean: list[Path],
                                                                   wrapper_too: bool) -> None:
    """Slurm ends a step's processes one at a time, in process-id order, and ids wrap: the server
    may get its TERM before its wrapper does. That rank was stopped with its step; a server that
    a TERM ended alone died."""
    import signal

    run_dir, env = _wrapper_of(tmp_path, "#!/bin/bash\nexec sleep 30\n")
    p = subprocess.Popen(["bash", str(run_dir / "scripts" / "rank_server.sh")], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        server = _server_of(p.pid, time.monotonic() + 10)
        time.sleep(0.3)   # the wrapper waits on its server
        os.kill(server, signal.SIGTERM)
        if wrapper_too:
            time.sleep(0.03)
            os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    code, _, how = (run_dir / "state" / "rank1.exit").read_text().split()[:3]
    assert (code, how) == ("143", "stopped" if wrapper_too else "died")
