"""Reading a run's logs from the login node: tail from the end, follow as they grow.

Logs live on the shared filesystem in the run folder; per-rank files appear when each rank
starts, so following keeps looking for them. Tail reads backwards in fixed blocks, so the
last lines of a multi-GB log cost constant memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from ftcluster.job.poll import CLOCK, EVENTS, LOG_LOOKUP, LOGS, Cadence, Clock
from ftcluster.run.layout import FILES, RunPaths
from ftcluster.hosts.runner import LocalRunner, Runner
from ftcluster.run.events import EV
from ftcluster.run.state import ended, run_state, this_attempt
from ftcluster.run.job_info import JobState

if TYPE_CHECKING:
    from ftcluster.schedulers.watch import JobWatch

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


def incarnations(paths: RunPaths) -> list[int]:
    """The earlier incarnations of a serving run's servers whose logs are kept (restarts)."""
    found = []
    for d in paths.logs.glob(FILES.incarnation_dir.format(n="*")):
        tail = d.name.rpartition("-")[2]
        if tail.isdigit():
            found.append(int(tail))
    return sorted(found)


def sources(paths: RunPaths, nodes: int, rank: int | None, server: bool, client: bool,
            step: bool = False, incarnation: int | None = None) -> list[LogSource]:
    """The log files to show, labelled with rank and node where known. A step run (preflight,
    convert) has its step's log alone: its output, every rank's. `incarnation`: the server logs
    of an earlier incarnation (before a restart) instead of the current one."""
    if step:
        return [LogSource("step", str(paths.logs / FILES.step_log))]
    found = []
    ranks = [rank] if rank is not None else list(range(nodes))
    if server:
        kept = paths.logs / FILES.incarnation_dir.format(n=incarnation) if incarnation is not None else None
        for r in ranks:
            host_file = kept / FILES.rank(r, "host") if kept else paths.rank_file(r, "host")
            host = host_file.read_text(errors="replace").strip() if host_file.is_file() else "?"
            log = kept / FILES.server_log(r) if kept else paths.server_log(r)
            found.append(LogSource(f"rank{r} {host}" + (f" #{incarnation}" if kept else ""), str(log)))
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
    """Follows several local files at once, including files that do not exist yet.

    Each file is read on an open descriptor: a poll that finds nothing new costs one read() and
    no path lookup on the shared filesystem. The path itself is opened again on the `lookup`
    cadence (poll.LOG_LOOKUP): to find a file that was not there, one that was replaced or
    truncated, and for NFS, whose clients revalidate a file another host appends to on open.
    """

    def __init__(self, srcs: list[LogSource], from_start: bool = True, clock: Clock = CLOCK,
                 lookup: Cadence = LOG_LOOKUP):
        self.srcs = srcs
        self.clock = clock
        self.offsets = {s.path: 0 for s in srcs}
        self.partial = {s.path: b"" for s in srcs}
        self._open: dict[str, BinaryIO] = {}
        self._lookups = {s.path: lookup.backoff() for s in srcs}
        self._lookup_at = {s.path: 0.0 for s in srcs}
        if not from_start:
            for s in srcs:
                try:
                    self.offsets[s.path] = os.path.getsize(s.path)
                except OSError:
                    pass

    def relabel(self, srcs: list[LogSource]) -> None:
        """The same files under new labels (a rank's node, known once it started)."""
        assert [s.path for s in srcs] == [s.path for s in self.srcs]
        self.srcs = srcs

    def poll(self, fresh: bool = False) -> list[tuple[LogSource, str]]:
        """New complete lines; `fresh`: open every path again first (a last read after the
        writers ended, which NFS shows only to a fresh open)."""
        out = []
        now = self.clock.monotonic()
        for src in self.srcs:
            path = src.path
            fh = self._open.get(path)
            data = self._take(path, fh) if fh is not None else b""
            if fresh or now >= self._lookup_at[path]:
                data += self._reopen(path)
                # Soon again while the file is missing or growing, less often while it is quiet.
                self._lookup_at[path] = now + self._lookups[path].next(bool(data) or path not in self._open)
            if not data:
                continue
            data = self.partial[path] + data
            complete, sep, self.partial[path] = data.rpartition(b"\n")
            if sep:
                out += [(src, line.decode(errors="replace")) for line in complete.split(b"\n")]
        return out

    def _take(self, path: str, fh: BinaryIO) -> bytes:
        """What the open file holds past the offset; the offset moves past it. Read in blocks
        on an unbuffered file: read() alone, where reading "all" would fstat() first."""
        fh.seek(self.offsets[path])
        chunks = []
        while True:
            chunk = fh.read(_BLOCK)
            if not chunk:
                break
            chunks.append(chunk)
            if len(chunk) < _BLOCK:
                break
        data = b"".join(chunks)
        self.offsets[path] += len(data)
        return data

    def _reopen(self, path: str) -> bytes:
        """Open the path afresh and read on from there (from 0 when the file was replaced or
        truncated)."""
        try:
            fresh = open(path, "rb", buffering=0)  # noqa: SIM115 (held open between polls)
        except OSError:
            return b""
        old = self._open.pop(path, None)
        if old is not None:
            st = os.fstat(fresh.fileno())
            if os.fstat(old.fileno()).st_ino != st.st_ino or st.st_size < self.offsets[path]:
                self.offsets[path] = 0
                self.partial[path] = b""
            old.close()
        self._open[path] = fresh
        return self._take(path, fresh)

    def close(self) -> None:
        for fh in self._open.values():
            fh.close()
        self._open.clear()

    def flush(self) -> list[tuple[LogSource, str]]:
        """Lines without a trailing newline, once the writers are gone."""
        out = [(s, self.partial[s.path].decode(errors="replace")) for s in self.srcs if self.partial[s.path]]
        for s in self.srcs:
            self.partial[s.path] = b""
        return out


def follow(follower: Follower, job_ended: Callable[[], bool], emit: Callable[[LogSource, str], None],
           clock: Clock = CLOCK) -> None:
    """Print new lines as they come until the job has ended (then drain and return). The logs
    are read on the LOGS back-off; `job_ended` is asked every EVENTS tick (it reads the events
    file on an open descriptor and paces its own scheduler questions: watch.JobWatch)."""
    wait = LOGS.backoff()
    logs_at = 0.0
    try:
        while True:
            now = clock.monotonic()
            if now >= logs_at:
                lines = follower.poll()
                for src, line in lines:
                    emit(src, line)
                logs_at = now + wait.next(bool(lines))
            if job_ended():
                for src, line in follower.poll(fresh=True) + follower.flush():
                    emit(src, line)
                return
            clock.sleep(max(0.0, min(EVENTS.slow, logs_at - clock.monotonic())))
    finally:
        follower.close()


def follow_job(follower: Follower, watch: JobWatch, emit: Callable[[LogSource, str], None],
               relabel: Callable[[], list[LogSource]] | None = None,
               notice: Callable[[str], None] | None = None, recorded: str | None = None) -> JobState | None:
    """`logs -f`: follow until the job's `done` or until the scheduler says it is gone; the
    run's final state as ftcluster.run.state defines it (None when neither told). `relabel`
    gives the sources again with what is known now (a rank's node, once it started): asked
    every second while a label lacks it. `recorded`: the run's status in the store.

    A job told to stop (its `interrupted`) other than by `ftcluster stop` may be one Slurm
    requeues (preemption, `scontrol requeue`): after its `done` the scheduler is asked, and a
    job back in the queue is followed into its next attempt (`notice` says so once per requeue)."""
    final: list[JobState] = []
    relabel_at = 0.0
    requeued = False   # this attempt of the job was seen back in the queue

    def ended_now() -> bool:
        nonlocal relabel_at, requeued
        now = watch.clock.monotonic()
        if relabel is not None and now >= relabel_at and any(s.label.endswith(" ?") for s in follower.srcs):
            relabel_at = now + LOG_LOOKUP.fast
            follower.relabel(relabel())
        # One attempt of the job at a time: a later `job_started` (Slurm requeued it) begins another.
        if any(e.kind == EV.job_started for e in watch.new_events()):
            requeued = False
        events = watch.events.events
        end = ended(events)
        if end is not None and (end[0] is JobState.STOPPED
                                or not any(e.kind == EV.interrupted for e in this_attempt(events))):
            final.append(end[0])
            return True
        info = watch.ask()
        if info is not None and info.gone:
            final.append(run_state(info, events, recorded).state)
            return True
        if end is not None and info is not None and info.state is JobState.PENDING and not requeued:
            requeued = True
            if notice is not None:
                notice("the job was requeued by Slurm: following its next start")
        return False

    follow(follower, ended_now, emit, watch.clock)
    return final[-1] if final else None
