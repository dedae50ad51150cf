"""examples/: each walkthrough's README commands, run as written from a copy of its folder, with
the FT-shaped test model in place of the weights.

What a user has before the README's ftcluster lines is made here: `model_repository/` is the FT
backend's own repository for the type (../shared/fixtures) with its backend line pointed at the
python test model, and `c-models/<tp>-gpu/` a converted checkpoint of the real layout and sizes
(sparse). Run verbatim: `plan`, `render`, `check-checkpoint`, `compose`. `launch` runs where the
bed has the walkthrough's style, on a copy of its cluster spec with the bed's values in place of
the ones its README says to edit (partition, image, workspace, account, setup), and without
`--keep-serving` so that the client check ends the run. `convert` runs as its README writes it
before that launch (no c-models/ yet: it makes it), on the same copy of the cluster spec, with
the test converters (tests/data/ft_converter: FT's command lines, a real layout) and their
input in place of the README's FasterTransformer checkout and weights. Not run: `cp` from a
backend checkout (done above), docker compose, the gateway and client lines (tested on their own
in test_gateway.py and test_client.py).
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
TEST_CONVERTER = REPO / "tests" / "data" / "ft_converter"
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


def materialise(name: str, dst: Path, converted: bool = True) -> Path:
    """A copy of the walkthrough with what its user has before the ftcluster lines: the
    converted weights, or (converted=False) what its `convert` line converts (dst/weights)."""
    source, model_type, tp = WALKTHROUGHS[name]
    folder = dst / name
    shutil.copytree(EXAMPLES / name, folder)
    _repository(FT_FIXTURES / source, folder / "model_repository")
    if converted:
        make_checkpoint(folder / "c-models", FT_FIXTURES / source, model_type, tp=tp)
        return folder
    # The test converters' input: the real checkpoint's config.ini, file names and sizes.
    made = make_checkpoint(dst / "layout", FT_FIXTURES / source, model_type, tp=tp)
    (dst / "weights").mkdir()
    (dst / "weights" / "layout.json").write_text(json.dumps({
        "tensor_para_size": tp, "config_ini": (made / "config.ini").read_text(),
        "files": {p.name: p.stat().st_size for p in made.iterdir() if p.name != "config.ini"}}))
    shutil.rmtree(dst / "layout")
    return folder


def convert_as_written(folder: Path) -> None:
    """The README's `convert` line with the test converters and dst/weights in place of its
    FasterTransformer checkout and weights; then its `check-checkpoint` line."""
    (argv,) = [c for c in readme_commands(folder) if c[0] == "convert"]
    argv[argv.index("--converter-root") + 1] = str(TEST_CONVERTER)
    argv[argv.index("--input") + 1] = str(folder.parent / "weights")
    assert not (folder / "c-models").exists()
    p = ftcluster(*argv, cwd=folder, timeout=300)
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    (check,) = [c for c in readme_commands(folder) if c[0] == "check-checkpoint"]
    p = ftcluster(*check, cwd=folder)
    assert p.returncode == 0, (check, p.stdout, p.stderr)


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
    from ftcluster.service.triton_local import find_tritonserver

    folder = materialise("megatron-gpt-two-nodes", shared_tmp, converted=False)
    _bed_cluster(folder, {"partition": "debug", "request_gpus": False, "exclusive": False,
                          "time_limit": "00:10:00", "workspace": str(shared_tmp / "ws"),
                          "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5}})
    convert_as_written(folder)
    _launch_and_check(folder, nodes=2)


@needs_fixtures
@pytest.mark.cluster
@pytest.mark.triton
def test_t5_launches_on_pyxis(pyxis_bed: Any, shared_tmp: Path) -> None:
    folder = materialise("t5-pyxis", shared_tmp, converted=False)
    pyxis_bed.assert_clean(timeout=5)
    spec = yaml.safe_load((folder / "cluster.yaml").read_text())
    _bed_cluster(folder, {"partition": pyxis_bed.tb.partition, "request_gpus": False, "exclusive": False,
                          "time_limit": "00:10:00", "workspace": str(shared_tmp / "ws"),
                          "container": {**spec["container"], "image": str(pyxis_bed.sqsh)},
                          # The image's tritonserver, on its PATH (as test_pyxis_launch.py has it).
                          "server": {"binary": "tritonserver", "ready_timeout": 90, "exit_grace": 5}})
    convert_as_written(folder)
    _launch_and_check(folder, nodes=1)
    pyxis_bed.assert_clean()


@needs_fixtures
@pytest.mark.cluster
@pytest.mark.docker
def test_gptj_converts_in_the_runs_container_on_slurm_docker(docker_nodes: Any, tmp_path: Path) -> None:
    from tests.docker import image
    from tests.docker.launching import SSH_PORT, assert_nothing_left

    dn = docker_nodes
    folder = materialise("gptj-slurm-docker", tmp_path, converted=False)
    spec = yaml.safe_load((folder / "cluster.yaml").read_text())
    _bed_cluster(folder, {"partition": dn.tb.partition, "request_gpus": False, "exclusive": False,
                          "time_limit": "10", "workspace": str(tmp_path / "runs"), "ssh_port": SSH_PORT,
                          "container": {**spec["container"], "image": image.IMAGE, "shm_size": "256m",
                                        "docker_host": dn.docker_host_template, "gpus": "nvidia-runtime"}})
    convert_as_written(folder)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "TEST CONVERTER: wrote" in (run_dir / "logs" / "step.log").read_text()
    assert_nothing_left(dn, run_dir)
