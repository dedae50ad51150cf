"""`ftcluster tunnel RUN`: a port on the workstation forwarded through the login node to a
run's endpoint (SSH local forwarding over the one connection fabric opens to `login_host`, as
`ssh -L` would). The endpoint and whether the run still serves are asked of the login node
(`ftcluster status RUN --json` there); the tunnel follows a hand-over to the successor's
endpoint, and ends on Ctrl-C or when the service ends.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftcluster.errors import UserError
from ftcluster.hosts.login import HOP_ENV, SshTarget, connect
from ftcluster.run.job_info import UNREACHABLE
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.observe.status import moved_to

@dataclass(frozen=True)
class Target:
    host: str
    port: int


def ask_status(conn: Any, cluster: ClusterSpec, run_id: str) -> dict[str, Any]:
    """The run's `status` object, as the login node has it."""
    cmd = f"{HOP_ENV}=1 {cluster.login_command} {shlex.join(['status', run_id, '--json'])}"
    res = conn.run(cmd, hide=True, warn=True, timeout=60, in_stream=False)
    if res.exited != 0:
        raise UserError(f"the login node does not know run {run_id}: {(res.stderr or res.stdout).strip()[:300]}",
                        field="RUN")
    text = res.stdout
    try:
        return dict(json.loads(text[text.index("{"):]))
    except ValueError:
        raise UserError(f"the login node's status of {run_id} is not JSON: {text.strip()[:200]}", field="RUN") from None


class Asker:
    """The login node's `status` of a run, asked again and again while the tunnel forwards: one
    that fails (squeue timing out on a busy controller, a slow login node) is said once and gives
    None, and the tunnel keeps what it forwards to until an answer comes: a hiccup of the login
    node does not end a tunnel that still works."""

    def __init__(self, ask: Callable[[str], dict[str, Any]], said: Callable[[str], None]):
        self.ask, self.said = ask, said
        self.failing = ""

    def __call__(self, run_id: str) -> dict[str, Any] | None:
        try:
            got = self.ask(run_id)
        except (UserError, OSError) as exc:
            if not self.failing:
                self.said(f"tunnel: the login node did not answer for run {run_id} ({exc}); the tunnel keeps "
                          "forwarding and asks again")
            self.failing = str(exc)
            return None
        if self.failing:
            self.said(f"tunnel: the login node answers for run {run_id} again")
            self.failing = ""
        return got


def endpoint_of(status: dict[str, Any], protocol: str, grpc_port: int | None) -> Target:
    endpoint = status.get("endpoint")
    if not endpoint or status.get("state") != "RUNNING":
        raise UserError(f"run {status.get('run_id')} does not serve ({status.get('phase_label') or status.get('state')})",
                        field="RUN", hint="`ftcluster status RUN`; a tunnel needs a serving run")
    host, _, port = str(endpoint).rpartition(":")
    if protocol == "grpc":
        if not grpc_port:
            raise UserError("the gRPC port is not known here", field="--remote-port", hint="give --remote-port")
        return Target(host, grpc_port)
    return Target(host, int(port))


def next_move(st: dict[str, Any], run_id: str, endpoint: str | None) -> tuple[str, str]:
    """What the tunnel does after the login node's `status` of the run it forwards to: ("stay",
    ""), ("follow", RUN) -- a successor it handed over to or moved to off a lost node, or the
    run itself where Slurm requeued it (preempted, its batch host lost) and its endpoint
    moves -- or ("end", words) once the service ended."""
    successor = moved_to(st)
    if successor:
        return "follow", successor
    if st.get("source") == UNREACHABLE:
        # Slurm did not answer (a busy controller): that says nothing of the job, whose state
        # reads UNKNOWN meanwhile; the tunnel keeps forwarding and asks again.
        return "stay", ""
    state = st.get("state")
    if st.get("phase") == "requeued" or (state == "RUNNING" and st.get("endpoint") not in (None, endpoint)):
        return "follow", run_id
    if state == "RUNNING":
        return "stay", ""
    return "end", f"tunnel: run {run_id} ended; the tunnel ends"


def serve_tunnel(cluster: ClusterSpec, run_id: str, local_port: int, protocol: str, remote_port: int | None,
                 said: Callable[[str], None], check_every: float, stop: threading.Event | None = None) -> int:
    """Forward 127.0.0.1:local_port to the run's endpoint until Ctrl-C, `stop`, or the service's
    end: a run that hands over (its time limit, a lost node) is followed to its successor's
    endpoint on the same local port. Returns 0 when the service ended or the tunnel was stopped."""
    conn = connect(SshTarget.from_spec(cluster))
    stop = stop or threading.Event()
    asker = Asker(lambda run: ask_status(conn, cluster, run), said)
    try:
        status = ask_status(conn, cluster, run_id)
        while True:
            target = endpoint_of(status, protocol, remote_port)
            if protocol == "http" and remote_port:
                target = Target(target.host, remote_port)
            successor = None
            with conn.forward_local(local_port, remote_port=target.port, remote_host=target.host,
                                    local_host="127.0.0.1"):
                said(f"tunnel: 127.0.0.1:{local_port} -> {target.host}:{target.port} through {cluster.login_host} "
                     f"({protocol}; a private run wants its token: `ftcluster token {run_id}`); Ctrl-C ends it")
                while not stop.wait(check_every):
                    now = asker(run_id)
                    if now is None:
                        continue
                    move, what = next_move(now, run_id, status.get("endpoint"))
                    if move == "end":
                        said(what)
                        return 0
                    if move == "follow":
                        successor = what
                        break
            if successor is None:
                return 0
            said(f"tunnel: run {run_id} " + ("moved (Slurm requeued it)" if successor == run_id else
                                             f"was succeeded by run {successor}") + "; the tunnel follows it")
            run_id = successor
            # One moved off a lost node, or requeued, may still be starting: wait while its job
            # may yet serve.
            status = asker(run_id) or {}
            while status.get("state") in ("PENDING", "UNKNOWN", None) or (
                    status.get("state") == "RUNNING" and status.get("phase") != "serving"):
                if stop.wait(check_every):
                    return 0
                status = asker(run_id) or {}
    finally:
        conn.close()
