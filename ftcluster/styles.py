"""The launch styles, one row each: which template renders the job script, which launcher runs it.

A new style is a template in job_templates/, a launcher module in ftcluster/launchers/ and one
row here; everything else (rendering, the job request, status, logs, stop) finds it through
this table. Light (no specs, no templates) so that status/logs/stop start fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    name: str
    template: str        # the job script's template in job_templates/
    launcher: str        # a key of LAUNCHERS
    runs_here: bool      # the job script runs on this host as a process group, not through sbatch
    docker: bool         # containers started with docker, mpirun over ssh with per-run keys
    in_image: bool       # the ranks run inside the user's image (its own python3, no ftcluster)


STYLES: dict[str, Style] = {s.name: s for s in (
    Style("none", "sbatch.sh.j2", "slurm", runs_here=False, docker=False, in_image=False),
    Style("pyxis", "sbatch.sh.j2", "pyxis_slurm", runs_here=False, docker=False, in_image=True),
    Style("docker", "sbatch_docker.sh.j2", "docker_slurm", runs_here=False, docker=True, in_image=True),
    Style("ssh_docker", "ssh_docker.sh.j2", "ssh_docker", runs_here=True, docker=True, in_image=True),
    Style("local", "local.sh.j2", "local", runs_here=True, docker=False, in_image=False),
)}

# The record of a run whose job is one step in place of the servers names that step as its
# style (its launcher is recorded beside it): no server ranks, one step log.
STEP_STYLES = ("preflight", "convert")

# Launcher name -> "module:class"; imported on use (a launcher pulls in its scheduler's code).
LAUNCHERS: dict[str, str] = {
    "slurm": "ftcluster.launchers.slurm:SlurmLauncher",
    "pyxis_slurm": "ftcluster.launchers.slurm:PyxisSlurmLauncher",
    "docker_slurm": "ftcluster.launchers.docker_slurm:DockerSlurmLauncher",
    "ssh_docker": "ftcluster.launchers.ssh_docker:SshDockerLauncher",
    "local": "ftcluster.launchers.local:LocalLauncher",
}


def style_name(scheduler: str, runtime: str) -> str:
    """A cluster's launch style from its scheduler and container runtime."""
    if scheduler == "local":
        return "local"
    if scheduler == "ssh":
        return "ssh_docker"   # the spec allows no other runtime with scheduler ssh
    return runtime


def launcher_name(scheduler: str, style: str) -> str:
    """The launcher of a recorded run. Runs recorded before the store kept it name only their
    scheduler and style; step runs (STEP_STYLES) are their scheduler's jobs."""
    if style in STYLES:
        return STYLES[style].launcher
    if scheduler in ("slurm", "local", "ssh"):
        return {"slurm": "slurm", "local": "local", "ssh": "ssh_docker"}[scheduler]
    return scheduler   # unknown: the caller's lookup in LAUNCHERS names it
