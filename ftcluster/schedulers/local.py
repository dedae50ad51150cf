"""The local scheduler: the rendered job.sh runs here as a process group, each rank in its own.

The job id is `local:<pid>@<start time>` of the job script, which leads its own session so that a
stop from another ftcluster process can signal the whole group, once it is identified as ours.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.run.events import parse_events
from ftcluster.schedulers.base import Scheduler
from ftcluster.plan.facts import resolve
from ftcluster.run.layout import FILES
from ftcluster.run.procs import ProcessId, job_id_of, read_pidfile
from ftcluster.run.state import ended
from ftcluster.run.job_info import NO_SUCH_JOB, JobInfo, JobState

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.runtimes.base import Submission
    from ftcluster.run.layout import RunPaths
    from ftcluster.plan.parallel import Plan
    from ftcluster.spec.cluster import ClusterSpec


def _job_process(job_id: str) -> ProcessId | None:
    """The job script's process as its job id records it (`local:PID@START`). An id without a
    start time (`local:PID`, from an older ftcluster) identifies nothing: None."""
    prefix, sep, rest = job_id.partition(":")
    if not sep or prefix != "local" or not rest.replace("@", "").isdigit():
        raise UserError(f"job id {job_id!r} is not a local job id (local:<pid>@<start>)",
                        field="job_id", hint="the run store entry is damaged; remove the run")
    return ProcessId.parse(rest)


def _job_mark(paths: RunPaths) -> str:
    """What the job's command line holds: job.sh execs the supervisor with the run's scripts
    folder in its arguments (`python3 RUN/scripts/ftcluster_job RUN/scripts/job.json`)."""
    return f"{paths.scripts}/"


def port_free(port: int) -> bool:
    """True when a server could listen on 0.0.0.0:port (as tritonserver does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


# Blocks of ports tried before a launch without fixed ports gives up (each try's ports are all
# free but for a busy machine's bad luck).
PORT_PICKS = 20
# Where a picked block starts: above the well-known and usual service ports, below Linux's
# default ephemeral range (32768-60999), which outgoing connections draw from.
PICKED_PORTS = (20000, 32000)


def _ports_of(cluster: ClusterSpec, plan: Plan) -> list[tuple[str, int, str, str]]:
    """Every port the run's servers take on this machine: (name, port, whose, the field that
    sets it). access: private -- the proxy takes the spec's HTTP and gRPC ports, Triton the
    loopback's."""
    facts = resolve(cluster)
    private = facts.private
    taken = [(name, getattr(facts.public, name), "the proxy", f"ports.{name}") for name in ("http", "grpc") if private]
    # Plain numbers: one past 65535 is a port to refuse, not a Ports to build.
    taken += [(name, facts.rank_port(name, rank), f"rank {rank}",
               "proxy.loopback_offset" if private else f"ports.{name}")
              for rank in range(plan.nodes) for name in ("http", "grpc", "metrics")]
    return taken


class LocalScheduler(Scheduler):
    name = "local"
    # By job id (pid and start time): a pid alone is reused (pid_max may be 32768), and a later
    # job's pid found here took an earlier, ended child's exit for its own.
    _children: dict[str, subprocess.Popen[bytes]] = {}
    kill_stray_ranks = True
    # Seconds beyond the server's exit grace that a stopped job script gets for its teardown.
    teardown_grace = 5.0

    def submit(self, request: Submission) -> str:
        paths = request.paths
        paths.logs.mkdir(parents=True, exist_ok=True)
        with open(paths.logs / FILES.job_out, "ab") as out:
            proc = subprocess.Popen(
                list(request.argv), cwd=str(request.cwd), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        # Our child, not reaped yet: its pid cannot name another process before we read this.
        job_id = job_id_of(proc.pid)
        self._children[job_id] = proc
        return job_id

    def _script_alive(self, job_id: str, paths: RunPaths) -> bool:
        job = _job_process(job_id)
        script = _job_mark(paths)
        if job is None:
            # An older ftcluster's `local:PID`: enough to report on (never to signal).
            legacy = ProcessId.of(int(job_id.partition(":")[2]))
            return legacy is not None and legacy.alive(script)
        child = self._children.get(job_id)
        if child is not None:
            return child.poll() is None
        return job.alive(script)

    def identifies(self, job_id: str) -> bool:
        # An id without a start time (an older ftcluster's) says nothing for sure about its pid.
        return _job_process(job_id) is not None

    def nodes(self, paths: RunPaths) -> tuple[str, ...]:
        # None from the "scheduler": the ranks' own host files name this machine, running or
        # ended alike (127.0.0.1, where they listen).
        return ()

    def with_ports(self, cluster: ClusterSpec, plan: Plan) -> ClusterSpec:
        """A spec that leaves `ports` out serves on a block of ports free now, not on fixed
        defaults another process of a shared machine may hold (or take before the ranks bind):
        a block at random below the kernel's ephemeral range (where no outgoing connection
        takes a port between this check and the servers' bind), tried until every port of the
        run (each rank's, the proxy's) is free."""
        if cluster.ports_given:
            return cluster
        from ftcluster.spec.cluster import Ports   # pydantic: imported by a launch that picks, not at start-up

        for _ in range(PORT_PICKS):
            base = random.randrange(*PICKED_PORTS)
            gpus = None if cluster.ports.gpus is None else base + 3
            try:
                picked = cluster.model_copy(update={"ports": Ports(http=base, grpc=base + 1, metrics=base + 2,
                                                                   gpus=gpus)})
            except ValueError:   # past 65535
                continue
            if all(0 < port < 65536 and port_free(port) for _, port, _, _ in _ports_of(picked, plan)):
                return picked
        raise UserError(f"no block of free ports found on this machine in {PORT_PICKS} tries", field="ports",
                        hint="fix the ports in the cluster spec (ports: {http: ..., grpc: ..., metrics: ...})")

    def check_limits(self, cluster: ClusterSpec, plan: Plan, servers: bool) -> None:
        # The ranks serve on this machine: a port in use is refused before anything starts.
        if not servers:
            return
        for name, port, whose, field in _ports_of(cluster, plan):
            if not port_free(port):
                raise UserError(f"port {port} ({whose}) is in use on this machine", field=field,
                                hint="stop what listens there (a serving run of yours: `ftcluster list`, "
                                     "`ftcluster stop RUN`), or choose other ports in the cluster spec "
                                     "(or leave `ports` out: a free block is picked at launch)")

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        if self._script_alive(job_id, paths):
            return JobInfo(job_id, JobState.RUNNING, "RUNNING", self.nodes(paths), source="local")
        try:
            events = parse_events(paths.events.read_text(errors="replace"))
        except FileNotFoundError:
            events = []
        end = ended(events)
        gone = paths.gone() if end is None else None
        if gone:
            # Its process is not there: the job is over (as a scheduler that knows no such job
            # any more says), but no events are left to tell a killed job from one that ended well.
            return JobInfo(job_id, JobState.UNKNOWN, "UNKNOWN", reason=f"{gone}: how its job ended is not known",
                           source=NO_SUCH_JOB)
        if end is None:
            return JobInfo(job_id, JobState.FAILED, "KILLED", reason="the job script was killed", source="local")
        # Its process is the job: how it ended is its own word (the one definition of it).
        state, rc = end
        return JobInfo(job_id, state, state.value, exit_code=rc, source="local")

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        """Stop the job script's process group and any rank left: each only while it is still
        the recorded process (ftcluster.run.procs); a recycled pid is never signalled."""
        job = _job_process(job_id)
        if job is None:
            raise UserError(f"the job script of job {job_id} cannot be identified (no start time was recorded), "
                            "so nothing was signalled", field="job_id",
                            hint=f"if `ps -o pid,args -p {job_id.split(':')[-1]}` shows bash {paths.job_script('local')}, "
                                 "stop it with kill -TERM -- -PID")
        if self._script_alive(job_id, paths):
            job.signal_group(signal.SIGTERM, _job_mark(paths))
        deadline = time.monotonic() + grace + self.teardown_grace
        while self._script_alive(job_id, paths) and time.monotonic() < deadline:
            time.sleep(0.05)
        # What is left of the script's group (its leader gone, or still ours).
        job.signal_group(signal.SIGKILL, _job_mark(paths))
        # Ranks lead their own process groups; kill any the script could not stop.
        for pidfile in paths.state.glob(FILES.rank("*", "pid")) if self.kill_stray_ranks else ():
            rank = read_pidfile(pidfile)
            if rank is not None:
                rank.signal_group(signal.SIGKILL, str(paths.scripts / "rank_server.sh"))
        child = self._children.pop(job_id, None)
        if child is not None:
            child.wait(timeout=5)
