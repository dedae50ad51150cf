"""Who am I in the world: rank, world size, local rank and rendezvous address from the environment.

Sources, first match wins:
  FTC_*        ftcluster's local launcher (ftcluster.schedulers.local_ranks)
  SLURM_*      srun; the master is the first host of SLURM_JOB_NODELIST
  OMPI_COMM_*  mpirun (Open MPI)
  PMIX_RANK    any PMIx launcher; the world size then comes from WORLD_SIZE
Nothing set at all means a single rank.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

# NVLink multicast (NVLS) can take a shared host's GPUs out of service; keep it off in every
# process we start, whatever the user's environment says.
NVLS_OFF: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

DEFAULT_PORT = 29500


class RankEnvError(RuntimeError):
    """The environment names a rank but not consistently (missing or non-integer values)."""


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "ftc", "slurm", "ompi", "pmix" or "single"

    @property
    def init_method(self) -> str:
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            raise RankEnvError(f"{key} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RankEnvError(f"{key}={raw!r} is not an integer") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list ("gpu[03-05,7],cpu1" -> "gpu03")."""
    try:
        import hostlist  # python-hostlist

        hosts = hostlist.expand_hostlist(nodelist)
        if hosts:
            return str(hosts[0])
    except ImportError:
        pass  # compute nodes without python-hostlist: the first host is all we need
    except Exception:  # malformed list: fall through to the plain parse
        pass
    m = re.match(r"^([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if not m or not (m.group(1) or m.group(2)):
        raise RankEnvError(f"cannot read a host from SLURM_JOB_NODELIST={nodelist!r}")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",", 1)[0].split("-", 1)[0]  # zero padding kept as written
    return prefix + first + suffix


def _master(env: Mapping[str, str], default_addr: str | None, default_port: int) -> tuple[str, int]:
    addr = env.get("MASTER_ADDR") or default_addr
    if not addr:
        raise RankEnvError("no rendezvous host: set MASTER_ADDR (or FTC_MASTER_ADDR)")
    return addr, _int(env, "MASTER_PORT", default_port)


def detect_rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    env = os.environ if environ is None else environ
    if "FTC_RANK" in env:
        return RankEnv(
            rank=_int(env, "FTC_RANK"), world_size=_int(env, "FTC_WORLD_SIZE"),
            local_rank=_int(env, "FTC_LOCAL_RANK", 0),
            master_addr=env.get("FTC_MASTER_ADDR") or "127.0.0.1",
            master_port=_int(env, "FTC_MASTER_PORT", DEFAULT_PORT), source="ftc",
        )
    if "SLURM_PROCID" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        # Every task of the step must derive the same port without talking to the others.
        job = _int(env, "SLURM_JOB_ID", 0) + _int(env, "SLURM_STEP_ID", 0)
        addr, port = _master(env, first_host(nodelist) if nodelist else None, 20000 + job % 20000)
        return RankEnv(
            rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS", _int(env, "SLURM_STEP_NUM_TASKS", 1)),
            local_rank=_int(env, "SLURM_LOCALID", 0), master_addr=addr, master_port=port,
            source="slurm",
        )
    if "OMPI_COMM_WORLD_RANK" in env:
        size = _int(env, "OMPI_COMM_WORLD_SIZE")
        # All ranks on this host: loopback works; otherwise the user must name the master.
        local = "127.0.0.1" if _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 0) == size else None
        addr, port = _master(env, local, DEFAULT_PORT)
        return RankEnv(
            rank=_int(env, "OMPI_COMM_WORLD_RANK"), world_size=size,
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            master_addr=addr, master_port=port, source="ompi",
        )
    if "PMIX_RANK" in env:
        size = _int(env, "WORLD_SIZE", _int(env, "PMIX_SIZE", 1) if "PMIX_SIZE" in env else None)
        addr, port = _master(env, "127.0.0.1" if size == 1 else None, DEFAULT_PORT)
        return RankEnv(
            rank=_int(env, "PMIX_RANK"), world_size=size, local_rank=_int(env, "LOCAL_RANK", 0),
            master_addr=addr, master_port=port, source="pmix",
        )
    addr, port = _master(env, "127.0.0.1", DEFAULT_PORT)
    return RankEnv(rank=0, world_size=1, local_rank=0, master_addr=addr, master_port=port,
                   source="single")


def apply_nvls_off(environ: dict[str, str] | None = None) -> None:
    """Force NVLS off in this process's environment (before NCCL reads it)."""
    target = os.environ if environ is None else environ
    target.update(NVLS_OFF)


def child_env(extra: Mapping[str, str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: base (default: ours) + extra, NVLS always off."""
    env = dict(os.environ if base is None else base)
    if extra:
        env.update(extra)
    env.update(NVLS_OFF)
    return env


def image_path() -> str | None:
    """The image's ENV PATH as Enroot records it in /etc/environment: Enroot (Pyxis) starts a
    step through a login shell, and an image's /etc/profile may replace PATH (Debian's does;
    NVIDIA/enroot#248). rank_server.sh looks there too."""
    try:
        with open("/etc/environment") as fh:
            found = [ln.strip()[5:] for ln in fh if ln.strip().startswith("PATH=")]
    except OSError:
        return None
    return found[-1].strip("\"'") if found else None


def which_in_image(name: str) -> str | None:
    """The executable a path or a command name leads to in this rank's image, else None: the
    step's PATH first, then the image's own ENV PATH."""
    if os.sep in name:
        found: str | None = name
    else:
        recorded = image_path()
        found = shutil.which(name) or (shutil.which(name, path=recorded) if recorded else None)
    return found if found and os.path.isfile(found) and os.access(found, os.X_OK) else None
