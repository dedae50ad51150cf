"""The one interface every launch style implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ftcluster.job.poll import CLOCK, Clock
from ftcluster.hosts.runner import Runner
from ftcluster.slurm import JobInfo

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from pathlib import Path

    from ftcluster.run.layout import RunPaths
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


class Submission(Protocol):
    """What a launcher reads of a job request (ftcluster.render.request.JobRequest). The request module
    imports the launchers (each builds its request's argv), never the other way round."""

    @property
    def paths(self) -> RunPaths: ...

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def cwd(self) -> Path: ...


class Launcher(ABC):
    # The clock its waits run on (tests: a virtual one, to count what a long wait costs).
    clock: Clock = CLOCK

    def __init__(self, runner: Runner):
        self.runner = runner

    def with_ports(self, cluster: ClusterSpec, plan: Plan) -> ClusterSpec:
        """The spec with the ports the servers will take, where the launcher picks them (a spec
        that leaves `ports` out); the spec itself elsewhere."""
        return cluster

    def check(self, cluster: ClusterSpec, plan: Plan, servers: bool = True) -> None:
        """Refuse what the cluster cannot run, before anything is written or submitted
        (servers=False: a job step, no server ports)."""

    @abstractmethod
    def submit(self, request: Submission) -> str:
        """Run the request's argv in its cwd (its files are written); return a job id for info/cancel."""

    @abstractmethod
    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        """The job's state now."""

    def infos(self, jobs: Sequence[tuple[str, RunPaths]]) -> dict[str, JobInfo]:
        """Several jobs' states by job id; a scheduler that can be asked once for all overrides this."""
        return {job_id: self.info(job_id, paths) for job_id, paths in jobs}

    def identifies(self, job_id: str) -> bool:
        """Whether `info` about this job id can be trusted to say it has ended."""
        return True

    @abstractmethod
    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        """Stop the job and everything it started; returns when it is gone (or after grace)."""

    def prepare_resources(self, request: Submission) -> None:
        """Make what this style's job needs beside the request's files (written with them, so
        that a run folder written by `render --out` has it too)."""

    def release_resources(self, paths: RunPaths) -> None:
        """Remove what prepare_resources made: the run has ended or was stopped."""

    def requeued(self, info: JobInfo) -> str | None:
        """Asked once the job has started: the failure to report when the scheduler has put it
        back in the queue (its ranks are gone; a re-run would start from scratch), else None."""
        return None
