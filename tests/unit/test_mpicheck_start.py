"""The MPI check's rank side when no world can form: each rank names itself and the reason,
with the real libraries of this machine and the variables srun really sets."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcluster.rank import ctmpi

MPICHECK = Path(__file__).resolve().parents[2] / "ftcluster" / "rank" / "mpicheck.py"


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI", "OMPI_", "FTC_"))}
    return subprocess.run([sys.executable, str(MPICHECK), "--nodes", "2"], capture_output=True, text=True,
                          env={**base, **env}, timeout=60, check=False)


def test_a_library_that_is_not_mpi_is_named() -> None:
    libc = ctypes.util.find_library("c")
    assert libc
    with pytest.raises(ctmpi.MPIError, match="is not an MPI library"):
        ctmpi.World(libc)


def test_missing_libmpi_names_the_rank_and_the_file() -> None:
    p = _run({"FTC_LIBMPI": "/nonexistent/libmpi.so.40", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
              "PMIX_RANK": "1"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("PROBLEM: rank 1 on "), p.stderr
    assert "cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi.so.40: no such file" in p.stderr


def test_srun_without_an_mpi_plugin_is_caught_before_mpi_init() -> None:
    """`srun --mpi=none` sets no PMI variables: Open MPI's MPI_Init would exit the process itself."""
    p = _run({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_MPI_TYPE": "none"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "PROBLEM: rank 0 on " in p.stderr and "cannot join a world" in p.stderr
    assert "--mpi=none" in p.stderr and "set mpi:" in p.stderr
