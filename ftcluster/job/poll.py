"""The one polling policy: every loop that asks Slurm or reads the shared filesystem, on the
login node and inside the job, waits through a `Backoff` built from a cadence below.

Fast while things change, slower while they do not, never slower than the cadence's ceiling.
The figures are the budget docs/operations.md states ("What ftcluster costs the cluster") and
bench/polling_budget.py measures. Shipped with the job (standard library only, Python 3.8):
the job's own loops use it too.
"""

from __future__ import annotations

import time
from collections import deque


class Cadence:
    """A back-off policy: `fast` after a change, `factor` times longer per quiet poll, up to `slow`."""

    def __init__(self, fast: float, slow: float, factor: float = 1.5):
        self.fast, self.slow, self.factor = fast, max(slow, fast), factor

    def backoff(self) -> Backoff:
        return Backoff(self)


# Slurm (squeue, sacct, scontrol), per run and per command that watches it. Every 0.1 s after a
# change (a new state or pending reason), slowing to every 10 s: 6 a minute while
# nothing happens, and room for the burst at a job's end within SCHEDULER_PER_MINUTE, which
# holds from the second minute on. A job's end that no event announces (the batch host lost,
# the supervisor SIGKILLed) is seen within 10 s; what the job says is seen through EVENTS.
SCHEDULER = Cadence(0.1, 10.0)
SCHEDULER_PER_MINUTE = 12
# Once the job's end is due (it wrote `done`): at once, then about every 0.1 s, slowly backing
# off to every 0.25 s, for up to 15 s. Slurm lets a job go a little after its batch script ended
# (a cancelled one stays COMPLETING for seconds, until its nodes have cleaned up); `launch` and
# `stop` return as soon as it has, as they did when they asked every 0.1-0.2 s all along.
ENDING = Cadence(0.1, 0.25, 1.1)
ENDING_S = 15.0
# The run's events file, read on an open descriptor (no path lookup): readiness and failures
# are seen within 50 ms, as before there was a budget.
EVENTS = Cadence(0.02, 0.05)
# What `launch` reads it at while it waits for ready, the user at the prompt: every 10 ms, so
# that ready is seen within 10 ms, not 50 (still a read on the open descriptor, of a file the
# page cache holds: NFS asks its server only when the file's attributes expire); then EVENTS.
STARTING = Cadence(0.01, 0.01)
# Log files that `logs -f` and `launch` follow, on open descriptors: a busy log is read every
# 20 ms, a quiet one every second (tail -f's own interval).
LOGS = Cadence(0.02, 1.0)
# Path lookups (open) of a followed file, which is otherwise read on an open descriptor: to find
# a file that is not there yet or was replaced, and for NFS, whose clients see another host's
# appends for certain only after a fresh open. The events file: every second. A log: every
# second while it is missing or growing, backing off to every 10 s while it is quiet.
EVENTS_LOOKUP = Cadence(1.0, 1.0)
LOG_LOOKUP = Cadence(1.0, 10.0)
# The job's reads of its rank files (state/, logs/) during a model load: every 10 ms while
# ranks report, backing off to 250 ms through a long quiet load.
RANK_FILES = Cadence(0.01, 0.25)
# A serving run's server logs, sized against server.log_max_mb: a stat per rank every 30 s.
LOG_CUT_S = 30.0


class Backoff:
    """The wait before each poll of one loop, following a Cadence."""

    def __init__(self, cadence: Cadence):
        self.cadence = cadence
        self.interval = cadence.fast

    def next(self, changed: bool) -> float:
        """The wait before the next poll, after one that saw something (changed) or nothing."""
        c = self.cadence
        self.interval = c.fast if changed else min(c.slow, self.interval * c.factor)
        return self.interval


class Clock:
    """Time as the loops see it; tests pass one whose sleep only moves it forward."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


CLOCK = Clock()


class Budget:
    """At most `per_minute` uses in any 60 s from the second minute on (the first is free: a
    job starting changes state often). A loop asks `wait()` how long to hold off before its next
    query (0: go ahead) and calls `spend()` when it asks. The back-off keeps the rate low; this
    keeps bursts (state changes, a job's end) from adding up past the stated figure."""

    def __init__(self, per_minute: int, clock: Clock = CLOCK):
        self.per_minute = per_minute
        self.used: deque[float] = deque()
        self._now = clock.monotonic
        self._counted_from = self._now() + 60.0

    def wait(self) -> float:
        now = self._now()
        while self.used and now - self.used[0] >= 60.0:
            self.used.popleft()
        if len(self.used) < self.per_minute:
            return 0.0
        return 60.0 - (now - self.used[0])

    def spend(self) -> None:
        now = self._now()
        if now >= self._counted_from:
            self.used.append(now)
