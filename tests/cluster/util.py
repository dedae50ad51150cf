"""Small process helpers shared by the test bed modules."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

# Tools the test bed needs; install.sh provides them on a fresh Debian machine.
REQUIRED_TOOLS = (
    "slurmctld", "slurmd", "munged", "sinfo", "scontrol", "srun", "sbatch", "squeue",
    "scancel", "ip", "nsenter", "unshare", "mount", "umount",
)
SSH_TOOLS = ("sshd", "ssh", "ssh-keygen")


class TestbedError(RuntimeError):
    """The test bed could not be brought up or down."""


def which(name: str) -> str:
    """Absolute path of a tool; sbin dirs are searched too (root's PATH may lack them)."""
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    found = shutil.which(name, path=path)
    if not found:
        raise TestbedError(f"{name} not found (run tests/cluster/install.sh as root)")
    return found


def missing_tools(names: Iterable[str] = REQUIRED_TOOLS) -> list[str]:
    out = []
    for n in names:
        try:
            which(n)
        except TestbedError:
            out.append(n)
    return out


def run(argv: Sequence[str], *, check: bool = True, env: Mapping[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a tool by absolute path, capturing output; raise with its stderr on failure."""
    argv = [which(argv[0]) if not os.path.isabs(argv[0]) else argv[0], *argv[1:]]
    p = subprocess.run(argv, capture_output=True, text=True, env=dict(env) if env else None,
                       timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def wait_until(pred: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.05) -> float:
    """Poll a condition (never a fixed sleep); return the seconds it took."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TestbedError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - t0


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (PID 1 reaps orphans late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    # The state letter follows the ")" that closes the command name.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_pids(pids: Iterable[int], grace: float = 5.0, term: bool = True) -> None:
    """SIGTERM (unless term=False), wait for exit, then SIGKILL what is left; reap our children."""
    live = [p for p in set(pids) if p > 1 and p != os.getpid() and pid_alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL) if term else (signal.SIGKILL,):
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        t0 = time.monotonic()
        while live and time.monotonic() - t0 < grace:
            _reap(live)
            live = [p for p in live if pid_alive(p)]
            if live:
                time.sleep(0.02)
        if not live:
            return
    _reap(live)
    live = [p for p in live if pid_alive(p)]
    if live:
        raise TestbedError(f"processes survived SIGKILL: {live}")


def _reap(pids: Iterable[int]) -> None:
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:  # not our child: PID 1 reaps it
            pass


def pids_in_namespace(ns_file: Path, kind: str = "net") -> list[int]:
    """Every process whose `kind` namespace is the one bound at ns_file.

    Job steps (slurmstepd and the tasks) are double-forked away from slurmd, so
    matching on the namespace is the only way to be sure none survives teardown.
    """
    try:
        ino = os.stat(ns_file).st_ino
    except FileNotFoundError:
        return []
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}/ns/{kind}").st_ino == ino and pid_alive(int(d)):
                out.append(int(d))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def cmdline(pid: int) -> str:
    """The process's command line, arguments space-separated ("" when gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def comm(pid: int) -> str:
    """The process's name ("" when gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def processes_mentioning(needle: str, names: Collection[str]) -> list[int]:
    """Live processes named one of `names` whose command line contains needle."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (os.path.basename(argv[0].decode(errors="replace")) in names
                and needle in b" ".join(argv).decode(errors="replace") and pid_alive(int(d))):
            out.append(int(d))
    return out


def tail(path: Path, n: int = 15) -> str:
    """The end of a log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no {path})"
