"""ftcluster.schedulers.slurm_cli without a cluster: a scripted runner answers squeue/sacct/scontrol as Slurm does."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import pytest

from ftcluster.errors import LaunchError
from ftcluster.runtimes.base import Runtime
from ftcluster.runtimes.docker import DockerRuntime
from ftcluster.runtimes.pyxis import PyxisRuntime
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.run.layout import RunPaths
from ftcluster.render.request import submit_argv
from ftcluster.hosts.runner import CommandResult
from ftcluster.run.job_info import JobInfo, JobState
from ftcluster.schedulers.slurm_cli import Slurm
from tests.fake_clock import FakeClock


class Scripted:
    """Answers each command by its program name; records every argv it was given."""

    def __init__(self, **answers: tuple[int, str, str]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        self.calls.append(list(argv))
        code, out, err = self.answers.get(argv[0], (0, "", ""))
        return CommandResult(tuple(argv), code, out, err)

    def read_text(self, path: str) -> str: raise NotImplementedError
    def write_text(self, path: str, text: str, mode: int = 0o644) -> None: raise NotImplementedError
    def exists(self, path: str) -> bool: raise NotImplementedError
    def open_binary(self, path: str) -> IO[bytes]: raise NotImplementedError
    def which(self, name: str) -> str | None: raise NotImplementedError


INVALID = (1, "", "slurm_load_jobs error: Invalid job id specified")
TIMED_OUT = (1, "", "squeue: error: Unable to contact slurm controller (connect failure)")


@pytest.mark.parametrize(("answers", "state", "gone", "unreachable"), [
    ({"squeue": (0, "RUNNING|None|n1\n", "")}, JobState.RUNNING, False, False),
    ({"squeue": (0, "PENDING|(Priority)|\n", "")}, JobState.PENDING, False, False),
    # squeue has forgotten it, accounting remembers how it ended
    ({"squeue": (0, "", ""), "sacct": (0, "CANCELLED by 0|0:15|n1\n", "")}, JobState.CANCELLED, True, False),
    # no accounting, and scontrol knows no such job either: gone
    ({"squeue": INVALID, "sacct": (1, "", "accounting storage is disabled"), "scontrol": INVALID},
     JobState.UNKNOWN, True, False),
    # the controller did not answer: neither gone nor any state
    ({"squeue": TIMED_OUT, "sacct": (1, "", "disabled"), "scontrol": TIMED_OUT}, JobState.UNKNOWN, False, True),
])
def test_gone_and_unreachable(answers: dict[str, tuple[int, str, str]], state: JobState, gone: bool,
                              unreachable: bool) -> None:
    info = Slurm(Scripted(**answers)).info("7")
    assert (info.state, info.gone, info.unreachable) == (state, gone, unreachable)


def test_a_terminal_state_is_gone_whoever_answered() -> None:
    for state in JobState:
        assert JobInfo("7", state, state.value, source="local").gone == state.terminal


class Cancellable(Scripted):
    """A running job that ends at the first scancel."""

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        if any(c[0] == "scancel" for c in self.calls):
            self.answers = {"squeue": INVALID, "sacct": (1, "", "disabled"), "scontrol": INVALID}
        return super().run(argv, cwd=cwd, timeout=timeout)


@pytest.mark.parametrize(("runtime", "scancel"), [
    # SIGTERM to the batch shell alone, whose trap runs the node teardown
    (None, ["scancel", "--batch", "--signal=TERM", "7"]),
    (PyxisRuntime(), ["scancel", "--batch", "--signal=TERM", "7"]),
    (DockerRuntime(), ["scancel", "--batch", "--signal=TERM", "7"]),
])
def test_cancel_runs_slurms_scancel(tmp_path: Path, runtime: Runtime | None, scancel: list[str]) -> None:
    runner = Cancellable(squeue=(0, "RUNNING|None|n1\n", ""))
    SlurmScheduler(runner, runtime).cancel("7", RunPaths("r", tmp_path), grace=0.0)
    assert [c for c in runner.calls if c[0] == "scancel"] == [scancel]
    assert submit_argv("slurm", "s.sbatch") == Slurm.submit_command("s.sbatch") == ("sbatch", "--parsable", "s.sbatch")


def test_cancel_of_a_pending_job_is_a_plain_scancel(tmp_path: Path) -> None:
    # No batch shell to ask: a job not running (pending, or requeued) is cancelled at once.
    runner = Cancellable(squeue=(0, "PENDING|Resources|\n", ""))
    SlurmScheduler(runner).cancel("7", RunPaths("r", tmp_path), grace=0.0)
    assert [c for c in runner.calls if c[0] == "scancel"] == [["scancel", "7"]]


def test_a_silent_controller_is_asked_once_not_again_through_scontrol() -> None:
    # squeue timed out: scontrol would wait on the same slurmctld; accounting (slurmdbd) is asked.
    runner = Scripted(squeue=TIMED_OUT, sacct=(1, "", "disabled"), scontrol=TIMED_OUT)
    assert Slurm(runner).info("7").unreachable
    assert [c[0] for c in runner.calls] == ["squeue", "sacct"]


@pytest.mark.parametrize("answer", [(0, "", ""), INVALID,
                                    (1, "", "scancel: error: Kill job error on job id 7: Job/step already "
                                            "completing or completed")])
def test_a_cancel_that_finds_nothing_left_to_cancel_is_no_error(answer: tuple[int, str, str]) -> None:
    Slurm(Scripted(scancel=answer)).cancel("7")


def test_a_cancel_slurm_did_not_take_says_the_job_may_still_run() -> None:
    with pytest.raises(LaunchError) as e:
        Slurm(Scripted(scancel=(1, "", "scancel: error: Socket timed out on send/recv operation"))).cancel("7")
    assert str(e.value) == ("scancel of job 7 failed: scancel: error: Socket timed out on send/recv operation; the job "
                            "may still run: try again once Slurm answers (`ftcluster status` says whether it does)")


def test_a_cancel_taken_but_never_confirmed_is_not_called_done(tmp_path: Path) -> None:
    # scancel went through, then slurmctld fell silent: `stop` must not say the job ended.
    launcher = SlurmScheduler(Scripted(squeue=TIMED_OUT, sacct=(1, "", "disabled")))
    launcher.clock = FakeClock()
    with pytest.raises(LaunchError) as e:
        launcher.cancel("7", RunPaths("r", tmp_path), grace=0.0)
    assert str(e.value).startswith("Slurm took the cancel of job 7 but has not answered since (squeue: error: Unable "
                                   "to contact slurm controller (connect failure)): its end is not confirmed")


class EndsCompleting(Scripted):
    """A running job whose batch shell, told TERM, writes `done` (when `says_done`) and ends,
    and that Slurm then holds COMPLETING: a node has not confirmed the end of one of its steps."""

    def __init__(self, events: Path, says_done: bool):
        super().__init__(squeue=(0, "RUNNING|None|n1,n2\n", ""))
        self.events, self.says_done = events, says_done

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        if argv[0] == "scancel" and "--batch" in argv:
            if self.says_done:
                with self.events.open("a") as f:
                    f.write("100.0 interrupted\n100.5 servers_stopped\n101.0 done 130\n")
            self.answers = {"squeue": (0, "COMPLETING|NonZeroExitCode|n2\n", "")}
        return super().run(argv, cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("says_done", [True, False])
def test_a_job_through_its_teardown_but_completing_in_slurm_is_stopped(tmp_path: Path, says_done: bool) -> None:
    # An earlier attempt's `done` (a requeued job) says nothing of this one.
    paths = RunPaths("r", tmp_path)
    paths.events.parent.mkdir(parents=True)
    paths.events.write_text("1.0 serving n1:8000\n2.0 done 0\n3.0 job_started n1 7\n")
    runner = EndsCompleting(paths.events, says_done)
    launcher = SlurmScheduler(runner)
    launcher.clock = FakeClock()
    start = launcher.clock.monotonic()
    launcher.cancel("7", paths, grace=10.0)
    waited = launcher.clock.monotonic() - start
    plain = [c for c in runner.calls if c == ["scancel", "7"]]
    if says_done:
        # Its own `done` and Slurm's COMPLETING: stopped, without the plain scancel or a long wait.
        assert not plain and waited < 5, (waited, runner.calls)
    else:
        # No word from the job: COMPLETING alone is not taken for its end.
        assert plain and waited > 60, (waited, runner.calls)


@pytest.mark.parametrize("events, over", [
    ("1.0 job_started n1 7\n2.0 serving n1:8000\n3.0 interrupted\n4.0 done 130\n", True),
    # An earlier attempt's `done`, then the attempt Slurm still holds: not through its teardown.
    ("1.0 job_started n1 7\n2.0 done 0\n3.0 job_started n2 7\n", False)])
def test_a_second_stop_of_a_job_completing_after_its_own_done_does_not_wait_for_slurm(
        tmp_path: Path, events: str, over: bool) -> None:
    # The first `stop` ended the job's attempt (its `done`); Slurm holds it COMPLETING, as it does
    # for a minute when a node's step end was lost to a silent slurmctld.
    paths = RunPaths("r", tmp_path)
    paths.events.parent.mkdir(parents=True)
    paths.events.write_text(events)
    runner = Scripted(squeue=(0, "COMPLETING|NonZeroExitCode|n2\n", ""),
                      scancel=(1, "", "scancel: error: Kill job error on job id 7: Job/step already completing or completed"))
    launcher = SlurmScheduler(runner)
    launcher.clock = FakeClock()
    start = launcher.clock.monotonic()
    launcher.cancel("7", paths, grace=10.0)
    waited = launcher.clock.monotonic() - start
    assert (waited < 5) if over else (waited >= 40), waited
    # Without its word, the TERM to the batch shell is followed by the plain scancel.
    assert (["scancel", "7"] in runner.calls) is not over, runner.calls


class InTurn(Scripted):
    """Answers each program's calls in turn (its last answer repeats)."""

    def __init__(self, **turns: list[tuple[int, str, str]]):
        super().__init__()
        self.turns = turns

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        self.calls.append(list(argv))
        left = self.turns[argv[0]]
        code, out, err = left.pop(0) if len(left) > 1 else left[0]
        return CommandResult(tuple(argv), code, out, err)


SBATCH_TIMED_OUT = (1, "", "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")


@pytest.mark.parametrize(("message", "silent"), [
    (SBATCH_TIMED_OUT[2], True),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)", True),
    ("timed out after 120s", True),   # the runner's own limit
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     False),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", False),
])
def test_a_silent_controller_is_told_from_a_refusal(message: str, silent: bool) -> None:
    from ftcluster.job.submit import unanswered

    assert unanswered(message) is silent


def test_an_unanswered_sbatch_whose_job_turns_up_late_leaves_one_job() -> None:
    """sbatch timed out; squeue, answering again, shows no job from the folder twice, so sbatch
    runs again, and then the first request's job is there too: the later job is cancelled and
    the first returned. (The bed's test covers the usual order: the first job found.)"""
    folder = "/shared/runs/r1"
    clock = FakeClock(0)
    runner = InTurn(sbatch=[SBATCH_TIMED_OUT, (0, "12\n", "")],
                    squeue=[(1, "", "squeue: error: Socket timed out on send/recv operation"), (0, "", ""),
                            (0, "9|/elsewhere\n", ""), (0, f"9|/elsewhere\n11|{folder}\n12|{folder}\n", "")],
                    scancel=[(0, "", "")])
    assert Slurm(runner).submit(["sbatch", "--parsable", "job.sbatch"], cwd=folder, clock=clock) == "11"
    assert [c[0] for c in runner.calls] == ["sbatch", "squeue", "squeue", "squeue", "sbatch", "squeue", "scancel"]
    assert runner.calls[-1] == ["scancel", "12"]


def test_an_sbatch_slurm_never_answers_says_a_job_may_exist() -> None:
    clock = FakeClock(0)
    runner = InTurn(sbatch=[SBATCH_TIMED_OUT], squeue=[(1, "", "squeue: error: Socket timed out on send/recv operation")])
    with pytest.raises(LaunchError) as e:
        Slurm(runner).submit(["sbatch", "--parsable", "job.sbatch"], cwd="/shared/runs/r1", clock=clock, patience=60)
    assert "a job may have been submitted from /shared/runs/r1" in str(e.value)
    assert [c[0] for c in runner.calls].count("sbatch") == 1 and 60 <= clock.monotonic() < 70


def test_a_refused_sbatch_is_a_user_error_at_once() -> None:
    from ftcluster.errors import UserError

    runner = InTurn(sbatch=[(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified")])
    with pytest.raises(UserError) as e:
        Slurm(runner).submit(["sbatch", "--parsable", "job.sbatch"], cwd="/shared/runs/r1", clock=FakeClock(0))
    assert "Invalid partition name" in str(e.value) and [c[0] for c in runner.calls] == ["sbatch"]


@pytest.mark.parametrize(("answer", "job"), [((0, "4242\n", ""), "4242"), ((0, "4242;cluster2\n", ""), "4242"),
                                            ((0, "1;$(x)", ""), "1"), ((0, "", ""), None),
                                            ((1, "", "sbatch: error: nope"), None)])
def test_the_job_package_reads_sbatchs_answer(answer: tuple[int, str, str], job: str | None) -> None:
    """A set's balancer submits its successor with the job package's own submit (stdlib)."""
    from ftcluster.job.submit import SubmitFailed, submit

    def run(argv: list[str], cwd: str | None, timeout: float) -> tuple[int, str, str]:
        return answer

    if job is None:
        with pytest.raises(SubmitFailed):
            submit(run, ["sbatch", "--parsable", "x"], "/runs/r1")
    else:
        assert submit(run, ["sbatch", "--parsable", "x"], "/runs/r1") == job


@pytest.mark.parametrize(("answer", "state"), [((0, "RUNNING\n", ""), "RUNNING"), ((0, "", ""), ""), (INVALID, ""),
                                              ((1, "", "slurm_load_jobs error: Socket timed out on send/recv "
                                                "operation"), None),
                                              ((124, "", "squeue timed out after 30s"), None)])
def test_a_job_asks_the_queue_gone_from_silent(answer: tuple[int, str, str], state: str | None) -> None:
    """A balancer asks for its successor: one squeue forgot (its "Invalid job id" on stderr) is
    gone, a Slurm that did not answer is no answer."""
    from ftcluster.job.submit import queue_state

    assert queue_state(lambda argv, cwd, timeout: answer, "77") == state
