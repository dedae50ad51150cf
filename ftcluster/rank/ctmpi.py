"""The few MPI calls ftcluster's rank side needs, through ctypes on the image's own libmpi.

Standard library only (Python >= 3.8): it runs where ftcluster and mpi4py are not installed --
inside a user's Triton+FT image, and inside the test model's python-backend stub, which finds
it beside its model.py. Like the FT backend it joins the world of whatever launched the rank
(`srun --mpi=pmix`, `mpirun`), through the libmpi that launcher belongs to: `FTC_LIBMPI` when
set, else the one the dynamic linker finds, else the Triton images' /usr/local/mpi and HPC-X.
Open MPI (handles are addresses of exported objects) and MPICH-ABI libraries (integer handles)
are both understood.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import time

MPI_THREAD_MULTIPLE = 3      # the same value in Open MPI and MPICH; FT asks for it too
_MPICH_COMM_WORLD = 0x44000000
_MPICH_BYTE = 0x4C00010D
_IMAGE_MPI_DIRS = ("/usr/local/mpi/lib", "/opt/hpcx/ompi/lib", "/usr/lib/x86_64-linux-gnu/openmpi/lib")


class MPIError(RuntimeError):
    pass


def find_libmpi() -> str:
    """The libmpi path to load, or a clear error naming where it looked."""
    explicit = os.environ.get("FTC_LIBMPI")
    if explicit:
        if not os.path.exists(explicit):
            raise MPIError(f"FTC_LIBMPI={explicit}: no such file")
        return explicit
    found = ctypes.util.find_library("mpi")
    if found:
        return found
    for folder in _IMAGE_MPI_DIRS:
        hits = sorted(glob.glob(os.path.join(folder, "libmpi.so*")))
        if hits:
            return hits[0]
    raise MPIError("no libmpi found (looked at FTC_LIBMPI, the linker's path and "
                   + ", ".join(_IMAGE_MPI_DIRS) + ")")


def libmpi_beside(mpirun: str) -> str | None:
    """The libmpi that belongs to an mpirun (<prefix>/bin/mpirun -> <prefix>/lib/libmpi.so*)."""
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(mpirun)))
    for pattern in ("lib/libmpi.so.*", "lib/libmpi.so", "lib64/libmpi.so*"):
        hits = sorted(glob.glob(os.path.join(prefix, pattern)))
        if hits:
            return hits[0]
    return None


class World:
    """MPI_COMM_WORLD of this process, initialised on construction (MPI_Init_thread)."""

    def __init__(self, path: str | None = None):
        self.path = path or find_libmpi()
        try:
            # RTLD_GLOBAL: Open MPI's plugins resolve libmpi's symbols through the global scope.
            self.lib = ctypes.CDLL(self.path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise MPIError(f"cannot load {self.path}: {exc}") from None
        if not hasattr(self.lib, "MPI_Init_thread"):
            raise MPIError(f"{self.path} is not an MPI library (no MPI_Init_thread)")
        self.flavour = "openmpi" if hasattr(self.lib, "ompi_mpi_comm_world") else "mpich"
        if self.flavour == "openmpi":
            self._comm: object = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(self.lib, "ompi_mpi_comm_world")))
            self._byte: object = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(self.lib, "ompi_mpi_byte")))
        else:
            self._comm, self._byte = ctypes.c_int(_MPICH_COMM_WORLD), ctypes.c_int(_MPICH_BYTE)
        # MPI is initialised once per process: a model that already did (mpi4py imported first)
        # shares that world.
        initialized = ctypes.c_int(0)
        self._check("MPI_Initialized", ctypes.byref(initialized))
        if not initialized.value:
            provided = ctypes.c_int(0)
            self._check("MPI_Init_thread", None, None, MPI_THREAD_MULTIPLE, ctypes.byref(provided))
        value = ctypes.c_int(0)
        self._check("MPI_Comm_rank", self._comm, ctypes.byref(value))
        self.rank = value.value
        self._check("MPI_Comm_size", self._comm, ctypes.byref(value))
        self.size = value.value

    def _check(self, name: str, *args: object) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise MPIError(f"{name} failed with MPI error {rc}")

    def library_version(self) -> str:
        buf = ctypes.create_string_buffer(8192)
        n = ctypes.c_int(0)
        self._check("MPI_Get_library_version", buf, ctypes.byref(n))
        return buf.value.decode(errors="replace").strip()

    def processor_name(self) -> str:
        buf = ctypes.create_string_buffer(1024)
        n = ctypes.c_int(0)
        self._check("MPI_Get_processor_name", buf, ctypes.byref(n))
        return buf.value.decode(errors="replace")

    def barrier(self) -> None:
        self._check("MPI_Barrier", self._comm)

    def bcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """Root's bytes on every rank (the length first, then the payload)."""
        mine = data if self.rank == root and data is not None else b""
        n = ctypes.c_longlong(len(mine))
        idle = os.environ.get("FTCLUSTER_TEST_IDLE_WAIT", "")
        if idle:
            self._bcast_idle(ctypes.byref(n), 8, root, float(idle))
        else:
            self._check("MPI_Bcast", ctypes.byref(n), 8, self._byte, root, self._comm)
        buf = ctypes.create_string_buffer(mine, n.value) if self.rank == root else ctypes.create_string_buffer(n.value)
        if n.value:
            self._check("MPI_Bcast", buf, n.value, self._byte, root, self._comm)
        return buf.raw[: n.value]

    def _bcast_idle(self, buf: object, count: int, root: int, every: float) -> None:
        """MPI_Bcast as MPI_Ibcast, the other ranks asking MPI_Test every `every` s in between:
        MPI's own wait polls a core flat out, as FT's ranks != 0 do on their own nodes; many
        ranks on one test machine would starve everything else of it. (Every rank must take
        this path: a blocking and a non-blocking collective do not match.)"""
        req = ctypes.c_void_p() if self.flavour == "openmpi" else ctypes.c_int()
        ignore = None if self.flavour == "openmpi" else ctypes.c_void_p(1)   # MPI_STATUS_IGNORE
        self._check("MPI_Ibcast", buf, count, self._byte, root, self._comm, ctypes.byref(req))
        if self.rank == root:
            self._check("MPI_Wait", ctypes.byref(req), ignore)
            return
        done = ctypes.c_int(0)
        while True:
            self._check("MPI_Test", ctypes.byref(req), ctypes.byref(done), ignore)
            if done.value:
                return
            time.sleep(every)

    def gather_bytes(self, block: bytes, root: int = 0) -> list[bytes] | None:
        """Every rank's block (all of one size) at root, in rank order; None elsewhere."""
        n = len(block)
        send = ctypes.create_string_buffer(block, n)
        recv = ctypes.create_string_buffer(n * self.size) if self.rank == root else None
        self._check("MPI_Gather", send, n, self._byte, recv, n, self._byte, root, self._comm)
        if recv is None:
            return None
        raw = recv.raw
        return [raw[i * n:(i + 1) * n] for i in range(self.size)]

    def finalize(self) -> None:
        self._check("MPI_Finalize")

    def abort(self, code: int = 1) -> None:
        self.lib.MPI_Abort(self._comm, code)
