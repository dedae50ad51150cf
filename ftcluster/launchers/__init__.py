"""Launch styles behind one interface: local process groups, Slurm (bare or Pyxis), Slurm + Docker,
ssh + Docker. Which launcher runs which style is ftcluster.spec.launch_styles' table."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.launchers.base import Launcher
from ftcluster.hosts.runner import LocalRunner, Runner
from ftcluster.spec.launch_styles import LAUNCHERS, launcher_name, style_of

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.spec.cluster import ClusterSpec
    from ftcluster.run.store import RunRecord


def launcher_class(name: str) -> type[Launcher]:
    if name not in LAUNCHERS:
        raise UserError(f"launching with {name!r} is not supported", field="scheduler",
                        hint="use 'slurm', 'ssh' or 'local'")
    module, _, cls = LAUNCHERS[name].partition(":")
    found: type[Launcher] = getattr(import_module(module), cls)
    return found


def launcher_named(name: str, runner: Runner | None = None) -> Launcher:
    return launcher_class(name)(runner or LocalRunner())


def launcher_for(cluster: ClusterSpec, runner: Runner | None = None) -> Launcher:
    return launcher_for_scheduler(cluster.scheduler, runner, style=style_of(cluster).name)


def launcher_for_scheduler(scheduler: str, runner: Runner | None = None,
                           style: str | None = None) -> Launcher:
    return launcher_named(launcher_name(scheduler, style or ""), runner)


def record_launcher(rec: RunRecord) -> str:
    """The name of the launcher that ran a recorded run: the one it names, else its scheduler's
    and style's."""
    return rec.launcher or launcher_name(rec.scheduler, rec.style)


def launcher_for_record(rec: RunRecord, runner: Runner | None = None) -> Launcher:
    return launcher_named(record_launcher(rec), runner)
