"""The engine seam holds: an engine that lives in the tests alone (tests/engines/echo), declared
through the `ftcluster.engines` entry points as another package would declare it, plans, renders
and serves through ftcluster unchanged -- on this machine and on bare Slurm, two nodes -- with
its own spec fields, plan rule, run repository, load line and model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.engines.echo import MAX_NODES, REPOSITORY, install
from tests.launch_helpers import ftcluster, launch_json, processes_matching, wait_for, write_cluster

REPO = Path(__file__).resolve().parents[2]


def _env(site: Path) -> dict[str, str]:
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), str(REPO)]
    return {"PYTHONPATH": os.pathsep.join(path)}


def _model(folder: Path, shift: int = 5) -> Path:
    path = folder / "echo.yaml"
    path.write_text(yaml.safe_dump({"name": "echo", "backend": "echo", "repository": str(REPOSITORY),
                                    "shift": shift}))
    return path


def _echoes(endpoint: str, shift: int, token: str) -> None:
    """The served model is the engine's: it answers with the prompt's ids shifted by `shift`."""
    import tritonclient.http as http

    client = http.InferenceServerClient(endpoint)
    ids = np.array([[1, 2, 3]], dtype=np.uint32)
    inputs = []
    for name, value in (("input_ids", ids), ("input_lengths", np.array([[3]], dtype=np.uint32)),
                        ("request_output_len", np.array([[1]], dtype=np.uint32))):
        tensor = http.InferInput(name, list(value.shape), "UINT32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    got = client.infer("echo", inputs, headers=headers).as_numpy("output_ids")
    assert got is not None and got.tolist() == (ids + shift).tolist()


def _serves_as_the_engine_says(out: dict[str, Any], nodes: int, env: dict[str, str]) -> None:
    run_dir = Path(out["run_dir"])
    # Every rank passed the engine's own load line; rank 0 serves the engine's model.
    for r in range(nodes):
        assert (run_dir / "state" / f"rank{r}.loaded").exists(), r
    config = (run_dir / "model_repository" / "echo" / "config.pbtxt").read_text()
    assert '"shift"' in config and '"world_size"' in config, config
    st = json.loads(ftcluster("status", out["run_id"], "--json", env=env).stdout)
    token = ftcluster("token", out["run_id"], env=env).stdout.strip() if st["access"] == "private" else ""
    _echoes(out["endpoint"], 5, token)
    # The liveness probe, made from the engine's served config, crosses the world.
    def probed() -> bool:
        st = json.loads(ftcluster("status", out["run_id"], "--json", env=env).stdout)
        return bool((st["health"] or {}).get("last_ok"))
    assert wait_for(probed, 30, interval=0.5)


@pytest.fixture
def echo_env(tmp_path: Path) -> dict[str, str]:
    return _env(install(tmp_path / "site"))


def test_a_spec_naming_an_engine_not_installed_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = ftcluster("plan", "--cluster", str(write_cluster(tmp_path)), "--model", str(_model(tmp_path)))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "backend: no engine is named 'echo'" in proc.stderr and "fastertransformer" in proc.stderr, proc.stderr


def test_the_engine_plans_with_its_own_rule(tmp_path: Path, echo_env: dict[str, str]) -> None:
    cluster = write_cluster(tmp_path, max_nodes=8)
    proc = ftcluster("plan", "--cluster", str(cluster), "--model", str(_model(tmp_path)), "--nodes", "2",
                     "--json", env=echo_env)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["shift"] == 5 and plan["mpi_ranks"] == 2 and plan["layout"]["per_gpu"] is False
    proc = ftcluster("plan", "--cluster", str(cluster), "--model", str(_model(tmp_path)),
                     "--nodes", str(MAX_NODES + 1), env=echo_env)
    assert proc.returncode == 3 and f"the echo engine serves on at most {MAX_NODES} nodes" in proc.stderr, \
        proc.stderr


@pytest.mark.triton
def test_the_engine_serves_on_this_machine(tmp_path: Path, echo_env: dict[str, str]) -> None:
    cluster = write_cluster(tmp_path, server={"liveness": {"interval": 1, "deadline": 5, "failures": 3}})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client", model=_model(tmp_path),
                               env=echo_env)
    assert rc == 0 and out["ok"], err
    try:
        _serves_as_the_engine_says(out, 2, echo_env)
    finally:
        assert ftcluster("stop", out["run_id"], env=echo_env).returncode == 0
    assert wait_for(lambda: not processes_matching(out["run_id"]), 30), processes_matching(out["run_id"])


def test_the_engine_serves_on_bare_slurm(slurm_cluster: Any, shared_tmp: Path, tmp_path: Path,
                                         echo_env: dict[str, str]) -> None:
    from tests.integration.test_launch_slurm import _assert_clean, _write_spec

    cluster = _write_spec(shared_tmp)
    rc, out, err = launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client",
                               model=_model(shared_tmp), env=echo_env)
    assert rc == 0 and out["ok"], err
    try:
        _serves_as_the_engine_says(out, 2, echo_env)
    finally:
        assert ftcluster("stop", out["run_id"], env=echo_env).returncode == 0
    _assert_clean(out)
