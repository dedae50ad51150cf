"""One node as a long-running service: the container settings, as docker compose and Docker SDK.

`service_spec` turns the specs and a one-node plan (tp = GPUs chosen, pp = 1) into a
`ServiceSpec`; `compose_files` (docker-compose.yml + .env) and `ftcluster.service.serve.sdk_kwargs`
(the Docker SDK's containers.run) are pure renderings of that one object, so the file a person
keeps and the container `ftcluster serve` starts cannot drift apart.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ftcluster.errors import UserError
from ftcluster.engines import engine_for, make_plan
from ftcluster.plan.parallel import Plan
from ftcluster.spec.cluster import DOCKER_REF_RE, MAX_GPUS_PER_NODE, ClusterSpec
from ftcluster.spec.model import ModelSpec

# Inside the container (bridge networking): Triton's defaults; the host side is remappable.
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
REPO_IN_CONTAINER = "/models"
LABEL = "org.ftcluster.service.serve"
MARKER = ".ftcluster-compose"   # marks a folder we wrote, so re-running may replace it
ULIMITS = {"memlock": -1, "stack": 67108864}   # what NVIDIA's Triton docs ask for


@dataclass(frozen=True)
class Bind:
    source: str          # host path (absolute)
    target: str          # container path
    read_only: bool = True


@dataclass(frozen=True)
class ServiceSpec:
    name: str                               # container name (and compose service label value)
    image: str
    command: tuple[str, ...]
    server_id: str                          # tritonserver --id, to know it is ours answering
    model: str                              # the model the readiness check waits for
    ports: dict[str, int]                   # role -> host port
    container_ports: dict[str, int]         # role -> port tritonserver listens on
    binds: tuple[Bind, ...]
    shm_size: str
    device_ids: tuple[str, ...] | None      # None: no GPU request (CPU image)
    environment: dict[str, str] = field(default_factory=dict)
    network_host: bool = False
    start_period_s: int = 900
    restart: str = "unless-stopped"
    ulimits: dict[str, int] = field(default_factory=lambda: dict(ULIMITS))

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL: self.name, f"{LABEL}.id": self.server_id}

    @property
    def health_url(self) -> str:
        return f"http://localhost:{self.container_ports['http']}/v2/health/ready"


def parse_gpus(text: str | None, cluster: ClusterSpec) -> tuple[str, ...] | None:
    """`0,1` -> ("0", "1"); `none` -> None (CPU); unset -> 0..gpus_per_node-1."""
    if text is None:
        if cluster.gpus_per_node == "auto":
            raise UserError("gpus_per_node is 'auto'", field="--gpus", hint="pass --gpus 0,1,... or --gpus none")
        return tuple(str(i) for i in range(cluster.gpus_per_node))
    if text.strip().lower() == "none":
        return None
    ids = tuple(p.strip() for p in text.split(","))
    if not all(p.isdigit() and int(p) < MAX_GPUS_PER_NODE for p in ids) or len(set(ids)) != len(ids):
        raise UserError(f"{text!r} is not a list of distinct GPU indices", field="--gpus",
                        hint="e.g. --gpus 0,1 or --gpus none")
    return ids


# The names `docker run --ulimit` takes (Docker's units.ParseUlimit).
ULIMIT_NAMES = frozenset({"as", "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
                          "nproc", "rss", "rtprio", "rttime", "sigpending", "stack"})


def parse_ulimits(items: tuple[str, ...]) -> dict[str, int]:
    """`memlock=8388608` -> {"memlock": 8388608}; -1 is unlimited."""
    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in ULIMIT_NAMES or not value.lstrip("-").isdigit() or not -1 <= int(value) < 1 << 63:
            raise UserError(f"{item!r} is not NAME=INTEGER (NAME one of {', '.join(sorted(ULIMIT_NAMES))}, "
                            "INTEGER -1 for unlimited or a limit)", field="--ulimit", hint="e.g. --ulimit memlock=-1")
        out[key] = int(value)
    return out


def plan_single_node(cluster: ClusterSpec, model: ModelSpec, gpus: tuple[str, ...] | None) -> Plan:
    tp = len(gpus) if gpus else 1
    return make_plan(cluster, model, 1, gpus_per_node=tp, tp=tp, pp=1)


def service_spec(
    cluster: ClusterSpec, model: ModelSpec, plan: Plan, *, repo_dir: Path, gpus: tuple[str, ...] | None,
    ports: dict[str, int] | None = None, name: str | None = None, image: str | None = None,
    network_host: bool = False, server_id: str | None = None, has_links: bool = False,
    ulimits: dict[str, int] | None = None,
) -> ServiceSpec:
    """The container for `plan` serving the prepared repository at `repo_dir`; pure."""
    img = image or cluster.container.image
    if not img:
        raise UserError("no container image", field="container.image",
                        hint="set container.image in the cluster spec or pass --image")
    if not DOCKER_REF_RE.fullmatch(img):   # it goes into .env and the Docker API as one word
        raise UserError(f"{img!r} is not a Docker image reference", field="container.image",
                        hint="use letters, digits and '_.:/@-' only, or pass --image")
    host_ports = {"http": cluster.ports.http, "grpc": cluster.ports.grpc, "metrics": cluster.ports.metrics,
                  **(ports or {})}
    if len(set(host_ports.values())) != 3:
        raise UserError(f"ports must differ (got {host_ports})", field="--http-port/--grpc-port/--metrics-port")
    # Host networking has no port mapping: tritonserver itself listens on the chosen ports.
    inner = dict(host_ports) if network_host else dict(CONTAINER_PORTS)
    sid = server_id or f"ftc-serve-{uuid.uuid4().hex[:10]}"
    binary = "tritonserver" if cluster.server.binary == "auto" else cluster.server.binary
    command = (binary, f"--model-repository={REPO_IN_CONTAINER}", f"--id={sid}",
               f"--http-port={inner['http']}", f"--grpc-port={inner['grpc']}",
               f"--metrics-port={inner['metrics']}", f"--exit-timeout-secs={int(cluster.server.exit_grace)}",
               *((f"--log-verbose={cluster.server.log_verbose}",) if cluster.server.log_verbose else ()),
               *cluster.server.extra_args)
    binds = [Bind(str(repo_dir), REPO_IN_CONTAINER),
             *(Bind(src, dst) for src, dst in engine_for(model).binds(model, repo_dir, has_links))]
    binds += [Bind(m.src, m.dst, "ro" in m.flags) for m in cluster.container.mounts]
    return ServiceSpec(
        name=name or f"ftcluster-{model.name}", image=img, command=command, server_id=sid,
        model=model.name, ports=host_ports, container_ports=inner, binds=tuple(binds),
        shm_size=cluster.container.shm_size, device_ids=gpus, environment=dict(cluster.env),
        network_host=network_host, start_period_s=int(cluster.server.ready_timeout),
        ulimits={**ULIMITS, **(ulimits or {})},
    )


def _lit(text: str) -> str:
    # Compose interpolates $VAR everywhere; literal dollars must be doubled.
    return text.replace("$", "$$")


def _rel(path: str, base: Path) -> str:
    p = Path(path)
    return f"./{p.relative_to(base)}" if p.is_relative_to(base) else path


def compose_files(svc: ServiceSpec, base: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(docker-compose.yml as a dict, .env); pure. Paths under `base` become relative to it."""
    env_file = {"FTC_IMAGE": svc.image, **{f"FTC_{r.upper()}_PORT": str(p) for r, p in svc.ports.items()}}
    service: dict[str, Any] = {
        "image": "${FTC_IMAGE}",
        "command": [_lit(c) for c in svc.command],
        "shm_size": svc.shm_size,
        "ulimits": dict(svc.ulimits),
        "volumes": [{"type": "bind", "source": _lit(_rel(b.source, base)), "target": _lit(b.target),
                     "read_only": b.read_only} for b in svc.binds],
        "restart": svc.restart,
        "healthcheck": {"test": ["CMD", "curl", "-fsS", svc.health_url], "interval": "10s",
                        "timeout": "5s", "retries": 3, "start_period": f"{svc.start_period_s}s"},
        "labels": {k: _lit(v) for k, v in svc.labels.items()},
    }
    if svc.network_host:
        service["network_mode"] = "host"
        # The ports are baked into the command; .env only documents them.
    else:
        service["ports"] = [f"${{FTC_{r.upper()}_PORT}}:{svc.container_ports[r]}" for r in ("http", "grpc", "metrics")]
    if svc.environment:
        service["environment"] = {k: _lit(v) for k, v in svc.environment.items()}
    if svc.device_ids is not None:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": list(svc.device_ids), "capabilities": ["gpu"]}]}}}
    return {"services": {"triton": service}}, env_file


def dump_compose(doc: dict[str, Any]) -> str:
    return "# Written by `ftcluster compose`; ports and image are in .env.\n" + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=False)


def dump_env(env: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in env.items())


def fresh_out(out: Path) -> None:
    """Make `out` an empty folder, replacing only a folder an earlier compose/serve wrote."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder", field="--out")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise UserError(f"{out} is not empty and was not written by ftcluster compose", field="--out",
                            hint="choose a new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def has_symlinks(folder: Path) -> bool:
    return any(p.is_symlink() for p in folder.rglob("*"))


def write_compose(out: Path, svc: ServiceSpec) -> list[Path]:
    doc, env = compose_files(svc, out)
    files = [out / "docker-compose.yml", out / ".env"]
    files[0].write_text(dump_compose(doc))
    files[1].write_text(dump_env(env))
    (out / MARKER).write_text(svc.name + "\n")
    return files


def prepare_service(cluster: ClusterSpec, model: ModelSpec, out: Path, *, gpus: tuple[str, ...] | None,
                    **opts: Any) -> tuple[ServiceSpec, list[Path]]:
    """Plan one node, write the per-run repository and the compose files under `out`."""
    plan = plan_single_node(cluster, model, gpus)
    out = out.expanduser().resolve()
    fresh_out(out)
    (out / MARKER).write_text("")  # ours from the start: a failed run may be repeated into it
    repo = engine_for(model).prepare(model, plan, out / "model_repository").path
    svc = service_spec(cluster, model, plan, repo_dir=repo, gpus=gpus, has_links=has_symlinks(repo), **opts)
    return svc, write_compose(out, svc)
