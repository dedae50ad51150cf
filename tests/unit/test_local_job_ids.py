"""The local launcher knows its own job scripts by job id (pid and start time), never by pid
alone: with pid_max at 32768 a pid comes round again within one long session (a test suite, a
gateway), and a new job's pid taken for an earlier, ended child read as that child's exit."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftcluster.hosts.runner import LocalRunner
from ftcluster.schedulers.local import LocalScheduler
from ftcluster.run.layout import RunPaths
from ftcluster.run.procs import job_id_of

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@dataclass(frozen=True)
class _Submission:
    paths: RunPaths
    argv: tuple[str, ...]
    cwd: Path


def _run_folder(tmp_path: Path, name: str, script: str) -> _Submission:
    paths = RunPaths(name, tmp_path / name)
    for sub in ("scripts", "logs", "state"):
        (paths.run_dir / sub).mkdir(parents=True)
    job = paths.scripts / "job.sh"
    job.write_text(script)
    return _Submission(paths, ("bash", str(job)), paths.run_dir)


def _start_with_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """A process given `pid`, as the kernel hands a freed pid out again: the next fork after
    ns_last_pid takes the one above it (another process's fork may win the race: tried again)."""
    for _ in range(50):
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(argv, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not NS_LAST_PID.exists(), reason="needs root to hand a pid out again")
def test_a_pid_come_round_again_is_not_an_ended_jobs(tmp_path: Path) -> None:
    launcher = LocalScheduler(LocalRunner())
    ended = _run_folder(tmp_path, "r-ended", "exit 0\n")
    ended_id = launcher.submit(ended)
    pid = int(ended_id.split(":")[1].split("@")[0])
    deadline = time.monotonic() + 30
    while launcher.info(ended_id, ended.paths).state.value == "RUNNING":   # its child, ended and reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)   # a start time is in clock ticks: the pid comes round in a later one, as it does
    running = _run_folder(tmp_path, "r-running", "sleep 60\n")
    proc = _start_with_pid(pid, ["bash", str(running.paths.scripts / "job.sh")])
    if proc is None:
        pytest.skip(f"pid {pid} went to another process each time")
    try:
        running_id = job_id_of(proc.pid)
        assert running_id != ended_id and running_id.startswith(f"local:{pid}@")
        # The job on that pid now runs; the ended one stays ended.
        assert launcher.info(running_id, running.paths).state.value == "RUNNING"
        assert launcher.info(ended_id, ended.paths).state.value != "RUNNING"
    finally:
        proc.kill()
        proc.wait()
