"""`--json` on every command, and an error under --json as a JSON object on stdout: real runs
of the CLI (no Docker daemon or replica set here: those commands' JSON errors are checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml

from ftcluster.run.store import RunRecord, RunStore

# Long-running servers and ftcluster's own hidden command: nothing to print as one object.
NO_JSON = {"gateway", "tunnel", "successor"}


def ftc(*args: str, cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "FTCLUSTER_STATE_DIR": str(state)}, timeout=120, check=False)


def test_every_command_takes_json() -> None:
    from ftcluster.cli import COMMANDS, HIDDEN_COMMANDS, cli, load

    for name in [*COMMANDS, *HIDDEN_COMMANDS]:
        load(name)
    lacking = []

    def walk(group: click.Group, prefix: str = "") -> None:
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, f"{prefix}{name} ")
            elif not any("--json" in p.opts for p in cmd.params) and name not in NO_JSON:
                lacking.append(prefix + name)

    walk(cli)
    assert lacking == [], lacking


@pytest.mark.parametrize(("args", "code", "field"), [
    (["status", "no-such-run", "--json"], 3, None),
    (["plan", "--nodes", "0", "--json"], 3, "--nodes"),
    (["list", "--json", "--no-such-option"], 2, None),
    (["scale", "--replicas", "2", "--json"], 3, None),
    (["down", "--name", "x", "--docker-host", "unix:///nonexistent.sock", "--json"], 3, "--docker-host"),
])
def test_an_error_under_json_is_a_json_object_on_stdout(tmp_path: Path, args: list[str], code: int,
                                                        field: str | None) -> None:
    p = ftc(*args, cwd=tmp_path, state=tmp_path / "state")
    assert p.returncode == code, p.stderr
    err = json.loads(p.stdout)
    assert (err["kind"], err["exit_code"], err["field"]) == ("error", code, field), err
    assert p.stderr.strip() in (f"error: {err['error']}", err["error"])   # the same line, still on stderr
    # Without --json: nothing on stdout.
    assert ftc(*[a for a in args if a != "--json"], cwd=tmp_path, state=tmp_path / "state").stdout == ""


def test_json_of_examples_compose_prepare_prune_token_and_image_import(tmp_path: Path) -> None:
    state = tmp_path / "state"

    def doc(*args: str) -> dict[str, object]:
        p = ftc(*args, "--json", cwd=tmp_path, state=state)
        assert p.returncode == 0, (args, p.stderr)
        found = json.loads(p.stdout)
        assert found["schema_version"] == 2 and isinstance(found, dict)
        return found   # type: ignore[no-any-return]

    ex = doc("examples")
    assert ex["kind"] == "examples" and "configs/models/demo.yaml" in ex["files"]   # type: ignore[operator]
    demo = "configs/models/demo.yaml"
    comp = doc("compose", "--cluster", "configs/clusters/slurm-docker.yaml", "--model", demo, "--gpus", "0",
               "--out", "svc")
    assert comp["kind"] == "compose" and str(tmp_path / "svc" / "docker-compose.yml") in comp["files"]  # type: ignore[operator]
    prep = doc("prepare", "--model", demo, "--nodes", "1", "--out", "repo")
    assert prep["kind"] == "prepare" and (tmp_path / str(prep["path"])).is_dir()
    assert doc("prune", "--dry-run") == {"schema_version": 2, "kind": "prune", "runs": [], "removed": False}
    run_dir = tmp_path / "run1"
    (run_dir / "scripts").mkdir(parents=True)
    (run_dir / "scripts" / "token").write_text("s3cret\n")
    RunStore(state / "runs.sqlite").add(RunRecord(
        run_id="run1", created=time.time(), cluster_name="c", cluster_source="", scheduler="local", style="local",
        run_dir=str(run_dir), nodes=1, model="m", job_id=None, status="COMPLETED"))
    assert doc("token", "run1") == {"schema_version": 2, "kind": "token", "run_id": "run1", "token": "s3cret"}
    pyxis = yaml.safe_load((tmp_path / "configs/clusters/pyxis.yaml").read_text())
    (tmp_path / "pyxis.yaml").write_text(yaml.safe_dump({**pyxis, "workspace": str(tmp_path / "ws")}))
    imp = doc("image", "import", "--cluster", "pyxis.yaml", "--dry-run")
    assert imp["kind"] == "image_import" and imp["imported"] is False and Path(str(imp["script"])).is_file()
    assert imp["command"][:2] == ["enroot", "import"]   # type: ignore[index]


def test_swapped_cluster_and_model_specs_are_named_for_what_they_are(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert ftc("examples", cwd=tmp_path, state=state).returncode == 0
    cluster, model = "configs/clusters/slurm-bare.yaml", "configs/models/demo.yaml"
    p = ftc("plan", "--cluster", model, "--model", cluster, "--nodes", "1", cwd=tmp_path, state=state)
    assert p.returncode == 3 and p.stderr.count("\n") == 1 and "unknown" not in p.stderr, p.stderr
    assert f"{model}: this is a model spec (" in p.stderr and "give it as --model" in p.stderr
    assert f"{cluster}: this is a cluster spec (" in p.stderr and "give it as --cluster" in p.stderr


def test_a_failure_after_the_commands_own_object_adds_no_second_one(tmp_path: Path) -> None:
    # A launch that failed prints its `launch` object, then exits 1 through an error: stdout
    # stays one JSON document.
    state = tmp_path / "state"
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({
        "scheduler": "local", "gpus_per_node": 1, "workspace": str(tmp_path / "ws"),
        "ports": {"http": 47300, "grpc": 47301, "metrics": 47302},
        "server": {"binary": "/bin/false", "ready_timeout": 20}}))
    p = ftc("launch", "--cluster", "cluster.yaml", "--nodes", "1", "--no-mpi-check", "--json", cwd=tmp_path,
            state=state)
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert out["kind"] == "launch" and out["ok"] is False, out
