"""The launch styles, one row each: what a style is made of and how it behaves.

A new style is a row here, an entry script template that extends job_templates/job.sh.j2, a
launcher module in ftcluster/launchers/ and a behaviour class in ftcluster/job/styles.py (how
the job reaches the nodes and its containers). Rendering, the job request, status, logs and stop
find it through this table and ask its fields, never its name. Light (no specs, no templates)
so that status/logs/stop start fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # specs are heavy (pydantic); annotations only
    from ftcluster.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class Style:
    name: str
    summary: str               # one line for the entry script's header: how the ranks start
    template: str              # the entry script's template in job_templates/ (extends job.sh.j2)
    launcher: str              # a key of LAUNCHERS
    runs_here: bool            # the job runs on this host as a process group (job.sh), not through sbatch (job.sbatch)
    in_image: bool             # the ranks run inside the user's image (its own python3, no ftcluster)
    node_script: str = ""      # a node-side script template rendered beside the job (containers up/down/guard)
    run_keys: bool = False     # per-run ssh keys: mpirun over ssh between the run's containers
    docker_run: bool = False   # containers started by `docker run` (its options rendered)
    srun_mounts: bool = False  # the image's mounts go through srun --container-mounts (Pyxis syntax, checked)
    host_list: bool = False    # fixed hosts reached over ssh (scripts/nodes.json for the fan-out)
    one_host: bool = False     # every rank on this machine: distinct ports per rank, no MPI check
    converts: bool = False     # FT's converter can run as this style's one-task job step (`ftcluster convert`)
    proxy: bool = True         # the job can start the endpoint's proxy beside rank 0 (access: private, replicas)
    # ... in rank 0's container, the job running on another machine: the job's own requests to
    # rank 0 go through the proxy, with the run's token
    proxy_in_container: bool = False

    @property
    def job_style(self) -> str:
        """The supervisor's behaviour class for this style (ftcluster.job.styles.JOB_STYLES)."""
        return self.name


STYLES: dict[str, Style] = {s.name: s for s in (
    Style("none", "srun --mpi starts one rank per node on the hosts themselves", "slurm_job.sh.j2", "slurm",
          runs_here=False, in_image=False, converts=True),
    Style("pyxis", "srun --mpi starts one rank per node in the image through Pyxis (--container-image)",
          "slurm_job.sh.j2", "pyxis_slurm", runs_here=False, in_image=True, node_script="pyxis_node.sh.j2",
          srun_mounts=True, converts=True),
    Style("docker", "a Docker container per node (srun runs scripts/docker_node.sh), mpirun over ssh from rank 0's",
          "slurm_job.sh.j2", "docker_slurm", runs_here=False, in_image=True, node_script="docker_node.sh.j2",
          run_keys=True, docker_run=True, converts=True),
    Style("ssh_docker", "a Docker container per host over ssh (python -m ftcluster.hosts.fanout), mpirun over ssh from "
          "rank 0's", "here_job.sh.j2", "ssh_docker", runs_here=True, in_image=True, node_script="docker_node.sh.j2",
          run_keys=True, docker_run=True, host_list=True, proxy_in_container=True),
    Style("charliecloud", "srun --mpi starts one rank per node, each inside ch-run IMAGE (Charliecloud)",
          "slurm_job.sh.j2", "charliecloud_slurm", runs_here=False, in_image=True,
          node_script="charliecloud_node.sh.j2", converts=True),
    Style("local", "one mpirun starts every rank on this machine, ports apart", "here_job.sh.j2", "local",
          runs_here=True, in_image=False, one_host=True, converts=True),
)}

# The record of a run whose job is one step in place of the servers names that step as its
# style (its launcher is recorded beside it): no server ranks, one step log.
STEP_STYLES = ("preflight", "convert", "front")

# Launcher name -> "module:class"; imported on use (a launcher pulls in its scheduler's code).
LAUNCHERS: dict[str, str] = {
    "slurm": "ftcluster.launchers.slurm:SlurmLauncher",
    "pyxis_slurm": "ftcluster.launchers.slurm:PyxisSlurmLauncher",
    "charliecloud_slurm": "ftcluster.launchers.charliecloud:CharliecloudSlurmLauncher",
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


def style_of(cluster: ClusterSpec) -> Style:
    """The launch style of a cluster spec."""
    return STYLES[style_name(cluster.scheduler, cluster.container.runtime)]


def launcher_name(scheduler: str, style: str) -> str:
    """The launcher of a recorded run. Runs recorded before the store kept it name only their
    scheduler and style; step runs (STEP_STYLES) are their scheduler's jobs."""
    if style in STYLES:
        return STYLES[style].launcher
    if scheduler in ("slurm", "local", "ssh"):
        return {"slurm": "slurm", "local": "local", "ssh": "ssh_docker"}[scheduler]
    return scheduler   # unknown: the caller's lookup in LAUNCHERS names it
