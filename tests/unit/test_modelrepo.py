"""Model repository preparation (issue 2, item 5) on the tiny test repository."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ftcluster.errors import UserError
from ftcluster.engines.triton_config import read_model_config
from ftcluster.engines.fastertransformer.repository import apply_plan, checkpoint_path_for_server, ft_parameters, prepare_repository
from ftcluster.engines import make_plan
from ftcluster.engines.fastertransformer.plan import plan_for
from ftcluster.spec.load import load_model
from tests.helpers_specs import MODELS, assert_one_line_error, ckpt, cluster, facts, model, run_cli
from tests.unit.test_fixtures_ft import check_prepared, tree_hash


TINY = MODELS / "tiny" / "repo"


def _plan(nodes: int = 2, gpn: int = 1):  # type: ignore[no-untyped-def]
    return plan_for(cluster(gpus_per_node=gpn), model(), facts(), ckpt(tp=gpn), nodes, gpn)


def test_ft_parameters_pure() -> None:
    m = model(data_type="bf16", int8_mode=1, enable_custom_all_reduce=True, parameters={"is_sparse": 1})
    params = ft_parameters(m, _plan(nodes=2, gpn=2), {"model_type": "GPT", "data_type": "fp16"})
    assert params == {
        "tensor_para_size": "2", "pipeline_para_size": "2", "model_checkpoint_path": "/ckpt/2-gpu/",
        "data_type": "bf16", "int8_mode": "1", "enable_custom_all_reduce": "1", "is_sparse": "1",
    }


def test_unset_spec_values_leave_the_source_alone() -> None:
    source = {"model_type": "GPT", "data_type": "fp16", "int8_mode": "1", "enable_custom_all_reduce": "1"}
    params = ft_parameters(model(), _plan(nodes=2, gpn=2), source)
    assert set(params) == {"tensor_para_size", "pipeline_para_size", "model_checkpoint_path"}


def test_model_type_written_as_the_backend_names_it() -> None:
    plan = _plan()
    assert "model_type" not in ft_parameters(model(model_type="BLOOM"), plan, {"model_type": "GPT"})
    # No model_type in the source: the backend reads GPT, so only other types are written.
    assert "model_type" not in ft_parameters(model(model_type="OPT"), plan, {})
    assert ft_parameters(model(model_type="T5-Encoder"), plan, {})["model_type"] == "T5-Encoder"


def test_data_type_defaults_to_the_checkpoints_weight_type() -> None:
    import dataclasses

    plan = dataclasses.replace(_plan(), details={**_plan().details, "weight_data_type": "fp32"})
    assert ft_parameters(model(data_type=None), plan)["data_type"] == "fp32"      # none in the source
    assert "data_type" not in ft_parameters(model(data_type=None), plan, {"data_type": "fp16"})
    assert ft_parameters(model(data_type="fp16"), plan)["data_type"] == "fp16"    # the spec wins
    unknown = dataclasses.replace(plan, details={**plan.details, "weight_data_type": None})
    assert ft_parameters(model(data_type=None), unknown)["data_type"] == "fp16"


def test_checkpoint_path_uses_the_container_mount() -> None:
    assert checkpoint_path_for_server(model(checkpoint_mount="/models/c/"), _plan(gpn=4)) == "/models/c/4-gpu/"
    assert checkpoint_path_for_server(model(), _plan(gpn=1)) == "/ckpt/1-gpu/"


def test_apply_plan_touches_only_the_parameters() -> None:
    cfg = read_model_config(TINY / "fastertransformer" / "config.pbtxt")
    before = model_config_pb2.ModelConfig()
    before.CopyFrom(cfg)
    apply_plan(cfg, {"tensor_para_size": "4", "new_key": "x"}, None)
    assert cfg.parameters["tensor_para_size"].string_value == "4"
    assert cfg.parameters["new_key"].string_value == "x"
    for c in (cfg, before):
        c.parameters.pop("tensor_para_size")
    cfg.parameters.pop("new_key")
    assert cfg == before
    apply_plan(cfg, {}, 16)
    assert cfg.max_batch_size == 16


def test_prepare_tiny_ensemble(tmp_path: Path) -> None:
    m = load_model(MODELS / "tiny.yaml").model_copy(update={"max_batch_size": 4})
    before = tree_hash(TINY)
    plan = make_plan(cluster(), m, 2)
    out = tmp_path / "repo"
    prepared = prepare_repository(m, plan, out)
    assert tree_hash(TINY) == before
    cfg = read_model_config(out / "fastertransformer" / "config.pbtxt")
    assert cfg.parameters["model_checkpoint_path"].string_value == "/ckpt/tiny/1-gpu/"
    assert cfg.parameters["pipeline_para_size"].string_value == "2"
    assert cfg.max_batch_size == 4
    # The ensemble may not batch more than the FT model; the preprocessing model is untouched.
    assert read_model_config(out / "ensemble" / "config.pbtxt").max_batch_size == 4
    assert read_model_config(out / "preprocessing" / "config.pbtxt").max_batch_size == 64
    check_prepared(TINY, out, "fastertransformer", prepared.parameters, 4)
    # Files that are not config.pbtxt are copied as they are.
    assert (out / "fastertransformer" / "1" / ".keep").is_file()


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    """A copy of the tiny repository with weights inside it: an N-gpu folder and a big file."""
    repo = tmp_path / "user" / "repo"
    shutil.copytree(TINY, repo)
    w = repo / "fastertransformer" / "1" / "2-gpu"
    w.mkdir()
    (w / "model.wte.bin").write_bytes(b"\0" * 1024)
    (repo / "preprocessing" / "1" / "big.bin").write_bytes(b"\1" * (2 << 20))
    (repo / "preprocessing" / "1" / "model.py").write_text("# small file\n")
    return repo


def test_weights_are_linked_not_copied(user_repo: Path, tmp_path: Path) -> None:
    m = model(repository=user_repo, ft_model="fastertransformer", checkpoint_root=MODELS / "tiny" / "ckpt")
    out = tmp_path / "out"
    prepare_repository(m, _plan(), out)
    w = out / "fastertransformer" / "1" / "2-gpu"
    assert w.is_symlink() and w.resolve() == (user_repo / "fastertransformer" / "1" / "2-gpu").resolve()
    big = out / "preprocessing" / "1" / "big.bin"
    assert big.is_symlink() and big.resolve() == (user_repo / "preprocessing" / "1" / "big.bin").resolve()
    small = out / "preprocessing" / "1" / "model.py"
    assert small.is_file() and not small.is_symlink()


def test_a_link_to_someone_elses_private_file_is_never_copied(user_repo: Path, tmp_path: Path) -> None:
    # A relative link out of the repository: a shared helper (readable by all) is copied, as
    # the run's nodes and containers need it; a 0600 file (a key) stays where it is, linked.
    shared, key = tmp_path / "user" / "helper.py", tmp_path / "user" / "id_key"
    shared.write_text("# shared\n")
    shared.chmod(0o644)
    key.write_text("SECRET\n")
    key.chmod(0o600)
    folder = user_repo / "preprocessing" / "1"
    (folder / "helper.py").symlink_to(os.path.relpath(shared, folder))
    (folder / "key").symlink_to(os.path.relpath(key, folder))
    m = model(repository=user_repo, ft_model="fastertransformer", checkpoint_root=MODELS / "tiny" / "ckpt")
    out = tmp_path / "out"
    prepare_repository(m, _plan(), out)
    copied, linked = out / "preprocessing" / "1" / "helper.py", out / "preprocessing" / "1" / "key"
    assert copied.is_file() and not copied.is_symlink() and copied.read_text() == "# shared\n"
    assert linked.is_symlink() and os.readlink(linked) == str(key.resolve())


def test_read_only_source_gives_a_writable_copy(user_repo: Path, tmp_path: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(user_repo):
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o444)
    for dirpath, dirnames, filenames in sorted(os.walk(user_repo), reverse=True):
        os.chmod(dirpath, 0o555)
    try:
        before = tree_hash(user_repo)
        m = model(repository=user_repo, ft_model="fastertransformer", checkpoint_root=MODELS / "tiny" / "ckpt")
        out = tmp_path / "out"
        prepare_repository(m, _plan(), out)
        assert tree_hash(user_repo) == before
        for p in [out, out / "fastertransformer", out / "fastertransformer" / "config.pbtxt",
                  out / "ensemble" / "config.pbtxt"]:
            assert p.stat().st_mode & stat.S_IWUSR, p
        shutil.rmtree(out)
    finally:
        for dirpath, dirnames, filenames in os.walk(user_repo):
            os.chmod(dirpath, 0o755)


def test_symlinked_config_or_model_folder_is_not_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(TINY, elsewhere)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ensemble").mkdir()
    (repo / "ensemble" / "config.pbtxt").symlink_to(elsewhere / "ensemble" / "config.pbtxt")
    (repo / "fastertransformer").symlink_to(elsewhere / "fastertransformer")
    before = tree_hash(elsewhere)
    m = model(repository=repo, ft_model="fastertransformer", checkpoint_root=MODELS / "tiny" / "ckpt",
              max_batch_size=2)
    out = tmp_path / "out"
    prepare_repository(m, _plan(), out)
    assert tree_hash(elsewhere) == before, "preparation wrote into a linked user file"
    assert read_model_config(out / "fastertransformer" / "config.pbtxt").parameters[
        "pipeline_para_size"].string_value == "2"
    assert read_model_config(out / "ensemble" / "config.pbtxt").max_batch_size == 2


def test_out_must_be_new(tmp_path: Path) -> None:
    m = load_model(MODELS / "tiny.yaml")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        prepare_repository(m, _plan(), tmp_path / "full")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        prepare_repository(m, _plan(), tmp_path / "file")
    (tmp_path / "empty").mkdir()
    prepare_repository(m, _plan(), tmp_path / "empty")
    assert (tmp_path / "empty" / "fastertransformer" / "config.pbtxt").is_file()


def test_prepared_config_is_text_format(tmp_path: Path) -> None:
    m = load_model(MODELS / "tiny.yaml")
    prepare_repository(m, _plan(), tmp_path / "o")
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse((tmp_path / "o" / "fastertransformer" / "config.pbtxt").read_text(), cfg)
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_cli_prepare(tmp_path: Path) -> None:
    out = tmp_path / "run repo"
    args = ["prepare", "--cluster", str(MODELS / "cluster_local.yaml"), "--model", str(MODELS / "tiny.yaml"),
            "--nodes", "3", "--out", str(out)]
    res = run_cli(*args)
    assert res.rc == 0, res.stderr
    assert "tensor_para_size=1" in res.stdout and "pipeline_para_size=3" in res.stdout
    cfg = read_model_config(out / "fastertransformer" / "config.pbtxt")
    assert cfg.parameters["pipeline_para_size"].string_value == "3"
    # A second prepare into the same folder refuses in one line.
    assert_one_line_error(run_cli(*args), "--out", "not empty")
