"""A run's job seen from the login node, at the cost docs/operations.md states: its events file on an
open descriptor (cheap, read on every tick) and the scheduler on the SCHEDULER back-off within
SCHEDULER_PER_MINUTE. `launch`, `logs -f` and `stop` follow a job through this one class.

The job announces what users wait for (ready, failed, done) in its events; the scheduler is
asked for what it cannot say itself: pending reasons, a requeue, an end without a word.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.run.events import EV, Event, EventFollower
from ftcluster.job.poll import CLOCK, ENDING, ENDING_S, EVENTS, SCHEDULER, SCHEDULER_PER_MINUTE, Budget, Clock
from ftcluster.run.job_info import JobInfo

if TYPE_CHECKING:
    from ftcluster.schedulers.base import Scheduler
    from ftcluster.run.layout import RunPaths


class JobWatch:
    def __init__(self, launcher: Scheduler, job_id: str, paths: RunPaths, clock: Clock = CLOCK):
        self.launcher, self.job_id, self.paths, self.clock = launcher, job_id, paths, clock
        self.events = EventFollower(str(paths.events), clock)
        self.info: JobInfo | None = None     # the scheduler's last answer
        self._pace = SCHEDULER.backoff()
        self._budget = Budget(SCHEDULER_PER_MINUTE, clock)
        self._ask_at = clock.monotonic()
        self._ending_until: float | None = None
        # The job's attempt now running wrote `done`: one after the last `job_started` (a
        # requeued job starts again in the same run folder, after an earlier attempt's `done`).
        self.said_done = False

    def new_events(self) -> list[Event]:
        """Events written since the last call; the job's `done` brings the next question forward
        (the scheduler is about to say the job is gone)."""
        new = self.events.poll()
        last = next((e.kind for e in reversed(new) if e.kind in (EV.done, EV.job_started)), None)
        if last is not None:
            self.said_done = last == EV.done
            if self.said_done:
                self.soon()
        return new

    def soon(self) -> None:
        """The job's end is due (it wrote `done`): ask now, then on the ENDING pace for a while."""
        now = self.clock.monotonic()
        self._pace = ENDING.backoff()
        self._ending_until = now + ENDING_S
        self._ask_at = min(self._ask_at, now)

    def ask(self) -> JobInfo | None:
        """The scheduler's answer when a question is due and the budget allows; else None."""
        now = self.clock.monotonic()
        if now < self._ask_at:
            return None
        hold = self._budget.wait()
        if hold > 0:
            self._ask_at = now + hold
            return None
        if self._ending_until is not None and now >= self._ending_until:
            self._pace, self._ending_until = SCHEDULER.backoff(), None
        self._budget.spend()
        info = self.launcher.info(self.job_id, self.paths)
        # Unreachable is no answer: back off as if nothing changed, never hammer a busy slurmctld.
        changed = not info.unreachable and (
            self.info is None or (info.state, info.reason) != (self.info.state, self.info.reason))
        self._ask_at = now + self._pace.next(changed)
        self.info = info
        return info

    def until_next(self) -> float:
        """Seconds until the next question is due."""
        return max(0.0, self._ask_at - self.clock.monotonic())

    def wait_gone(self, seconds: float, told_done: bool = False) -> bool:
        """Whether the job is gone (JobInfo.gone) within `seconds`: the events are read every
        tick, and the scheduler is asked as the back-off and the job's `done` say.

        told_done: a job that wrote `done` during the wait (its batch shell, the supervisor, is
        through its teardown: every rank stopped) and that Slurm shows COMPLETING counts as
        gone. Slurm holds a job COMPLETING until every node confirms its end, which a step's
        message lost to a silent slurmctld delays by a minute (its slurmstepd's retries)."""
        deadline = self.clock.monotonic() + seconds
        tick = EVENTS.backoff()
        while True:
            changed = bool(self.new_events())
            info = self.ask()
            if info is not None and (info.gone or (told_done and self.said_done and info.raw_state == "COMPLETING")):
                return True
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return False
            self.clock.sleep(min(tick.next(changed), self.until_next() or EVENTS.fast, left))

    def close(self) -> None:
        self.events.close()
