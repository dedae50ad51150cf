"""What following a run costs Slurm and the shared filesystem, counted on a virtual clock (so an
hour of following runs in a second, and nothing here is timed): an hour of `logs -f` on a
serving run, a launch through a 30-minute model load, a `stop` whose teardown takes a minute.
The figures are the budget of ftcluster/job/poll.py and docs/operations.md."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ftcluster.run import logs as logs_module
from ftcluster.job.poll import EVENTS, SCHEDULER_PER_MINUTE, Budget
from ftcluster.runtimes.pyxis import PyxisRuntime
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.run.layout import RunPaths
from ftcluster.run.logs import Follower, LogSource, follow_job
from ftcluster.hosts.runner import CommandResult
from ftcluster.run.job_info import NO_SUCH_JOB, JobInfo, JobState
from ftcluster.schedulers.watch import JobWatch
from tests.fake_clock import START, FakeClock, World, most_in_a_minute


class Scheduler:
    """A launcher's info(): RUNNING until the job has ended, then gone; each question's time kept."""

    def __init__(self, clock: World):
        self.clock = clock
        self.ended = False
        self.asked: list[float] = []

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        self.asked.append(self.clock.now)
        if self.ended:
            return JobInfo(job_id, JobState.UNKNOWN, "UNKNOWN", source=NO_SUCH_JOB)
        return JobInfo(job_id, JobState.RUNNING, "RUNNING", source="squeue")


def append(path: Path, text: str) -> Callable[[], None]:
    def write() -> None:
        with open(path, "a") as fh:
            fh.write(text)
    return write


class Opened:
    """Every path the followers open (a lookup on the shared filesystem), at its virtual time."""

    def __init__(self) -> None:
        self.clock: FakeClock | None = None
        self.at: dict[str, list[float]] = {}


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Opened:
    seen = Opened()

    def spy(path: str, *args: Any, **kw: Any) -> Any:
        seen.at.setdefault(str(path), []).append(seen.clock.now if seen.clock else 0.0)
        return builtins.open(path, *args, **kw)

    monkeypatch.setattr(logs_module, "open", spy, raising=False)
    return seen


def _run(tmp_path: Path) -> RunPaths:
    paths = RunPaths("r1", tmp_path / "r1")
    for d in (paths.state, paths.logs):
        d.mkdir(parents=True)
    return paths


def test_an_hour_of_logs_f_on_a_serving_run_stays_within_the_budget(tmp_path: Path,
                                                                      opened: Opened) -> None:
    world = World()
    opened.clock = world
    paths = _run(tmp_path)
    paths.events.write_text("1 job_started n1 42\n2 ready n1:8000\n3 serving n1:8000\n")
    logs = [paths.server_log(0), paths.server_log(1), paths.logs / "client.log"]
    for log in logs:
        log.write_text("started\n")
    # Rank 0 logs a request every 7 s for an hour; the others stay quiet. Then the job ends.
    for t in range(7, 3600, 7):
        world.at(t, append(logs[0], f"request at {t}\n"))
    world.at(3600, append(paths.events, "3600 done 0\n"))
    scheduler = Scheduler(world)
    world.at(3600.5, lambda: setattr(scheduler, "ended", True))
    shown: list[str] = []
    watch = JobWatch(scheduler, "42", paths, world)  # type: ignore[arg-type]
    final = follow_job(Follower([LogSource(str(p.name), str(p)) for p in logs], clock=world), watch,
                       lambda src, line: shown.append(line))
    watch.close()
    # Everything was shown, and the end was seen at the next events tick after `done`.
    assert final is JobState.COMPLETED
    assert len(shown) == 3 + len(range(7, 3600, 7))
    assert world.now - (START + 3600) <= EVENTS.slow + 1e-9
    # Slurm: within the budget from the second minute on, and far below it while serving.
    assert most_in_a_minute(scheduler.asked, START + 60) <= SCHEDULER_PER_MINUTE
    assert len(scheduler.asked) <= 7 * 60
    # The filesystem: the events file looked up once a second, a quiet log once every 10 s,
    # the busy one between; every other poll is a read on an open descriptor.
    after = START + 60
    assert most_in_a_minute(opened.at[str(paths.events)], after) <= 61
    for quiet in logs[1:]:
        assert most_in_a_minute(opened.at[str(quiet)], after) <= 7
    assert most_in_a_minute(opened.at[str(logs[0])], after) <= 61
    total = sum(most_in_a_minute(opened.at[str(p)], after) for p in [paths.events, *logs])
    assert total <= 61 + 61 + 7 + 7


def test_logs_f_on_a_run_requeued_before_follows_it_to_its_own_end(tmp_path: Path) -> None:
    """Slurm requeued the serving job once (preempted): its events hold the earlier attempt's
    `done`, then it started again and serves. `logs -f` follows it until its own end."""
    world = World()
    paths = _run(tmp_path)
    paths.events.write_text("1 job_started n1 42\n3 serving n1:8000\n50 done 143\n90 job_started n2 42\n"
                            "93 serving n2:8000\n")
    log = paths.server_log(0)
    log.write_text("started again\n")
    world.at(30, append(log, "a request\n"))
    world.at(60, append(paths.events, "160 done 0\n"))
    scheduler = Scheduler(world)
    world.at(60.5, lambda: setattr(scheduler, "ended", True))
    shown: list[str] = []
    watch = JobWatch(scheduler, "42", paths, world)  # type: ignore[arg-type]
    final = follow_job(Follower([LogSource("rank0", str(log))], clock=world), watch, lambda src, line: shown.append(line))
    watch.close()
    assert final is JobState.COMPLETED and shown == ["started again", "a request"]
    assert world.now >= START + 60


class Requeueing(Scheduler):
    """RUNNING, then (from `pending`) back in the queue, then RUNNING again, then gone."""

    def __init__(self, clock: World, pending: tuple[float, float]):
        super().__init__(clock)
        self.pending = pending

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        if not self.ended and START + self.pending[0] <= self.clock.now < START + self.pending[1]:
            self.asked.append(self.clock.now)
            return JobInfo(job_id, JobState.PENDING, "PENDING", reason="BeginTime", source="squeue")
        return super().info(job_id, paths)


@pytest.mark.parametrize("requeued", [True, False])
def test_logs_f_follows_a_job_requeued_while_it_follows(tmp_path: Path, requeued: bool) -> None:
    """Slurm requeues the serving job while `logs -f` follows it (preemption): the job is told to
    stop and writes its `done`, then waits in the queue, then starts again. `logs -f` goes on into
    the new attempt (saying so once) and ends with it. Told to stop and not requeued (a
    scancel), it ends once the scheduler says the job is gone."""
    world = World()
    paths = _run(tmp_path)
    paths.events.write_text("1 job_started n1 42\n3 serving n1:8000\n")
    log = paths.server_log(0)
    log.write_text("first attempt\n")
    world.at(20, append(paths.events, "20 interrupted\n21 done 143\n"))
    scheduler = Requeueing(world, (22, 40) if requeued else (0, 0))
    if requeued:
        def start_again() -> None:
            log.unlink()                      # the earlier attempt's logs moved to incarnation-0
            log.write_text("second attempt\n")
            append(paths.events, "41 job_started n2 42\n44 serving n2:8000\n")()
        world.at(41, start_again)
        world.at(70, append(paths.events, "70 done 0\n"))
        world.at(70.5, lambda: setattr(scheduler, "ended", True))
    else:
        world.at(23, lambda: setattr(scheduler, "ended", True))
    shown: list[str] = []
    notices: list[str] = []
    watch = JobWatch(scheduler, "42", paths, world)  # type: ignore[arg-type]
    final = follow_job(Follower([LogSource("rank0", str(log))], clock=world), watch,
                       lambda src, line: shown.append(line), notice=notices.append)
    watch.close()
    if requeued:
        assert final is JobState.COMPLETED and shown == ["first attempt", "second attempt"]
        assert notices == ["the job was requeued by Slurm: following its next start"]
        assert START + 70 <= world.now < START + 75
    else:
        # Told to stop by another than `ftcluster stop` (a scancel): cancelled (ftcluster.run.state).
        assert final is JobState.CANCELLED and shown == ["first attempt"] and notices == []
        assert START + 23 <= world.now < START + 26


class SlurmOnAClock:
    """Slurm's commands as seen by a cancel: the job runs until `ends` (virtual seconds), then
    squeue shows it no more and sacct says CANCELLED; the batch shell's TERM starts the teardown."""

    def __init__(self, clock: World, paths: RunPaths, teardown: float):
        self.clock, self.paths, self.teardown = clock, paths, teardown
        self.ends: float | None = None
        self.queries: list[float] = []

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        gone = self.ends is not None and self.clock.now >= self.ends
        if argv[0] in ("squeue", "sacct", "scontrol"):
            self.queries.append(self.clock.now)
        if argv[0] == "scancel":
            if self.ends is None:
                self.ends = self.clock.now + self.teardown
                self.clock.at(self.ends - START - 0.3, append(self.paths.events, "1 done 130\n"))
            return CommandResult(tuple(argv), 0, "", "")
        if argv[0] == "squeue":
            return CommandResult(tuple(argv), 0, "" if gone else "RUNNING|None|n1\n", "")
        if argv[0] == "sacct":
            return CommandResult(tuple(argv), 0, "CANCELLED by 0|0:15|n1\n" if gone else "", "")
        return CommandResult(tuple(argv), 1, "", "unexpected")


def test_stop_waits_through_a_minute_of_teardown_on_a_few_queries(tmp_path: Path) -> None:
    world = World()
    paths = _run(tmp_path)
    paths.events.write_text("1 job_started n1 42\n")
    slurm = SlurmOnAClock(world, paths, teardown=60.0)
    launcher = SlurmScheduler(slurm, PyxisRuntime())  # type: ignore[arg-type]
    launcher.clock = world
    launcher.cancel("42", paths, grace=10.0)
    # Gone when the teardown ends, seen right after (the job's `done` brought the question forward).
    assert slurm.ends is not None and slurm.ends <= world.now <= slurm.ends + 1.0
    # Before, it asked every 0.2 s: 300 queries for this minute. Now the back-off from the
    # cancel, then a short burst after the job's `done`.
    assert len(slurm.queries) <= 2 * SCHEDULER_PER_MINUTE
    assert len([t for t in slurm.queries if t < slurm.ends - 0.3]) <= 18


def test_the_budget_caps_bursts_from_the_second_minute_on() -> None:
    clock = FakeClock(START)
    budget = Budget(12, clock)
    spent = []
    while clock.now < START + 600:
        if budget.wait() == 0:
            budget.spend()
            spent.append(clock.now)
        clock.sleep(0.1)   # a loop that would ask every 0.1 s
    assert most_in_a_minute(spent, START + 60) <= 12
    assert len([t for t in spent if t < START + 60]) >= 590   # the first minute is not capped
