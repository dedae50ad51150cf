"""A job's state as a scheduler reports it, in words every scheduler shares: the scheduler's
answer that status, logs, stop and the run's state (ftcluster.run.state) read. Each scheduler
(ftcluster.schedulers) maps its own states onto JobState."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    # A run ended by `ftcluster stop`, as its own events say (ftcluster.run.state): never from
    # Slurm, whose STOPPED (a job held by SIGSTOP) is PENDING here.
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.STOPPED)


# JobInfo.source when the scheduler answered that it knows no such job (it is gone), and when
# it could not be asked at all (a busy or restarting slurmctld times out).
NO_SUCH_JOB = "none"
UNREACHABLE = "error"


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: JobState
    raw_state: str
    nodes: tuple[str, ...] = ()
    reason: str = ""
    exit_code: str = ""
    source: str = ""   # who answered: squeue, sacct, scontrol, local; NO_SUCH_JOB; UNREACHABLE

    @property
    def gone(self) -> bool:
        """The job is over: it reached a final state, or the scheduler knows no such job any more."""
        return self.state.terminal or self.source == NO_SUCH_JOB

    @property
    def unreachable(self) -> bool:
        """The scheduler could not be asked: not an answer about the job; ask again later."""
        return self.source == UNREACHABLE
