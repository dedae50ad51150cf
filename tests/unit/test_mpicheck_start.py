"""The MPI check's rank side when no world can form: each rank names itself and the reason,
with the real libraries of this machine and the variables srun really sets."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.rank import ctmpi
from ftcluster.render.scripts import RANK_FILE_SOURCES

RANK = Path(__file__).resolve().parents[2] / "ftcluster" / "rank"


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """The MPI check's files as a run's scripts/ folder holds them, without ftcluster importable."""
    for name in ("mpicheck.py", "ctmpi.py", "rank_env.py"):
        (tmp_path / name).write_text((RANK / RANK_FILE_SOURCES.get(name, name)).read_text())
    return tmp_path


def _run(scripts: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "PMI", "OMPI_", "FTC_")) and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-S", str(scripts / "mpicheck.py"), "--nodes", "2"], capture_output=True,
                          text=True, env={**base, **env}, cwd=scripts, timeout=60, check=False)


def test_a_library_that_is_not_mpi_is_named() -> None:
    libc = ctypes.util.find_library("c")
    assert libc
    with pytest.raises(ctmpi.MPIError, match="is not an MPI library"):
        ctmpi.World(libc)


def test_missing_libmpi_names_the_rank_and_the_file(scripts: Path) -> None:
    p = _run(scripts, {"FTC_LIBMPI": "/nonexistent/libmpi.so.40", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
              "PMIX_RANK": "1"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("PROBLEM: rank 1 on "), p.stderr
    assert "cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi.so.40: no such file" in p.stderr


def test_srun_without_an_mpi_plugin_is_caught_before_mpi_init(scripts: Path) -> None:
    """`srun --mpi=none` sets no PMI variables: Open MPI's MPI_Init would exit the process itself."""
    p = _run(scripts, {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_MPI_TYPE": "none"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "PROBLEM: rank 0 on " in p.stderr and "cannot join a world" in p.stderr
    assert "--mpi=none" in p.stderr and "set mpi:" in p.stderr


OMPI5 = Path(sys.prefix) / "lib" / "libmpi.so.40"   # pip's Open MPI 5 (mpi4py's), where installed


@pytest.mark.skipif(not OMPI5.exists(), reason="no pip Open MPI 5 here")
def test_the_check_keeps_open_mpi_segments_under_the_run_prefix(scripts: Path) -> None:
    """Open MPI 5's singleton leaves its sm_segment in /dev/shm even when it finalizes: the
    check puts it in a folder of its rank's under the run's prefix and removes that."""
    prefix = f"/dev/shm/ftc+check-test-{os.getpid()}+"
    before = set(os.listdir("/dev/shm"))
    sessions = {n for n in os.listdir("/tmp") if n.startswith("ompi.")}   # its session folder
    try:
        r = subprocess.run([sys.executable, "-S", str(scripts / "mpicheck.py"), "--nodes", "1",
                            "--shm-prefix", prefix], capture_output=True, text=True, cwd=scripts, timeout=60,
                           env={**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI", "OMPI_"))},
                                "FTC_LIBMPI": str(OMPI5), "SLURM_PROCID": "0"})
        assert r.returncode == 0, r.stdout + r.stderr
        left = sorted(set(os.listdir("/dev/shm")) - before)
        assert left == [], left
        assert {n for n in os.listdir("/tmp") if n.startswith("ompi.")} == sessions
    finally:
        for name in set(os.listdir("/dev/shm")) - before:
            if name.startswith(("sm_segment.", f"ftc+check-test-{os.getpid()}+")):
                path = Path("/dev/shm") / name
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


@pytest.mark.skipif(not OMPI5.exists(), reason="no pip Open MPI 5 here")
def test_the_check_names_a_backend_library_the_image_lacks(scripts: Path) -> None:
    """A server without the model's backend (the CPU tritonserver: a python backend, no FT one)
    fails the check, naming the path looked for, instead of failing at model load."""
    from ftcluster.service.triton_local import find_tritonserver

    server = find_tritonserver()
    backends = server.resolve().parent.parent / "backends"
    assert (backends / "python" / "libtriton_python.so").is_file()
    prefix = f"/dev/shm/ftc+backend-test-{os.getpid()}+"   # Open MPI's segments go there, and with the check
    r = subprocess.run([sys.executable, "-S", str(scripts / "mpicheck.py"), "--nodes", "1", "--tritonserver",
                        str(server), "--backends", "fastertransformer,python", "--shm-prefix", prefix],
                       capture_output=True, text=True, cwd=scripts, timeout=60,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI", "OMPI_"))},
                            "FTC_LIBMPI": str(OMPI5), "SLURM_PROCID": "0"})
    assert r.returncode == 1, r.stdout + r.stderr
    problems = [line for line in r.stdout.splitlines() if line.startswith("PROBLEM: ")]
    assert len(problems) == 1 and "backend 'fastertransformer'" in problems[0], r.stdout
    assert f"{backends}/fastertransformer/libtriton_fastertransformer.so" in problems[0], problems


# srun's report of the check's rank 1 that Open MPI 5 crashed in MPI_Init on the test bed
# (open-mpi/ompi#12495), as recorded, Open MPI's own trace cut short.
_SRUN_CRASH_LOG = """\
[node2:02352] *** Process received signal ***
[node2:02352] Signal: Segmentation fault (11)
[node2:02352] [ 1] /root/.pyenv/versions/3.11.7/lib/libmpi.so.40(mca_pml_ob1_recv_frag_callback_match+0x95)[0x7f5380078f25]
[node2:02352] [ 9] /root/.pyenv/versions/3.11.7/lib/libmpi.so.40(ompi_mpi_init+0x425)[0x7f537fe91215]
[node2:02352] *** End of error message ***
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node1: error: *** STEP 1869.0 ON node1 CANCELLED AT 2026-11-28T14:55:02 ***
srun: error: node2: task 1: Segmentation fault
srun: error: node1: task 0: Exited with exit code 14
"""


def test_a_crashed_rank_is_named_from_srun() -> None:
    from ftcluster.job.world import crashed_rank

    assert crashed_rank(_SRUN_CRASH_LOG) == "rank 1 on node2 (Segmentation fault)"
    assert crashed_rank("srun: error: node3: tasks 0-1: Bus error (core dumped)\n") == "rank 0-1 on node3 (Bus error)"
    # A rank that ended itself, or was killed, did not crash: no second check for it.
    assert crashed_rank("srun: error: node1: task 0: Exited with exit code 14\n") is None
    assert crashed_rank("srun: error: node2: task 1: Killed\n") is None
    # Open MPI 5 wraps its report at any space, inside the signal's name too: named on one line.
    assert crashed_rank("prterun noticed that process rank 1 with PID 7 on node node2 exited on signal 11 "
                        "(Segmentation\nfault).") == "rank 1 on node2 (Segmentation fault)"

    # A crash after another task's failure is still the one named.
    assert crashed_rank("srun: error: node1: task 0: Exited with exit code 1\n"
                        "srun: error: node2: task 1: Segmentation fault\n") == "rank 1 on node2 (Segmentation fault)"


def test_a_failed_check_is_named_from_the_same_srun_lines_as_a_crash() -> None:
    """The failed check's cause and the crash come from one reading of srun's task lines: the
    first failed task, its node, what srun said of it, and the first line that is not srun's."""
    from ftcluster.job.schedulers.slurm import SrunWorld
    from ftcluster.job.world import srun_failures

    style = SrunWorld.__new__(SrunWorld)   # no job: a log without a plugin's word asks it nothing
    assert srun_failures(_SRUN_CRASH_LOG) == [("node2", "1", "Segmentation fault"),
                                              ("node1", "0", "Exited with exit code 14")]
    assert style.mpi_check_problem(_SRUN_CRASH_LOG) == (
        "rank 1 on node2 (Segmentation fault): [node2:02352] *** Process received signal ***")
    assert style.mpi_check_problem("srun: error: node3: tasks 0-1: Exited with exit code 1\n") == (
        "rank 0-1 on node3 (Exited with exit code 1): see logs/mpicheck.log")
    assert style.mpi_check_problem("PROBLEM: rank 1 saw 1 of 2 ranks\nsrun: error: node3: task 1: Killed\n") == (
        "rank 1 saw 1 of 2 ranks")


def test_a_failed_check_in_containers_is_named_by_its_rank_not_by_mpiruns_warning() -> None:
    """mpirun over ssh (the Docker styles) may log Open MPI's ignored setpgid warning before the
    rank's own PROBLEM line (seen on the test bed): the rank's line names the failure."""
    from ftcluster.job.runtimes.docker import DockerWorld

    log = ("[node1:00045] plm:rsh: Warning: setpgid(62,62) failed in parent with errno=Permission denied(13)\n"
           "PROBLEM: rank 1 on node2 cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi.so.40: no such file\n")
    problem = DockerWorld.mpi_check_problem(None, log)   # type: ignore[arg-type]
    assert problem == "rank 1 on node2 cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi.so.40: no such file"
    # Without the rank's line: the first error that is not the warning.
    assert DockerWorld.mpi_check_problem(None, log.splitlines()[0] + "\nssh: connect to host node2: "   # type: ignore[arg-type]
                                         "Connection refused\nORTE was unable to reach a daemon: failed\n") == (
        "ORTE was unable to reach a daemon: failed")


def _mpiruns() -> list[str]:
    """Every Open MPI mpirun of this machine (the OS's 4.x, the Python environment's 5.x)."""
    found = {os.path.realpath(p) for p in ("/usr/bin/mpirun", os.path.join(os.path.dirname(sys.executable), "mpirun"),
                                            shutil.which("mpirun") or "") if p and os.path.exists(p)}
    return sorted(found)


@pytest.mark.parametrize("mpirun", _mpiruns())
@pytest.mark.parametrize(("sig", "crashed"), [("SIGSEGV", True), ("SIGKILL", False)])
def test_a_crashed_rank_is_named_from_mpirun(mpirun: str, sig: str, crashed: bool) -> None:
    """mpirun's own report of a rank that died by a signal (Open MPI 5 wraps it at any space)."""
    from ftcluster.job.world import crashed_rank

    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, check=False).stdout
    if "Open MPI" not in version and "OpenRTE" not in version:   # 4.x's orterun says OpenRTE
        pytest.skip(f"{mpirun} is not Open MPI's")
    code = f"import os, signal; os.environ['OMPI_COMM_WORLD_RANK'] == '1' and os.kill(os.getpid(), signal.{sig})"
    proc = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-S", "-c", code],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    named = crashed_rank(proc.stdout + proc.stderr)
    if crashed:
        assert named is not None and named.startswith("rank 1 on ") and named.endswith("(Segmentation fault)"), proc.stderr
    else:
        assert named is None, proc.stderr
