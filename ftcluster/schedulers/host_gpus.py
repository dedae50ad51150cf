"""Enough GPUs on this machine for a local run?

With `scheduler: local` every "node" is a process group on this machine, and rank r sees slice r
of CUDA_VISIBLE_DEVICES, or of 0..N-1 when that is unset (local_rank.sh). Where the machine has
fewer GPUs than nodes x gpus_per_node, the ranks past the last one see none: FT fails on them at
model load, after the ranks started (the test model would compute on the CPU there while rank 0
uses its GPU, and the world breaks). A machine without the NVIDIA driver is not asked: the CPU
test model runs on any number of nodes.
"""

from __future__ import annotations

from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def host_gpus(root: Path | None = None) -> int:
    """The GPUs the NVIDIA driver has here (a folder each, named by PCI address); 0 without the
    driver. /proc, not NVML or nvidia-smi: a launch asks on its way to the job (well under 1 ms)."""
    try:
        return sum(1 for _ in (root or NVIDIA_GPUS).iterdir())
    except OSError:
        return 0


def visible_pool(visible: str | None) -> list[str] | None:
    """The devices a CUDA_VISIBLE_DEVICES value names; None when it is unset. Set but empty
    means "no GPU" to CUDA: an empty pool, not every GPU."""
    return None if visible is None else [d.strip() for d in visible.split(",") if d.strip()]


def local_gpu_problem(nodes: int, gpus_per_node: int, visible: str | None, host: int) -> str | None:
    """Why this machine cannot give each of `nodes` ranks its `gpus_per_node` GPUs, or None.
    `visible`: the job's CUDA_VISIBLE_DEVICES (None: unset); `host`: host_gpus()."""
    need = nodes * gpus_per_node
    if host == 0 or need == 0:
        return None
    pool = visible_pool(visible)
    have = host if pool is None else min(len(pool), host)
    if have >= need:
        return None
    where = (f"CUDA_VISIBLE_DEVICES={visible!r} gives {have}" if pool is not None and len(pool) < host
             else f"this machine has {host}")
    return (f"{nodes} nodes x {gpus_per_node} GPUs need {need} GPUs (scheduler local: every node is a "
            f"process group on this machine), {where}")
