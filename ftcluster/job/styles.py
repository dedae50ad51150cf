"""Each launch style as a scheduler and a runtime, composed per run: the only place of the
supervisor that knows styles. `ftcluster.spec.launch_styles.Style.job_style` names the style.

The scheduler (schedulers/: local, ssh, slurm) gives the job's id and nodes, a command on every
node or the first host, lost nodes, and the MPI world where the runtime brings none; the runtime
(runtimes/: none, pyxis, charliecloud, docker) gives how a command enters the image, the
containers up and down, and the MPI world where it brings its own (Docker's mpirun over ssh).
`JobStyle` holds the two, the world and the proxy they chose, and only passes calls on.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Type

from .config import StepConfig
from .runtimes.base import Proxy, Runtime
from .runtimes.charliecloud import CharliecloudRuntime
from .runtimes.docker import DockerRuntime
from .runtimes.none import NoRuntime
from .runtimes.pyxis import PyxisRuntime
from .schedulers.base import Scheduler
from .schedulers.local import LocalScheduler
from .schedulers.slurm import SlurmScheduler
from .schedulers.ssh import SshScheduler
from .world import World

if TYPE_CHECKING:
    from .supervisor import Job

# A style's name (launch_styles.Style.job_style) -> its scheduler and runtime.
JOB_STYLES: Dict[str, Tuple[Type[Scheduler], Type[Runtime]]] = {
    "none": (SlurmScheduler, NoRuntime),
    "pyxis": (SlurmScheduler, PyxisRuntime),
    "charliecloud": (SlurmScheduler, CharliecloudRuntime),
    "docker": (SlurmScheduler, DockerRuntime),
    "ssh_docker": (SshScheduler, DockerRuntime),
    "local": (LocalScheduler, NoRuntime),
}


class JobStyle:
    """A scheduler and a runtime for one job; the MPI world is the runtime's own where it brings
    one, else the scheduler's."""

    def __init__(self, job: Job, scheduler: Type[Scheduler], runtime: Type[Runtime]):
        self.job = job
        self.scheduler = scheduler(self)
        self.runtime = runtime(self)
        world = self.runtime.world() or self.scheduler.world()
        if world is None:
            raise ValueError(f"{scheduler.__name__} with {runtime.__name__}: neither starts an MPI world")
        self.world: World = world
        self.proxy: Proxy = self.runtime.proxy()

    # --- the scheduler ----------------------------------------------------------------------------

    @property
    def guarded(self) -> bool:
        return self.scheduler.guarded

    @property
    def lost(self) -> List[str]:
        return self.scheduler.lost

    def job_id(self) -> str:
        return self.scheduler.job_id()

    def job_nodes(self) -> List[str]:
        return self.scheduler.job_nodes()

    def every_node(self, output: str) -> List[str]:
        return self.scheduler.every_node(output)

    def lost_nodes(self) -> List[str]:
        return self.scheduler.lost_nodes()

    def guard_argv(self) -> List[str]:
        return self.scheduler.guard_argv()

    def end_stopped_job(self) -> None:
        self.scheduler.end_stopped_job()

    def end_earlier_steps(self) -> None:
        self.scheduler.end_earlier_steps()

    # --- the runtime ------------------------------------------------------------------------------

    def up(self) -> None:
        self.runtime.up()

    def down(self) -> bool:
        return self.runtime.down()

    def first_step_seen(self, failed: bool, logs: List[str]) -> None:
        self.runtime.first_step_seen(failed, logs)

    def clear_servers(self) -> None:
        self.runtime.clear_servers()

    # --- the MPI world ----------------------------------------------------------------------------

    @property
    def servers(self) -> Optional[subprocess.Popen[bytes]]:
        return self.world.servers

    @servers.setter
    def servers(self, proc: Optional[subprocess.Popen[bytes]]) -> None:
        self.world.servers = proc

    @property
    def ended_while_serving(self) -> str:
        return self.world.ended_while_serving

    @property
    def world_ends_s(self) -> float:
        return self.world.world_ends_s

    def mpi_check(self) -> None:
        self.world.mpi_check()

    def step_command(self, step: StepConfig) -> Tuple[List[str], Dict[str, str]]:
        return self.world.step_command(step)

    def start_servers(self) -> None:
        self.world.start_servers()

    def servers_alive(self) -> bool:
        return self.world.servers_alive()

    def started_servers(self) -> bool:
        return self.world.started_servers()

    def term_rank0(self) -> bool:
        return self.world.term_rank0()

    def kill_servers(self) -> None:
        self.world.kill_servers()

    # --- the proxy (access: private) --------------------------------------------------------------

    @property
    def proxy_in_container(self) -> bool:
        return self.proxy.proxy_in_container

    def proxy_command(self, binary: str, token: str) -> Tuple[List[str], Dict[str, str]]:
        return self.proxy.proxy_command(binary, token)

    def wait_proxy_listening(self, proxy: subprocess.Popen[bytes]) -> None:
        self.proxy.wait_proxy_listening(proxy)

    def stop_proxy(self) -> None:
        self.proxy.stop_proxy()

    def proxy_host(self) -> str:
        return self.proxy.proxy_host()

    def proxy_node(self) -> str:
        return self.proxy.proxy_node()


def style_for(job: Job) -> JobStyle:
    scheduler, runtime = JOB_STYLES[job.cfg.style]
    return JobStyle(job, scheduler, runtime)
