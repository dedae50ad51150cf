"""Docker: one container per node (the node script's `up`), sshd inside on the run's port and
key, then the run's own MPI world: mpirun over ssh from rank 0's container. Every node command
goes through the scheduler's fan-out (srun on Slurm, ssh for a host list). Where the job runs
on another machine than rank 0 (ssh), a private run's proxy runs in rank 0's container
(docker_node.sh proxy_up), and the job reaches rank 0 through it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..config import PROXY_BINARY, PROXY_STAGE, PROXY_TLS_FILES, StepConfig
from ..fileops import copy_private, file_size, remove_entry
from ..names import EV, FILES
from ..text import first_match, last_line, read_text
from ..world import World
from .base import Proxy, Runtime
from .node_containers import NodeContainers

if TYPE_CHECKING:
    from ..styles import JobStyle

# A proxy in rank 0's container (ssh + Docker): its start over ssh and docker exec, its copy of
# Caddy (about 50 MB) and its listening within this long; at its stop, this long for its
# requests in flight (as a proxy beside the job gets) before it is killed.
PROXY_START_S = 60.0
PROXY_STOP_S = 5


class DockerRuntime(Runtime):
    def __init__(self, style: JobStyle):
        super().__init__(style)
        self.node_script = self.script("docker_node.sh")
        self.containers = NodeContainers(
            style, "docker", self.node_script,
            f"docker rm -f $(docker ps -aq --filter label={self.cfg.docker_label}={self.cfg.run_id})")
        self.hosts: List[str] = []
        self.rank0_node = ""

    def world(self) -> Optional[World]:
        return DockerWorld(self.style, self)

    def proxy(self) -> Proxy:
        # The job beside rank 0 starts the proxy itself; elsewhere it runs in rank 0's container.
        return Proxy(self.style) if self.style.scheduler.on_rank0_node else ContainerProxy(self.style, self)

    def find_hosts(self) -> None:
        self.hosts = self.style.scheduler.hosts_rank0_first()
        self.rank0_node = self.hosts[0]

    def in_rank0_container(self, *argv: str) -> List[str]:
        return [*self.style.scheduler.on_first_host(), "bash", self.node_script, "exec", *argv]

    def mpi_hosts(self) -> str:
        return ",".join(f"{h}:1" for h in self.hosts)

    def up(self) -> None:
        job, cfg = self.job, self.cfg
        self.find_hosts()
        ssh = cfg.ssh_dir
        if not (file_size(os.path.join(ssh, "id_ed25519")) and file_size(os.path.join(ssh, "host_ed25519.pub"))):
            job.fail(f"no run keys in {ssh} (ftcluster launch makes them before submitting)")
        # Every node presents the run's host key on the ssh port: ssh verifies it, never skips it.
        host_key = " ".join(read_text(os.path.join(ssh, "host_ed25519.pub")).split()[:2])
        with open(os.path.join(ssh, "known_hosts"), "w") as f:
            f.writelines(f"[{h}]:{cfg.ssh_port} {host_key}\n" for h in self.hosts)
        job.event(EV.containers_starting, *self.hosts)
        self.containers.start_guards()
        job.run(self.containers.node_step("up", "up"))
        bad, first = [], ""
        for h in self.hosts:
            st = read_text(os.path.join(self.containers.dir(), f"{h}.up")).strip()
            if not st:
                last = last_line(read_text(job.log_path(f"docker-up-{h}.log"))) or f"see logs/docker-up-{h}.log"
                st = f"failed the node step did not run: {last}"
            word, _, rest = st.partition(" ")
            if word == "ok":
                job.event(EV.node_ready, h, rest)
            else:
                bad.append(h)
                job.event(EV.node_failed, h, rest)
                first = first or f"{h}: {rest}"
        if bad:
            job.fail(f"containers failed to start on {' '.join(bad)}: {first}")
        job.event(EV.containers_ready, self.mpi_hosts())

    def clear_servers(self) -> None:
        self.containers.reap()

    def clean_left_over(self) -> None:
        # Not down(): the run's keys stay, for the containers started next.
        self.find_hosts()
        self.containers.started = True
        self.containers.down([h for h in self.hosts if h not in self.style.scheduler.lost])

    def down(self) -> bool:
        ok = self.containers.down([h for h in self.hosts if h not in self.style.scheduler.lost])
        # The run's keys are only good for this run's containers.
        shutil.rmtree(self.cfg.ssh_dir, ignore_errors=True)
        return ok


class DockerWorld(World):
    """One process per node, from rank 0's container, over ssh with the run's key."""

    world_ends_s = 0.0   # mpirun: killed at once (it takes longer to end the world itself)

    ended_while_serving = "mpirun ended while serving"

    def __init__(self, style: JobStyle, runtime: DockerRuntime):
        super().__init__(style)
        self.runtime = runtime

    def from_rank0(self, mpirun: str, *argv: str) -> List[str]:
        """The world through the node script's `mpirun` (the servers: a failed rank's world gets
        the exit grace) or `mpirun_brief` (the others end at once)."""
        rt = self.runtime
        return rt.in_rank0_container("bash", rt.node_script, mpirun, rt.mpi_hosts(), *argv)

    def mpi_world(self, *argv: str) -> List[str]:
        """The MPI check's and a job step's world."""
        return self.from_rank0("mpirun_brief", *argv)

    def where_rank0_runs(self, *argv: str) -> List[str]:
        # In its container: pids as the container sees them.
        return self.runtime.in_rank0_container(*argv)

    def rank0_host(self) -> str:
        return self.runtime.rank0_node

    def mpi_check_problem(self, log: str) -> str:
        """The check's own PROBLEM line wherever it stands; else the first line that says an
        error, but none of Open MPI's warnings: mpirun's plm:rsh (plm:ssh in Open MPI 5) logs
        "Warning: setpgid(...) failed in parent with errno=Permission denied" when its ssh child
        has already exec'd, which it ignores ("the child is off and running"), and which came
        before the rank's own PROBLEM line."""
        problem = first_match(log, r"^PROBLEM: ")
        if problem:
            return problem[len("PROBLEM: "):]
        return first_match(log, r"^(?!.*\bWarning: ).*(error|ERROR|denied|failed)")

    def step_command(self, step: StepConfig) -> Tuple[List[str], Dict[str, str]]:
        if step.per_node:
            # One rank per container; rank 0's node is the rendezvous host.
            return self.mpi_world(*step.argv, "--master-addr", self.runtime.rank0_node), {}
        return self.runtime.in_rank0_container(*step.argv), {}

    def start_servers(self) -> None:
        self.servers = self.job.start(self.from_rank0("mpirun", "bash", self.runtime.node_script, "rank"),
                                      out=self.job.log_path(FILES.mpirun_log))

    def kill_servers(self) -> None:
        # Ends mpirun's docker exec here; the container removal (the teardown), or clear_servers
        # before a restart, is the SIGKILL for what runs in the containers.
        self.kill_server_process()
        self.reap_servers()


class ContainerProxy(Proxy):
    """The proxy in rank 0's container, the job running on another machine (ssh + Docker)."""

    proxy_in_container = True

    def __init__(self, style: JobStyle, runtime: DockerRuntime):
        super().__init__(style)
        self.runtime = runtime
        self.proxy_started = False

    def proxy_stage(self) -> str:
        return self.state_file(PROXY_STAGE)

    def proxy_record(self) -> str:
        """Where rank 0's container records that its proxy listens ("ok") or failed ("failed WHY")."""
        return os.path.join(self.runtime.containers.dir(), f"{self.runtime.rank0_node}.proxy")

    def proxy_command(self, binary: str, token: str) -> Tuple[List[str], Dict[str, str]]:
        """docker_node.sh proxy_up on rank 0's node. What Caddy needs there is staged in the run
        folder, which every host and container sees at the same path (the launching machine's
        own paths may not exist on the node): the binary this job would run (the image has
        none) and proxy.tls_cert's files, copied with their final modes from the start. The
        container copies them into a folder of its own and removes the staged copy; it reads
        the token from the run's token file itself, so nothing here carries it."""
        p = self.cfg.proxy
        assert p is not None
        stage = self.proxy_stage()
        remove_entry(stage)
        os.mkdir(stage, 0o700)
        self.proxy_started = True   # from here on the teardown stops it and removes what is left
        copy_private(shutil.which(binary) or binary, os.path.join(stage, PROXY_BINARY), 0o700)
        if p.tls_cert and p.tls_key:
            for src, name in zip((p.tls_cert, p.tls_key), PROXY_TLS_FILES):
                copy_private(os.path.expanduser(src), os.path.join(stage, name), 0o600)
        remove_entry(self.proxy_record())   # no earlier start's word is taken for this one's
        return [*self.style.scheduler.on_first_host(), "bash", self.runtime.node_script, "proxy_up"], {}

    def wait_proxy_listening(self, proxy: subprocess.Popen[bytes]) -> None:
        """Until rank 0's container records that Caddy holds the endpoint's ports: the job's
        requests carry the token there only then (to a port someone else held, they would give
        it away)."""
        job = self.job
        rank0 = self.runtime.rank0_node
        deadline = time.monotonic() + PROXY_START_S
        while True:
            said = read_text(self.proxy_record()).strip()
            if said == "ok":
                return
            if said.startswith("failed ") or proxy.poll() is not None:
                try:   # the record comes first, the exit follows: its code and its last words
                    proxy.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.fail(f"the proxy (access: private) did not start in rank 0's container on {rank0}: "
                             f"{said[len('failed '):]}")
                job.fail(job.doors.proxy_problem() or "the proxy (access: private) ended")
            if time.monotonic() >= deadline:
                job.fail(f"the proxy (access: private) did not listen in rank 0's container on {rank0} "
                         f"within {PROXY_START_S:g} s: see logs/{FILES.proxy_log}")
            job.nap(0.05)

    def stop_proxy(self) -> None:
        """Caddy in rank 0's container asked to stop there (SIGTERM, killed after PROXY_STOP_S)
        and its copied files removed; the staged copy goes if it is still here."""
        if self.proxy_started:
            self.proxy_started = False
            rt = self.runtime
            rc = self.job.run(rt.in_rank0_container("bash", rt.node_script, "proxy_stop", str(PROXY_STOP_S)),
                              out=subprocess.DEVNULL, limit=PROXY_STOP_S + 60, interruptible=False)
            if rc:
                self.job.say(f"ftcluster: stopping the proxy in rank 0's container on {rt.rank0_node} failed "
                             f"(exit {rc}); the container's removal ends it")
        remove_entry(self.proxy_stage())

    def proxy_host(self) -> str:
        return self.runtime.rank0_node

    def proxy_node(self) -> str:
        return self.runtime.rank0_node
