"""Converter table, enroot command, checkpoint check, and `convert` as a local run (the job request).

Checkpoints come from the TEST converter in tests/data/ft_converter (FT's GPT converter's command
line and file layout, tiny sizes), run for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftcluster.service import image as img
from ftcluster.engines.fastertransformer.checkpoint_check import checkpoint_problems, gpt_layout, verify_checkpoint
from ftcluster.engines.fastertransformer.converters import CONVERTERS, converter_argv
from ftcluster.errors import PlanError
from ftcluster.engines.fastertransformer.config import read_ini
from ftcluster.engines.fastertransformer.modeltypes import MODEL_TYPES
from ftcluster.engines import make_plan
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.load import load_cluster, load_model
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec

REPO = Path(__file__).resolve().parents[2]
TEST_CONVERTER = REPO / "tests" / "data" / "ft_converter"
HF_TINY = TEST_CONVERTER / "hf_tiny_gpt"
TINY_REPO = REPO / "tests" / "data" / "models" / "tiny" / "repo"


def ftc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, check=False)


def convert_tiny(out: Path, tp: int, dtype: str = "fp16") -> Path:
    argv = converter_argv("GPT", TEST_CONVERTER, str(HF_TINY), str(out), tp, dtype, "tiny",
                          python=sys.executable)
    subprocess.run(argv, check=True, capture_output=True)
    return out / f"{tp}-gpu"


def write_specs(tmp_path: Path, **cluster: object) -> tuple[Path, Path]:
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    model = {"name": "tinygpt", "model_type": "GPT", "repository": str(TINY_REPO),
             "ft_model": "fastertransformer", "checkpoint_root": str(tmp_path / "ckpt"),
             "data_type": "fp16"}
    spec = {"scheduler": "local", "gpus_per_node": 2, "workspace": str(tmp_path / "runs"), **cluster}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(model))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "cluster.yaml", tmp_path / "model.yaml"


# ---- the converter table --------------------------------------------------------------------

def test_converter_table_names_ft_scripts_and_flags() -> None:
    assert set(CONVERTERS) == set(MODEL_TYPES)   # one per type the spec accepts
    root = Path("/ft")
    gpt = converter_argv("GPT", root, "/hf/gpt2", "/ckpt", 4, "fp16", "m")
    assert gpt == ["python3", "/ft/examples/pytorch/gpt/utils/huggingface_gpt_convert.py",
                   "-i", "/hf/gpt2", "-o", "/ckpt", "-i_g", "4", "-weight_data_type", "fp16"]
    gptj = converter_argv("GPT-J", root, "/in", "/ckpt", 2, "fp16", "m")
    assert gptj[1].endswith("gptj/utils/gptj_ckpt_convert.py")
    assert gptj[2:] == ["--ckpt-dir", "/in", "--output-dir", "/ckpt", "--n-inference-gpus", "2"]
    neox = converter_argv("GPT-NeoX", root, "/in", "/ckpt", 2, "bf16", "neo")
    assert neox[1].endswith("gptneox/utils/huggingface_gptneox_convert.py")
    assert neox[-4:] == ["-weight_data_type", "fp32", "-model_name", "neo"]   # bf16 serves fp32 weights
    t5 = converter_argv("T5", root, "/in", "/ckpt", 8, "fp32", "m")
    assert t5[2:] == ["-in_file", "/in", "-saved_dir", "/ckpt", "-inference_tensor_para_size", "8",
                      "-weight_data_type", "fp32"]
    bloom = converter_argv("BLOOM", root, "/in", "/ckpt", 2, "fp16", "m")
    assert bloom[1].endswith("gpt/utils/huggingface_bloom_convert.py")
    assert bloom[2:] == ["-i", "/in", "-o", "/ckpt", "-tp", "2", "-dt", "fp16"]
    opt = converter_argv("OPT", root, "/in", "/ckpt", 2, "fp16", "m")
    assert opt[1].endswith("gpt/utils/huggingface_opt_convert.py")
    assert opt[2:] == ["-i", "/in", "-o", "/ckpt", "-i_g", "2", "-weight_data_type", "fp16"]
    t5e = converter_argv("T5-Encoder", root, "/in", "/ckpt", 2, "fp16", "m")
    assert t5e[1].endswith("t5/utils/huggingface_t5_ckpt_convert.py")
    assert t5e[2:] == ["-in_file", "/in", "-saved_dir", "/ckpt", "-inference_tensor_para_size", "2",
                       "-weight_data_type", "fp16", "--encoder_only"]
    bert = converter_argv("bert", root, "/in", "/ckpt", 4, "bf16", "m")
    assert bert[1].endswith("bert/utils/huggingface_bert_convert.py")
    assert bert[2:] == ["-in_file", "/in", "-saved_dir", "/ckpt", "-infer_tensor_para_size", "4",
                        "-weight_data_type", "fp32"]


def test_megatron_gpt_converter() -> None:
    from ftcluster.errors import SpecError, UserError

    argv = converter_argv("GPT", Path("/ft"), "/meg/iter_0001000", "/ckpt", 2, "fp16", "m", variant="megatron")
    assert argv[1:] == ["/ft/examples/pytorch/gpt/utils/megatron_ckpt_convert.py", "-i", "/meg/iter_0001000",
                        "-o", "/ckpt", "-i_g", "2", "--weight-data-type", "fp16"]
    with pytest.raises(UserError, match="no megatron converter is known for model_type OPT"):
        converter_argv("OPT", Path("/ft"), "/in", "/out", 1, "fp16", "m", variant="megatron")
    spec = REPO / "configs" / "models" / "megatron-gpt.yaml"
    assert ModelSpec.model_validate(yaml.safe_load(spec.read_text())).converter == "megatron"
    with pytest.raises((SpecError, ValueError), match="megatron converts GPT checkpoints"):
        ModelSpec.model_validate({"name": "m", "model_type": "bert", "repository": "r",
                                  "checkpoint_root": "c", "converter": "megatron"})


def test_unknown_model_type_has_no_converter() -> None:
    from ftcluster.errors import UserError

    with pytest.raises(UserError, match="no FT converter is known for model_type LLaMA"):
        converter_argv("LLaMA", Path("/ft"), "/in", "/out", 1, "fp16", "m")


# ---- image names and the enroot command ------------------------------------------------------

def test_enroot_command_and_script(tmp_path: Path) -> None:
    sqsh = tmp_path / "a b" / "img.sqsh"
    assert img.enroot_argv("reg/x:1", sqsh) == ["enroot", "import", "-o", str(sqsh), "dockerd://reg/x:1"]
    script = img.import_script("reg/x:1", sqsh)
    assert f"enroot import -o '{sqsh}' dockerd://reg/x:1" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_image_tag_and_sqsh_from_the_spec(tmp_path: Path) -> None:
    pyxis = ClusterSpec(scheduler="slurm", workspace=str(tmp_path),
                        container={"runtime": "pyxis", "image": "/lustre/img/triton_ft.sqsh"})
    assert img.image_tag(pyxis) == "ftcluster/triton_with_ft:22.12"
    assert img.image_tag(pyxis, triton_version="23.04") == "ftcluster/triton_with_ft:23.04"
    assert img.sqsh_path(pyxis) == Path("/lustre/img/triton_ft.sqsh")
    docker = ClusterSpec(scheduler="slurm", workspace=str(tmp_path),
                         container={"runtime": "docker", "image": "team/triton_ft:22.12"})
    assert img.image_tag(docker) == "team/triton_ft:22.12"
    assert img.sqsh_path(docker) == tmp_path / "images" / "team_triton_ft_22.12.sqsh"
    named = ClusterSpec(scheduler="slurm", image={"tag": "x/y:1", "sqsh": "/s/y.sqsh"})
    assert (img.image_tag(named), img.sqsh_path(named)) == ("x/y:1", Path("/s/y.sqsh"))
    assert img.image_tag(named, "cli/tag:2") == "cli/tag:2"


def test_image_import_dry_run_and_without_enroot(tmp_path: Path) -> None:
    cluster, _ = write_specs(tmp_path, scheduler="slurm", image={"tag": "ftc/t:1"})
    p = ftc("image", "import", "--cluster", str(cluster), "--dry-run")
    assert p.returncode == 0, p.stderr
    sqsh = tmp_path / "runs" / "images" / "ftc_t_1.sqsh"
    assert p.stdout.splitlines()[1] == f"enroot import -o {sqsh} dockerd://ftc/t:1"
    assert (tmp_path / "runs" / "images" / "import-ftc_t_1.sh").is_file()
    env = {"PATH": str(tmp_path / "no-tools")}  # no enroot on this PATH (tests/pyxis installs one)
    p = ftc("image", "import", "--cluster", str(cluster), env=env)
    assert p.returncode == 1
    assert p.stderr.startswith("error: image import: enroot is not installed on this machine")
    assert "Traceback" not in p.stderr and not sqsh.exists()


def test_image_build_takes_the_engines_source_under_either_spelling(tmp_path: Path) -> None:
    """--source and its first spelling --ft-backend are one option; the check of the source is
    the engine's recipe's (its Dockerfile), made before any daemon is asked."""
    cluster, _ = write_specs(tmp_path, scheduler="slurm", image={"tag": "ftc/t:1"})
    src = tmp_path / "src"
    src.mkdir()
    recipe = img.engine_recipe()[1]
    for option in ("--source", "--ft-backend"):
        p = ftc("image", "build", "--cluster", str(cluster), option, str(src),
                env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
        assert p.returncode == 3, p.stderr
        assert p.stderr.startswith(f"error: --source: {src / recipe.dockerfile} does not exist"), p.stderr
        assert f"point it at {recipe.source}" in p.stderr
    p = ftc("image", "build", "--cluster", str(cluster), "--engine", "nosuch", "--source", str(src))
    assert p.returncode != 0 and "no engine is named 'nosuch'" in p.stderr, p.stderr
    assert img.image_tag(ClusterSpec(scheduler="local", workspace=str(tmp_path)), recipe=recipe) \
        == f"{recipe.repository}:22.12"


def test_image_metadata_round_trip(tmp_path: Path) -> None:
    cluster = ClusterSpec(scheduler="local", workspace=str(tmp_path), image={"tag": "a/b:1"})
    assert img.image_metadata(cluster) is None
    img.record_build(cluster, "a/b:1", "sha256:abc", "22.12", tmp_path, None)
    meta = img.image_metadata(cluster)
    assert meta is not None and (meta.image_id, meta.triton_version) == ("sha256:abc", "22.12")
    assert json.loads((tmp_path / "images" / "a_b_1.json").read_text())["image_id"] == "sha256:abc"


# ---- the checkpoint check --------------------------------------------------------------------

def test_converted_checkpoint_checks_out(tmp_path: Path) -> None:
    d = convert_tiny(tmp_path, 2)
    assert checkpoint_problems(tmp_path, "GPT", 2) == []
    files = gpt_layout(read_ini(d / "config.ini"), "GPT", 2)
    assert {f.name for f in files} == {p.name for p in d.glob("*.bin")}
    qkv = next(f for f in files if f.name == "model.layers.0.attention.query_key_value.weight.1.bin")
    assert qkv.nbytes == 16 * 3 * 16 // 2 * 2   # hidden * 3 * hidden / tp * fp16


def test_wrong_gpu_count_is_named(tmp_path: Path) -> None:
    convert_tiny(tmp_path, 2)
    assert checkpoint_problems(tmp_path, "GPT", 4) == [
        f"no 4-gpu folder under {tmp_path}; it was converted for 2-gpu GPU(s)"]
    # Renamed to 4-gpu: config.ini says 2; without that line, the shards say it.
    (tmp_path / "2-gpu").rename(tmp_path / "4-gpu")
    probs = checkpoint_problems(tmp_path, "GPT", 4)
    assert "tensor_para_size=2: converted for 2 GPU(s), not 4" in probs[0]
    ini = tmp_path / "4-gpu" / "config.ini"
    ini.write_text("".join(ln for ln in ini.read_text().splitlines(True) if "tensor_para" not in ln))
    assert checkpoint_problems(tmp_path, "GPT", 4) == [
        "the weight shards are for 2 GPU(s) (rank files .0.bin to .1.bin): converted for 2 GPU(s), not 4"]
    (tmp_path / "4-gpu").rename(tmp_path / "1-gpu")
    assert "shards are for 2 GPU(s)" in checkpoint_problems(tmp_path, "GPT", 1)[0]


def test_missing_shard_and_truncated_file(tmp_path: Path) -> None:
    d = convert_tiny(tmp_path, 2)
    (d / "model.layers.1.attention.dense.weight.1.bin").unlink()
    with open(d / "model.layers.0.mlp.dense_h_to_4h.weight.0.bin", "r+b") as fh:
        fh.truncate(100)
    (d / "model.wpe.bin").unlink()
    assert checkpoint_problems(tmp_path, "GPT", 2) == [
        "missing file model.wpe.bin",
        "model.layers.0.mlp.dense_h_to_4h.weight.0.bin is 100 bytes, config.ini implies 1024 (truncated)",
        "missing shard model.layers.1.attention.dense.weight.1.bin",
    ]


@pytest.mark.parametrize("key,value,why", [
    ("head_num", "0", "out of range"), ("head_num", "-12", "not a positive integer"),
    ("num_layer", "1e30", "not a positive integer"), ("num_layer", "99999999999", "out of range (1 to 10000)"),
    ("vocab_size", "\u0661\u0662", "not a positive integer"), ("size_per_head", "4294967296", "out of range"),
])
def test_config_ini_sizes_ft_could_not_use_are_named_before_any_layout(key: str, value: str, why: str,
                                                                      tmp_path: Path) -> None:
    """FT reads these as C ints (strtol): Arabic-Indic digits, exponents, 0 and counts past a C
    int are named, and no layout is built from them (10^11 layers would exhaust memory)."""
    d = convert_tiny(tmp_path, 2)
    ini = d / "config.ini"
    ini.write_text("".join(f"{key} = {value}\n" if ln.split("=")[0].strip() == key else ln
                           for ln in ini.read_text().splitlines(True)))
    problems = checkpoint_problems(tmp_path, "GPT", 2)
    assert problems and f"[gpt] {key}={value} " in problems[0] and why in problems[0], problems
    with pytest.raises(PlanError, match=why.split(" (")[0]):
        verify_checkpoint(tmp_path, "GPT", 2)


def test_plan_checks_weights_only_when_there_are_any(tmp_path: Path) -> None:
    cluster_path, model_path = write_specs(tmp_path)
    cluster, _ = load_cluster(cluster_path), None
    d = tmp_path / "ckpt" / "2-gpu"
    d.mkdir(parents=True)
    (d / "config.ini").write_text("[gpt]\nhead_num=4\nnum_layer=2\ntensor_para_size=2\n")
    # Config-only (like the test models and the demo): plans.
    assert make_plan(cluster, load_model(model_path), 1).tensor_para_size == 2
    convert_tiny(tmp_path / "ckpt", 2)
    assert make_plan(cluster, load_model(model_path), 1).tensor_para_size == 2
    (d / "model.layers.1.mlp.dense_4h_to_h.weight.0.bin").unlink()
    with pytest.raises(PlanError, match="missing shard model.layers.1.mlp.dense_4h_to_h.weight.0.bin"):
        make_plan(cluster, load_model(model_path), 1)
    verify_checkpoint(tmp_path / "ckpt", "GPT", 1)   # no 1-gpu folder: nothing to check here
    p = ftc("plan", "--cluster", str(cluster_path), "--model", str(model_path))
    assert p.returncode == 3 and p.stderr.count("\n") == 1 and "missing shard" in p.stderr


# ---- convert as a local run: the job request, the step log, the checkpoint check ---------------

def test_convert_local_job_logs_and_check(tmp_path: Path) -> None:
    cluster, model = write_specs(tmp_path)
    args = ["convert", "--cluster", str(cluster), "--model", str(model), "--converter-root",
            str(TEST_CONVERTER), "--input", str(HF_TINY), "--python", sys.executable]
    p = ftc(*args, "--dry-run")
    assert p.returncode == 0, p.stderr
    # The request: the job script with the converter's command, and what would run it.
    job = json.loads(p.stdout.split("# ===== scripts/job.json (0600) =====\n", 1)[1].split("# =====", 1)[0])
    assert " ".join(job["step"]["argv"]).endswith(f"-i {HF_TINY} -o {tmp_path / 'ckpt'} -i_g 2 -weight_data_type fp16")
    assert "# ===== scripts/job.sh (0755) =====" in p.stdout
    assert p.stdout.rstrip().splitlines()[-1].endswith("&& bash " + p.stdout.split("run folder ", 1)[1].split()[0]
                                                       + "/scripts/job.sh")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "ckpt" / "2-gpu").exists()
    p = ftc(*args)
    assert p.returncode == 0, p.stderr
    run_id = p.stdout.split()[1].rstrip(":")
    assert checkpoint_problems(tmp_path / "ckpt", "GPT", 2) == []
    logs = ftc("logs", run_id)
    assert "TEST CONVERTER: wrote" in logs.stdout
    # A failing converter: non-zero exit, one error line naming the run's logs.
    p = ftc(*args[:-4], "--input", str(tmp_path / "nope"), "--python", sys.executable, "--gpus-per-node", "1")
    assert p.returncode == 1 and "error: conversion failed: the converter exited 1" in p.stderr
    assert "Traceback" not in p.stderr
    failed = p.stderr.split("ftcluster logs ")[1].split("`")[0]
    assert "No such file or directory" in ftc("logs", failed).stdout


def test_every_problem_is_named_on_one_line() -> None:
    from ftcluster.errors import PROBLEMS_SHOWN, every_problem

    assert every_problem(["a missing", "b short"]) == "a missing; b short"
    many = [f"shard {i} missing" for i in range(PROBLEMS_SHOWN + 3)]
    assert every_problem(many) == "; ".join(many[:PROBLEMS_SHOWN]) + "; and 3 more"
