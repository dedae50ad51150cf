"""The proxy of a private endpoint as pure functions: which runs are private, the ports Triton
takes, Caddy's config (no secret in it, the private API refused, TLS), refusals in one line.
The proxy itself, for real, is tests/integration/test_access.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ftcluster.plan.endpoint import (
    PRIVATE_GRPC_METHODS,
    PRIVATE_HTTP_PATHS,
    access_of,
    access_problems,
    caddy_config,
    loopback_ports,
)
from ftcluster.spec.cluster import Ports, Proxy
from tests.helpers_specs import run_cli
from tests.unit.test_render import SPECS, cluster


@pytest.mark.parametrize("style,want", [("none", "private"), ("pyxis", "private"), ("docker", "private"),
                                        ("local", "cluster"), ("ssh_docker", "private")])
def test_private_by_default_where_a_proxy_can_run_beside_rank0(style: str, want: str) -> None:
    assert access_of(cluster(**SPECS[style])) == want
    assert access_of(cluster(**{**SPECS[style], "access": "cluster"})) == "cluster"


def test_refusals_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from ftcluster.spec.launch_styles import STYLES

    high = cluster(**{**SPECS["none"], "ports": {"http": 65500, "grpc": 65501, "metrics": 65502}})
    assert access_problems(high)[0].startswith("proxy.loopback_offset:")
    assert access_problems(cluster(**SPECS["none"])) == []
    assert access_problems(cluster(**SPECS["ssh_docker"])) == []
    # ssh + Docker: the GPU exporter runs in the job, away from the proxy in rank 0's container.
    gpus = {"ports": {"http": 8000, "grpc": 8001, "metrics": 8002, "gpus": 8003}}
    assert access_problems(cluster(**{**SPECS["ssh_docker"], **gpus}))[0].startswith("ports.gpus: ")
    assert access_problems(cluster(**{**SPECS["ssh_docker"], **gpus, "access": "cluster"})) == []
    # A style that cannot start the proxy refuses private, which is then not its default either.
    monkeypatch.setitem(STYLES, "ssh_docker", replace(STYLES["ssh_docker"], proxy=False))
    assert "access: private" in access_problems(cluster(**{**SPECS["ssh_docker"], "access": "private"}))[0]
    assert access_of(cluster(**SPECS["ssh_docker"])) == "cluster"


def test_the_config_holds_no_secret_and_refuses_the_private_api() -> None:
    public, triton = Ports(), loopback_ports(Ports(), Proxy())
    assert (triton.http, triton.grpc, triton.metrics) == (8100, 8101, 8102)
    text = json.dumps(caddy_config(public, triton, Proxy()))
    assert "{env.FTC_PROXY_TOKEN}" in text and '"disabled": true' in text and '"persist": false' in text
    servers = caddy_config(public, triton, Proxy())["apps"]["http"]["servers"]
    assert set(servers) == {"http", "grpc"} and servers["http"]["listen"] == [":8000"]
    assert servers["grpc"]["protocols"] == ["h1", "h2c"]
    # A request goes on only past the token check and the private paths.
    first, private = servers["http"]["routes"][:2]
    assert first["handle"][0]["status_code"] == 401 and private["handle"][0]["status_code"] == 403
    exposed = caddy_config(public, triton, Proxy(expose_repository=True, expose_metrics=True))["apps"]["http"]
    assert set(exposed["servers"]) == {"http", "grpc", "metrics"}
    assert all(r["handle"][0].get("status_code") != 403 for r in exposed["servers"]["http"]["routes"])


@pytest.mark.parametrize("path,private", [
    ("/v2/repository/index", True), ("/v2/repository/models/m/load", True), ("/V2/Repository/index", True),
    ("/v2/systemsharedmemory/region/r/register", True), ("/v2/cudasharedmemory/status", True),
    ("/v2/logging", True), ("/v2/trace/setting", True), ("/v2/models/m/trace/setting", True),
    ("/v2/models/m/versions/1/trace/setting", True),
    ("/v2/models/m/infer", False), ("/v2/models/m/config", False), ("/v2/health/ready", False), ("/v2", False),
    ("/v2/models/repository/infer", False), ("/v2/models/m/generate_stream", False),
])
def test_the_private_http_paths(path: str, private: bool) -> None:
    # Go's regexp and Python's agree on this pattern (no look-around, no back-references).
    assert bool(re.search(PRIVATE_HTTP_PATHS, path)) == private


@pytest.mark.parametrize("method,private", [
    ("RepositoryModelUnload", True), ("RepositoryIndex", True), ("SystemSharedMemoryRegister", True),
    ("CudaSharedMemoryStatus", True), ("TraceSetting", True), ("LogSettings", True),
    ("ModelInfer", False), ("ModelStreamInfer", False), ("ServerReady", False), ("ModelConfig", False),
])
def test_the_private_grpc_methods(method: str, private: bool) -> None:
    assert bool(re.search(PRIVATE_GRPC_METHODS, f"/inference.GRPCInferenceService/{method}")) == private


def test_tls_from_the_users_files(tmp_path: Path) -> None:
    proxy = Proxy(tls_cert="/c.pem", tls_key="/k.pem")
    config = caddy_config(Ports(), loopback_ports(Ports(), proxy), proxy)
    assert config["apps"]["tls"]["certificates"]["load_files"] == [{"certificate": "/c.pem", "key": "/k.pem"}]
    assert config["apps"]["http"]["servers"]["grpc"]["protocols"] == ["h1", "h2"]
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nscheduler: slurm\npartition: p\nproxy: {tls_cert: /c.pem}\n")
    res = run_cli("plan", "--cluster", str(spec), cwd=tmp_path)
    assert res.rc == 3 and "tls_cert and tls_key go together" in res.stderr and "Traceback" not in res.stderr


def test_a_proxy_in_rank0s_container_serves_the_metrics_to_the_job_and_its_tls_copies() -> None:
    """ssh + Docker: the job reads rank 0's metrics through the proxy (with the token) from the
    launching machine, and Caddy loads the copies of proxy.tls_cert's files in its container."""
    from ftcluster.job.config import CONTAINER_PROXY_DIR, JobConfig
    from tests.unit.test_render import render_style

    files = render_style("ssh_docker", proxy={"tls_cert": "/home/u/c.pem", "tls_key": "/home/u/k.pem"}).files
    config = json.loads(files["proxy.json"])
    metrics = config["apps"]["http"]["servers"]["metrics"]
    assert metrics["listen"] == [":8002"] and metrics["routes"][0]["handle"][0]["status_code"] == 401
    assert config["apps"]["tls"]["certificates"]["load_files"] == [
        {"certificate": f"{CONTAINER_PROXY_DIR}/cert.pem", "key": f"{CONTAINER_PROXY_DIR}/key.pem"}]
    proxy = JobConfig.from_json(files["job.json"]).proxy
    assert proxy is not None and (proxy.tls_cert, proxy.tls_key) == ("/home/u/c.pem", "/home/u/k.pem")
    # Where the job runs beside rank 0, the metrics stay hidden and the files are the user's own.
    beside = json.loads(render_style("docker", proxy={"tls_cert": "/home/u/c.pem", "tls_key": "/home/u/k.pem"}
                                     ).files["proxy.json"])
    assert "metrics" not in beside["apps"]["http"]["servers"]
    assert beside["apps"]["tls"]["certificates"]["load_files"] == [{"certificate": "/home/u/c.pem",
                                                                    "key": "/home/u/k.pem"}]


def test_the_dry_run_names_the_token_file_and_shows_no_token(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(f"name: c\nscheduler: slurm\nrequest_gpus: false\nworkspace: {tmp_path}/ws\n"
                    "server: {binary: /bin/true}\n")
    res = run_cli("launch", "--cluster", str(spec), "--dry-run", cwd=tmp_path)
    assert res.rc == 0, res.stderr
    assert "scripts/token (0600)" in res.stdout and "--http-address=127.0.0.1" in res.stdout
    assert "scripts/proxy.json" in res.stdout and not (tmp_path / "ws").exists()


def test_the_gpu_exporter_port_follows_the_access_of_tritons_metrics() -> None:
    from ftcluster.job.config import JobConfig
    from ftcluster.plan.replicas import member_ports, ports_of
    from ftcluster.render.scripts import RenderOptions, RunPaths, render
    from tests.unit.test_render import RUN_DIR, _model, _plan

    with pytest.raises(ValueError, match="must differ"):
        Ports(gpus=8002)
    public = Ports(gpus=8003)
    triton = loopback_ports(public, Proxy())
    assert triton.gpus == 8103 and loopback_ports(Ports(), Proxy()).gpus is None
    # Behind the proxy it is served where the metrics are, with the token; hidden where they are.
    exposed = caddy_config(public, triton, Proxy(expose_metrics=True))["apps"]["http"]["servers"]
    assert exposed["gpus"]["listen"] == [":8003"]
    assert exposed["gpus"]["routes"][0]["handle"][0]["status_code"] == 401
    assert exposed["gpus"]["routes"][-1]["handle"][0]["upstreams"] == [{"dial": "127.0.0.1:8103"}]
    assert "gpus" not in caddy_config(public, triton, Proxy())["apps"]["http"]["servers"]
    assert "gpus" not in caddy_config(Ports(), loopback_ports(Ports(), Proxy()), Proxy(expose_metrics=True))[
        "apps"]["http"]["servers"]
    # A replica set's members take it step by step, as every other port.
    spec = cluster(**{**SPECS["none"], "ports": {"http": 8000, "grpc": 8001, "metrics": 8002, "gpus": 8003}})
    assert member_ports(spec, 1).gpus == 8043
    assert ("replica 1's gpus (loopback)", 8143) in ports_of(spec, 2, 1, 0)
    high = cluster(**{**SPECS["none"], "ports": {"http": 8000, "grpc": 8001, "metrics": 8002, "gpus": 65500}})
    assert access_problems(high)[0].startswith("proxy.loopback_offset:")

    def job(style: str, keep_serving: bool, **kw: object) -> JobConfig:
        c = cluster(**{**SPECS[style], "ports": {"http": 18000, "grpc": 18001, "metrics": 18002, "gpus": 18003},
                       "server": {"liveness": {"interval": 0}}, **kw})   # the model's config is not here
        files = render(c, _model(), _plan(c), RunPaths("gpt-2n", RUN_DIR),
                       RenderOptions(python="/p/python", keep_serving=keep_serving)).files
        return JobConfig.from_json(files["job.json"])
    private = job("none", True)
    assert (private.gpu_exporter_address, private.gpu_exporter_port, private.public_gpu_exporter_port) == (
        "127.0.0.1", 18103, 18003)
    open_ = job("none", True, access="cluster")
    assert (open_.gpu_exporter_address, open_.gpu_exporter_port, open_.public_gpu_exporter_port) == ("", 18003, 18003)
    assert job("none", False).gpu_exporter_port == 0   # a one-shot run serves no exporter
