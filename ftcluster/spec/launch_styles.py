"""The launch styles, one row each: what a style is made of and how it behaves.

A style is a scheduler x a container runtime. A new style is a row here naming its scheduler
(a key of SCHEDULERS: a module in ftcluster/schedulers/) and its runtime (a key of RUNTIMES: a
module in ftcluster/runtimes/), either of them new or both existing; its launcher name (a key of
LAUNCHERS, which run records keep); an entry script template that extends
job_templates/job.sh.j2; and a row of JOB_STYLES in ftcluster/job/styles.py (the job's side,
composed of a scheduler of ftcluster/job/schedulers/ and a runtime of ftcluster/job/runtimes/). Rendering, the job request, status, logs and stop
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
    scheduler: str             # a key of SCHEDULERS: submits, follows and stops the job
    runtime: str               # a key of RUNTIMES: the image's check, the run's resources (keys)
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
    def launcher(self) -> str:
        """The name run records and job requests keep for this style's scheduler and runtime."""
        return launcher_of(self.scheduler, self.runtime)

    @property
    def job_style(self) -> str:
        """The supervisor's row for this style (ftcluster.job.styles.JOB_STYLES: its scheduler and runtime)."""
        return self.name


STYLES: dict[str, Style] = {s.name: s for s in (
    Style("none", "srun --mpi starts one rank per node on the hosts themselves", "slurm_job.sh.j2", "slurm", "none",
          runs_here=False, in_image=False, converts=True),
    Style("pyxis", "srun --mpi starts one rank per node in the image through Pyxis (--container-image)",
          "slurm_job.sh.j2", "slurm", "pyxis",
          runs_here=False, in_image=True, node_script="pyxis_node.sh.j2",
          srun_mounts=True, converts=True),
    Style("docker", "a Docker container per node (srun runs scripts/docker_node.sh), mpirun over ssh from rank 0's",
          "slurm_job.sh.j2", "slurm", "docker",
          runs_here=False, in_image=True, node_script="docker_node.sh.j2",
          run_keys=True, docker_run=True, converts=True),
    Style("ssh_docker", "a Docker container per host over ssh (python -m ftcluster.hosts.fanout), mpirun over ssh from "
          "rank 0's", "here_job.sh.j2", "ssh", "docker",
          runs_here=True, in_image=True, node_script="docker_node.sh.j2",
          run_keys=True, docker_run=True, host_list=True, proxy_in_container=True),
    Style("charliecloud", "srun --mpi starts one rank per node, each inside ch-run IMAGE (Charliecloud)",
          "slurm_job.sh.j2", "slurm", "charliecloud",
          runs_here=False, in_image=True,
          node_script="charliecloud_node.sh.j2", converts=True),
    Style("local", "one mpirun starts every rank on this machine, ports apart", "here_job.sh.j2", "local", "none",
          runs_here=True, in_image=False, one_host=True, converts=True),
)}

# The record of a run whose job is one step in place of the servers names that step as its
# style (its launcher is recorded beside it): no server ranks, one step log.
STEP_STYLES = ("preflight", "convert", "front")

# Scheduler name (a cluster spec's `scheduler`) -> "module:class"; imported on use
# (ftcluster.schedulers): a scheduler pulls in its own code (Slurm's CLI, the local job's).
SCHEDULERS: dict[str, str] = {
    "slurm": "ftcluster.schedulers.slurm:SlurmScheduler",
    "ssh": "ftcluster.schedulers.ssh:SshScheduler",
    "local": "ftcluster.schedulers.local:LocalScheduler",
}

# Container runtime name (a spec's container.runtime; "none": the hosts themselves) -> "module:class".
RUNTIMES: dict[str, str] = {
    "none": "ftcluster.runtimes.none:NoRuntime",
    "pyxis": "ftcluster.runtimes.pyxis:PyxisRuntime",
    "charliecloud": "ftcluster.runtimes.charliecloud:CharliecloudRuntime",
    "docker": "ftcluster.runtimes.docker:DockerRuntime",
}

# Launcher name -> (scheduler, runtime): the name run records and job requests keep (run
# folders written before the two axes were split name these too, and resolve through here).
LAUNCHERS: dict[str, tuple[str, str]] = {
    "slurm": ("slurm", "none"),
    "pyxis_slurm": ("slurm", "pyxis"),
    "charliecloud_slurm": ("slurm", "charliecloud"),
    "docker_slurm": ("slurm", "docker"),
    "ssh_docker": ("ssh", "docker"),
    "local": ("local", "none"),
}


def launcher_of(scheduler: str, runtime: str) -> str:
    """The launcher name of a scheduler and runtime (a pair of LAUNCHERS)."""
    return next(name for name, pair in LAUNCHERS.items() if pair == (scheduler, runtime))


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
