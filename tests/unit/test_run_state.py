"""A run's state, defined once (ftcluster.run.state), as `status` and `list` tell it: Slurm's
answers are the test bed's own (Slurm 22.05, no accounting), recorded and played back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ftcluster.observe import status as status_module
from ftcluster.schedulers.slurm import SlurmScheduler
from ftcluster.run.state import STOPPED_REASON
from ftcluster.observe.status import live_states, run_status
from ftcluster.run.store import RunRecord
from tests.unit.test_slurm import Scripted

# Recorded on the bed: a job Slurm has forgotten (MinJobAge after its end, no slurmdbd).
INVALID = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
NO_ACCOUNTING = (1, "", "Slurm accounting storage is disabled\n")
# A job whose batch script exited 130 (the job of old, stopped), and one cancelled.
SCONTROL = ("JobId=7 JobName=ftc UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
            "Account=(null) QOS=(null) JobState={state} Reason={reason} Dependency=(null) Requeue=1 Restarts=0 "
            "BatchFlag=1 Reboot=0 ExitCode={code} RunTime=00:00:04 TimeLimit=00:10:00 NodeList=node1 "
            "BatchHost=node1 NumNodes=1 NumCPUs=2 NumTasks=2 Power= \n")
FAILED_130 = (0, SCONTROL.format(state="FAILED", reason="NonZeroExitCode", code="130:0"), "")
CANCELLED = (0, SCONTROL.format(state="CANCELLED", reason="None", code="0:15"), "")


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: str, recorded: str,
         scontrol: tuple[int, str, str]) -> RunRecord:
    run_dir = tmp_path / "run"
    (run_dir / "state").mkdir(parents=True)
    (run_dir / "state" / "events").write_text(events)
    runner = Scripted(squeue=(0, "", "") if scontrol is not INVALID else INVALID, sacct=NO_ACCOUNTING, scontrol=scontrol)
    monkeypatch.setattr(status_module, "scheduler_for_record", lambda rec: SlurmScheduler(runner))
    monkeypatch.setattr(status_module, "scheduler_named", lambda name: SlurmScheduler(runner))
    return RunRecord(run_id="run", created=time.time(), cluster_name="c", cluster_source="", scheduler="slurm",
                     style="none", run_dir=str(run_dir), nodes=1, model="m", job_id="7", status=recorded)


SERVED = "1.0 job_started node1 7\n2.0 serving node1:8000\n"


def listed(rec: RunRecord) -> str:
    """`list`'s word for the run: its state now where its job may live, else as recorded."""
    found = live_states([rec]).get(rec.run_id)
    return found.state.value if found is not None else rec.status


@pytest.mark.parametrize(("end", "state", "code"), [("3.0 done 0\n", "COMPLETED", 0), ("3.0 done 1\n", "FAILED", 1)])
def test_a_run_slurm_has_forgotten_is_told_by_its_own_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             end: str, state: str, code: int) -> None:
    # A detached launch left the record SUBMITTED; Slurm no longer knows the job (it said UNKNOWN).
    rec = _run(tmp_path, monkeypatch, SERVED + end, "SUBMITTED", INVALID)
    st = run_status(rec)
    assert (st["state"], st["source"], st["exit_code"]) == (state, "events", code), st
    assert st["reason"] == f"the scheduler no longer knows job 7: its events say it ended with exit code {code}"
    assert listed(rec) == state     # what `list` shows


def test_a_run_slurm_has_forgotten_without_its_last_word_stays_unknown(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Killed with its batch host: no `done`, so nothing is guessed.
    rec = _run(tmp_path, monkeypatch, SERVED, "SUBMITTED", INVALID)
    assert run_status(rec)["state"] == "UNKNOWN" and listed(rec) == "UNKNOWN"


@pytest.mark.parametrize(("events", "recorded", "scontrol"), [
    # Stopped now: the job said so, and cancelled itself.
    (SERVED + "3.0 interrupted\n3.1 stopped\n4.0 servers_stopped\n5.0 done 0\n", "SERVING", CANCELLED),
    # ... whatever Slurm says: its own cancel did not reach slurmctld.
    (SERVED + "3.0 interrupted\n3.1 stopped\n4.0 servers_stopped\n5.0 done 0\n", "SERVING", FAILED_130),
    # Stopped by the ftcluster of old (the job ended 130), or before it ever started: the record says so.
    (SERVED + "3.0 interrupted\n4.0 servers_stopped\n5.0 done 130\n", "STOPPED", FAILED_130),
    ("", "STOPPED", CANCELLED),
    # Slurm forgot it: its events still say.
    (SERVED + "3.0 interrupted\n3.1 stopped\n5.0 done 0\n", "SERVING", INVALID),
])
def test_a_stopped_run_is_stopped_wherever_it_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: str,
                                                       recorded: str, scontrol: tuple[int, str, str]) -> None:
    rec = _run(tmp_path, monkeypatch, events, recorded, scontrol)
    st = run_status(rec)
    assert (st["state"], st["reason"]) == ("STOPPED", STOPPED_REASON), st
    assert listed(rec) == "STOPPED"


def test_an_interrupted_run_that_was_no_stop_keeps_slurms_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm's own TERM (a time limit's stop_lead, a scancel by hand): not a stop of ftcluster's.
    rec = _run(tmp_path, monkeypatch, SERVED + "3.0 interrupted\n5.0 done 130\n", "SERVING", FAILED_130)
    st = run_status(rec)
    assert (st["state"], st["reason"], st["exit_code"]) == ("FAILED", "NonZeroExitCode", 130), st


def test_a_run_its_interrupted_launch_cancelled_is_cancelled_wherever_it_is_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C of a foreground launch cancels the job (the job ends 130: FAILED in Slurm's books)
    # and records CANCELLED: status said FAILED while list said CANCELLED.
    rec = _run(tmp_path, monkeypatch, SERVED + "3.0 interrupted\n5.0 done 130\n", "CANCELLED", FAILED_130)
    st = run_status(rec)
    assert (st["state"], st["reason"]) == ("CANCELLED", "cancelled: its `ftcluster launch` was interrupted"), st
    assert listed(rec) == "CANCELLED"
