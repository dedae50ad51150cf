"""What the job starts dies with it, in every style: a child asks the kernel for SIGKILL when the
process that started it dies (PR_SET_PDEATHSIG), so that a supervisor SIGKILLed by hand or by
the OOM killer -- which runs no teardown -- leaves no proxy listening on the endpoint's ports
with an old token, and no step launcher behind. Stdlib only (ctypes), Linux; elsewhere nothing.

The kernel sends it when the *thread* that forked the child ends: only the job's main thread
starts children this way (lifeline() says None on any other).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Any, Callable, Optional

PR_SET_PDEATHSIG = 1

_prctl: Any = None   # libc's prctl, looked up once in the parent (a forked child loads nothing)


def _lookup() -> Any:
    global _prctl
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):   # no libc with prctl: not Linux
            _prctl = False
    return _prctl


def lifeline() -> Optional[Callable[[], None]]:
    """A preexec_fn for Popen: the child is SIGKILLed when this process dies; None where that
    cannot be asked for (no prctl, or not the main thread)."""
    prctl = _lookup()
    if not prctl or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:   # the parent died between the fork and the request: too late to ask
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
