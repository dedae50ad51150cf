"""examples/: each walkthrough's README commands, run as written from a copy of its folder, with
the FT-shaped test model in place of the weights.

What a user has before the README's ftcluster lines is made here: `model_repository/` is the FT
backend's own repository for the type (../shared/fixtures) with its backend line pointed at the
python test model, and `c-models/<tp>-gpu/` a converted checkpoint of the real layout and sizes
(sparse). Run verbatim: `plan`, `render`, `check-checkpoint`, `compose`. `launch` runs where the
bed has the walkthrough's style, on a copy of its cluster spec with the bed's values in place of
the ones its README says to edit (partition, image, workspace, account, setup), and without
`--keep-serving` so that the client check ends the run. Not run: `convert` (FT's converters and
real weights), `cp` from a backend checkout (done above), docker compose, the gateway and client
lines (tested on their own in test_gateway.py and test_client.py).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers_specs import FT_FIXTURES
from tests.integration.test_zoo_launch import _repository
from tests.launch_helpers import ftcluster, processes_matching, wait_for
from tests.unit.test_zoo import make_checkpoint

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# Walkthrough -> (the backend's repository for its type, model_type, GPUs its weights are for).
WALKTHROUGHS = {
    "t5-pyxis": ("t5", "T5", 1),
    "gptj-slurm-docker": ("gptj", "GPT-J", 2),
    "megatron-gpt-two-nodes": ("gpt", "GPT", 1),
    "single-node-gateway": ("gpt", "GPT", 2),
}
RUN_AS_WRITTEN = {"plan", "render", "check-checkpoint", "compose"}

needs_fixtures = pytest.mark.skipif(not FT_FIXTURES.is_dir(), reason="needs ../shared/fixtures (the backend's all_models)")


def readme_commands(folder: Path) -> list[list[str]]:
    """The `ftcluster ...` lines of the README's bash blocks, continuations joined."""
    commands: list[list[str]] = []
    in_block, pending = False, ""
    for line in (folder / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_block = line.strip() == "```bash" and not in_block
            continue
        if not in_block:
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        text, pending = pending.strip(), ""
        if text.startswith("ftcluster "):
            commands.append(shlex.split(text.split(" &")[0])[1:])
    return commands


def materialise(name: str, dst: Path) -> Path:
    """A copy of the walkthrough with what its user has before the ftcluster lines."""
    source, model_type, tp = WALKTHROUGHS[name]
    folder = dst / name
    shutil.copytree(EXAMPLES / name, folder)
    _repository(FT_FIXTURES / source, folder / "model_repository")
    make_checkpoint(folder / "c-models", FT_FIXTURES / source, model_type, tp=tp)
    return folder


def test_every_walkthrough_is_listed_and_has_its_files() -> None:
    folders = {p.name for p in EXAMPLES.iterdir() if p.is_dir()}
    assert folders == set(WALKTHROUGHS)
    index = (EXAMPLES / "README.md").read_text()
    for name in folders:
        assert f"]({name}/)" in index, name
        assert {"README.md", "cluster.yaml", "model.yaml"} <= {p.name for p in (EXAMPLES / name).iterdir()}
        subcommands = {c[0] for c in readme_commands(EXAMPLES / name)}
        assert {"plan", "check-checkpoint"} <= subcommands, (name, subcommands)


@needs_fixtures
@pytest.mark.parametrize("name", sorted(WALKTHROUGHS))
def test_readme_lines_run_as_written(name: str, tmp_path: Path) -> None:
    folder = materialise(name, tmp_path)
    ran = []
    for argv in readme_commands(folder):
        if argv[0] not in RUN_AS_WRITTEN:
            continue
        p = ftcluster(*argv, cwd=folder, env={"FTCLUSTER_STATE_DIR": str(tmp_path / "state")})
        assert p.returncode == 0, (name, argv, p.stdout[-1500:], p.stderr[-1500:])
        assert "Traceback" not in p.stderr
        ran.append(argv[0])
        if argv[0] == "render":
            out = folder / argv[argv.index("--out") + 1]
            assert (out / "scripts").is_dir() and (out / "model_repository").is_dir(), sorted(out.iterdir())
        if argv[0] == "compose":
            out = folder / argv[argv.index("--out") + 1]
            compose = yaml.safe_load((out / "docker-compose.yml").read_text())
            (service,) = compose["services"].values()
            assert service["image"] == "${FTC_IMAGE}"   # from .env, beside it
            image = yaml.safe_load((folder / "cluster.yaml").read_text())["container"]["image"]
            assert f"FTC_IMAGE={image}" in (out / ".env").read_text()
    assert {"plan", "check-checkpoint"} <= set(ran), ran


def _bed_cluster(folder: Path, overrides: dict[str, Any]) -> None:
    """The walkthrough's cluster spec with the bed's values where its README says to edit."""
    path = folder / "cluster.yaml"
    spec = yaml.safe_load(path.read_text())
    for key in ("account", "setup"):
        spec.pop(key, None)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    path.write_text(yaml.safe_dump(spec))


def _launch_line(folder: Path) -> list[str]:
    (argv,) = [c for c in readme_commands(folder) if c[0] == "launch"]
    return [a for a in argv if a != "--keep-serving"] + ["--json"]


def _launch_and_check(folder: Path, nodes: int) -> None:
    p = ftcluster(*_launch_line(folder), cwd=folder, timeout=400)
    out = json.loads(p.stdout) if p.stdout.strip() else {}
    assert p.returncode == 0, (out.get("failure"), out.get("log_tail"), p.stderr[-2000:])
    assert out["ok"] and out["client"]["ok"], out
    run_dir = Path(out["run_dir"])
    hosts = {(run_dir / "state" / f"rank{r}.host").read_text().strip() for r in range(nodes)}
    assert len(hosts) == nodes, hosts
    assert wait_for(lambda: not processes_matching(out["run_id"]), 20), processes_matching(out["run_id"])


@needs_fixtures
@pytest.mark.cluster
@pytest.mark.triton
def test_megatron_two_nodes_launches_on_bare_slurm(slurm_cluster: Any, shared_tmp: Path) -> None:
    from ftcluster.triton_local import find_tritonserver

    folder = materialise("megatron-gpt-two-nodes", shared_tmp)
    _bed_cluster(folder, {"partition": "debug", "request_gpus": False, "exclusive": False,
                          "time_limit": "00:10:00", "workspace": str(shared_tmp / "ws"),
                          "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5}})
    _launch_and_check(folder, nodes=2)


@needs_fixtures
@pytest.mark.cluster
@pytest.mark.triton
def test_t5_launches_on_pyxis(pyxis_bed: Any, shared_tmp: Path) -> None:
    folder = materialise("t5-pyxis", shared_tmp)
    pyxis_bed.assert_clean(timeout=5)
    spec = yaml.safe_load((folder / "cluster.yaml").read_text())
    _bed_cluster(folder, {"partition": pyxis_bed.tb.partition, "request_gpus": False, "exclusive": False,
                          "time_limit": "00:10:00", "workspace": str(shared_tmp / "ws"),
                          "container": {**spec["container"], "image": str(pyxis_bed.sqsh)},
                          # The image's tritonserver, on its PATH (as test_pyxis_launch.py has it).
                          "server": {"binary": "tritonserver", "ready_timeout": 90, "exit_grace": 5}})
    _launch_and_check(folder, nodes=1)
    pyxis_bed.assert_clean()
