"""Run a `ServiceSpec` through the Docker SDK, wait until our server is ready, remove it.

Readiness is ours, not just any 200: the container must be running and `triton_probe.ours_ready`
(our `--id` answering, the model ready) must hold.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from ftcluster.service.compose import LABEL, ServiceSpec
from ftcluster.errors import UserError
from ftcluster.client.ready import ours_ready
from ftcluster.extras import need

_NS = 1_000_000_000  # the Engine API counts healthcheck durations in nanoseconds


def sdk_kwargs(svc: ServiceSpec) -> dict[str, Any]:
    """containers.run() keyword arguments with the compose file's settings; pure."""
    # optional extra: docker (the Docker SDK)
    from docker.types import DeviceRequest, Mount, Ulimit

    kw: dict[str, Any] = {
        "image": svc.image,
        "command": list(svc.command),
        "name": svc.name,
        "labels": svc.labels,
        "shm_size": svc.shm_size,
        "ulimits": [Ulimit(name=k, soft=v, hard=v) for k, v in svc.ulimits.items()],
        "mounts": [Mount(b.target, b.source, type="bind", read_only=b.read_only) for b in svc.binds],
        "environment": dict(svc.environment),
        "restart_policy": {"Name": svc.restart},
        "healthcheck": {"test": ["CMD", "curl", "-fsS", svc.health_url], "interval": 10 * _NS,
                        "timeout": 5 * _NS, "retries": 3, "start_period": svc.start_period_s * _NS},
        "detach": True,
    }
    if svc.network_host:
        kw["network_mode"] = "host"
    else:
        kw["ports"] = {f"{svc.container_ports[r]}/tcp": p for r, p in svc.ports.items()}
    if svc.device_ids is not None:
        kw["device_requests"] = [DeviceRequest(driver="nvidia", device_ids=list(svc.device_ids),
                                               capabilities=[["gpu"]])]
    return kw


def docker_client(docker_host: str | None, timeout: int | None = None, field: str = "--docker-host") -> Any:
    """A Docker SDK client for `docker_host` (else DOCKER_HOST, else the default socket) that
    answered a ping, or one user error naming where it looked and the option that sets it."""
    docker = need("docker", "the Docker SDK (image build, serve, down)")
    opts = {"timeout": timeout} if timeout else {}
    try:
        client = docker.DockerClient(base_url=docker_host, **opts) if docker_host else docker.from_env(**opts)
        client.ping()
    except Exception as exc:  # noqa: BLE001  (DockerException, requests errors, OSError...)
        where = docker_host or os.environ.get("DOCKER_HOST") or "the default daemon"
        raise UserError(f"cannot reach Docker at {where}: {exc}", field=field,
                        hint=f"start dockerd or set {field} to its socket, e.g. unix:///path/docker.sock") from None
    return client


def resolve_docker_host(option: str | None, template: str | None) -> str | None:
    """--docker-host, else the cluster's container.docker_host for this host, else the SDK default."""
    if option:
        return option
    if template and not os.environ.get("DOCKER_HOST"):
        return template.replace("{node}", socket.gethostname().split(".")[0])
    return None


def endpoint_host(docker_host: str | None) -> str:
    """Where the published ports are reachable: the daemon's host for tcp://, else here."""
    if docker_host and docker_host.startswith(("tcp://", "ssh://")):
        return urlparse(docker_host).hostname or "127.0.0.1"
    return "127.0.0.1"


def _ours(client: Any, name: str) -> Any | None:
    # optional extra: docker (the Docker SDK)
    import docker.errors

    try:
        c = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    if LABEL not in (c.labels or {}):
        raise UserError(f"container {name!r} exists and was not started by ftcluster", field="--name",
                        hint="choose another --name")
    return c


def start(client: Any, svc: ServiceSpec) -> Any:
    """Replace an earlier container of ours with the same name, then create and start it."""
    # optional extra: docker (the Docker SDK)
    import docker.errors

    old = _ours(client, svc.name)
    if old is not None:
        old.remove(force=True)
    _have_image(client, svc.image)
    try:
        return client.containers.run(**sdk_kwargs(svc))
    except docker.errors.APIError as exc:
        leftover = _ours(client, svc.name)
        if leftover is not None:
            leftover.remove(force=True)
        raise UserError(f"docker could not start {svc.name!r}: {exc.explanation or exc}",
                        hint="--gpus none runs without a GPU request (CPU images)") from None


def _have_image(client: Any, image: str) -> None:
    """Pull only when missing; an air-gapped daemon gets a clear message instead of a DNS error."""
    # optional extra: docker (the Docker SDK)
    import docker.errors

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.pull(image)
    except docker.errors.APIError as exc:
        raise UserError(f"image {image!r} is not on the Docker daemon and could not be pulled: "
                        f"{exc.explanation or exc}", field="container.image",
                        hint="docker load/import it on that daemon first") from None


@dataclass(frozen=True)
class Served:
    container_id: str
    http: str
    grpc: str
    metrics: str
    seconds: float


def wait_ready(container: Any, svc: ServiceSpec, host: str, timeout: float) -> Served:
    t0 = time.monotonic()
    while True:
        if ours_ready(host, svc.ports["http"], svc.server_id, svc.model):
            return Served(container.id, f"{host}:{svc.ports['http']}", f"{host}:{svc.ports['grpc']}",
                          f"{host}:{svc.ports['metrics']}", time.monotonic() - t0)
        container.reload()
        if container.status in ("exited", "dead") or time.monotonic() - t0 > timeout:
            tail = container.logs(tail=30).decode(errors="replace")
            what = f"exited ({container.status})" if container.status in ("exited", "dead") \
                else f"not ready after {timeout:.0f} s"
            raise UserError(f"container {svc.name!r} {what}; last log lines:\n{tail}",
                            hint=f"`ftcluster down --name {svc.name}` removes it")
        time.sleep(0.2)


def remove(client: Any, name: str, grace: float = 10.0) -> bool:
    """Stop (SIGTERM, then SIGKILL after `grace`) and remove our container; False if absent."""
    c = _ours(client, name)
    if c is None:
        return False
    try:
        c.stop(timeout=int(grace))
    finally:
        c.remove(force=True)
    return True
