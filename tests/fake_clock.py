"""A clock for the polling loops whose sleep only moves it forward: a long follow runs in no
time, and what it costs is counted, not timed."""

from __future__ import annotations

from collections.abc import Callable

from ftcluster.job.poll import Clock


class FakeClock(Clock):
    def __init__(self, start: float = 1000.0):
        self.now = start
        self.slept = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept += 1
        self.now += seconds


START = 1000.0


class World(FakeClock):
    """The job's side of a run: each action happens once the clock has passed its time."""

    def __init__(self) -> None:
        super().__init__(START)
        self.actions: list[tuple[float, Callable[[], None]]] = []

    def at(self, t: float, action: Callable[[], None]) -> None:
        self.actions.append((START + t, action))
        self.actions.sort(key=lambda a: a[0])

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        while self.actions and self.actions[0][0] <= self.now:
            self.actions.pop(0)[1]()


def most_in_a_minute(times: list[float], after: float) -> int:
    """The most events in any 60 s window that starts at or after `after`."""
    times = sorted(t for t in times if t >= after)
    return max((sum(1 for u in times[i:] if u < t + 60) for i, t in enumerate(times)), default=0)
