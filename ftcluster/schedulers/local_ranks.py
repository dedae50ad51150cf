"""Run N ranks of one command on this machine, each its own process group (a "node" apiece).

Used for rank-side checks (preflight) on the local scheduler and in tests. Every rank gets
FTC_RANK/FTC_WORLD_SIZE/FTC_LOCAL_RANK/FTC_MASTER_ADDR/FTC_MASTER_PORT (read by
ftcluster.rank.env) and, with gpus_per_rank, its own CUDA_VISIBLE_DEVICES slice. If any rank
fails, the run times out or the caller is interrupted, every rank's group is killed: a rank
left behind would hold GPUs and the rendezvous port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ftcluster.schedulers.host_gpus import visible_pool
from ftcluster.rank.env import child_env

POLL_S = 0.05


@dataclass(frozen=True)
class RankResult:
    rank: int
    pid: int
    returncode: int  # negative: killed by that signal
    stdout_path: Path
    stderr_path: Path
    killed: bool = False  # we stopped it (another rank failed, timeout or interrupt)
    timed_out: bool = False
    cuda_visible_devices: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def gpu_slices(nodes: int, gpus_per_rank: int, visible: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES per rank, cut from what this process may see (all GPUs if unset)."""
    pool = visible_pool(visible)
    need = nodes * gpus_per_rank
    if pool is None:
        pool = [str(i) for i in range(need)]
    if len(pool) < need:
        raise ValueError(f"{nodes} ranks x {gpus_per_rank} GPUs need {need} GPUs, "
                         f"CUDA_VISIBLE_DEVICES={visible!r} gives {len(pool)}")
    return [",".join(pool[r * gpus_per_rank:(r + 1) * gpus_per_rank]) for r in range(nodes)]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_all(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM every group, SIGKILL what is left after grace; reap the leaders."""
    for p in procs:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not any(_group_alive(p.pid) for p in procs):
            break
        time.sleep(POLL_S)
    for p in procs:
        _signal_group(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def run_local_ranks(
    argv: list[str], nodes: int, gpus_per_rank: int | None,
    env: Mapping[str, str] | None = None, timeout: float | None = None, *,
    log_dir: Path, grace: float = 5.0, cwd: str | None = None,
) -> list[RankResult]:
    """Start `argv` as `nodes` ranks, wait for all of them; kill all on the first failure.

    `env` is added to this process's environment. Returns one RankResult per rank, in rank
    order; KeyboardInterrupt is re-raised after every rank is gone.
    """
    if nodes < 1:
        raise ValueError("nodes must be >= 1")
    base = dict(os.environ)
    if env:
        base.update(env)
    slices = (gpu_slices(nodes, gpus_per_rank, base.get("CUDA_VISIBLE_DEVICES"))
              if gpus_per_rank else [None] * nodes)
    # The caller's folder: the ranks' output outlives this call (RankResult reads it), so a
    # folder of our own could only be left behind.
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()

    procs: list[subprocess.Popen[bytes]] = []
    paths: list[tuple[Path, Path]] = []
    killed = timed_out = False
    try:
        for rank in range(nodes):
            extra = {
                "FTC_RANK": str(rank), "FTC_WORLD_SIZE": str(nodes), "FTC_LOCAL_RANK": "0",
                "FTC_MASTER_ADDR": "127.0.0.1", "FTC_MASTER_PORT": str(port),
            }
            if slices[rank] is not None:
                extra["CUDA_VISIBLE_DEVICES"] = str(slices[rank])
            out, err = logs / f"rank-{rank}.out", logs / f"rank-{rank}.err"
            paths.append((out, err))
            with open(out, "wb") as fo, open(err, "wb") as fe:
                procs.append(subprocess.Popen(
                    argv, env=child_env(extra, base), cwd=cwd, stdin=subprocess.DEVNULL,
                    stdout=fo, stderr=fe, start_new_session=True,
                ))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                killed = any(c is None for c in codes)
                break
            if all(c is not None for c in codes):
                break
            if deadline is not None and time.monotonic() >= deadline:
                killed = timed_out = True
                break
            time.sleep(POLL_S)
    except BaseException:  # KeyboardInterrupt, or a spawn that failed half-way
        _stop_all(procs, grace)
        raise
    running = {p.pid for p in procs if p.poll() is None}
    # Always sweep the groups: a rank that exited may have left children behind.
    _stop_all(procs, grace if running else 0.0)
    return [
        RankResult(rank=r, pid=p.pid, returncode=int(p.returncode), stdout_path=paths[r][0],
                   stderr_path=paths[r][1], killed=killed and p.pid in running,
                   timed_out=timed_out, cuda_visible_devices=slices[r])
        for r, p in enumerate(procs)
    ]
