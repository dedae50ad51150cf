"""Every model type the FT backend serves: plan, prepare and check-checkpoint per type.

Repositories: tests/data/zoo (BLOOM, OPT, GPT-NeoX, interactive GPT, T5-Encoder, Megatron GPT) and, when
present, the shared fixtures of the backend's all_models/ (GPT, GPT-J, T5, bert). Weights are
written here with the file names and sizes of FT's converters (ftcluster.engines.fastertransformer.checkpoint_check).
"""

from __future__ import annotations

import json

import shutil
from pathlib import Path

import numpy as np
import pytest

from ftcluster.engines.fastertransformer.checkpoint_check import (
    bert_layout,
    checkpoint_problems,
    expected_files,
    gpt_layout,
    gptj_layout,
    t5_layout,
)
from ftcluster.client.identity import check_response
from ftcluster.client.modelio import build_request, output_names, parse_config
from ftcluster.errors import PlanError, UserError
from ftcluster.engines.triton_config import read_model_config
from ftcluster.engines.fastertransformer.config import read_ini
from ftcluster.engines.fastertransformer.repository import prepare_repository
from ftcluster.engines.fastertransformer.modeltypes import KINDS
from ftcluster.engines import make_plan
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec
from tests.helpers_specs import DATA, FT_FIXTURES, cluster
from tests.unit.test_fixtures_ft import check_prepared


ZOO = DATA / "zoo"
# repository folder -> spec model_type
REPOS: dict[Path, str] = {ZOO / "bloom": "BLOOM", ZOO / "opt": "OPT", ZOO / "gptneox": "GPT-NeoX",
                          ZOO / "gpt-interactive": "GPT", ZOO / "t5-encoder": "T5-Encoder",
                          ZOO / "megatron-gpt": "GPT"}
if FT_FIXTURES.is_dir():
    REPOS.update({FT_FIXTURES / "gpt": "GPT", FT_FIXTURES / "gptj": "GPT-J", FT_FIXTURES / "t5": "T5",
                  FT_FIXTURES / "bert": "bert"})
IDS = [f"{p.name}-{t}" for p, t in REPOS.items()]
def source_ini(repo: Path) -> Path:
    version = repo / "fastertransformer" / "1"
    found = [version / "config.ini", *sorted(version.glob("*-gpu/config.ini"))]
    return next(p for p in found if p.is_file())


def make_checkpoint(root: Path, repo: Path, model_type: str, tp: int, weights: bool = True) -> Path:
    """<root>/<tp>-gpu with the repository's config.ini (tensor_para_size set to tp) and weights."""
    d = root / f"{tp}-gpu"
    d.mkdir(parents=True)
    parser = read_ini(source_ini(repo))
    for section in parser.sections():
        if parser.has_option(section, "tensor_para_size"):
            parser.set(section, "tensor_para_size", str(tp))
    with open(d / "config.ini", "w") as fh:
        parser.write(fh)
    if not weights:
        return d
    for e in expected_files(parser, model_type, tp):
        with open(d / e.name, "wb") as fh:
            fh.truncate(e.nbytes)   # sparse: the real sizes without writing them
    return d


def spec_for(repo: Path, model_type: str, root: Path, **kw: object) -> ModelSpec:
    return ModelSpec.model_validate({"name": "fastertransformer", "model_type": model_type,
                                     "repository": str(repo), "checkpoint_root": str(root),
                                     "client": {"batch_size": 1}, **kw})


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_check_checkpoint_per_type(repo: Path, model_type: str, tmp_path: Path) -> None:
    d = make_checkpoint(tmp_path / "ok", repo, model_type, 2)
    assert checkpoint_problems(d.parent, model_type, 2) == []
    # incomplete: one rank-1 shard gone
    victim = sorted(p for p in d.glob("*.1.bin"))[-1]
    victim.unlink()
    problems = checkpoint_problems(d.parent, model_type, 2)
    assert problems and victim.name in " ".join(problems) or "rank 1" in " ".join(problems)
    # wrong tp: converted for 2, asked for 1 (no 1-gpu folder) or the folder renamed
    assert "converted for 2-gpu" in checkpoint_problems(d.parent, model_type, 1)[0]
    wrong = make_checkpoint(tmp_path / "wrong", repo, model_type, 2)
    wrong.rename(wrong.parent / "4-gpu")
    assert any("converted for 2" in p or "for 2 GPU" in p
               for p in checkpoint_problems(wrong.parent, model_type, 4)), model_type


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_empty_folder_is_never_complete(repo: Path, model_type: str, tmp_path: Path) -> None:
    d = make_checkpoint(tmp_path, repo, model_type, 1, weights=False)
    problems = checkpoint_problems(d.parent, model_type, 1)
    assert any("no weight files" in p for p in problems)


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_plan_and_prepare_per_type(repo: Path, model_type: str, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    make_checkpoint(root, repo, model_type, 2)
    src = tmp_path / "src"
    shutil.copytree(repo, src)
    m = spec_for(src, model_type, root)
    for nodes in (1, 2):
        plan = make_plan(cluster(gpus_per_node=2), m, nodes)
        out = tmp_path / f"out{nodes}"
        prepared = prepare_repository(m, plan, out)
        # Only tp, pp and the checkpoint path change; everything else stays what the source said.
        assert set(prepared.parameters) == {"tensor_para_size", "pipeline_para_size", "model_checkpoint_path"}
        check_prepared(src, out, plan.engine_model, prepared.parameters, None)
        cfg = read_model_config(out / plan.engine_model / "config.pbtxt")
        assert cfg.parameters["model_type"].string_value == KINDS[model_type].backend_type


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_plan_refuses_a_model_type_the_repository_does_not_hold(repo: Path, model_type: str,
                                                                 tmp_path: Path) -> None:
    other = "T5" if model_type != "T5" else "GPT-J"
    root = tmp_path / "ckpt"
    make_checkpoint(root, repo, model_type, 1)
    with pytest.raises(PlanError) as exc:
        make_plan(cluster(), spec_for(repo, other, root), 1)
    assert "model_type" in str(exc.value)


def test_bloom_and_encoder_only_named_wrong_get_the_right_advice(tmp_path: Path) -> None:
    root = tmp_path / "bloom"
    make_checkpoint(root, ZOO / "bloom", "BLOOM", 1)
    problems = checkpoint_problems(root, "GPT", 1)
    assert "max_pos_seq_len" in problems[0] and "set model_type: BLOOM" in problems[0]
    root = tmp_path / "t5e"
    make_checkpoint(root, ZOO / "t5-encoder", "T5-Encoder", 1)
    problems = checkpoint_problems(root, "T5", 1)
    assert "[decoder]" in problems[0] and "set model_type: T5-Encoder" in problems[0]


def test_prepare_keeps_unset_values_and_writes_set_ones(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    make_checkpoint(root, ZOO / "opt", "OPT", 1)
    src = tmp_path / "src"
    shutil.copytree(ZOO / "opt", src)
    cfg_path = src / "fastertransformer" / "config.pbtxt"
    cfg_path.write_text(cfg_path.read_text().replace('"int8_mode" value: { string_value: "0"',
                                                     '"int8_mode" value: { string_value: "1"'))
    plan = make_plan(cluster(), spec_for(src, "OPT", root), 1)
    prepare_repository(spec_for(src, "OPT", root), plan, tmp_path / "a")
    cfg = read_model_config(tmp_path / "a" / "fastertransformer" / "config.pbtxt")
    assert (cfg.parameters["int8_mode"].string_value, cfg.parameters["data_type"].string_value) == ("1", "fp16")
    m = spec_for(src, "OPT", root, int8_mode=0, data_type="fp32")
    prepare_repository(m, plan, tmp_path / "b")
    cfg = read_model_config(tmp_path / "b" / "fastertransformer" / "config.pbtxt")
    assert (cfg.parameters["int8_mode"].string_value, cfg.parameters["data_type"].string_value) == ("0", "fp32")


def test_plan_checks_the_client_batch_against_max_batch_size(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    make_checkpoint(root, ZOO / "gptneox", "GPT-NeoX", 1)
    with pytest.raises(PlanError) as exc:
        make_plan(cluster(), spec_for(ZOO / "gptneox", "GPT-NeoX", root, max_batch_size=2,
                                      client={"batch_size": 4}), 1)
    assert exc.value.field == "client.batch_size" and "at most 2" in (exc.value.hint or "")
    # Interactive GPT: max_batch_size 1, the batch travels inside FT's pseudo batch dimension.
    root = tmp_path / "seq"
    make_checkpoint(root, ZOO / "gpt-interactive", "GPT", 1)
    make_plan(cluster(), spec_for(ZOO / "gpt-interactive", "GPT", root, client={"batch_size": 4}), 1)


def test_plan_refuses_sequence_batching_without_the_pseudo_batch_dim(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ZOO / "gpt-interactive", src)
    cfg = src / "fastertransformer" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "input_ids" data_type: TYPE_UINT32 dims: [ -1, -1 ]',
                                           'name: "input_ids" data_type: TYPE_UINT32 dims: [ -1 ]'))
    root = tmp_path / "ckpt"
    make_checkpoint(root, ZOO / "gpt-interactive", "GPT", 1)
    with pytest.raises(PlanError, match="pseudo|second dimension"):
        make_plan(cluster(), spec_for(src, "GPT", root), 1)


def _io(repo: Path) -> dict[str, object]:
    """The config as Triton's HTTP endpoint returns it (JSON, snake_case)."""
    from google.protobuf import json_format

    cfg = read_model_config(repo / "fastertransformer" / "config.pbtxt")
    return dict(json_format.MessageToDict(cfg, preserving_proto_field_name=True))


def test_client_request_for_sequence_batching_has_the_pseudo_batch_dim() -> None:
    io = parse_config(_io(ZOO / "gpt-interactive"))
    assert io.sequence_batching and io.style == "decoder"
    req = build_request(io, 3, 5, 4)
    assert req.arrays["input_ids"].shape == (1, 3, 5)
    assert req.arrays["input_lengths"].shape == (1, 3, 1)
    assert req.arrays["request_output_len"].shape == (1, 3, 1)
    assert np.array_equal(req.arrays["input_ids"][0], req.prompt_ids)


def test_client_t5_encoder_and_bert() -> None:
    io = parse_config(_io(ZOO / "t5-encoder"))
    assert io.style == "encoder" and not io.sequence_batching
    req = build_request(io, 2, 6, 1)
    assert req.arrays["input_ids"].shape == (2, 6) and req.arrays["sequence_length"].shape == (2, 1)
    if not FT_FIXTURES.is_dir():
        return
    cfg = _io(FT_FIXTURES / "bert")
    with pytest.raises(UserError, match="input_hidden_state") as exc:
        build_request(parse_config(cfg), 1, 4, 1)
    assert exc.value.field == "--hidden-size"
    # As the server returns it: FT's auto-complete typed input_hidden_state from data_type fp16.
    cfg["input"][0]["data_type"] = "TYPE_FP16"
    cfg["output"][0]["data_type"] = "TYPE_FP16"
    io = parse_config(cfg)
    assert io.style == "encoder" and io.roles == {"input_hidden_state": "hidden_state",
                                                  "sequence_lengths": "input_lengths"}
    req = build_request(io, 2, 6, 1, hidden_size=768)
    assert req.arrays["input_hidden_state"].shape == (2, 6, 768)
    assert req.arrays["input_hidden_state"].dtype == np.float16
    assert req.arrays["sequence_lengths"].shape == (2, 1) and req.arrays["sequence_lengths"].dtype == np.int32
    assert output_names(io) == ["output_hidden_state"]
    # The identity checks: a hidden dimension 0 everywhere is a tensor-parallel share gone missing.
    good = np.tanh(req.arrays["input_hidden_state"].astype(np.float32)).astype(np.float16)
    assert all(c.ok for c in check_response(io, req, {"output_hidden_state": good}))
    bad = good.copy()
    bad[:, :, 1::2] = 0
    failed = [c.name for c in check_response(io, req, {"output_hidden_state": bad}) if not c.ok]
    assert failed == ["output_hidden_state has no all-zero dimension"]
    failed = [c.name for c in check_response(io, req, {"output_hidden_state": good.astype(np.float32)})
              if not c.ok]
    assert failed == ["output_hidden_state dtype"]


def test_plan_gives_bert_client_the_checkpoint_hidden_size(tmp_path: Path) -> None:
    if not FT_FIXTURES.is_dir():
        pytest.skip("../shared/fixtures absent")
    from ftcluster.run.layout import RunPaths
    from ftcluster.render.scripts import render

    root = tmp_path / "ckpt"
    make_checkpoint(root, FT_FIXTURES / "bert", "bert", 1)
    plan = make_plan(cluster(), spec_for(FT_FIXTURES / "bert", "bert", root), 1)
    assert plan.client_hidden_size == 768
    with pytest.raises(PlanError) as exc:
        make_plan(cluster(), spec_for(FT_FIXTURES / "bert", "bert", root, client={"hidden_size": 512}), 1)
    assert exc.value.field == "client.hidden_size" and "768" in str(exc.value)
    scripts = render(cluster(), spec_for(FT_FIXTURES / "bert", "bert", root), plan,
                     RunPaths("r1", tmp_path / "r1"))
    args = json.loads(scripts.files["job.json"])["client_args"]
    assert args[args.index("--hidden-size") + 1] == "768"


def test_opt_and_bert_layouts_follow_their_converters(tmp_path: Path) -> None:
    opt = read_ini(source_ini(ZOO / "opt"))
    names = {e.name for e in gpt_layout(opt, "OPT", 1)}
    assert {"model.lm_head.weight.bin", "model.wpe.bin", "model.final_layernorm.weight.bin"} <= names
    opt.set("gpt", "has_post_decoder_layernorm", "0")   # OPT-350m: no final layernorm written
    assert not any(n.startswith("model.final_layernorm") for n in (e.name for e in gpt_layout(opt, "OPT", 1)))
    d = tmp_path / "2-gpu"
    d.mkdir()
    (d / "config.ini").write_text("[bert]\nhidden_size = 8\nnum_layer = 1\nhead_num = 2\nsize_per_head = 4\n"
                                  "inter_size = 32\nweight_data_type = fp16\ntensor_para_size = 2\n")
    layout = {e.name: e.nbytes for e in bert_layout(read_ini(d / "config.ini"), 2)}
    assert len(layout) == 6 + 2 * 10
    assert layout["model.encoder.layer.0.attention.self.query.weight.1.bin"] == 8 * 8 // 2 * 2
    assert layout["model.encoder.layer.0.output.dense.weight.0.bin"] == 32 // 2 * 8 * 2
    for name, n in layout.items():
        (d / name).write_bytes(b"\0" * n)
    assert checkpoint_problems(tmp_path, "bert", 2) == []
    (d / "model.encoder.layer.0.intermediate.dense.bias.1.bin").write_bytes(b"\0" * 4)
    assert checkpoint_problems(tmp_path, "bert", 2) == [
        "model.encoder.layer.0.intermediate.dense.bias.1.bin is 4 bytes, config.ini implies 32 (truncated)"]


def test_gptj_layout_follows_its_converter(tmp_path: Path) -> None:
    """huggingface_gptj_ckpt_convert.py: rotary (no wpe), lm_head with a bias, no attention.dense
    bias, no post-attention layernorm; the MLP and attention weights split per rank."""
    d = tmp_path / "2-gpu"
    d.mkdir()
    (d / "config.ini").write_text("[gptj]\nhead_num = 2\nsize_per_head = 4\ninter_size = 32\nnum_layer = 1\n"
                                  "vocab_size = 10\nrotary_embedding = 4\nstart_id = 1\nend_id = 2\n"
                                  "weight_data_type = fp32\n")
    layout = {e.name: e.nbytes for e in gptj_layout(read_ini(d / "config.ini"), 2)}
    assert len(layout) == 5 + 3 + 2 * 5
    assert layout["model.lm_head.bias.bin"] == 10 * 4
    assert layout["model.layers.0.attention.query_key_value.weight.1.bin"] == 8 * 3 * 8 // 2 * 4
    assert layout["model.layers.0.mlp.dense_h_to_4h.bias.0.bin"] == 32 // 2 * 4
    assert not any("wpe" in n or "attention.dense.bias" in n or "post_attention" in n for n in layout)
    for name, n in layout.items():
        (d / name).write_bytes(b"\0" * n)
    assert checkpoint_problems(tmp_path, "GPT-J", 2) == []
    (d / "model.lm_head.bias.bin").unlink()
    assert checkpoint_problems(tmp_path, "GPT-J", 2) == ["missing file model.lm_head.bias.bin"]


def _hf_gptneox_convert(d: Path, hidden: int, heads: int, inter: int, layers: int, vocab: int, tp: int,
                        parallel_residual: bool) -> None:
    """The writes of huggingface_gptneox_convert.py (fp32): HF GPTNeoXForCausalLM's parameter
    names and shapes, its renames, its split axes on the transposed arrays, its config.ini."""
    hf = {"gpt_neox.embed_in.weight": (vocab, hidden), "gpt_neox.final_layer_norm.weight": (hidden,),
          "gpt_neox.final_layer_norm.bias": (hidden,), "embed_out.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"gpt_neox.layers.{i}."
        hf.update({f"{p}{n}": (hidden,) for n in ("input_layernorm.weight", "input_layernorm.bias",
                                                   "post_attention_layernorm.weight",
                                                   "post_attention_layernorm.bias", "attention.dense.bias",
                                                   "mlp.dense_4h_to_h.bias")})
        hf.update({f"{p}attention.query_key_value.weight": (3 * hidden, hidden),
                   f"{p}attention.query_key_value.bias": (3 * hidden,),
                   f"{p}attention.dense.weight": (hidden, hidden),
                   f"{p}mlp.dense_h_to_4h.weight": (inter, hidden), f"{p}mlp.dense_h_to_4h.bias": (inter,),
                   f"{p}mlp.dense_4h_to_h.weight": (hidden, inter)})
    whole = {"gpt_neox.embed_in.weight": "model.wte.bin", "embed_out.weight": "model.lm_head.weight.bin",
             "gpt_neox.final_layer_norm.weight": "model.final_layernorm.weight.bin",
             "gpt_neox.final_layer_norm.bias": "model.final_layernorm.bias.bin"}
    once = ("layernorm", "attention.dense.bias", "mlp.dense_4h_to_h.bias")
    for name, shape in hf.items():
        val = np.zeros(shape, np.float32).T
        key = name.replace("gpt_neox.", "")
        if name in whole:
            val.tofile(d / whole[name])
            continue
        if any(o in key for o in once):
            val.tofile(d / f"model.{key}.bin")
            continue
        if "attention.dense.weight" in key or "dense_4h_to_h.weight" in key:
            parts = np.split(val, tp, axis=0)
        elif "dense_h_to_4h" in key:
            parts = np.split(val, tp, axis=-1)
        elif key.endswith("query_key_value.bias"):
            parts = np.split(val.reshape(3, hidden), tp, axis=-1)
        else:
            parts = np.split(val.reshape(hidden, 3, hidden), tp, axis=-1)
        for j, part in enumerate(parts):
            part.tofile(d / f"model.{key}.{j}.bin")
    if parallel_residual:
        for i in range(layers):
            np.zeros(hidden, np.float32).tofile(d / f"model.layers.{i}.mlp.attention.bias.sum.bin")
    (d / "config.ini").write_text(
        f"[gptneox]\nmodel_name = neox\nhead_num = {heads}\nsize_per_head = {hidden // heads}\n"
        f"inter_size = {inter}\nnum_layer = {layers}\nrotary_embedding = 2\nvocab_size = {vocab}\n"
        f"start_id = 0\nend_id = 0\nuse_gptj_residual = {int(parallel_residual)}\nweight_data_type = fp32\n")


@pytest.mark.parametrize("parallel_residual", [True, False])
def test_gptneox_layout_follows_its_converter(tmp_path: Path, parallel_residual: bool) -> None:
    """Exactly the files huggingface_gptneox_convert.py writes, no more and no fewer: rotary (no
    wpe), an unbiased lm_head, GPT's layers, and mlp.attention.bias.sum when use_gptj_residual."""
    d = tmp_path / "2-gpu"
    d.mkdir()
    _hf_gptneox_convert(d, hidden=8, heads=2, inter=24, layers=2, vocab=10, tp=2,
                        parallel_residual=parallel_residual)
    layout = expected_files(read_ini(d / "config.ini"), "GPT-NeoX", 2)
    assert {e.name for e in layout} == {p.name for p in d.glob("*.bin")}
    assert checkpoint_problems(tmp_path, "GPT-NeoX", 2) == []
    (d / "model.layers.1.mlp.dense_h_to_4h.bias.1.bin").write_bytes(b"\0" * 4)
    (d / "model.lm_head.weight.bin").unlink()
    assert checkpoint_problems(tmp_path, "GPT-NeoX", 2) == [
        "missing file model.lm_head.weight.bin",
        "model.layers.1.mlp.dense_h_to_4h.bias.1.bin is 4 bytes, config.ini implies 48 (truncated)"]
    if parallel_residual:   # FT loads the summed bias then, not the two it came from
        (d / "model.layers.0.mlp.attention.bias.sum.bin").unlink()
        assert "missing file model.layers.0.mlp.attention.bias.sum.bin" in checkpoint_problems(tmp_path, "GPT-NeoX", 2)


def test_an_example_spec_per_type() -> None:
    """configs/models (`ftcluster examples`): every model type, the interactive GPT, Megatron GPT
    and a GPT ensemble, each naming the type the spec schema accepts."""
    import yaml

    from ftcluster.engines.fastertransformer.modeltypes import MODEL_TYPES

    examples = Path(__file__).resolve().parents[2] / "configs" / "models"
    specs = {p.stem: ModelSpec.model_validate(yaml.safe_load(p.read_text())) for p in examples.glob("*.yaml")}
    assert set(MODEL_TYPES) <= {m.model_type for m in specs.values()}
    assert specs["gpt-interactive"].model_type == "GPT" and "sequence" in (examples / "gpt-interactive.yaml").read_text()
    assert specs["megatron-gpt"].model_type == "GPT"
    assert any(m.name == "ensemble" for m in specs.values())


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_plan_follows_ft_int8_and_sparse_rules(repo: Path, model_type: str, tmp_path: Path) -> None:
    """ModelFactory: int8_mode reaches GPT (BLOOM, OPT) and bert only, and bert aborts on int8 or
    is_sparse; a spec asking int8 of a type built without it is refused, not silently ignored."""
    root = tmp_path / "ckpt"
    make_checkpoint(root, repo, model_type, 1)
    if model_type in ("GPT", "BLOOM", "OPT"):
        assert make_plan(cluster(), spec_for(repo, model_type, root, int8_mode=1), 1)
        return
    with pytest.raises(PlanError) as exc:
        make_plan(cluster(), spec_for(repo, model_type, root, int8_mode=1), 1)
    assert exc.value.field == "int8_mode" and "int8" in str(exc.value)
    make_plan(cluster(), spec_for(repo, model_type, root, int8_mode=0), 1)
    if model_type == "bert":
        with pytest.raises(PlanError, match="sparse"):
            make_plan(cluster(), spec_for(repo, model_type, root, parameters={"is_sparse": "1"}), 1)


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_check_checkpoint_command_per_type(repo: Path, model_type: str, tmp_path: Path) -> None:
    """`ftcluster check-checkpoint`: complete (exit 0), incomplete and wrong tp (exit 3, the
    problems on stdout, one error line), never complete for a folder without weights."""
    import yaml

    from tests.helpers_specs import assert_one_line_error, run_cli

    root = tmp_path / "ckpt"
    d = make_checkpoint(root, repo, model_type, 2)
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump({"name": "fastertransformer", "model_type": model_type,
                                    "repository": str(repo), "checkpoint_root": str(root)}))
    ok = run_cli("check-checkpoint", "--model", str(spec), "--gpus", "2")
    assert ok.rc == 0 and "is complete for 2 GPU(s)" in ok.stdout, ok
    assert_one_line_error(run_cli("check-checkpoint", "--model", str(spec), "--gpus", "1"), "problem(s)")
    victim = max(d.glob("*.0.bin"))
    victim.unlink()
    bad = run_cli("check-checkpoint", "--model", str(spec), "--gpus", "2")
    assert_one_line_error(bad, "problem(s)")
    assert victim.name in bad.stdout or "rank 0" in bad.stdout, bad.stdout
    for f in d.glob("*.bin"):
        f.unlink()
    empty = run_cli("check-checkpoint", "--model", str(spec), "--gpus", "2")
    assert_one_line_error(empty, "problem(s)")
    assert "no weight files" in empty.stdout


def test_plan_follows_ft_data_type_rules(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    make_checkpoint(root, ZOO / "gptneox", "GPT-NeoX", 1)
    with pytest.raises(PlanError, match="GPT-NeoX in fp16 or fp32 only") as exc:
        make_plan(cluster(), spec_for(ZOO / "gptneox", "GPT-NeoX", root, data_type="bf16"), 1)
    assert exc.value.field == "data_type"
    make_plan(cluster(), spec_for(ZOO / "gptneox", "GPT-NeoX", root, data_type="fp32"), 1)
    with pytest.raises(PlanError, match="'fp8'"):
        make_plan(cluster(), spec_for(ZOO / "gptneox", "GPT-NeoX", root, parameters={"data_type": "fp8"}), 1)
    root = tmp_path / "opt"
    make_checkpoint(root, ZOO / "opt", "OPT", 1)
    make_plan(cluster(), spec_for(ZOO / "opt", "OPT", root, data_type="bf16"), 1)


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_plan_refuses_splits_ft_cannot_make(repo: Path, model_type: str, tmp_path: Path) -> None:
    """Every stack's heads split over tensor_para_size and its layers over pipeline_para_size
    (T5: encoder and decoder both), per type."""
    from ftcluster.engines.fastertransformer.checkpoint import read_checkpoint

    probe = tmp_path / "probe"
    make_checkpoint(probe, repo, model_type, 1, weights=False)
    splits = read_checkpoint(probe, model_type, 1).splits
    heads = min(s.head_num for s in splits)
    tp = next(t for t in range(2, heads + 2) if any(s.head_num % t for s in splits))
    root = tmp_path / "tp"
    make_checkpoint(root, repo, model_type, tp, weights=False)
    with pytest.raises(PlanError, match=f"head_num .* not divisible by tensor_para_size {tp}"):
        make_plan(cluster(gpus_per_node=tp), spec_for(repo, model_type, root), 1)
    pp = next(p for p in range(2, 64) if any(s.num_layer % p for s in splits))
    with pytest.raises(PlanError, match=f"num_layer .* not divisible by pipeline_para_size {pp}"):
        make_plan(cluster(gpus_per_node=1, max_nodes=64), spec_for(repo, model_type, probe), pp)


def test_t5_layouts_follow_the_t5_converter(tmp_path: Path) -> None:
    ini = tmp_path / "config.ini"
    ini.write_text("[encoder]\nvocab_size = 32\nd_model = 16\nd_kv = 4\nd_ff = 64\nnum_layers = 2\n"
                   "num_heads = 4\nrelative_attention_num_buckets_or_max_pos_seq_len = 32\n"
                   "weight_data_type = fp32\n[decoder]\nvocab_size = 32\nd_model = 16\nd_kv = 4\nd_ff = 64\n"
                   "num_layers = 1\nnum_decoder_layers = 1\nnum_heads = 4\n[structure]\nuse_gated_activation = 1\n")
    enc = {e.name: e.nbytes for e in t5_layout(read_ini(ini), True, 2)}
    # once: shared (2), final norm, 2 norms x 2 layers; split x 2 ranks: q k v o wi wi2 wo x 2 layers + bias
    assert len(enc) == 3 + 4 + 2 * (2 * 7 + 1)
    assert enc["encoder.block.0.layer.0.SelfAttention.q.weight.1.bin"] == 16 * 16 // 2 * 4
    assert enc["encoder.block.1.layer.1.DenseReluDense.wo.weight.0.bin"] == 64 // 2 * 16 * 4
    assert enc["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight.1.bin"] == 4 // 2 * 32 * 4
    assert "encoder.block.1.layer.1.DenseReluDense.wi2.weight.1.bin" in enc and "lm_head.weight.bin" not in enc
    full = {e.name: e.nbytes for e in t5_layout(read_ini(ini), False, 2)}
    assert full["decoder.block.0.layer.0.SelfAttention.qkv.weight.1.bin"] == 16 * 3 * 16 // 2 * 4
    assert full["decoder.block.0.layer.1.EncDecAttention.k.weight.0.bin"] == 16 * 16 // 2 * 4
    assert full["lm_head.weight.bin"] == 32 * 16 * 4
    assert not any(n.startswith("decoder.block.0.layer.0.SelfAttention.q.") for n in full)
