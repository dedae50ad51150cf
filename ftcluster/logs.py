"""Reading a run's logs from the login node: tail from the end, follow as they grow.

Logs live on the shared filesystem in the run folder; per-rank files appear when each rank
starts, so following keeps looking for them. Tail reads backwards in fixed blocks, so the
last lines of a multi-GB log cost constant memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ftcluster.layout import FILES, RunPaths
from ftcluster.runner import LocalRunner, Runner

_BLOCK = 64 * 1024


@dataclass(frozen=True)
class LogSource:
    label: str      # "rank0 node1", "client"
    path: str


def tail_lines(path: str, n: int) -> list[str]:
    """The last `n` lines of a file, reading backwards block by block."""
    if n <= 0:
        return []
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = pos = fh.tell()
        chunks: list[bytes] = []
        newlines = 0
        while pos > 0 and newlines <= n:
            step = min(_BLOCK, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step)
            chunks.append(chunk)
            newlines += chunk.count(b"\n")
        data = b"".join(reversed(chunks))
    if end and data.endswith(b"\n"):
        data = data[:-1]
    return [line.decode(errors="replace") for line in data.split(b"\n")[-n:]] if data else []


def sources(paths: RunPaths, nodes: int, rank: int | None, server: bool, client: bool,
            step: bool = False) -> list[LogSource]:
    """The log files to show, labelled with rank and node where known. A step run (preflight,
    convert) has its step's log alone: its output, every rank's."""
    if step:
        return [LogSource("step", str(paths.logs / FILES.step_log))]
    found = []
    ranks = [rank] if rank is not None else list(range(nodes))
    if server:
        for r in ranks:
            host_file = paths.rank_file(r, "host")
            host = host_file.read_text().strip() if host_file.is_file() else "?"
            found.append(LogSource(f"rank{r} {host}", str(paths.server_log(r))))
    if client:
        found.append(LogSource("client", str(paths.logs / FILES.client_log)))
    return found


def tail(srcs: list[LogSource], n: int, runner: Runner | None = None) -> Iterator[tuple[LogSource, str]]:
    runner = runner or LocalRunner()
    for src in srcs:
        if isinstance(runner, LocalRunner):
            if os.path.exists(src.path):
                for line in tail_lines(src.path, n):
                    yield src, line
        else:
            res = runner.run(["tail", "-n", str(n), src.path])
            if res.ok:
                for line in res.stdout.splitlines():
                    yield src, line


class Follower:
    """Follows several files at once, including files that do not exist yet."""

    def __init__(self, srcs: list[LogSource], runner: Runner | None = None, from_start: bool = True):
        self.srcs = srcs
        self.runner = runner or LocalRunner()
        self.offsets = {s.path: 0 for s in srcs}
        self.partial = {s.path: b"" for s in srcs}
        if not from_start:
            for s in srcs:
                try:
                    self.offsets[s.path] = os.path.getsize(s.path)
                except OSError:
                    pass

    def poll(self) -> list[tuple[LogSource, str]]:
        out = []
        for src in self.srcs:
            data = self.runner.read_from(src.path, self.offsets[src.path])
            if not data:
                continue
            self.offsets[src.path] += len(data)
            data = self.partial[src.path] + data
            complete, sep, self.partial[src.path] = data.rpartition(b"\n")
            if sep:
                out += [(src, line.decode(errors="replace")) for line in complete.split(b"\n")]
        return out

    def flush(self) -> list[tuple[LogSource, str]]:
        """Lines without a trailing newline, once the writers are gone."""
        out = [(s, self.partial[s.path].decode(errors="replace")) for s in self.srcs if self.partial[s.path]]
        for s in self.srcs:
            self.partial[s.path] = b""
        return out


def follow(
    follower: Follower, job_ended: Callable[[], bool], emit: Callable[[LogSource, str], None],
    interval: float = 0.02, check_every: float = 0.5,
) -> None:
    """Print new lines as they come until the job has ended (then drain and return)."""
    next_check = 0.0
    while True:
        for src, line in follower.poll():
            emit(src, line)
        now = time.monotonic()
        if now >= next_check:
            next_check = now + check_every
            if job_ended():
                for src, line in follower.poll() + follower.flush():
                    emit(src, line)
                return
        time.sleep(interval)
