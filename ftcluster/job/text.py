"""Small text helpers for what the job reads back from logs and per-node files."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Callable, Optional, Tuple

from .names import FILES

def read_text(path: str) -> str:
    """The file's text; "" when it is not there (yet)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def mtime(path: str) -> Optional[float]:
    """When the file was last written; None when it is not there."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def squeeze(text: str) -> str:
    """On one line, runs of white space as one space."""
    return " ".join(text.split())


def first_match(text: str, pattern: str) -> str:
    rx = re.compile(pattern)
    return next((ln for ln in text.splitlines() if rx.search(ln)), "")


def last_line(text: str) -> str:
    """The last line that says something."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def write_json(path: str, data: Any, mode: Optional[int] = None) -> None:
    """Whole or not at all: a reader elsewhere (status on the login node, the front, Prometheus)
    may read the file at any moment. `mode`: its permissions (default: the umask's)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, sort_keys=True)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)   # a half-written copy on a full disk is only in the way
        except OSError:
            pass
        raise


def append_line(path: str, line: str) -> None:
    """`line` and its newline on a line of their own (append_lines)."""
    append_lines(path, (line + "\n").encode())


def append_lines(path: str, data: bytes) -> None:
    """Whole lines, from the start of a line, in one write: after a write cut short (no room left
    midway) the next one starts a new line, so a reader loses only the cut one."""
    with open(path, "a+b") as f:   # one open: O_APPEND writes at the end wherever it read
        if f.seek(0, os.SEEK_END):
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)


# What a start of the servers needs of the run folder's filesystem, at least: every rank writes a
# few small files there (its host, pid, progress, log), each a block or more.
ROOM_NEEDED = 1 << 20


def free_bytes(folder: str) -> Optional[int]:
    """What the filesystem of `folder` has free for us (a quota not counted); None: not known."""
    try:
        fs = os.statvfs(folder)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize


def no_room_in(folder: str) -> Optional[str]:
    """None when `folder` takes ROOM_NEEDED bytes (written, synced and removed: a quota counts
    too, which free space does not show); else the system's words for why not (no room, or
    no write at all: a filesystem remounted read-only, an I/O error)."""
    path = os.path.join(folder, f".room-{os.getpid()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left = memoryview(bytes(ROOM_NEEDED))
            while left:
                left = left[os.write(fd, left):]
            os.fsync(fd)   # a network filesystem may say ENOSPC only here
        finally:
            os.close(fd)
    except OSError as e:
        return e.strerror or str(e)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return None


class Room:
    """Whether the run folder's filesystem took the job's writes lately. A serving world needs no
    disk, and a shared scratch filled by someone else, a quota reached, a filesystem remounted
    read-only or failing (EIO), or a folder made unwritable must not end it: a refused record is
    skipped (the caller keeps what must not be lost) and the job serves on. `attempt` is called
    from the job's loop and its sampling thread."""

    def __init__(self) -> None:
        self.since: Optional[float] = None   # the first refused write of the present shortage
        self.why = ""                        # ... which record, and the system's words
        self.skipped = 0
        self.ended: Optional[Tuple[float, int]] = None   # (since, skipped) of one just over
        self.told: Optional[float] = None    # the shortage already told of

    def attempt(self, what: str, write: Callable[[], None]) -> bool:
        """True when `write` wrote; False when the filesystem refused it, for whatever reason
        (the system's words are kept in `why`)."""
        try:
            write()
        except OSError as e:
            if self.since is None:
                self.since, self.why, self.skipped = time.time(), f"{what}: {e.strerror or e}", 0
            self.skipped += 1
            return False
        self.regained()
        return True

    def untold(self) -> bool:
        """True once per shortage: the moment to tell of it (each teller holds its own Room)."""
        if self.since is None or self.told == self.since:
            return False
        self.told = self.since
        return True

    def regained(self) -> None:
        """Room again (a write went through): the shortage, if any, is over."""
        if self.since is not None:
            self.ended, self.since = (self.since, self.skipped), None


def keep_last_alive(room: Room, state: str, when: float, job: str) -> None:
    """state/last-alive gains "EPOCH JOB" as a job starts again (Slurm's requeue, a front's
    takeover): the last sign of life of what ran before, which may have written no last word
    (its node lost); `report` ends its span there."""
    path = os.path.join(state, FILES.last_alive)
    room.attempt(FILES.last_alive, lambda: append_line(path, f"{when:.3f} {job}"))
