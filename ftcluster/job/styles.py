"""How each launch style runs the job's pieces: the only place of the supervisor that knows styles.

A style answers: how a command reaches every node, or rank 0's node; how the run's containers go
up and down; how the servers, the MPI check and a job step start; how rank 0 is asked to stop
and every rank killed. `ftcluster.spec.launch_styles.Style.job_style` names the class here.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from .bash import FREE_PYTHON_ENVS, KILL_MARKED, NODE_TEARDOWN, PROVE_IN_IMAGE, SESSION_GUARD
from .config import PROXY_BINARY, PROXY_STAGE, PROXY_TLS_FILES, PROXY_TOKEN_ENV, StepConfig
from .names import EV, FILES
from .text import first_match, last_line, read_text, squeeze

# Triton's python backend's own /tmp folder (mkdtemp of /tmp/python_env_XXXXXX).
PYTHON_ENV_DIR = re.compile(r"/tmp/python_env_[A-Za-z0-9]{6}")
# Seconds x 10 a teardown that is not a failure's gives the marked processes (see KILL_MARKED).
MARKED_GRACE = 30
if TYPE_CHECKING:
    from .supervisor import Job


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
# The guards' own removal of the containers, when the teardown asks for it: done and recorded
# within this long (a node whose guard records nothing gets the teardown's `down` step).
GUARD_RECORD_S = 30.0
# A proxy in rank 0's container (ssh + Docker): its start over ssh and docker exec, its copy of
# Caddy (about 50 MB) and its listening within this long; at its stop, this long for its
# requests in flight (as a proxy beside the job gets) before it is killed.
PROXY_START_S = 60.0
PROXY_STOP_S = 5


# srun's line for a step's tasks that failed on a node: `srun: error: node2: task 1: Segmentation
# fault`, `srun: error: node1: tasks 0-1: Exited with exit code 14`.
_SRUN_FAILED = re.compile(r"^srun: error: ([^:\s]+): tasks? ([0-9][0-9,-]*): (.*)$", re.MULTILINE)


def srun_failures(log: str) -> List[Tuple[str, str, str]]:
    """(node, tasks as srun names them, what) for each failed-tasks line of srun's, in order."""
    return _SRUN_FAILED.findall(log)


# A rank that died by a crash signal, as srun (above) and Open MPI's mpirun (`... noticed that
# process rank 1 with PID 42 on node node2 exited on signal 11 (Segmentation fault).`, wrapped at
# any space by Open MPI 5) report it.
_CRASHES = ("Segmentation fault", "Bus error")
_MPIRUN_CRASH = re.compile(r"noticed\s+that\s+process\s+rank\s+([0-9]+)\s+with\s+PID\s+[0-9]+\s+on\s+node\s+(\S+)\s+"
                           r"exited\s+on\s+signal\s+(?:11|7)\s+\(([^)]+)\)")


def crashed_rank(log: str) -> Optional[str]:
    """`rank R on NODE (SIGNAL)` for the first rank of a step's log that crashed, else None. On
    one line: it goes into an event (Open MPI 5 may wrap inside the signal's name too)."""
    for node, tasks, what in srun_failures(log):
        crash = next((c for c in _CRASHES if what.startswith(c)), None)
        if crash:
            return f"rank {tasks} on {node} ({crash})"
    m = _MPIRUN_CRASH.search(log)
    if m:
        return f"rank {m.group(1)} on {m.group(2)} ({squeeze(m.group(3))})"
    return None


class JobStyle:
    """The bare-metal Slurm style (no container); the others change what differs."""

    ended_while_serving = "the server step ended while serving"
    # After a rank's death srun (--kill-on-bad-exit) ends the other tasks itself (TERM; each
    # wrapper then kills its server): this long for it before the step is KILLed (16 ranks on 2
    # cores: 0.5-1 s). A KILL to the step while Slurm ends it waited 1.2 s for slurmctld at 16
    # nodes here, and a step signalled that early has hung in its PMIx teardown (the job left
    # COMPLETING).
    world_ends_s = 1.0

    def __init__(self, job: Job):
        self.job = job
        self.cfg = job.cfg
        self.servers: Optional[subprocess.Popen[bytes]] = None
        self.checked = False   # the MPI check ran on the nodes (what a killed rank of it leaves goes too)
        self.lost: List[str] = []   # nodes of the job that stopped answering (lost_nodes)

    # --- who am I -----------------------------------------------------------------------------

    def job_id(self) -> str:
        return os.environ.get("SLURM_JOB_ID", "")

    def script(self, name: str) -> str:
        return os.path.join(self.cfg.scripts, name)

    def state_file(self, name: str) -> str:
        return os.path.join(self.cfg.state, name)

    # --- the job beside its launcher ------------------------------------------------------------

    # The job runs beside its launcher (local, ssh + Docker), where no scheduler ends the job's
    # processes with it: a guard does, should the supervisor die (SESSION_GUARD).
    guarded = False

    def guard_argv(self, mpi_folder: str = "") -> List[str]:
        session = os.getsid(0)
        return ["bash", "-c", SESSION_GUARD, "_", str(session) if session == os.getpid() else "", mpi_folder,
                self.cfg.run_id, self.shm_glob()]

    def end_stopped_job(self) -> None:
        """After a stop asked for (`ftcluster stop`), torn down: the job cancels itself, so that
        Slurm's books (squeue, sacct, scontrol) say CANCELLED as its user asked, not FAILED or
        COMPLETED by the batch script's exit code. A job beside its launcher has no scheduler."""
        if not self.guarded and self.job_id():
            self.job.capture(["scancel", self.job_id()], limit=10)

    # --- containers ---------------------------------------------------------------------------

    def up(self) -> None:
        """The run's containers on every node (none here)."""

    def down(self) -> bool:
        """Removes the run's containers on every node; False when a node failed. Bare metal has
        none: what SIGKILLed ranks (the servers', the MPI check's) leave in /dev/shm is removed
        on every node instead."""
        if self.started_servers() or self.checked:
            self.job.run([*self.every_node("/dev/null"), "bash", "-c", NODE_TEARDOWN,
                          "_", self.cfg.run_id, str(self.marked_grace()), self.shm_glob(), *self.python_envs()],
                         out=subprocess.DEVNULL, limit=60, interruptible=False)
        return True

    def marked_grace(self) -> int:
        """Tenths of a second the run's leftover server processes get to end by themselves:
        none when the world broke (failing; a restart), some at a stop."""
        return 0 if self.job.failing or self.job.restarting else MARKED_GRACE

    def shm_glob(self) -> str:
        """What the run's ranks name in /dev/shm, as a prefix (rank_server.sh)."""
        return os.path.join(FILES.shm_dir, FILES.shm_prefix(self.cfg.run_id))

    def python_envs(self) -> List[str]:
        """The python backend's /tmp folders the run's SIGKILLed ranks left (rank_server.sh
        notes them): only names of that one shape, whatever the file says."""
        lines = read_text(os.path.join(self.cfg.state, FILES.python_envs)).split()
        return sorted({p for p in lines if PYTHON_ENV_DIR.fullmatch(p)})

    # --- the proxy (access: private) ----------------------------------------------------------

    # Whether the proxy runs in rank 0's container, the job on another machine (ssh + Docker):
    # the job's own requests to rank 0 then go through the proxy, with the run's token.
    proxy_in_container = False

    def proxy_command(self, binary: str, token: str) -> Tuple[List[str], Dict[str, str]]:
        """The proxy's command and what its environment adds, a child of the job: here, beside
        rank 0. Caddy's home is the run's own: it writes nothing else. The token reaches Caddy
        through its environment (its config names {env.FTC_PROXY_TOKEN})."""
        p = self.cfg.proxy
        assert p is not None
        home = self.state_file("proxy")
        os.makedirs(home, mode=0o700, exist_ok=True)
        return [binary, "run", "--config", p.config], {"HOME": home, "XDG_CONFIG_HOME": home, "XDG_DATA_HOME": home,
                                                       **({PROXY_TOKEN_ENV: token} if token else {})}

    def wait_proxy_listening(self, proxy: subprocess.Popen[bytes]) -> None:
        """Once the proxy was started: until it holds the endpoint's ports, where that takes a
        word from elsewhere (a child of the job here fails at once when a port is taken)."""

    def stop_proxy(self) -> None:
        """At the teardown, before the job's proxy children are ended: a proxy that runs
        elsewhere is asked to stop there."""

    def proxy_host(self) -> str:
        """Where the job reaches the proxy."""
        return "127.0.0.1"

    def proxy_node(self) -> str:
        """The node the proxy runs on, for messages."""
        return socket.gethostname()

    # --- Slurm steps --------------------------------------------------------------------------

    def container_flags(self) -> List[str]:
        return []

    def srun_world(self, mpi: bool = True) -> List[str]:
        """One task per node (one MPI world unless mpi=False), in the container where there is one."""
        n = self.cfg.nodes
        return ["srun", *([f"--mpi={self.cfg.mpi}"] if mpi else []), f"--nodes={n}", f"--ntasks={n}",
                "--ntasks-per-node=1", "--kill-on-bad-exit=1", *self.cfg.srun_args, *self.container_flags()]

    def job_nodes(self) -> List[str]:
        """The job's nodes, as Slurm names them."""
        listed = self.job.capture(["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")])
        return (listed or "").split()

    def every_node(self, output: str) -> List[str]:
        """One task on every node at once (but a lost one), beside the other steps, its output
        to `output` (%N: the node)."""
        n = self.cfg.nodes - len(self.lost)
        return ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                *([f"--exclude={','.join(self.lost)}"] if self.lost else []), f"--output={output}"]

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

    def mpi_check(self) -> None:
        """The MPI world through the same path and container as the servers: a broken world
        otherwise shows up later as a tritonserver that hangs silently at model load. A check
        whose rank crashed (SIGSEGV, SIGBUS) runs once more: Open MPI 5 started by srun's PMIx
        now and then takes a peer's first message before its own MPI_Init is ready for it and
        crashes there (open-mpi/ompi#12495; seen here about once in a hundred checks on a busy
        node); a world that is really broken fails the second check too."""
        job = self.job
        log = job.log_path(FILES.mpicheck_log)
        job.event(EV.mpicheck_started)
        self.checked = True
        rc = self._run_mpi_check(log)
        crash = crashed_rank(read_text(log)) if rc else None
        if crash:
            aside = job.log_path(FILES.mpicheck_crash_log)
            os.replace(log, aside)
            job.event(EV.mpicheck_again, crash.replace(" ", "_"))
            job.say(f"ftcluster: a rank of the MPI check crashed, {crash}; Open MPI does so at start-up now and "
                    f"then (open-mpi/ompi#12495): checking once more (the first check's log: logs/{FILES.mpicheck_crash_log})")
            rc = self._run_mpi_check(log)
        if rc:
            text = read_text(log)
            job.say(text.rstrip("\n"))
            job.fail(f"MPI check failed: {squeeze(self.mpi_check_problem(text)) or 'see logs/' + FILES.mpicheck_log}")
        job.event(EV.mpicheck_ok)

    def _run_mpi_check(self, log: str) -> int:
        job, cfg = self.job, self.cfg
        backends = ["--backends", ",".join(cfg.backends)] if cfg.backends else []
        if cfg.backends and cfg.backend_directory:
            backends += ["--backend-directory", cfg.backend_directory]
        rc = job.run(self.mpi_world("python3", self.script("mpicheck.py"), "--nodes", str(cfg.nodes),
                                    "--tritonserver", cfg.tritonserver, "--rank0-host", self.rank0_host(),
                                    "--out", os.path.join(cfg.results, FILES.mpicheck_json),
                                    "--shm-prefix", self.shm_glob(), *backends),
                     out=log, limit=cfg.mpi_check_timeout)
        self.first_step_seen(rc != 0, [log])
        return rc

    def in_image(self, argv: List[str]) -> List[str]:
        """A step task's command where the style runs it: as it is here (on the node, or in the
        container srun's own flags give it); a style whose container is a wrapper command
        (Charliecloud's ch-run) puts that in front."""
        return list(argv)

    def mpi_world(self, *argv: str) -> List[str]:
        """One process per node of one MPI world, as the servers start."""
        return [*self.srun_world(), *self.in_image(list(argv))]

    def first_step_seen(self, failed: bool, logs: List[str]) -> None:
        """After the first step that runs in the image (the MPI check, a job step) ended, or once
        the servers' rank 0 started (or their step ended first: `failed`): a style that
        creates its containers in that step checks them here. `logs`: that step's output."""

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
        if step.per_node:
            return self.mpi_world(*step.argv), {}
        return ["srun", "--nodes=1", "--ntasks=1", *self.cfg.srun_args, *self.container_flags(),
                *self.in_image(list(step.argv))], {}

    def server_flags(self) -> List[str]:
        return [f"--job-name={SERVER_STEP}"]   # named, so that it can be ended alone

    def start_servers(self) -> None:
        self.servers = self.job.start([*self.srun_world(), *self.server_flags(), f"--output={self.cfg.logs}/rank%t.stdout",
                                       *self.in_image(["bash", self.script("rank_server.sh")])])

    def servers_alive(self) -> bool:
        return self.servers is not None and self.servers.poll() is None

    def started_servers(self) -> bool:
        return self.servers is not None

    def term_rank0(self) -> bool:
        """SIGTERM to rank 0's wrapper where it runs, once identified as the recorded one
        (signal_rank.sh)."""
        pidfile = self.job.ranks.path(0, "pid")
        if not os.path.exists(pidfile):
            return False
        return self.job.run(self.where_rank0_runs("bash", self.script("signal_rank.sh"), "TERM", pidfile),
                            out=subprocess.DEVNULL, limit=30, interruptible=False) == 0

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
            steps = self.job.capture(["squeue", "-h", "-s", "-j", self.job_id(), "-o", "%i %j"]) or ""
            step = next((ln.split()[0] for ln in steps.splitlines()
                         if len(ln.split()) == 2 and ln.split()[1] == SERVER_STEP), "")
            if not step or self.job.capture(["scancel", "--signal=KILL", step]) is None:
                self.kill_server_process()
        self.reap_servers()

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
        self.clean_left_over()

    def clean_left_over(self) -> None:
        """What the earlier supervisor's ranks left on the nodes goes, as at its teardown."""
        self.checked = True   # the node step runs, as after a world of its own
        self.down()

    def clear_servers(self) -> None:
        """Before a restart's servers start: what the killed world left where they will run.
        On the nodes themselves the step's end killed every rank; a python backend stub that
        its server's end orphaned is found by the run's mark on every node."""
        self.job.run([*self.every_node("/dev/null"), *self.kill_marked_argv(0)], out=subprocess.DEVNULL, limit=60,
                     interruptible=False)

    def kill_marked_argv(self, grace: int) -> List[str]:
        """The command that kills the run's marked processes where it runs, after `grace`
        tenths of a second for them to end by themselves (KILL_MARKED)."""
        return ["bash", "-c", KILL_MARKED + 'kill_marked "$1" "$2"', "_", self.cfg.run_id, str(grace)]

    def kill_server_process(self) -> None:
        if self.servers is not None and self.servers.poll() is None:
            self.servers.kill()

    def reap_servers(self) -> None:
        if self.servers is not None:
            try:
                self.servers.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.servers.kill()
                self.servers.wait()


class NodeContainers:
    """The run's containers on every node, through a node script's `guard` and `down` (written
    once for Pyxis and Docker): a guard per node while the run may have containers (when the job
    cannot run its teardown -- cancelled by hand, out of time, the machine running it lost --
    the guard step ends and each guard removes its node's containers), and a `down` on every node
    whose outcome each node writes to state/<kind>/<node>.down ("ok" or "failed WHY")."""

    def __init__(self, style: JobStyle, kind: str, node_script: str, hint: str, guards_record: bool = False):
        self.style, self.job = style, style.job
        self.kind, self.node_script, self.hint = kind, node_script, hint
        # The guards' own removal writes each node's record (Pyxis): the teardown ends the guard
        # step and needs no `down` step of its own (a step launch fewer), but where a guard left
        # no record (it died with its node's step, say).
        self.guards_record = guards_record
        self.started = False
        self.guard: Optional[subprocess.Popen[bytes]] = None

    def dir(self) -> str:
        return self.style.state_file(self.kind)

    def node_step(self, what: str, log: str) -> List[str]:
        return [*self.style.every_node(os.path.join(self.job.cfg.logs, f"{self.kind}-{log}-%N.log")),
                "bash", self.node_script, what]

    def start_guards(self) -> None:
        os.makedirs(self.dir(), exist_ok=True)
        for name in os.listdir(self.dir()):   # an earlier job's (a requeue) say nothing of this one's
            if name.endswith(".down"):
                remove_entry(os.path.join(self.dir(), name))
        self.started = True
        self.guard = self.job.start(self.node_step("guard", "guard"))

    def stop_guards(self) -> None:
        # Each guard removes its node's containers as it ends (already gone after a `down` step).
        if self.guard is not None:
            self.job.end_child(self.guard, 30)
            self.guard = None

    def reap(self) -> None:
        """Every process of the killed world still in the run's containers, killed on every node
        (a restart's servers start in empty containers)."""
        if self.job.run(self.node_step("reap", "reap"), limit=120, interruptible=False):
            logs = sorted(n for n in os.listdir(self.job.cfg.logs) if n.startswith(f"{self.kind}-reap-"))
            problem = next(filter(None, (last_line(read_text(self.job.log_path(n))) for n in logs)), "")
            self.job.fail(f"the killed servers' processes could not be cleared from the containers: "
                          f"{squeeze(problem) or f'see logs/{self.kind}-reap-*.log'}")

    def down(self, hosts: List[str]) -> bool:
        if not self.started:
            return True
        job = self.job
        job.event(EV.containers_stopping)
        records = [os.path.join(self.dir(), f"{h}.down") for h in hosts]
        if self.guards_record and self.guard is not None and self.guard.poll() is None:
            # srun passes USR1 on to the guards and ends with them (a TERM it does not pass on:
            # it kills the step, and the guards with it).
            self.guard.send_signal(signal.SIGUSR1)
            try:
                self.guard.wait(GUARD_RECORD_S)
            except subprocess.TimeoutExpired:
                pass
            self.stop_guards()
        if not all(os.path.exists(r) for r in records):
            job.run(self.node_step("down", "down"), limit=120, interruptible=False)
        bad = []
        for h, record in zip(hosts, records):
            st = read_text(record).strip() or "failed no answer from the teardown step"
            if st != "ok":
                bad.append(h)
                why = st[len("failed "):] if st.startswith("failed ") else st
                job.event(EV.teardown_failed, h, why)
                job.say(f"ftcluster: removing the containers of the run on {h} failed: {why}; remove them by hand there: "
                        + self.hint)
        self.stop_guards()
        if bad:
            job.event(EV.failed, f"teardown failed on {' '.join(bad)}")
            return False
        job.event(EV.containers_stopped)
        return True


class PyxisStyle(JobStyle):
    """Pyxis: the first step that runs in the image (the MPI check, a job step or the servers)
    creates the named container on every node, and the later steps reuse it (mounts repeated: a
    named container keeps its filesystem, not its mounts). Nothing enters it while the servers
    run: the client runs here."""

    def __init__(self, job: Job):
        super().__init__(job)
        self.containers = NodeContainers(self, "pyxis", self.script("pyxis_node.sh"),
                                         f"enroot remove -f pyxis_{self.cfg.container_name}", guards_record=True)
        self.proven = False   # a step ran in the image: the containers exist

    def container_flags(self) -> List[str]:
        return list(self.cfg.container_flags)


    def clean_left_over(self) -> None:
        self.containers.started = True   # the earlier supervisor's: they go
        self.down()

    def up(self) -> None:
        """The guards; the containers come with the first step that runs in the image (one
        step launch and one container start fewer than a step of their own)."""
        self.job.event(EV.containers_starting)
        self.containers.start_guards()

    def in_image(self, argv: List[str]) -> List[str]:
        """Until a step has run in the image, a step's tasks prove where they run first."""
        if self.proven:
            return list(argv)
        return ["bash", "-c", PROVE_IN_IMAGE, "_", self.containers.dir(), *argv]

    def first_step_seen(self, failed: bool, logs: List[str]) -> None:
        """Proof that the steps run in the image: a step's / must not be this node's /. Pyxis
        loaded by srun but not by the nodes' slurmd accepts --container-image and runs the step
        on the host. A step that failed before its task wrote its / did not get its container."""
        if self.proven:
            return
        job = self.job
        node0 = this_node()
        root = read_text(os.path.join(self.containers.dir(), f"{node0}.root")).strip()
        st = os.stat("/")
        if root == f"{st.st_dev}:{st.st_ino}":
            job.fail(f"Pyxis is not active on the compute nodes: a step with --container-image ran on {node0}'s own "
                     "filesystem, not in the image (srun accepts the flags when only the submitting side loads "
                     "Pyxis; check plugstack.conf on the nodes)", named=True)
        # Any task that ran in the image shows the containers come up: a step that failed after
        # that (a rank that ended at once, and srun killed the others, even before they started)
        # failed for its own reasons, which the step's caller names.
        ran = root or any(n.endswith(".root") for n in os.listdir(self.containers.dir()))
        if failed and not ran:
            problem = next(filter(None, (first_match(read_text(log), r"pyxis|enroot") for log in logs)), "")
            job.fail(f"the container did not start: {squeeze(problem) or 'see ' + ', '.join(logs)}", named=True)
        if ran:
            self.proven = True
            job.event(EV.containers_ready)

    def clear_servers(self) -> None:
        self.containers.reap()

    def down(self) -> bool:
        return self.containers.down([n for n in self.job_nodes() if n not in self.lost])


class CharliecloudStyle(JobStyle):
    """Bare Slurm's steps with every task inside `ch-run IMAGE` (charliecloud_node.sh): ch-run
    execs the command in new user and mount namespaces, in the node's process tree and Slurm's
    tracking, so a step's end ends its container and there is none to bring up, reap or remove.
    The node's /dev/shm and /tmp are shared: what killed ranks leave there goes as on bare metal."""

    def in_image(self, argv: List[str]) -> List[str]:
        return ["bash", self.script("charliecloud_node.sh"), *argv]


class DockerStyle(JobStyle):
    """Docker: one container per node (the node script's `up`), sshd inside on the run's port and
    key, then mpirun over ssh from rank 0's container. The fan-out to the nodes is the subclass's."""

    world_ends_s = 0.0   # mpirun: killed at once (it takes longer to end the world itself)

    ended_while_serving = "mpirun ended while serving"

    def __init__(self, job: Job):
        super().__init__(job)
        self.node_script = self.script("docker_node.sh")
        self.containers = NodeContainers(
            self, "docker", self.node_script,
            f"docker rm -f $(docker ps -aq --filter label={self.cfg.docker_label}={self.cfg.run_id})")
        self.hosts: List[str] = []
        self.rank0_node = ""

    def on_node0(self) -> List[str]:
        """The prefix that runs a command on rank 0's node (empty: this host)."""
        raise NotImplementedError

    def find_hosts(self) -> None:
        raise NotImplementedError

    def in_rank0_container(self, *argv: str) -> List[str]:
        return [*self.on_node0(), "bash", self.node_script, "exec", *argv]

    def world(self, mpirun: str, *argv: str) -> List[str]:
        """One process per node, from rank 0's container, over ssh with the run's key, through
        the node script's `mpirun` (the servers: a failed rank's world gets the exit grace) or
        `mpirun_brief` (the others end at once)."""
        return self.in_rank0_container("bash", self.node_script, mpirun, self.mpi_hosts(), *argv)

    def mpi_world(self, *argv: str) -> List[str]:
        """The MPI check's and a job step's world."""
        return self.world("mpirun_brief", *argv)

    def where_rank0_runs(self, *argv: str) -> List[str]:
        # In its container: pids as the container sees them.
        return self.in_rank0_container(*argv)

    def rank0_host(self) -> str:
        return self.rank0_node

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
            return self.mpi_world(*step.argv, "--master-addr", self.rank0_node), {}
        return self.in_rank0_container(*step.argv), {}

    def start_servers(self) -> None:
        self.servers = self.job.start(self.world("mpirun", "bash", self.node_script, "rank"),
                                      out=self.job.log_path(FILES.mpirun_log))

    def kill_servers(self) -> None:
        # Ends mpirun's docker exec here; the container removal (the teardown), or clear_servers
        # before a restart, is the SIGKILL for what runs in the containers.
        self.kill_server_process()
        self.reap_servers()

    def clear_servers(self) -> None:
        self.containers.reap()

    def clean_left_over(self) -> None:
        # Not down(): the run's keys stay, for the containers started next.
        self.find_hosts()
        self.containers.started = True
        self.containers.down([h for h in self.hosts if h not in self.lost])

    def down(self) -> bool:
        ok = self.containers.down([h for h in self.hosts if h not in self.lost])
        # The run's keys are only good for this run's containers.
        shutil.rmtree(self.cfg.ssh_dir, ignore_errors=True)
        return ok


class SlurmDockerStyle(DockerStyle):
    """Slurm + Docker: srun is the fan-out; rank 0 is the batch node."""

    def on_node0(self) -> List[str]:
        return []

    def find_hosts(self) -> None:
        # Rank 0 is this node (the client and readiness checks run here); the others follow.
        self.rank0_node = this_node()
        self.hosts = [self.rank0_node] + [h for h in self.job_nodes() if h != self.rank0_node]
        if len(self.hosts) != self.cfg.nodes:
            self.job.fail(f"expected {self.cfg.nodes} nodes, Slurm gave: {' '.join(self.hosts)}")


class SshDockerStyle(DockerStyle):
    """Docker on a plain host list: every node step goes over ssh, at most node_ssh.parallel at
    once (python -m ftcluster.hosts.fanout with scripts/nodes.json); rank 0 is the first host. The job
    runs on the launching machine: a private run's proxy runs in rank 0's container
    (docker_node.sh proxy_up), and the job reaches rank 0 through it."""

    proxy_in_container = True
    guarded = True

    def __init__(self, job: Job):
        super().__init__(job)
        self.proxy_started = False

    def proxy_stage(self) -> str:
        return self.state_file(PROXY_STAGE)

    def proxy_record(self) -> str:
        """Where rank 0's container records that its proxy listens ("ok") or failed ("failed WHY")."""
        return os.path.join(self.containers.dir(), f"{self.rank0_node}.proxy")

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
        return [*self.on_node0(), "bash", self.node_script, "proxy_up"], {}

    def wait_proxy_listening(self, proxy: subprocess.Popen[bytes]) -> None:
        """Until rank 0's container records that Caddy holds the endpoint's ports: the job's
        requests carry the token there only then (to a port someone else held, they would give
        it away)."""
        job = self.job
        deadline = time.monotonic() + PROXY_START_S
        while True:
            said = read_text(self.proxy_record()).strip()
            if said == "ok":
                return
            if said.startswith("failed ") or proxy.poll() is not None:
                try:   # the record comes first, the exit follows: its code and its last words
                    proxy.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.fail(f"the proxy (access: private) did not start in rank 0's container on {self.rank0_node}: "
                             f"{said[len('failed '):]}")
                job.fail(job.doors.proxy_problem() or "the proxy (access: private) ended")
            if time.monotonic() >= deadline:
                job.fail(f"the proxy (access: private) did not listen in rank 0's container on {self.rank0_node} "
                         f"within {PROXY_START_S:g} s: see logs/{FILES.proxy_log}")
            job.nap(0.05)

    def stop_proxy(self) -> None:
        """Caddy in rank 0's container asked to stop there (SIGTERM, killed after PROXY_STOP_S)
        and its copied files removed; the staged copy goes if it is still here."""
        if self.proxy_started:
            self.proxy_started = False
            rc = self.job.run(self.in_rank0_container("bash", self.node_script, "proxy_stop", str(PROXY_STOP_S)),
                              out=subprocess.DEVNULL, limit=PROXY_STOP_S + 60, interruptible=False)
            if rc:
                self.job.say(f"ftcluster: stopping the proxy in rank 0's container on {self.rank0_node} failed "
                             f"(exit {rc}); the container's removal ends it")
        remove_entry(self.proxy_stage())

    def proxy_host(self) -> str:
        return self.rank0_node

    def proxy_node(self) -> str:
        return self.rank0_node

    def fanout(self) -> List[str]:
        return [self.cfg.python, "-m", "ftcluster.hosts.fanout", "--config", self.script("nodes.json")]

    def every_node(self, output: str) -> List[str]:
        return [*self.fanout(), "--hosts", ",".join(self.cfg.run_hosts), f"--output={output}"]

    def on_node0(self) -> List[str]:
        return [*self.fanout(), "--hosts", self.cfg.run_hosts[0], "--"]

    def find_hosts(self) -> None:
        self.hosts = list(self.cfg.run_hosts)
        self.rank0_node = self.hosts[0]


class LocalStyle(JobStyle):
    """Every rank on this machine under one mpirun: they share its address and take ports
    PORT_STRIDE apart. Each "node" sees only its own gpus_per_node GPUs, as on a real cluster
    (FT refuses a rank that sees more or fewer): rank r gets slice r of CUDA_VISIBLE_DEVICES, or
    of 0..N-1 when unset (local_rank.sh)."""

    world_ends_s = 0.0   # mpirun: killed at once (it takes longer to end the world itself)
    guarded = True

    ended_while_serving = "a server rank exited while serving"

    def __init__(self, job: Job):
        super().__init__(job)
        self.mpi_tmp = ""

    def job_id(self) -> str:
        return str(os.getpid())

    def mpirun(self, stdout: str, argv: List[str], export: Tuple[str, ...] = ()) -> List[str]:
        exports = [a for name in ("GPUS_PER_NODE", "GPU_POOL", *export) for a in ("-x", name)]
        return [self.cfg.mpirun, "-np", str(self.cfg.nodes), "--oversubscribe", "--bind-to", "none", *exports,
                "bash", self.script("local_rank.sh"), stdout, *argv]

    def mpi_folder(self) -> str:
        # Open MPI's session folder (its PMIx sockets) in a folder of this run: a SIGKILLed mpirun
        # leaves it behind, and a later mpirun that gets the same pid cannot start its PMIx server there.
        if not self.mpi_tmp:
            self.mpi_tmp = tempfile.mkdtemp(prefix="ftc-mpi.", dir=self.job.child_env.get("TMPDIR") or None)
        return self.mpi_tmp

    def guard_argv(self, mpi_folder: str = "") -> List[str]:
        return super().guard_argv(self.mpi_folder())

    def mpi_env(self) -> Dict[str, str]:
        self.mpi_folder()
        env = self.job.child_env
        n = self.cfg.nodes * self.cfg.gpus_per_node
        pool = env["CUDA_VISIBLE_DEVICES"] if "CUDA_VISIBLE_DEVICES" in env else ",".join(str(i) for i in range(n))
        return {"TMPDIR": self.mpi_tmp, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "GPUS_PER_NODE": str(self.cfg.gpus_per_node), "GPU_POOL": pool}

    def step_command(self, step: StepConfig) -> Tuple[List[str], Dict[str, str]]:
        if not step.per_node:
            return list(step.argv), {}
        # A free port for the ranks' torch.distributed rendezvous on this machine.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return self.mpirun("-", list(step.argv), ("MASTER_PORT",)), {**self.mpi_env(), "MASTER_PORT": str(port)}

    def start_servers(self) -> None:
        stdout = os.path.join(self.cfg.logs, FILES.rank("{rank}", "stdout"))
        self.servers = self.job.start(self.mpirun(stdout, [".", self.script("rank_server.sh")], ("FTC_INCARNATION",)),
                                      out=self.job.log_path(FILES.mpirun_log),
                                      env={**self.mpi_env(), "FTC_RANK_HOST": "127.0.0.1"})

    def signal_ranks(self, sig: str, ranks: range) -> None:
        """mpirun makes each rank the leader of its own process group (its server and the
        server's stub inside): a signal to the group reaches all of them, once the rank is
        identified as the recorded one (signal_rank.sh)."""
        for r in ranks:
            pidfile = self.job.ranks.path(r, "pid")
            if os.path.exists(pidfile):
                self.job.run(["bash", self.script("signal_rank.sh"), sig, pidfile, "group"],
                             out=subprocess.DEVNULL, limit=30, interruptible=False)

    def term_rank0(self) -> bool:
        if not self.job.ranks.exists(0, "pid"):
            return False
        self.signal_ranks("TERM", range(1))
        return True

    def kill_servers(self) -> None:
        self.signal_ranks("KILL", range(self.cfg.nodes))
        self.kill_server_process()
        self.reap_servers()

    def clear_servers(self) -> None:
        self.kill_marked(0)   # the killed world's: nothing to wait for

    def kill_marked(self, grace: int) -> None:
        self.job.run(self.kill_marked_argv(grace), out=subprocess.DEVNULL, limit=60, interruptible=False)

    def down(self) -> bool:
        if self.started_servers():
            self.kill_marked(self.marked_grace())
        if self.mpi_tmp:
            shutil.rmtree(self.mpi_tmp, ignore_errors=True)
        for path in glob.glob(glob.escape(self.shm_glob()) + "*"):
            remove_entry(path)
        envs = self.python_envs()
        if envs:
            self.job.run(["bash", "-c", FREE_PYTHON_ENVS, "_", self.cfg.run_id, *envs],
                         out=subprocess.DEVNULL, limit=60, interruptible=False)
        return True


JOB_STYLES = {
    "none": JobStyle,
    "pyxis": PyxisStyle,
    "charliecloud": CharliecloudStyle,
    "docker": SlurmDockerStyle,
    "ssh_docker": SshDockerStyle,
    "local": LocalStyle,
}


def style_for(job: Job) -> JobStyle:
    return JOB_STYLES[job.cfg.style](job)


def this_node() -> str:
    """This node's name as Slurm knows it, else the short hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def is_this_node(name: str) -> bool:
    """Whether a rank's recorded host (its `hostname`, or Slurm's name for the node) is this one."""
    host = socket.gethostname()
    return name in {this_node(), host, host.split(".")[0]}


def copy_private(src: str, dst: str, mode: int) -> None:
    """A copy of a file, created with `mode` (a key's copy is never readable by others)."""
    with open(src, "rb") as f, os.fdopen(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def remove_entry(path: str) -> None:
    """A folder with what is in it, or a file or link (a link is never followed); what is gone
    already is no error."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass
