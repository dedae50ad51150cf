"""`ftcluster serve` / `down` for real: the test bed's dockerd (tests/docker) and its CPU test image.

One daemon, in this machine's own network namespace (a one-"node" test bed, so no Slurm is
needed), started and stopped by `DockerNodes` under its own socket folder, so it never touches
the Slurm + Docker tests' daemons. The test-bed daemons run without a bridge, so the service
uses host networking (`--network-host`, ports given to tritonserver itself); the GPU request
is left out (`--gpus none`): the daemon has no GPU runtime.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.docker import image
from tests.docker.daemons import DockerNodes, unavailable
from tests.triton_server import free_ports

# `bed`: its daemon shares the test bed's image cache (data-root) and runs with the bed's tests.
pytestmark = [pytest.mark.docker, pytest.mark.triton, pytest.mark.bed]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "ftcluster" / "demo"


class _HostNet:
    def enter(self, node: str) -> list[str]:
        return []  # no namespace: the daemon and its host-network containers share ours


class _OneNode:
    """What DockerNodes needs of a test bed: node names and how to enter a node."""

    nodes = ("serve1",)
    net = _HostNet()


@pytest.fixture(scope="module")
def dockerd() -> Iterator[DockerNodes]:
    why = unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the Docker test bed cannot run: {why}")
        pytest.skip(why)
    nodes = DockerNodes(_OneNode(), sock_root=Path("/run/ftc-docker-serve")).up()
    stray: list[str] = []
    try:
        nodes.ensure_image()   # cached data-root: imported once, then kept
        yield nodes
        stray = nodes.containers("serve1")
    finally:
        nodes.down()
    left = nodes.leftovers()
    assert not stray and not left, f"left containers {stray}, test bed left {left}"


def ftc(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)


def test_serve_infer_down(dockerd: DockerNodes, tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    host = f"unix://{dockerd.socket('serve1')}"
    spec = tmp_path / "cluster.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "svc", "scheduler": "local", "gpus_per_node": 1,
        "container": {"runtime": "docker", "image": image.IMAGE, "shm_size": "256m"},
        "server": {"binary": image.TRITON_BIN, "ready_timeout": 90, "exit_grace": 5},
    }))
    http, grpc, metrics = free_ports(3)
    name = f"ftc-serve-test-{os.getpid()}"
    # memlock=-1 needs CAP_SYS_RESOURCE, which the test machine's dockerd may lack: its own cap.
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    common = ["--cluster", str(spec), "--model", str(DEMO / "model.yaml"), "--name", name,
              "--ulimit", f"memlock={memlock}"]
    p = ftc("serve", *common, "--gpus", "none", "--network-host", "--docker-host", host,
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--out", str(tmp_path / "svc"), "--json")
    try:
        assert p.returncode == 0, p.stderr + p.stdout
        served = json.loads(p.stdout)
        assert served["http"] == f"127.0.0.1:{http}" and served["model"] == "fastertransformer"
        assert (tmp_path / "svc" / "docker-compose.yml").is_file()   # what ran, kept for compose users
        # The container has the compose file's settings.
        info = json.loads(dockerd.docker("serve1", ["inspect", name], check=True).stdout)[0]
        hc = info["HostConfig"]
        assert hc["RestartPolicy"]["Name"] == "unless-stopped" and hc["ShmSize"] == 256 * 2**20
        assert {u["Name"]: u["Soft"] for u in hc["Ulimits"]} == {"memlock": memlock, "stack": 67108864}
        assert info["Config"]["Healthcheck"]["Test"][-1] == f"http://localhost:{http}/v2/health/ready"
        assert not hc.get("DeviceRequests")
        # An inference through the endpoint `serve` printed.
        client = httpclient.InferenceServerClient(served["http"])
        try:
            ids = np.array([[5, 6, 7]], dtype=np.uint32)
            inputs = [httpclient.InferInput("input_ids", [1, 3], "UINT32"),
                      httpclient.InferInput("input_lengths", [1, 1], "UINT32"),
                      httpclient.InferInput("request_output_len", [1, 1], "UINT32")]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(np.array([[3]], dtype=np.uint32))
            inputs[2].set_data_from_numpy(np.array([[2]], dtype=np.uint32))
            out = client.infer("fastertransformer", inputs).as_numpy("output_ids")
        finally:
            client.close()
        assert out.reshape(-1)[:5].tolist() == [5, 6, 7, 8, 9]
    finally:
        d = ftc("down", "--name", name, "--docker-host", host, timeout=60)
    assert d.returncode == 0 and f"removed {name}" in d.stdout, d.stderr
    assert dockerd.containers("serve1") == []
    # Nothing to remove the second time, and a failing image is cleaned up, not left half-started.
    assert "no container" in ftc("serve", *common, "--stop", "--docker-host", host, timeout=60).stdout
    bad = ftc("serve", *common, "--gpus", "none", "--network-host", "--docker-host", host,
              "--image", "ftcluster-test/missing:0", "--out", str(tmp_path / "svc2"))
    assert bad.returncode != 0 and "is not on the Docker daemon" in bad.stderr
    assert dockerd.containers("serve1") == []
