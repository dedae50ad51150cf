"""Local launch style: the rendered job.sh runs here, each rank in its own process group.

The job id is `local:<pid>` of the job script, which leads its own session so that a stop
from another ftcluster process can signal the whole group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.events import EV, last, parse_events
from ftcluster.launchers.base import Launcher
from ftcluster.layout import FILES
from ftcluster.slurm import JobInfo, JobState

if TYPE_CHECKING:  # specs and plans are heavy (pydantic); annotations only
    from ftcluster.layout import RunPaths
    from ftcluster.plan import Plan
    from ftcluster.request import JobRequest
    from ftcluster.spec import ClusterSpec


def _pid(job_id: str) -> int:
    prefix, sep, pid = job_id.partition(":")
    try:
        return int(pid if sep else prefix)
    except ValueError:
        raise UserError(f"job id {job_id!r} is not a local job id (local:<pid> or <pid>)",
                        field="job_id", hint="the run store entry is damaged; remove the run") from None


def _alive(pid: int, script: str | None = None) -> bool:
    """True for a live, non-zombie process (running our script, when given)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        if script is not None:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                return script.encode() in fh.read()
        return True
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def port_free(port: int) -> bool:
    """True when a server could listen on 0.0.0.0:port (as tritonserver does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalLauncher(Launcher):
    _children: dict[int, subprocess.Popen[bytes]] = {}
    kill_stray_ranks = True
    # Seconds beyond the server's exit grace that a stopped job script gets for its teardown.
    teardown_grace = 5.0

    @staticmethod
    def command(script: str) -> tuple[str, ...]:
        return ("bash", script)

    def submit(self, request: JobRequest) -> str:
        paths = request.paths
        paths.logs.mkdir(parents=True, exist_ok=True)
        with open(paths.logs / FILES.job_out, "ab") as out:
            proc = subprocess.Popen(
                list(request.argv), cwd=str(request.cwd), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._children[proc.pid] = proc
        return f"local:{proc.pid}"

    def _script_alive(self, pid: int, paths: RunPaths) -> bool:
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return _alive(pid, str(paths.job_script("local")))  # job.sh, as for every style run here

    def nodes(self, paths: RunPaths) -> tuple[str, ...]:
        return ("localhost",)

    def check(self, cluster: ClusterSpec, plan: Plan, servers: bool = True) -> None:
        # The ranks serve on this machine: a port in use is refused before anything starts.
        from ftcluster.render import LOCAL_PORT_STRIDE

        if not servers:
            return
        for rank in range(plan.nodes):
            for name in ("http", "grpc", "metrics"):
                port = getattr(cluster.ports, name) + rank * LOCAL_PORT_STRIDE
                if not port_free(port):
                    raise UserError(f"port {port} (rank {rank}) is in use on this machine", field=f"ports.{name}",
                                    hint="stop what listens there or choose other ports in the cluster spec")

    def info(self, job_id: str, paths: RunPaths) -> JobInfo:
        pid = _pid(job_id)
        if self._script_alive(pid, paths):
            return JobInfo(job_id, JobState.RUNNING, "RUNNING", self.nodes(paths), source="local")
        try:
            events = parse_events(paths.events.read_text())
        except FileNotFoundError:
            events = []
        done = last(events, EV.done)
        if done is None:
            return JobInfo(job_id, JobState.FAILED, "KILLED", reason="the job script was killed", source="local")
        rc = done.args[0] if done.args else "?"
        state = JobState.COMPLETED if rc == "0" else (
            JobState.CANCELLED if last(events, EV.interrupted) else JobState.FAILED)
        return JobInfo(job_id, state, state.value, exit_code=rc, source="local")

    def cancel(self, job_id: str, paths: RunPaths, grace: float = 10.0) -> None:
        pid = _pid(job_id)
        if self._script_alive(pid, paths):
            _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace + self.teardown_grace
        while self._script_alive(pid, paths) and time.monotonic() < deadline:
            time.sleep(0.05)
        _killpg(pid, signal.SIGKILL)
        # Ranks lead their own process groups; kill any the script could not stop.
        for pidfile in paths.state.glob(FILES.rank("*", "pid")) if self.kill_stray_ranks else ():
            try:
                rank_pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            if _alive(rank_pid, str(paths.scripts / "rank_server.sh")):
                _killpg(rank_pid, signal.SIGKILL)
        child = self._children.pop(pid, None)
        if child is not None:
            child.wait(timeout=5)
