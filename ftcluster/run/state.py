"""A run's state, defined once: what `status`, `list`, `logs -f` and `stop` say a run is.

The scheduler tells a job's state while it knows the job. The run's own events tell what it
cannot: that `ftcluster stop` ended the run (the job's `stopped`; Slurm's word is CANCELLED,
or FAILED or COMPLETED by the exit code where the job's own cancel did not reach slurmctld),
and how the job ended once the scheduler has forgotten it (a cluster without accounting forgets
a job `MinJobAge` seconds after its end): its `done` and exit code.
"""

from __future__ import annotations

from collections.abc import Sequence

from ftcluster.run.events import EV, Event, last
from ftcluster.run.job_info import NO_SUCH_JOB, JobInfo, JobState

STOPPED_REASON = "stopped by `ftcluster stop`"
CANCELLED_REASON = "cancelled: its `ftcluster launch` was interrupted"
# JobInfo.source when the run's events told the state (the scheduler knows the job no more).
EVENTS_SOURCE = "events"


def this_attempt(events: Sequence[Event]) -> Sequence[Event]:
    """The events since the job's last start: a job Slurm requeued starts again in the same
    folder, after the earlier attempt's `done`."""
    starts = [i for i, e in enumerate(events) if e.kind == EV.job_started]
    return events[starts[-1]:] if starts else events


def ended(events: Sequence[Event]) -> tuple[JobState, str] | None:
    """How the job's attempt ended by its own word, with its exit code: None before its `done`."""
    attempt = this_attempt(events)
    done = last(list(attempt), EV.done)
    if done is None:
        return None
    rc = done.args[0] if done.args else "?"
    if any(e.kind == EV.stopped for e in attempt):
        return JobState.STOPPED, rc
    if rc == "0":
        return JobState.COMPLETED, rc
    return (JobState.CANCELLED if any(e.kind == EV.interrupted for e in attempt) else JobState.FAILED), rc


def run_state(info: JobInfo, events: Sequence[Event], recorded: str | None = None) -> JobInfo:
    """The run's state now: the scheduler's answer about its job, told more truly by the run's
    events and its record (`recorded`: the store's status, STOPPED once `ftcluster stop` ended it).

    - stopped: the job said `stopped` and `done`, or the record says STOPPED and the job is over
      (a pending job's stop has no job to say it), whatever end Slurm gives it;
    - cancelled: the record says so (an interrupted `launch` cancelled it) and the job is over;
    - the scheduler knows the job no more: the end the job's `done` says;
    - else the scheduler's answer (a job it could not be asked about stays unknown)."""
    if info.unreachable or info.state is JobState.PENDING:
        return info   # not asked; or waiting (again: a requeue), and an end in its events is an earlier attempt's
    end = ended(events)
    if (end is not None and end[0] is JobState.STOPPED) or (recorded == "STOPPED" and info.gone):
        code = end[1] if end is not None else info.exit_code
        return JobInfo(info.job_id, JobState.STOPPED, info.raw_state, info.nodes, STOPPED_REASON, code, info.source)
    if recorded == "CANCELLED" and info.gone:
        code = end[1] if end is not None else info.exit_code
        return JobInfo(info.job_id, JobState.CANCELLED, info.raw_state, info.nodes, CANCELLED_REASON, code,
                       info.source)
    if end is not None and info.source == NO_SUCH_JOB:
        state, code = end
        return JobInfo(info.job_id, state, info.raw_state, info.nodes,
                       f"the scheduler no longer knows job {info.job_id}: its events say it ended with exit code {code}",
                       code, EVENTS_SOURCE)
    return info
