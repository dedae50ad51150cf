"""Helpers of the Docker launch tests (Slurm and ssh schedulers): the test bed's cluster spec,
running `ftcluster launch --json`, the run's events, and the check that nothing is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker import image
from tests.docker.daemons import DockerNodes

REPO = Path(__file__).resolve().parents[2]
DEMO_CHECKPOINT = REPO / "ftcluster" / "demo" / "checkpoint"
# Not the test bed's own sshd port (11068): sshd may already listen there on every node.
SSH_PORT = 11168


def write_spec(tmp_path: Path, dn: DockerNodes, *, top: dict[str, Any] | None = None, **container: Any) -> Path:
    """The test bed's Slurm + Docker cluster spec; `top` replaces top-level fields (scheduler...)."""
    spec = {
        "name": "tb-docker",
        "scheduler": "slurm",
        "partition": dn.tb.partition,  # type: ignore[attr-defined]
        "request_gpus": False,
        "exclusive": False,
        "gpus_per_node": 1,
        "time_limit": "10",
        "workspace": str(tmp_path / "runs"),
        "ssh_port": SSH_PORT,
        "container": {
            "runtime": "docker",
            "image": image.IMAGE,
            "docker_host": dn.docker_host_template,
            "shm_size": "256m",
            # The bed's daemons run "nvidia" as plain runc: the GPU wiring is real, the GPUs not.
            "gpus": "nvidia-runtime",
            # The demo model's checkpoint, mounted as a user mounts theirs.
            "mounts": [f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}:ro"],
            **container,
        },
        # Nothing of ftcluster inside the image and no mount of this checkout: the rank side
        # is what a stock Triton + FT image has (tritonserver on its PATH, bash, python3).
        "server": {"ready_timeout": 90, "exit_grace": 10},
    }
    spec.update(top or {})
    spec = {k: v for k, v in spec.items() if v is not None}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def launch_cmd(spec: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "ftcluster", "launch", "--cluster", str(spec), "--json", *args]


def launch(dn: DockerNodes, spec: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    p = subprocess.run(launch_cmd(spec, *args), capture_output=True, text=True, timeout=300,
                       env=dn.tb.env)  # type: ignore[attr-defined]
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from launch (rc {p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.returncode, out, p.stderr


def events(run_dir: Path) -> list[list[str]]:
    return [ln.split()[1:] for ln in (run_dir / "state" / "events").read_text().splitlines()]


def assert_nothing_left(dn: DockerNodes, run_dir: Path) -> None:
    for node in dn.nodes:
        assert dn.containers(node, f"org.ftcluster.run={run_dir.name}") == [], f"containers left on {node}"
    assert not (run_dir / "state" / "ssh").exists(), "the run's ssh keys were not removed"
    run_id = run_dir.name
    deadline = time.monotonic() + 15
    while True:
        left = [d for d in os.listdir("/proc") if d.isdigit() and run_id in _cmdline(d)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, [(d, _cmdline(d)[:120]) for d in left]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for_event(run_dir: Path, kind: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "state" / "events").is_file() and any(e[0] == kind for e in events(run_dir)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {kind} event in {timeout}s: {events(run_dir)}")


def wait_no_containers(dn: DockerNodes, run_dir: Path, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = [f"{n}:{c}" for n in dn.nodes for c in dn.containers(n, f"org.ftcluster.run={run_dir.name}")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def serve_detached(dn: DockerNodes, spec: Path) -> tuple[dict[str, Any], Path]:
    """Launch 2 nodes with --keep-serving --detach; returns once both containers serve."""
    rc, out, err = launch(dn, spec, "--nodes", "2", "--keep-serving", "--no-client", "--detach")
    assert rc == 0, (out, err)
    run_dir = Path(out["run_dir"])
    wait_for_event(run_dir, "serving")
    assert sum(len(dn.containers(n, f"org.ftcluster.run={run_dir.name}")) for n in dn.nodes) == 2
    return out, run_dir


def stop(dn: DockerNodes, run_id: str) -> None:
    p = subprocess.run([sys.executable, "-m", "ftcluster", "stop", run_id], capture_output=True, text=True,
                       timeout=180, check=False, env=dn.tb.env)  # type: ignore[attr-defined]
    assert p.returncode == 0, p.stderr


def wait_containers_ready(proc: subprocess.Popen[str], runs: Path, dn: DockerNodes) -> Path:
    """Wait until the launch in `proc` has its containers up (one per node); its run folder."""
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(runs.glob("*/state/events"))
        if found and any(e[0] == "containers_ready" for e in events(found[0].parents[1])):
            run_dir = found[0].parents[1]
            break
        time.sleep(0.2)
    assert run_dir is not None, proc.communicate(timeout=5)
    assert sum(len(dn.containers(n, f"org.ftcluster.run={run_dir.name}")) for n in dn.nodes) == 2
    return run_dir


def assert_weird_path_launch(dn: DockerNodes, spec: Path, weird: Path) -> None:
    """A 2-node launch from a workspace under `weird` (spaces, quotes, shell syntax) serves,
    executes none of the path, and leaves nothing."""
    rc, out, err = launch(dn, spec, "--nodes", "2")
    assert rc == 0 and out["client"]["ok"] is True, (out, err)
    run_dir = Path(out["run_dir"])
    assert str(run_dir).startswith(str(weird))
    assert not list(weird.parent.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    assert_nothing_left(dn, run_dir)

