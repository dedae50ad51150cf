"""Preparation over the real FT backend configs (issue 2, item 5 / "Done when").

Reads every config.pbtxt and config.ini under ../shared/fixtures/fastertransformer_backend
(never copied into the project); skips cleanly when that folder is absent. Where a fixture has
no `<tp>-gpu` checkpoint folder, a temp checkpoint root gets a copy of the fixture's config.ini.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ftcluster.engines.fastertransformer.checkpoint import read_checkpoint
from ftcluster.engines.fastertransformer.config import read_ini
from ftcluster.engines.fastertransformer.repository import prepare_repository
from ftcluster.engines import make_plan
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec
from tests.helpers_specs import FT_FIXTURES, cluster

pytestmark = [pytest.mark.skipif(not FT_FIXTURES.is_dir(), reason="../shared/fixtures absent")]

MODEL_TYPE = {"gpt": "GPT", "gptj": "GPT-J", "t5": "T5", "bert": "bert"}
REPOS = sorted(p.name for p in FT_FIXTURES.iterdir()) if FT_FIXTURES.is_dir() else []
INIS = sorted(str(p.relative_to(FT_FIXTURES)) for p in FT_FIXTURES.rglob("config.ini")) if REPOS else []
PBTXTS = sorted(str(p.relative_to(FT_FIXTURES)) for p in FT_FIXTURES.rglob("config.pbtxt")) if REPOS else []
SHAPES = [(1, 1), (2, 1), (1, 2), (2, 2)]   # (nodes, gpus_per_node)


def parse(path: Path) -> model_config_pb2.ModelConfig:
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(), cfg)
    return cfg


def tree_hash(root: Path) -> str:
    """Paths, modes, link targets and contents of everything under root."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)}\0{st.st_mode}\0".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def ft_folder(repo: Path) -> Path:
    found = [p.parent for p in repo.glob("*/config.pbtxt") if parse(p).backend == "fastertransformer"]
    assert len(found) == 1, found
    return found[0]


def checkpoint_root_for(repo: Path, tp: int, tmp: Path) -> Path:
    """The fixture's own `<tp>-gpu` folder when it has one, else a temp root with its config.ini."""
    version = ft_folder(repo) / "1"
    if (version / f"{tp}-gpu" / "config.ini").is_file():
        return version
    src = version / "config.ini"
    if not src.is_file():
        src = sorted(version.glob("*-gpu/config.ini"))[0]
    root = tmp / "ckpt"
    (root / f"{tp}-gpu").mkdir(parents=True)
    shutil.copyfile(src, root / f"{tp}-gpu" / "config.ini")
    return root


def check_prepared(src_repo: Path, out: Path, ft: str, params: dict[str, str], mbs: int | None) -> None:
    """Every prepared config parses; only the set values differ from the source."""
    src_models = {p.parent.name for p in src_repo.glob("*/config.pbtxt")}
    assert {p.parent.name for p in out.glob("*/config.pbtxt")} == src_models
    for name in src_models:
        before = parse(src_repo / name / "config.pbtxt")
        after = parse(out / name / "config.pbtxt")
        assert not (out / name / "config.pbtxt").is_symlink()
        assert os.stat(out / name / "config.pbtxt").st_mode & 0o200, "prepared config must be writable"
        if name == ft:
            for key, value in params.items():
                assert after.parameters[key].string_value == value
                before.parameters.pop(key, None)
                after.parameters.pop(key, None)
            if mbs is not None:
                assert after.max_batch_size == mbs
                before.max_batch_size = after.max_batch_size
        elif mbs is not None and any(s.model_name == ft for s in before.ensemble_scheduling.step):
            assert after.max_batch_size == min(before.max_batch_size, mbs)
            before.max_batch_size = after.max_batch_size
        assert after == before, f"{name}: more than the planned values changed"


@pytest.mark.parametrize("pbtxt", PBTXTS)
def test_every_fixture_config_parses(pbtxt: str) -> None:
    cfg = parse(FT_FIXTURES / pbtxt)
    assert cfg.name


@pytest.mark.parametrize("ini", INIS)
def test_every_fixture_config_ini_gives_heads_and_layers(ini: str, tmp_path: Path) -> None:
    repo_name = ini.split("/")[0]
    mt = MODEL_TYPE[repo_name]
    tp = read_ini(FT_FIXTURES / ini).getint(
        read_ini(FT_FIXTURES / ini).sections()[0], "tensor_para_size", fallback=1)
    root = tmp_path / "ckpt"
    (root / f"{tp}-gpu").mkdir(parents=True)
    shutil.copyfile(FT_FIXTURES / ini, root / f"{tp}-gpu" / "config.ini")
    facts = read_checkpoint(root, mt, tp)
    assert facts.splits and all(s.head_num > 0 and s.num_layer > 0 for s in facts.splits)
    assert len(facts.splits) == (2 if mt == "T5" else 1)
    assert facts.ini_tensor_para_size in (None, tp)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}n{g}g" for n, g in SHAPES])
@pytest.mark.parametrize("repo_name", REPOS)
@pytest.mark.parametrize("mount", [None, "/models/ckpt"], ids=["host", "mounted"])
def test_prepare_fixture(repo_name: str, shape: tuple[int, int], mount: str | None, tmp_path: Path) -> None:
    nodes, gpn = shape
    repo = FT_FIXTURES / repo_name
    root = checkpoint_root_for(repo, gpn, tmp_path)
    ft = ft_folder(repo).name
    mbs = 64 if mount else None
    model = ModelSpec(name=ft if repo_name in ("t5", "bert") else "ensemble", model_type=MODEL_TYPE[repo_name],
                      repository=repo, ft_model=ft, checkpoint_root=root, checkpoint_mount=mount,
                      max_batch_size=mbs)
    before = tree_hash(repo)
    plan = make_plan(cluster(gpus_per_node=gpn), model, nodes)
    assert (plan.tensor_para_size, plan.pipeline_para_size) == (gpn, nodes)

    out = tmp_path / "run" / "model_repository"
    prepared = prepare_repository(model, plan, out)

    assert tree_hash(repo) == before, "the user's repository changed"
    cfg = parse(out / ft / "config.pbtxt")
    p = {k: v.string_value for k, v in cfg.parameters.items()}
    assert p["tensor_para_size"] == str(gpn)
    assert p["pipeline_para_size"] == str(nodes)
    assert p["model_checkpoint_path"] == f"{mount or root}/{gpn}-gpu/"
    assert p["model_type"] == MODEL_TYPE[repo_name]
    check_prepared(repo, out, ft, prepared.parameters, mbs)

    # Converted weight folders inside the repository are linked, never copied.
    for src_dir in repo.rglob("*-gpu"):
        dst = out / src_dir.relative_to(repo)
        assert dst.is_symlink() and dst.resolve() == src_dir.resolve()
    # And the prepared copy can be removed by its owner.
    shutil.rmtree(out)
