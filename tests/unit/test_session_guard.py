"""The guard of a job beside its launcher (scripts/session_guard.sh), with real processes: when the
job's process dies without its teardown, what is left of the job's session and the run's marked
processes are killed and the run's /dev/shm entries and python backend marks removed; a job that
ended with its teardown ("done") leaves the guard nothing to do; a job that leads no session of
its own gets no session-wide kill, so nothing of the terminal it was run from is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.launch_helpers import alive
from tests.unit.test_render import render_style

# A stand-in job: leads a session of its own (as the local launcher starts it), starts a child
# in its session and a guard on a pipe only it holds, says both pids, then waits to be killed.
JOB = r"""
import os, subprocess, sys
child = subprocess.Popen(["sleep", "300"])
r, w = os.pipe()
lead = sys.argv[1] == "lead"
guard = subprocess.Popen(["bash", sys.argv[2], str(os.getsid(0)) if lead else "", sys.argv[3], sys.argv[4],
                          sys.argv[5]], stdin=r, start_new_session=True)
os.close(r)
print(child.pid, guard.pid, flush=True)
if sys.argv[6] == "done":
    os.write(w, b"done\n")
    os.close(w)
    guard.wait()
    print("guard ended", flush=True)
sys.stdin.read()
"""



def _gone(pid: int, within: float = 10.0) -> bool:
    until = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > until:
            return False
        time.sleep(0.02)
    return True


def _start(tmp_path: Path, how: str, ending: str, run: str) -> tuple[subprocess.Popen[str], int, int, Path, Path]:
    mpi = tmp_path / "ftc-mpi.x"
    mpi.mkdir()
    shm = Path("/dev/shm") / f"ftc+{run}+r0+i0+mpi"
    shm.write_text("")
    guard_script = tmp_path / "session_guard.sh"   # as the job runs it: bash session_guard.sh ARGS
    guard_script.write_text(render_style("local").files["session_guard.sh"])
    job = subprocess.Popen([sys.executable, "-c", JOB, how, str(guard_script), str(mpi), run, f"/dev/shm/ftc+{run}+",
                            ending], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           start_new_session=how == "lead")
    assert job.stdout is not None
    child, guard = (int(p) for p in job.stdout.readline().split())
    return job, child, guard, mpi, shm


def test_a_killed_job_leaves_nothing_of_its_session(tmp_path: Path) -> None:
    run = f"guardtest-{os.getpid()}-a"
    outside = subprocess.Popen(["sleep", "300"])   # this test's own session: never the guard's
    marked = subprocess.Popen(["sleep", "300"], env={**os.environ, "FTC_SERVER_OF": f"{run}/rank1/1"},
                              start_new_session=True)   # a rank's server that left the session
    job, child, guard, mpi, shm = _start(tmp_path, "lead", "killed", run)
    try:
        job.kill()
        job.wait()
        assert _gone(guard) and _gone(child)
        assert marked.wait(timeout=10) == -9
        assert not mpi.exists() and not shm.exists()
        assert alive(outside.pid)
    finally:
        outside.kill()
        outside.wait()
        shm.unlink(missing_ok=True)


def test_a_job_that_tore_down_leaves_the_guard_nothing_to_do(tmp_path: Path) -> None:
    run = f"guardtest-{os.getpid()}-b"
    job, child, guard, mpi, shm = _start(tmp_path, "lead", "done", run)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "guard ended"
        assert alive(child) and mpi.exists() and shm.exists()
    finally:
        job.kill()
        job.wait()
        os.kill(child, 9)
        shm.unlink(missing_ok=True)


def test_a_job_in_a_terminal_session_gets_no_session_kill(tmp_path: Path) -> None:
    run = f"guardtest-{os.getpid()}-c"
    job, child, guard, mpi, shm = _start(tmp_path, "follow", "killed", run)   # the test's session
    try:
        job.kill()
        job.wait()
        assert _gone(guard)
        assert alive(child) and not shm.exists()   # the marks' part still ran
    finally:
        os.kill(child, 9)
        shm.unlink(missing_ok=True)
