"""Slurm: the job is a batch job; srun starts its steps (one MPI world with --mpi, a command on
every node with --overlap), a node that runs no step is lost, the servers' step is ended by its
name, and scancel ends a stopped job and an earlier supervisor's steps."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from ..config import StepConfig
from ..names import FILES
from ..text import first_match
from ..thisnode import is_this_node, this_node
from ..world import World, srun_failures
from .base import Scheduler

# The servers' Slurm step, by name: ended alone on a restart and at the teardown.
SERVER_STEP = "ftc-servers"
# A step that has not run on a node within this long (srun's own wait for an unanswering
# slurmd is MessageTimeout, 10 s by default) means the node is lost.
LOST_NODE_S = 10.0
# How often the nodes are asked while not even the batch host runs a step (slurmctld waited for
# between asks).
LOST_NODE_ASKS = 3
# One step over all of them, first: this long, plus 10 ms a node (srun's fan-out).
ALL_NODES_S = 3.0
# A supervisor started again in the same job waits this long for the earlier one's steps to end.
STEPS_END_S = 30.0


class SlurmScheduler(Scheduler):
    def job_id(self) -> str:
        return os.environ.get("SLURM_JOB_ID", "")

    def job_nodes(self) -> List[str]:
        """The job's nodes, as Slurm names them."""
        listed = self.job.capture(["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")])
        return (listed or "").split()

    def hosts_rank0_first(self) -> List[str]:
        # Rank 0 is this node (the client and readiness checks run here); the others follow.
        rank0 = this_node()
        hosts = [rank0] + [h for h in self.job_nodes() if h != rank0]
        if len(hosts) != self.cfg.nodes:
            self.job.fail(f"expected {self.cfg.nodes} nodes, Slurm gave: {' '.join(hosts)}")
        return hosts

    def every_node(self, output: str) -> List[str]:
        n = self.cfg.nodes - len(self.lost)
        return ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                *([f"--exclude={','.join(self.lost)}"] if self.lost else []), f"--output={output}"]

    def on_first_host(self) -> List[str]:
        return []   # rank 0 is the batch node

    def world(self) -> Optional[World]:
        return SrunWorld(self.style)

    def lost_nodes(self) -> List[str]:
        """The job's nodes that no longer run a step (their slurmd is gone, or the machine).
        They are remembered (the teardown's node steps leave them out). A step needs slurmctld:
        while it does not answer, no step runs anywhere, and that loses no node. The batch host
        is the proof (this runs on it): where its own step failed too, the job waits until
        slurmctld answers and asks again (LOST_NODE_ASKS times at most: a slurmd of the batch host
        that is gone while slurmctld answers is a lost node too)."""
        for ask in range(LOST_NODE_ASKS):
            nodes = self.job_nodes()
            lost = self._nodes_without_a_step(nodes)
            if this_node() not in lost or this_node() not in nodes or ask == LOST_NODE_ASKS - 1:
                break
            self.job.wait_for_slurm(f"not even this node ({this_node()}) ran a step")
        self.lost = lost
        return self.lost

    def _nodes_without_a_step(self, nodes: List[str]) -> List[str]:
        """First one tiny step over every node (the common case, none lost: one step, not one
        srun and one step request per node -- 16 of them took 0.9 s here), given ALL_NODES_S;
        only if it fails, one on each at once, each given LOST_NODE_S."""
        if len(nodes) > 1:
            rc = self.job.run([*self.every_node(os.devnull), "true"], out=subprocess.DEVNULL,
                              limit=ALL_NODES_S + 0.01 * len(nodes), kill_after=0, interruptible=False)
            if rc == 0:
                return []
        probes = {n: self.job.start(["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", n, "--kill-on-bad-exit=0",
                                     "true"], out=subprocess.DEVNULL) for n in nodes}
        deadline = time.monotonic() + LOST_NODE_S
        for proc in probes.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return [n for n, proc in probes.items() if proc.returncode != 0]

    def end_stopped_job(self) -> None:
        """After a stop asked for (`ftcluster stop`), torn down: the job cancels itself, so that
        Slurm's books (squeue, sacct, scontrol) say CANCELLED as its user asked, not FAILED or
        COMPLETED by the batch script's exit code."""
        if self.job_id():
            self.job.capture(["scancel", self.job_id()], limit=10)

    def end_earlier_steps(self) -> None:
        """A supervisor started again in the same job (Job.taken_back): the steps the one before
        started (its servers, its containers' guards) are SIGKILLed, then what their ranks left
        on every node goes as at a teardown: the run's marked processes, /dev/shm entries and
        containers. The world then starts afresh."""
        def steps() -> List[str]:
            listed = self.job.capture(["squeue", "-h", "-s", "-j", self.job_id(), "-o", "%i"]) or ""
            return [s for s in listed.split() if s.rpartition(".")[2].isdigit()]   # not .batch, .extern

        left = steps()
        for step in left:
            self.job.capture(["scancel", "--signal=KILL", step])
        deadline = time.monotonic() + STEPS_END_S
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = steps()
        if left:
            self.job.say(f"ftcluster: the earlier supervisor's steps {' '.join(left)} did not end within "
                         f"{STEPS_END_S:g} s")
        self.style.runtime.clean_left_over()


class SrunWorld(World):
    """One task per node under srun --mpi, in the runtime's image: the servers' step, the MPI
    check, a job step."""

    # After a rank's death srun (--kill-on-bad-exit) ends the other tasks itself (TERM; each
    # wrapper then kills its server): this long for it before the step is KILLed (16 ranks on 2
    # cores: 0.5-1 s). A KILL to the step while Slurm ends it waited 1.2 s for slurmctld at 16
    # nodes here, and a step signalled that early has hung in its PMIx teardown (the job left
    # COMPLETING).
    world_ends_s = 1.0

    def srun_world(self, mpi: bool = True) -> List[str]:
        """One task per node (one MPI world unless mpi=False), in the container where there is one."""
        n = self.cfg.nodes
        return ["srun", *([f"--mpi={self.cfg.mpi}"] if mpi else []), f"--nodes={n}", f"--ntasks={n}",
                "--ntasks-per-node=1", "--kill-on-bad-exit=1", *self.cfg.srun_args,
                *self.style.runtime.container_flags()]

    def mpi_world(self, *argv: str) -> List[str]:
        return [*self.srun_world(), *self.style.runtime.in_image(list(argv))]

    def rank0_host(self) -> str:
        return socket.gethostname()

    def mpi_check_problem(self, log: str) -> str:
        """The cause of a failed MPI check from its log: the check's own PROBLEM line; else the
        first task srun saw fail (the image's MPI ended a rank itself: Open MPI exits inside
        MPI_Init), with the first line that is not srun's own; else srun's own error. A plugin
        srun does not know gets the list of those it does."""
        if "plugin" in log:
            self.job.say("ftcluster: MPI plugins this cluster offers (set mpi: in the cluster spec):")
            self.job.say(self.job.capture(["srun", "--mpi=list"]) or "")
        problem = first_match(log, r"^PROBLEM: ")
        if problem:
            return problem[len("PROBLEM: "):]
        failed = srun_failures(log)
        if failed:
            node, tasks, what = failed[0]
            other = first_match(log, r"^(?!srun|slurmstepd)") or f"see logs/{FILES.mpicheck_log}"
            return f"rank {tasks} on {node} ({what}): {other}"
        return first_match(log, r"error")

    def step_command(self, step: StepConfig) -> Tuple[List[str], Dict[str, str]]:
        runtime = self.style.runtime
        if step.per_node:
            return self.mpi_world(*step.argv), {}
        return ["srun", "--nodes=1", "--ntasks=1", *self.cfg.srun_args, *runtime.container_flags(),
                *runtime.in_image(list(step.argv))], {}

    def start_servers(self) -> None:
        self.servers = self.job.start([*self.srun_world(), f"--job-name={SERVER_STEP}",   # named: ended alone
                                       f"--output={self.cfg.logs}/rank%t.stdout",
                                       *self.style.runtime.in_image(["bash", self.script("rank_server.sh")])])

    def where_rank0_runs(self, *argv: str) -> List[str]:
        """A command run beside rank 0: here when rank 0 runs on this node (Slurm places it on
        the batch host; a container of Pyxis or Charliecloud shares the host's process ids), which
        saves launching a step (0.2-0.5 s a stop or restart); else a step on its node (scancel
        signals every step)."""
        node = self.job.ranks.node(0)
        if is_this_node(node):
            return list(argv)
        return ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", node, *argv]

    def kill_servers(self) -> None:
        """SIGKILL to the server step alone (found by its name): scancel --signal=KILL of the
        whole job ends the job, and neither a restart nor the teardown's steps could start."""
        if self.servers_alive():
            steps = self.job.capture(["squeue", "-h", "-s", "-j", self.style.scheduler.job_id(), "-o", "%i %j"]) or ""
            step = next((ln.split()[0] for ln in steps.splitlines()
                         if len(ln.split()) == 2 and ln.split()[1] == SERVER_STEP), "")
            if not step or self.job.capture(["scancel", "--signal=KILL", step]) is None:
                self.kill_server_process()
        self.reap_servers()
