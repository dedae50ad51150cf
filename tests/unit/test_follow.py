"""How `launch` follows a submitted run to its end (Launch._follow, _finish): the job's events and
a scripted scheduler, each exit in turn, without a cluster."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ftcluster.launch import run as launch_module
from ftcluster.job.poll import EVENTS, SCHEDULER_PER_MINUTE, STARTING
from ftcluster.launch.run import Launch, LaunchOptions, LaunchOutcome
from ftcluster.runtimes.base import Submission
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.run.layout import RunPaths
from ftcluster.engines import make_plan
from ftcluster.plan.parallel import Plan
from ftcluster.hosts.runner import LocalRunner
from ftcluster.run.job_info import NO_SUCH_JOB, UNREACHABLE, JobInfo, JobState
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_model
from ftcluster.run.store import RunStore
from tests.fake_clock import START, FakeClock, World, most_in_a_minute
from tests.helpers_specs import cluster

RUNNING = JobInfo("42", JobState.RUNNING, "RUNNING", source="squeue")
COMPLETED = JobInfo("42", JobState.COMPLETED, "COMPLETED", source="sacct")


class Scripted(SlurmScheduler):
    """Slurm's launcher (its requeue check) over a scripted scheduler: the job writes `events`
    at submission; each info() gives the next answer (the last one again), after writing the
    events `later` holds for that answer."""

    def __init__(self, events: list[str], answers: list[JobInfo], later: dict[int, list[str]] | None = None,
                 log: str = ""):
        super().__init__(LocalRunner())
        self.events, self.answers, self.later, self.log = events, answers, later or {}, log
        self.asked = 0
        self.cancelled: list[str] = []
        self.released: list[Path] = []
        self.paths: RunPaths | None = None

    def check(self, cluster: ClusterSpec, plan: Plan, servers: bool = True) -> None:
        pass

    def submit(self, request: Submission) -> str:
        self.paths = request.paths
        self.paths.server_log(0).write_text(self.log)
        self._write(self.events)
        return "42"

    def _write(self, lines: list[str]) -> None:
        assert self.paths is not None
        with open(self.paths.events, "a") as f:
            f.writelines(f"{time.time():.3f} {line}\n" for line in lines)

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        self._write(self.later.get(self.asked, []))
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return answer

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        self.cancelled.append(job_id)

    def release_resources(self, paths: RunPaths) -> None:
        self.released.append(paths.run_dir)


def _launch(tmp_path: Path, launcher: Scripted, clock: FakeClock | None = None,
            **opts: object) -> tuple[LaunchOutcome, list[tuple[str, str]]]:
    c = cluster(name="s", scheduler="slurm", partition="gpu", gpus_per_node=1, workspace=str(tmp_path / "ws"),
                server={"binary": "/opt/tritonserver/bin/tritonserver"})
    m = load_model(embedded_model_path())
    shown: list[tuple[str, str]] = []
    launch = Launch(c, m, make_plan(c, m, 1), LaunchOptions(**opts),  # type: ignore[arg-type]
                    progress=lambda phase, t, detail: shown.append((phase, detail)),
                    store=RunStore(tmp_path / "runs.sqlite"), launcher=launcher, run_id="r1", clock=clock or FakeClock())
    return launch.run(), shown


def test_done_ends_the_launch(tmp_path: Path) -> None:
    launcher = Scripted(["job_started h 42", "ready h:8000", "done 0"], [COMPLETED])
    outcome, _ = _launch(tmp_path, launcher)
    assert outcome.ok and outcome.endpoint == "h:8000" and outcome.failure is None
    assert "ready" in outcome.phases and launcher.cancelled == [] and len(launcher.released) == 1


def test_serving_ends_the_launch_and_leaves_the_job_running(tmp_path: Path) -> None:
    launcher = Scripted(["job_started h 42", "ready h:8000", "serving h:8000"], [RUNNING])
    outcome, _ = _launch(tmp_path, launcher, keep_serving=True)
    assert outcome.ok and launcher.cancelled == [] and launcher.released == []


def test_a_failed_run_ends_when_its_job_does(tmp_path: Path) -> None:
    failed = JobInfo("42", JobState.FAILED, "FAILED", source="sacct")
    launcher = Scripted(["job_started h 42", "rank_failed 1 n2 9", "failed rank 1 died"], [RUNNING, RUNNING, failed])
    outcome, _ = _launch(tmp_path, launcher)
    assert not outcome.ok and outcome.failure == "rank 1 died"   # the job's own words, not "the job ended"
    assert outcome.failed_rank == {"rank": "1", "node": "n2", "exit_code": "9"}
    assert launcher.cancelled == [] and len(launcher.released) == 1


def test_pending_reasons_are_shown_once_each(tmp_path: Path) -> None:
    pending = [JobInfo("42", JobState.PENDING, "PENDING", reason=r, source="squeue")
               for r in ("Priority", "Priority", "Resources")]
    launcher = Scripted([], [*pending, RUNNING, COMPLETED], later={3: ["job_started h 42", "done 0"]})
    outcome, shown = _launch(tmp_path, launcher)
    assert outcome.ok
    assert [d for p, d in shown if d.startswith("pending")] == ["pending: Priority", "pending: Resources"]


def test_a_job_requeued_after_it_started_fails_and_is_cancelled(tmp_path: Path) -> None:
    requeued = JobInfo("42", JobState.PENDING, "PENDING", reason="BeginTime", source="squeue")
    launcher = Scripted(["job_started h 42"], [requeued])
    outcome, _ = _launch(tmp_path, launcher)
    assert outcome.failure == "Slurm requeued the job after it had started: BeginTime; it was cancelled"
    assert not outcome.ok and launcher.cancelled == ["42"]


def test_a_job_gone_without_done_fails_after_reading_its_last_events(tmp_path: Path) -> None:
    failed = JobInfo("42", JobState.FAILED, "NODE_FAIL", reason="n2 died", source="sacct")
    outcome, _ = _launch(tmp_path, Scripted(["job_started h 42"], [RUNNING, failed]))
    assert outcome.failure == "the job ended (NODE_FAIL: n2 died) before the run finished"
    # `done` written just before the scheduler forgot the job: read before judging
    gone = JobInfo("42", JobState.UNKNOWN, "UNKNOWN", source=NO_SUCH_JOB)
    outcome, _ = _launch(tmp_path / "2", Scripted(["job_started h 42"], [gone], later={0: ["done 0"]}))
    assert outcome.ok and outcome.failure is None


def test_an_unreachable_scheduler_is_asked_again_then_given_up(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_module, "SCHEDULER_UNREACHABLE_LIMIT", 1.0)
    down = JobInfo("42", JobState.UNKNOWN, "UNKNOWN", reason="timed out", source=UNREACHABLE)
    launcher = Scripted(["job_started h 42"], [down])
    outcome, _ = _launch(tmp_path, launcher)
    assert outcome.failure == "the scheduler could not be asked about job 42 for 1s: timed out"
    assert launcher.asked > 2 and launcher.cancelled == ["42"]
    # An answer in between starts the count again; the job's own events still end the launch.
    launcher = Scripted(["job_started h 42"], [down, RUNNING, down, COMPLETED], later={3: ["done 0"]})
    outcome, _ = _launch(tmp_path / "2", launcher)
    assert outcome.ok


def test_rank0s_telling_log_lines_are_shown(tmp_path: Path) -> None:
    log = "I1124 12:00:00 loading\nE1124 12:00:01 model_repository_manager.cc:1 failed to load\n"
    launcher = Scripted(["job_started h 42"], [RUNNING, COMPLETED], later={1: ["done 0"]}, log=log)
    outcome, shown = _launch(tmp_path, launcher)
    assert outcome.ok
    assert [d for p, d in shown if p == "log"] == ["E1124 12:00:01 model_repository_manager.cc:1 failed to load"]


class Loading(Scripted):
    """A job whose model loads for `load` virtual seconds, then serves the client and ends."""

    def __init__(self, world: World, load: float):
        super().__init__([], [RUNNING])
        self.world, self.load = world, load
        self.asked_at: list[float] = []

    def submit(self, request: Submission) -> str:
        job_id = super().submit(request)
        for t, line in ((1, "job_started h 42"), (3, "servers_starting h"), (self.load, "ready h:8000"),
                        (self.load + 1, "client_started"), (self.load + 2, "client_done 0"),
                        (self.load + 3, "done 0")):
            self.world.at(t, lambda line=line: self._write([line]))
        self.world.at(self.load + 3.4, lambda: self.answers.append(COMPLETED))
        return job_id

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        self.asked_at.append(self.world.now)
        return self.answers[-1]


def test_a_launch_through_a_30_minute_load_stays_within_the_budget(tmp_path: Path) -> None:
    """Counted on a virtual clock: Slurm questions per minute, and how soon ready and the job's
    end are seen (the ready event at the next events tick; the end right after Slurm lets go)."""
    world = World()
    launcher = Loading(world, load=1800)
    outcome, _ = _launch(tmp_path, launcher, clock=world)
    assert outcome.ok
    assert most_in_a_minute(launcher.asked_at, START + 60) <= SCHEDULER_PER_MINUTE
    assert len(launcher.asked_at) <= 6 * 31 + 12
    assert world.now <= START + 1800 + 3.4 + 1.0


class Naps(World):
    """A world that keeps each of the launch's naps, with when it began."""

    def __init__(self) -> None:
        super().__init__()
        self.naps: list[tuple[float, float]] = []

    def sleep(self, seconds: float) -> None:
        self.naps.append((self.now, seconds))
        super().sleep(seconds)


def test_ready_is_seen_within_10_ms_then_the_events_are_read_at_their_own_pace(tmp_path: Path) -> None:
    """The user waits at the prompt for ready: the events are read every STARTING tick until
    then, and on the EVENTS back-off after (through the client, to the job's end)."""
    world = Naps()
    outcome, _ = _launch(tmp_path, Loading(world, load=60), clock=world)
    assert outcome.ok
    until_ready = [s for t, s in world.naps if t < START + 60]
    assert until_ready and max(until_ready) == STARTING.slow
    slowed = min(t for t, s in world.naps if s > STARTING.slow)
    assert START + 60 <= slowed <= START + 60 + STARTING.slow + 1e-6
    assert max(s for t, s in world.naps if t >= slowed) == EVENTS.slow
