"""Launch styles behind one interface: local process groups, Slurm (bare or Pyxis), Slurm + Docker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftcluster.launchers.base import Launcher
from ftcluster.runner import LocalRunner, Runner

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.spec import ClusterSpec


def launcher_for(cluster: ClusterSpec, runner: Runner | None = None) -> Launcher:
    from ftcluster.render import launch_style

    return launcher_for_scheduler(cluster.scheduler, runner, style=launch_style(cluster))


def launcher_for_scheduler(scheduler: str, runner: Runner | None = None,
                           style: str | None = None) -> Launcher:
    runner = runner or LocalRunner()
    if scheduler == "slurm" and style == "docker":
        from ftcluster.launchers.docker_slurm import DockerSlurmLauncher

        return DockerSlurmLauncher(runner)
    if scheduler == "slurm" and style == "pyxis":
        from ftcluster.launchers.slurm import PyxisSlurmLauncher

        return PyxisSlurmLauncher(runner)
    if scheduler == "ssh":
        from ftcluster.launchers.ssh_docker import SshDockerLauncher

        return SshDockerLauncher(runner)
    if scheduler == "local":
        from ftcluster.launchers.local import LocalLauncher

        return LocalLauncher(runner)
    if scheduler == "slurm":
        from ftcluster.launchers.slurm import SlurmLauncher

        return SlurmLauncher(runner)
    from ftcluster.errors import UserError

    raise UserError(f"launching with scheduler {scheduler!r} is not supported yet",
                    field="scheduler", hint="use 'slurm', 'ssh' or 'local'")
