"""Identity before signals: a recorded pid is signalled only while it still names the process
that was recorded.

A pid alone names whatever process holds it now: after the run's process ended, the kernel
hands the number out again (pid_max is often 32768). So a process is recorded as PID plus its
start time (field 22 of /proc/PID/stat, clock ticks since boot, fixed for the process's life),
and is taken to be ours only when both match and its command line names what it runs.

A process group is signalled by its leader's pid. While any member of a group lives, no new
process can be given that number (POSIX: a process group id is not reused until the group's
lifetime ends), so a group whose recorded leader has gone and whose number names no process
holds only the leader's descendants: it may be signalled. A number that names another process
(another start time) is never signalled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), or None when there is no such live
    process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state); starttime is field 22.
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


@dataclass(frozen=True)
class ProcessId:
    """A process as recorded: its pid and its start time."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        start = start_time(pid)
        return None if start is None else cls(pid, start)

    @classmethod
    def parse(cls, text: str) -> ProcessId | None:
        """'PID START' (a rank wrapper's state/rank<R>.pid) or 'PID@START' (a job id); None for
        anything else, a bare pid included: it cannot be identified."""
        parts = text.strip().replace("@", " ").split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        return cls(int(parts[0]), int(parts[1]))

    def __str__(self) -> str:
        return f"{self.pid}@{self.start}"

    def alive(self, command: str | None = None) -> bool:
        """True while this pid still names the recorded process (and, when given, its command
        line holds `command`)."""
        if start_time(self.pid) != self.start:
            return False
        return command is None or command.encode() in _cmdline(self.pid)

    def signal_group(self, sig: int, command: str | None = None) -> bool:
        """Signal the process group this process leads: while the leader is ours, or once its
        number names no process (only its group's members can be reached then). False when
        nothing was signalled."""
        if start_time(self.pid) is not None and not self.alive(command):
            return False   # the number names another process now
        try:
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False


def read_pidfile(path: str | os.PathLike[str]) -> ProcessId | None:
    try:
        with open(path) as fh:
            return ProcessId.parse(fh.read())
    except OSError:
        return None


def job_id_of(pid: int) -> str:
    """The job id of the job script with this pid, `local:PID@START`, its start time read now.
    One already gone gets start 0, which no live process has: the id reports (from the run's
    events) and never names a process to signal. The job is also known by its command line
    (schedulers/local.py's _job_mark), so a pid reused since is never taken for it either."""
    ident = ProcessId.of(pid)
    return f"local:{ident or f'{pid}@0'}"
