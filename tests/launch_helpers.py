"""Helpers for tests that run `ftcluster launch` for real (specs in tmp folders, free ports)."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from ftcluster.schedulers.local import port_free
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.observe.status import rank_exit as state_rank_exit


@contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A filesystem of its own at `path` (a tmpfs of `size`), to fill for real (the tests run as
    root, as the test cluster needs)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "ftc-test-small", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """A file that takes every byte left on `folder`'s filesystem (remove it to give room back)."""
    path = folder / "fill"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, bytes(1 << 20))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return path


def free_port_base(ranks: int = 3, stride: int = 10) -> int:
    """A base port whose http/grpc/metrics ports are free for `ranks` local ranks. Below Linux's
    ephemeral range (32768-60999): the job's probes leave client sockets in TIME_WAIT on ports
    there, and tritonserver cannot listen on one of those ("already in use")."""
    for _ in range(200):
        base = random.randrange(20000, 32600, 100)
        if all(port_free(base + r * stride + k) for r in range(ranks) for k in range(3)):
            return base
    raise RuntimeError("no free port range")


def write_cluster(folder: Path, **overrides: Any) -> Path:
    base = free_port_base()
    spec: dict[str, Any] = {
        "name": "test-local",
        "scheduler": "local",
        "gpus_per_node": 1,
        "workspace": str(folder / "ws"),
        "ports": {"http": base, "grpc": base + 1, "metrics": base + 2},
        "server": {"binary": "auto", "ready_timeout": 60, "exit_grace": 5},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def ftcluster(*args: str, env: dict[str, str] | None = None, timeout: float = 180,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def launch_json(cluster: Path, *extra: str, env: dict[str, str] | None = None,
                model: Path | None = None, timeout: float = 180) -> tuple[int, dict[str, Any], str]:
    proc = ftcluster("launch", "--cluster", str(cluster), "--model", str(model or embedded_model_path()),
                     "--json", *extra, env=env, timeout=timeout)
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {}
    return proc.returncode, data, proc.stderr


def processes_matching(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (e.g. a run id) in their command
    line, working directory or environment: a python backend stub started from the run folder
    names only a relative model path."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or str(os.getpid()) == pid:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
            continue
        if text in cmd or text in cwd or text in env:
            found.append(f"{cmd} (pid {pid}, cwd {cwd})")
    return found


def alive(pid: int) -> bool:
    """The process exists and is no zombie (a child not reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def rank_exit(run_dir: Path, rank: int) -> tuple[str, str] | None:
    return state_rank_exit(run_dir / "state", rank)


def assert_served_like_ft(run_dir: Path, run_id: str, nodes: int) -> None:
    """Rank 0 served and stopped cleanly; every other rank reached FT's model-instance line,
    never opened its ports (it blocks in model load, as FT's ranks do) and did not die."""
    # Rank 0 was stopped, not dead: under srun the step may be ended (its other ranks SIGKILLed)
    # before rank 0's wrapper writes its exit.
    assert rank_exit(run_dir, 0) in (None, ("0", "stopped")), rank_exit(run_dir, 0)
    assert f"ftc-{run_id}-rank0" in (run_dir / "logs" / "server-rank0.log").read_text()
    for r in range(1, nodes):
        log = (run_dir / "logs" / f"server-rank{r}.log").read_text()
        assert "(count 1) (instance_id 0)" in log and (run_dir / "state" / f"rank{r}.loaded").exists()
        assert "Started HTTPService" not in log, f"rank {r} opened its HTTP port"
        assert rank_exit(run_dir, r) in (None, ("143", "stopped"), ("137", "stopped")), rank_exit(run_dir, r)
