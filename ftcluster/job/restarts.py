"""Which faults of a serving run count against `server.restarts`.

A fault counts until the world has served `server.restart_reset` seconds without one: a long
healthy stretch starts the count and the back-off afresh, so a run that serves for weeks is not
given up, nor made to wait minutes, for faults days apart (0: every fault of the run's life
counts). A restart whose start-up fails never served, so it never starts the count afresh.
"""

from typing import List, Optional, Sequence

from .names import EV


class Faults:
    """The faults counted now (`counted`, oldest first) and every restart of the run so far,
    counted or forgotten (`restarts`: the incarnations are numbered by it)."""

    def __init__(self, reset: float, carried: Sequence[str] = ()) -> None:
        self.reset = reset
        self.counted: List[str] = list(carried)   # a successor starts with its predecessor's
        self.restarts = 0
        self.serving_since: Optional[float] = None

    def serving(self, at: float) -> None:
        """The world serves from `at` (a clock of the caller's choice, the same for `fault`)."""
        self.serving_since = at

    def still_counted(self, at: float) -> List[str]:
        """The faults that count at `at` (what a successor carries on): none once the world has
        served restart_reset seconds by then."""
        if self.reset > 0 and self.serving_since is not None and at - self.serving_since >= self.reset:
            return []
        return list(self.counted)

    def fault(self, cause: str, at: Optional[float]) -> int:
        """A fault seen at `at` (None: when is unknown, nothing is forgotten); how many count now."""
        if self.reset > 0 and self.serving_since is not None and at is not None \
                and at - self.serving_since >= self.reset:
            self.counted.clear()
        self.serving_since = None
        self.counted.append(cause)
        return len(self.counted)


def faults_of_events(text: str, reset: float, carried: Sequence[str] = ()) -> Faults:
    """The faults and restarts of an earlier attempt of the job (Slurm requeued it), from its
    events: `serving` and `restarting TRY CAUSE...` lines, after those it `carried` from its
    predecessor."""
    faults = Faults(reset, carried)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            at = float(parts[0])
        except ValueError:
            continue
        if parts[1] == EV.serving:
            faults.serving(at)
        elif parts[1] == EV.restarting and len(parts) > 3:
            faults.fault(" ".join(parts[3:]), at)
            faults.restarts += 1
    return faults
