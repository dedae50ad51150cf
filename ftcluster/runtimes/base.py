"""The one interface every container runtime implements on the launcher side: what is checked
of its image before anything is submitted, and what a run of it needs beside its files.

How a command enters the image, its mounts and its containers' start and end are the job's
(ftcluster/job, job_templates); a scheduler (ftcluster.schedulers) holds the runtime of its run
and asks it at these points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from pathlib import Path

    from ftcluster.hosts.runner import Runner
    from ftcluster.plan.parallel import Plan
    from ftcluster.run.layout import RunPaths
    from ftcluster.spec.cluster import ClusterSpec


class Submission(Protocol):
    """What a scheduler and a runtime read of a job request (ftcluster.render.request.JobRequest).
    The request module imports the schedulers (each builds its request's argv), never the other
    way round."""

    @property
    def paths(self) -> RunPaths: ...

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def cwd(self) -> Path: ...


class Runtime:
    """No container: the ranks run on the hosts themselves. Each runtime overrides what it needs."""

    name = "none"

    def check(self, cluster: ClusterSpec, plan: Plan, runner: Runner) -> None:
        """Refuse an image the run cannot use, before anything is written or submitted (the
        runner: where the scheduler's commands run, which sees what the nodes see)."""

    def prepare_resources(self, request: Submission) -> None:
        """Make what this runtime's job needs beside the request's files (written with them, so
        that a run folder written by `render --out` has it too)."""

    def release_resources(self, paths: RunPaths) -> None:
        """Remove what prepare_resources made: the run has ended or was stopped."""
