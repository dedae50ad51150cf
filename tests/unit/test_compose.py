"""`ftcluster compose`: the pure rendering, the CLI's files, and `docker-compose config` on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftcluster.service.compose import compose_files, parse_gpus, parse_ulimits, plan_single_node, service_spec
from ftcluster.errors import UserError
from ftcluster.service.serve import sdk_kwargs
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.load import load_model


DEMO = Path(__file__).resolve().parents[2] / "ftcluster" / "demo"


def cluster(**kw: object) -> ClusterSpec:
    base: dict[str, object] = {
        "scheduler": "local", "gpus_per_node": 2,
        "container": {"runtime": "docker", "image": "nvcr.io/nvidia/tritonserver:23.04-ft", "shm_size": "16g",
                      "mounts": ["/data/tok:/tok:ro"]},
        "env": {"NCCL_DEBUG": "WARN", "PRICE": "$5"},
        "server": {"binary": "/opt/tritonserver/bin/tritonserver", "ready_timeout": 600}}
    base.update(kw)
    return ClusterSpec.model_validate(base)


def compose_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(yaml.safe_dump(cluster().model_dump(exclude_none=True, mode="json")))
    return subprocess.run([sys.executable, "-m", "ftcluster", "compose", "--cluster", str(spec),
                           "--model", str(DEMO / "model.yaml"), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_parse_gpus() -> None:
    c = cluster()
    assert parse_gpus(None, c) == ("0", "1")
    assert parse_gpus("2,3", c) == ("2", "3")
    assert parse_gpus("none", c) is None
    for bad in ("0,0", "a", "0,", "", "9" * 20):
        with pytest.raises(UserError):
            parse_gpus(bad, c)


def test_parse_ulimits() -> None:
    assert parse_ulimits(("memlock=-1", "stack=67108864")) == {"memlock": -1, "stack": 67108864}
    for bad in ("bogus=1", "memlock", "memlock=x", "nofile=-2", f"nofile={1 << 64}"):
        with pytest.raises(UserError, match="--ulimit"):
            parse_ulimits((bad,))


def test_an_image_that_is_no_docker_reference(tmp_path: Path) -> None:
    c, m = cluster(), load_model(DEMO / "model.yaml")
    with pytest.raises(UserError, match="container.image: 'UP PER' is not a Docker image reference"):
        service_spec(c, m, plan_single_node(c, m, ("0",)), repo_dir=tmp_path, gpus=("0",), image="UP PER")


def test_compose_dict(tmp_path: Path) -> None:
    c, m = cluster(), load_model(DEMO / "model.yaml")
    plan = plan_single_node(c, m, ("0",))
    assert (plan.tensor_para_size, plan.pipeline_para_size, plan.nodes) == (1, 1, 1)
    svc = service_spec(c, m, plan, repo_dir=tmp_path / "model_repository", gpus=("0",),
                       ports={"http": 2000, "grpc": 2001, "metrics": 2002}, server_id="ftc-x")
    doc, env = compose_files(svc, tmp_path)
    s = doc["services"]["triton"]
    assert env == {"FTC_IMAGE": c.container.image, "FTC_HTTP_PORT": "2000", "FTC_GRPC_PORT": "2001",
                   "FTC_METRICS_PORT": "2002"}
    assert s["ports"] == ["${FTC_HTTP_PORT}:8000", "${FTC_GRPC_PORT}:8001", "${FTC_METRICS_PORT}:8002"]
    assert s["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert s["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert s["shm_size"] == "16g" and s["restart"] == "unless-stopped"
    assert s["healthcheck"]["test"] == ["CMD", "curl", "-fsS", "http://localhost:8000/v2/health/ready"]
    assert s["command"][:3] == ["/opt/tritonserver/bin/tritonserver", "--model-repository=/models", "--id=ftc-x"]
    vols = {v["target"]: v for v in s["volumes"]}
    assert vols["/models"]["source"] == "./model_repository"          # the folder can move
    assert vols[str(m.checkpoint_root)]["source"] == str(m.checkpoint_root)
    assert vols["/tok"] == {"type": "bind", "source": "/data/tok", "target": "/tok", "read_only": True}
    assert s["environment"]["PRICE"] == "$$5"                           # not interpolated
    # The SDK runs the very same settings.
    kw = sdk_kwargs(svc)
    assert kw["ports"] == {"8000/tcp": 2000, "8001/tcp": 2001, "8002/tcp": 2002}
    assert kw["device_requests"][0]["DeviceIDs"] == ["0"] and kw["device_requests"][0]["Driver"] == "nvidia"
    assert kw["restart_policy"] == {"Name": "unless-stopped"} and kw["shm_size"] == "16g"
    assert {u["Name"]: u["Soft"] for u in kw["ulimits"]} == {"memlock": -1, "stack": 67108864}
    assert kw["command"] == list(svc.command) and kw["environment"]["PRICE"] == "$5"


def test_cpu_and_host_network(tmp_path: Path) -> None:
    c, m = cluster(), load_model(DEMO / "model.yaml")
    svc = service_spec(c, m, plan_single_node(c, m, None), repo_dir=tmp_path, gpus=None, network_host=True,
                       ports={"http": 3000, "grpc": 3001, "metrics": 3002})
    s = compose_files(svc, tmp_path)[0]["services"]["triton"]
    assert "deploy" not in s and "ports" not in s and s["network_mode"] == "host"
    assert "--http-port=3000" in s["command"] and s["healthcheck"]["test"][-1].endswith(":3000/v2/health/ready")
    assert "device_requests" not in sdk_kwargs(svc) and sdk_kwargs(svc)["network_mode"] == "host"
    with pytest.raises(UserError, match="ports must differ"):
        service_spec(c, m, plan_single_node(c, m, None), repo_dir=tmp_path, gpus=None, ports={"http": 8001})


def test_cli_writes_a_valid_compose_project(tmp_path: Path) -> None:
    out = tmp_path / "svc dir"
    p = compose_cli(tmp_path, "--gpus", "0", "--http-port", "2000", "--grpc-port", "2001",
                    "--metrics-port", "2002", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "model_repository" / "fastertransformer" / "config.pbtxt").is_file()
    assert 'string_value: "1"' in (out / "model_repository" / "fastertransformer" / "config.pbtxt").read_text()
    # Again into the same folder: ours, so it is replaced; a foreign folder is refused.
    assert compose_cli(tmp_path, "--gpus", "none", "--out", str(out)).returncode == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    p = compose_cli(tmp_path, "--out", str(foreign))
    assert p.returncode != 0 and "not written by ftcluster" in p.stderr and (foreign / "keep.txt").exists()
    p = compose_cli(tmp_path, "--gpus", "0,0", "--out", str(tmp_path / "x"))
    assert p.returncode != 0 and "--gpus" in p.stderr


def _compose_binary() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.mark.parametrize("gpus", ["0,1", "none"])
def test_docker_compose_config_accepts_it(tmp_path: Path, gpus: str) -> None:
    binary = _compose_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but neither docker-compose nor `docker compose` is installed")
        pytest.skip("docker-compose not installed (Debian 12: apt-get install docker-compose)")
    out = tmp_path / "svc"
    p = compose_cli(tmp_path, "--gpus", gpus, "--http-port", "2000", "--out", str(out))
    assert p.returncode == 0, p.stderr
    cfg = subprocess.run([*binary, "config"], cwd=out, capture_output=True, text=True, timeout=60, check=False)
    assert cfg.returncode == 0, cfg.stderr
    s = yaml.safe_load(cfg.stdout)["services"]["triton"]
    assert s["image"] == cluster().container.image                  # from .env
    assert {"published": 2000, "target": 8000} in [{k: int(v) for k, v in p.items() if k in ("published", "target")}
                                                   for p in s["ports"]]
    assert s["volumes"][0]["source"] == str(out / "model_repository")
    devices = s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    assert devices == ([{"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}]
                       if gpus != "none" else None)


@pytest.mark.parametrize("out", ["/proc/no-such/svc", "{tmp}/" + "s" * 300, "{tmp}/file/svc"])
def test_cli_refuses_a_folder_it_cannot_write_in_one_line(tmp_path: Path, out: str) -> None:
    (tmp_path / "file").write_text("a file, not a folder\n")
    r = compose_cli(tmp_path, "--out", out.format(tmp=tmp_path))
    assert r.returncode == 3 and r.stderr.startswith("error: --out: cannot write ") and r.stderr.count("\n") == 1, \
        r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "file"]   # nothing of its own left
