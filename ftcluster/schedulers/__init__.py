"""Schedulers behind one interface (ftcluster.schedulers.base.Scheduler), one module each: local
process groups, ssh to fixed hosts, Slurm. A run's scheduler holds its container runtime
(ftcluster.runtimes); which pair runs which style, and which pair a recorded launcher name
stands for, is ftcluster.spec.launch_styles' table. Both are imported on use: status, logs and
stop load only the ones their runs name."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ftcluster.errors import UserError
from ftcluster.hosts.runner import LocalRunner, Runner
from ftcluster.schedulers.base import Scheduler
from ftcluster.spec.launch_styles import LAUNCHERS, RUNTIMES, SCHEDULERS, launcher_name, style_of

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.run.store import RunRecord
    from ftcluster.runtimes.base import Runtime
    from ftcluster.spec.cluster import ClusterSpec


def _load(where: str) -> Any:
    module, _, cls = where.partition(":")
    return getattr(import_module(module), cls)


def scheduler_class(name: str) -> type[Scheduler]:
    """A scheduler's class by its name (a key of SCHEDULERS: a cluster spec's `scheduler`)."""
    found: type[Scheduler] = _load(SCHEDULERS[name])
    return found


def runtime_class(name: str) -> type[Runtime]:
    """A container runtime's class by its name (a key of RUNTIMES: a spec's container.runtime)."""
    found: type[Runtime] = _load(RUNTIMES[name])
    return found


def scheduler_named(launcher: str, runner: Runner | None = None) -> Scheduler:
    """The scheduler, holding its runtime, that a launcher name (a key of LAUNCHERS, as run
    records and job requests keep it) stands for."""
    if launcher not in LAUNCHERS:
        raise UserError(f"launching with {launcher!r} is not supported", field="scheduler",
                        hint="use 'slurm', 'ssh' or 'local'")
    scheduler, runtime = LAUNCHERS[launcher]
    return scheduler_class(scheduler)(runner or LocalRunner(), runtime_class(runtime)())


def scheduler_for(cluster: ClusterSpec, runner: Runner | None = None) -> Scheduler:
    """The scheduler, holding its runtime, that runs a cluster spec's jobs."""
    return scheduler_named(style_of(cluster).launcher, runner)


def record_launcher(rec: RunRecord) -> str:
    """The launcher name of a recorded run: the one it names, else its scheduler's and style's
    (runs recorded before the store kept it)."""
    return rec.launcher or launcher_name(rec.scheduler, rec.style)


def scheduler_for_record(rec: RunRecord, runner: Runner | None = None) -> Scheduler:
    """The scheduler, holding its runtime, that ran a recorded run."""
    return scheduler_named(record_launcher(rec), runner)
