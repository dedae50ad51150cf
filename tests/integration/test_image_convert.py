"""For real: `ftcluster convert` as a Slurm job on the test cluster (its job request, submitted by
the Slurm launcher like a launch's), and
`ftcluster image build` against a test-bed dockerd (local base image, no registry), including a
failing build whose error names the step.

The converter is the TEST converter in tests/data/ft_converter (FT's GPT converter's command
line and output layout, tiny sizes); the "fastertransformer_backend checkout" is a tiny fake
whose docker/Dockerfile builds FROM the test bed's CPU image.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftcluster.engines.fastertransformer.checkpoint_check import checkpoint_problems
from tests.docker import image as test_image
from tests.docker.daemons import DockerNodes

REPO = Path(__file__).resolve().parents[2]
TEST_CONVERTER = REPO / "tests" / "data" / "ft_converter"
HF_TINY = TEST_CONVERTER / "hf_tiny_gpt"
TINY_REPO = REPO / "tests" / "data" / "models" / "tiny" / "repo"


def ftc(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, check=False)


@pytest.mark.cluster
def test_convert_as_slurm_job(slurm_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({
        "name": "tinygpt", "model_type": "GPT", "repository": str(TINY_REPO),
        "ft_model": "fastertransformer", "checkpoint_root": str(tmp_path / "ckpt"), "data_type": "fp16"}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({
        "scheduler": "slurm", "partition": slurm_cluster.partition, "time_limit": "5",
        "gpus_per_node": 2, "request_gpus": False, "exclusive": False,
        "workspace": str(tmp_path / "runs")}))
    args = ["convert", "--cluster", str(tmp_path / "cluster.yaml"), "--model", str(tmp_path / "model.yaml"),
            "--converter-root", str(TEST_CONVERTER), "--input", str(HF_TINY), "--python", sys.executable]
    env = slurm_cluster.env
    p = ftc(*args, "--timeout", "60", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    run_id, job_id = p.stdout.split()[1].rstrip(":"), p.stdout.split()[3]
    assert checkpoint_problems(tmp_path / "ckpt", "GPT", 2) == []
    # The job ran on a test-bed node, and its logs are the run's logs.
    logs = ftc("logs", run_id, env=env).stdout
    assert "TEST CONVERTER: wrote" in logs
    events = (tmp_path / "runs" / run_id / "state" / "events").read_text()
    assert any(line.split()[1:] == ["job_started", node, job_id] for line in events.splitlines()
               for node in slurm_cluster.nodes), events
    st = json.loads(ftc("status", run_id, "--json", env=env).stdout)
    assert (st["state"], st["style"], st["job_id"]) == ("COMPLETED", "convert", job_id)
    sbatch = (tmp_path / "runs" / run_id / "scripts" / "job.sbatch").read_text()
    assert f"#SBATCH --partition={slurm_cluster.partition}" in sbatch and "#SBATCH --time=5" in sbatch

    # The plan now checks the weights: a wrong GPU count, a missing shard, a truncated file.
    plan = ["plan", "--cluster", str(tmp_path / "cluster.yaml"), "--model", str(tmp_path / "model.yaml")]
    assert ftc(*plan, env=env).returncode == 0
    d = tmp_path / "ckpt" / "2-gpu"
    (d.rename(tmp_path / "ckpt" / "4-gpu"))
    p = ftc(*plan, "--gpus-per-node", "4", env=env)
    assert p.returncode == 3 and "converted for 2 GPU(s)" in p.stderr
    (tmp_path / "ckpt" / "4-gpu").rename(d)
    with open(d / "model.layers.1.attention.query_key_value.weight.1.bin", "r+b") as fh:
        fh.truncate(7)
    p = ftc(*plan, env=env)
    assert p.returncode == 3 and "query_key_value.weight.1.bin is 7 bytes" in p.stderr and "truncated" in p.stderr
    (d / "model.layers.0.mlp.dense_4h_to_h.weight.0.bin").unlink()
    p = ftc(*plan, env=env)
    assert "missing shard model.layers.0.mlp.dense_4h_to_h.weight.0.bin" in p.stderr


DOCKERFILE = """\
ARG TRITON_VERSION=22.12
FROM {base}
ARG TRITON_VERSION
RUN echo "fake FT backend for triton $TRITON_VERSION" > /opt/ft_backend_version
{extra}
LABEL org.ftcluster.test-build=true
"""


def fake_backend(root: Path, extra: str = "") -> Path:
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "Dockerfile").write_text(DOCKERFILE.format(base=test_image.IMAGE, extra=extra))
    (root / "README.md").write_text("TEST: a fake fastertransformer_backend checkout\n")
    return root


@pytest.mark.docker
@pytest.mark.cluster
def test_image_build_on_the_test_bed_daemon(docker_nodes: DockerNodes, tmp_path: Path) -> None:  # noqa: F811
    node = docker_nodes.nodes[0]
    env = {"DOCKER_HOST": f"unix://{docker_nodes.socket(node)}"}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"scheduler": "slurm", "workspace": str(tmp_path / "ws"),
                                       "image": {"tag": "ftc-test/triton_with_ft:build"}}))
    tags = ["ftc-test/triton_with_ft:build", "ftc-test/triton_with_ft:broken"]
    try:
        # The daemons run with --bridge=none: RUN steps use the node's network.
        p = ftc("image", "build", "--cluster", str(cluster), "--ft-backend", str(fake_backend(tmp_path / "ok")),
                "--triton-version", "23.01", "--network", "host", "--json", env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        meta = json.loads(p.stdout)
        assert meta["triton_version"] == "23.01" and meta["tag"] == tags[0]
        assert "Step 4/5 : RUN echo" in p.stderr   # the streamed build output
        inspect = docker_nodes.docker(node, ["image", "inspect", tags[0], "--format", "{{.Id}}"], check=True)
        assert inspect.stdout.strip() == meta["image_id"]
        recorded = json.loads((tmp_path / "ws" / "images" / "ftc-test_triton_with_ft_build.json").read_text())
        assert recorded == meta
        out = docker_nodes.docker(node, ["run", "--rm", "--network", "none", tags[0],
                                         "cat", "/opt/ft_backend_version"], check=True)
        assert out.stdout.strip() == "fake FT backend for triton 23.01"

        # A failing step: one error line naming the step and the daemon's message, exit 1.
        broken = fake_backend(tmp_path / "broken", extra="RUN echo 'cmake: FT backend failed' >&2 && exit 3")
        p = ftc("image", "build", "--cluster", str(cluster), "--ft-backend", str(broken), "--tag", tags[1],
                "--network", "host", env=env, timeout=300)
        assert p.returncode == 1
        assert "cmake: FT backend failed" in p.stderr          # the step's own output, streamed
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("error: step 5/6 (RUN echo 'cmake: FT backend failed' >&2 && exit 3) failed: ")
        assert "returned a non-zero code: 3" in last and "Traceback" not in p.stderr

        # No daemon: a clear error too.
        p = ftc("image", "build", "--cluster", str(cluster), "--ft-backend", str(tmp_path / "ok"),
                env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
        assert p.returncode == 3 and p.stderr.startswith("error: DOCKER_HOST: cannot reach Docker at unix://")
    finally:
        for tag in tags:
            docker_nodes.docker(node, ["rmi", "-f", tag])
        docker_nodes.docker(node, ["image", "prune", "-f"])
