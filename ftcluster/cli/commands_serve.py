"""`compose`, `serve` and `down`: one node as a long-running docker service."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ftcluster.cli import cli
from ftcluster.cli.folders import new_folder
from ftcluster.cli.numbers import seconds, tcp_port
from ftcluster.cli.options import echo_json
from ftcluster.cli.words import DockerRef
from ftcluster.errors import every
from ftcluster.observe.documents import document
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.defaults import default_cluster_path, default_model_path
from ftcluster.spec.load import load_cluster, load_model, load_specs


def service_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
                     help="Cluster spec YAML (image, shm size, ports, server binary)."),
        click.option("--model", "model_path", type=click.Path(dir_okay=False), help="Model spec YAML."),
        click.option("--gpus", default=None,
                     help="GPU indices, e.g. 0,1 (tensor_para_size = their count), or 'none' for a CPU "
                          "image; default: 0..gpus_per_node-1."),
        click.option("--http-port", type=tcp_port(), default=None, help="Host port for HTTP (default: the spec's)."),
        click.option("--grpc-port", type=tcp_port(), default=None, help="Host port for gRPC."),
        click.option("--metrics-port", type=tcp_port(), default=None, help="Host port for metrics."),
        click.option("--image", default=None, type=DockerRef(), help="Override container.image."),
        click.option("--name", default=None, help="Container name (default: ftcluster-<model name>)."),
        click.option("--ulimit", "ulimits", multiple=True, metavar="NAME=N",
                     help="Override a ulimit (default memlock=-1, stack=67108864); for daemons "
                          "that may not raise memlock."),
        click.option("--network-host", is_flag=True,
                     help="Host networking: tritonserver listens on the host ports itself (no mapping)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _checked(cluster: ClusterSpec, gpus: str | None, ulimits: tuple[str, ...]) -> tuple[tuple[str, ...] | None, dict[str, int]]:
    """--gpus and --ulimit as the service takes them, or one error saying both problems."""
    # startup: the service code only when the command runs, not for its --help
    from ftcluster.service.compose import parse_gpus, parse_ulimits

    gpu_ids, limits = every(lambda: parse_gpus(gpus, cluster), lambda: parse_ulimits(ulimits))
    return gpu_ids, limits


def _build(out: Path, cluster_path: str | None, model_path: str | None, gpus: str | None,
           http_port: int | None, grpc_port: int | None, metrics_port: int | None,
           image: str | None, name: str | None, network_host: bool, ulimits: tuple[str, ...]) -> Any:
    # startup: the service code only when the command runs, not for its --help
    from ftcluster.service.compose import prepare_service

    cluster, model = load_specs(cluster_path or default_cluster_path(), model_path or default_model_path())
    ports = {k: v for k, v in (("http", http_port), ("grpc", grpc_port), ("metrics", metrics_port)) if v}
    for role, port in ports.items():
        if not 0 < port < 65536:
            raise click.BadParameter(f"{port} is not a port", param_hint=f"--{role}-port")
    gpu_ids, limits = _checked(cluster, gpus, ulimits)
    # A folder that cannot be written is one line naming --out; what this made there goes again.
    with new_folder(out.expanduser()):
        svc, files = prepare_service(cluster, model, out, gpus=gpu_ids, ports=ports, image=image, name=name,
                                     network_host=network_host, ulimits=limits)
    return cluster, model, svc, files


@cli.command("compose")
@service_options
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Folder for docker-compose.yml, .env and model_repository/.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {files, tensor_para_size, gpus, ports} as JSON.")
def compose_cmd(out: str, as_json: bool, **kw: Any) -> None:
    """Write docker-compose.yml + .env serving one node (pp = 1) as a restartable service.

    \b
    Example:
      ftcluster compose --cluster configs/clusters/slurm-docker.yaml --model configs/models/gpt.yaml \\
          --gpus 0,1 --http-port 2000 --grpc-port 2001 --metrics-port 2002 --out svc/
      cd svc && docker compose up -d
    """
    _, _, svc, files = _build(Path(out), **kw)
    tp = len(svc.device_ids) if svc.device_ids else 1
    if as_json:
        echo_json(document("compose", {"files": [str(p) for p in files], "tensor_para_size": tp,
                                       "pipeline_para_size": 1, "gpus": list(svc.device_ids or []),
                                       "ports": dict(svc.ports)}))
        return
    for path in files:
        click.echo(str(path))
    click.echo(f"tensor_para_size={tp} pipeline_para_size=1, GPUs {list(svc.device_ids or []) or 'none'}, "
               f"HTTP on host port {svc.ports['http']}")


@cli.command("serve")
@service_options
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for the prepared repository and compose files (default: <workspace>/serve-<name>).")
@click.option("--docker-host", default=None, help="Docker daemon (default: DOCKER_HOST or container.docker_host).")
@click.option("--timeout", type=seconds(), default=None, help="Seconds to wait for readiness (default: server.ready_timeout).")
@click.option("--stop", is_flag=True, help="Remove the service instead (same as `ftcluster down`).")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoint as JSON.")
def serve_cmd(out: str | None, docker_host: str | None, timeout: float | None, stop: bool,
              as_json: bool, **kw: Any) -> None:
    """Start one node as a container through the Docker SDK and wait until the model is ready.

    \b
    Example:
      ftcluster serve --cluster configs/clusters/slurm-docker.yaml --model configs/models/gpt.yaml --gpus 0,1
      ftcluster serve --model configs/models/gpt.yaml --stop
    """
    # startup: the Docker service code only for `serve`/`down`, not `compose` or --help
    from ftcluster.service import serve

    if stop:
        _down(kw.get("name"), kw.get("model_path"), kw.get("cluster_path"), docker_host, as_json)
        return
    cluster, model = load_specs(kw["cluster_path"] or default_cluster_path(), kw["model_path"] or default_model_path())
    name = kw["name"] or f"ftcluster-{model.name}"
    folder = Path(out) if out else Path(cluster.workspace) / f"serve-{name}"
    _checked(cluster, kw["gpus"], kw["ulimits"])   # the options' problems before Docker's
    host = serve.resolve_docker_host(docker_host, cluster.container.docker_host)
    client = serve.docker_client(host)   # fail before preparing anything
    _, _, svc, _ = _build(folder, **kw)
    container = serve.start(client, svc)
    try:
        served = serve.wait_ready(container, svc, serve.endpoint_host(host),
                                  timeout or cluster.server.ready_timeout)
    except BaseException:
        serve.remove(client, svc.name, grace=2)   # nothing half-started stays behind
        raise
    if as_json:
        echo_json({"name": svc.name, "container": served.container_id, "http": served.http,
                   "grpc": served.grpc, "metrics": served.metrics, "model": svc.model,
                   "ready_s": round(served.seconds, 2), "folder": str(folder.expanduser().resolve())})
    else:
        click.echo(f"{svc.name}: model {svc.model!r} ready in {served.seconds:.1f} s at http://{served.http} "
                   f"(gRPC {served.grpc}, metrics {served.metrics}); stop with "
                   f"`ftcluster down --name {svc.name}`")


def _down(name: str | None, model_path: str | None, cluster_path: str | None, docker_host: str | None,
          as_json: bool = False) -> None:
    # startup: the Docker service code only for `serve`/`down`, not `compose` or --help
    from ftcluster.service import serve

    template = load_cluster(cluster_path).container.docker_host if cluster_path else None
    if name is None:
        name = f"ftcluster-{load_model(model_path or default_model_path()).name}"
    client = serve.docker_client(serve.resolve_docker_host(docker_host, template))
    removed = serve.remove(client, name)
    if as_json:
        echo_json(document("down", {"name": name, "removed": bool(removed)}))
    elif removed:
        click.echo(f"removed {name}")
    else:
        click.echo(f"no container {name!r}")


@cli.command("down")
@click.option("--name", default=None, help="Container name (default: ftcluster-<model name>).")
@click.option("--model", "model_path", type=click.Path(dir_okay=False), help="Model spec (for the default name).")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), help="Cluster spec (its docker_host).")
@click.option("--docker-host", default=None, help="Docker daemon (default: DOCKER_HOST).")
@click.option("--json", "as_json", is_flag=True, help="Print {name, removed} as JSON.")
def down_cmd(name: str | None, model_path: str | None, cluster_path: str | None, docker_host: str | None,
             as_json: bool) -> None:
    """Stop and remove a service started by `ftcluster serve`.

    \b
    Example:
      ftcluster down --name ftcluster-ensemble
    """
    _down(name, model_path, cluster_path, docker_host, as_json)
