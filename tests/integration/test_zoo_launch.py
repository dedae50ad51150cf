"""A launch per FT model type: the faithful test model served under each type's own config.pbtxt
(its inputs, outputs and batching, as the backend's all_models/ and tests/data/zoo have them),
two ranks of one MPI world (scheduler local), and ftcluster's client check against it.

Only the backend line changes (`fastertransformer` -> the python test model beside it). The
encoder-only types (T5-Encoder, bert) return hidden states typed from data_type, as FT's
auto-complete types them; bert's client sends input_hidden_state with the checkpoint's hidden
size, which the launch takes from config.ini.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from ftcluster.client.bench import parse_steps, run_bench
from ftcluster.client.endpoint import Endpoint
from ftcluster.client.identity import format_identity, run_identity
from tests.helpers_specs import FT_FIXTURES, assert_one_line_error, run_cli
from tests.launch_helpers import launch_json, write_cluster
from tests.triton_server import TritonServer, require_tritonserver, running_tritonserver
from tests.unit.test_zoo import REPOS, make_checkpoint

pytestmark = pytest.mark.triton

TEST_MODEL = Path(__file__).resolve().parents[2] / "ftcluster/demo/model_repository/fastertransformer/1"
SERVED = set(REPOS.items())
IDS = [f"{p.name}-{t}" for p, t in sorted(SERVED)]


def _repository(src: Path, dst: Path) -> Path:
    """Only the FT model of the source repository (its ensemble steps need tokenizers)."""
    ft = dst / "fastertransformer"
    shutil.copytree(src / "fastertransformer", ft, ignore=shutil.ignore_patterns("*-gpu", "*.bin"))
    config = ft / "config.pbtxt"
    text = config.read_text()
    assert 'backend: "fastertransformer"' in text
    text = text.replace('backend: "fastertransformer"', 'backend: "python"')
    # The python backend takes default_model_filename as its script's name; FT as the
    # checkpoint folder's, which ftcluster sets through model_checkpoint_path anyway.
    text = re.sub(r'(?m)^default_model_filename:.*\n', "", text)
    config.write_text(text)
    version = ft / "1"
    version.mkdir(exist_ok=True)
    for name in ("model.py", "ctmpi.py", "gpt_cuda.py"):
        shutil.copy(TEST_MODEL / name, version / name)  # follows the ctmpi.py link
    return dst


@pytest.mark.parametrize(("repo", "model_type"), sorted(SERVED), ids=IDS)
def test_each_type_serves_and_passes_the_client_check(repo: Path, model_type: str, tmp_path: Path) -> None:
    repository = _repository(repo, tmp_path / "repo")
    make_checkpoint(tmp_path / "ckpt", repo, model_type, tp=1)
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({"name": "fastertransformer", "model_type": model_type,
                                     "repository": str(repository),
                                     "checkpoint_root": str(tmp_path / "ckpt"),
                                     "client": {"batch_size": 1}}))
    rc, out, err = launch_json(write_cluster(tmp_path), "--nodes", "2", model=model)
    assert rc == 0, (out.get("failure"), out.get("log_tail"), err[-2000:])
    assert out["client"]["ok"], out["client"]
    if model_type in ("T5-Encoder", "bert"):
        client = json.loads((Path(out["run_dir"]) / "results" / "client.json").read_text())
        assert client["style"] == "encoder" and client["ok"], client
        # FT's auto-complete: the hidden state comes back in the model's data_type (fp16 here).
        assert any(c["name"] == "output_hidden_state dtype" and c["ok"] and "float16" in c["detail"]
                   for c in client["checks"]), client["checks"]


def test_gpt_ensemble_serves_on_two_ranks(tmp_path: Path) -> None:
    """FT's GPT ensemble layout (preprocessing -> fastertransformer -> postprocessing, with the
    demo's byte-level TEST tokenizers): the client queries `ensemble` with text while the FT
    model inside spans two ranks."""
    demo = TEST_MODEL.parents[2]
    model = tmp_path / "model.yaml"
    # ft_model named: the demo's FT model is the python test model, not backend fastertransformer.
    model.write_text(yaml.safe_dump({"name": "ensemble", "model_type": "GPT", "ft_model": "fastertransformer",
                                     "repository": str(demo / "ensemble_repository"),
                                     "checkpoint_root": str(demo / "checkpoint"),
                                     "client": {"batch_size": 2, "input_len": 4, "output_len": 3}}))
    rc, out, err = launch_json(write_cluster(tmp_path), "--nodes", "2", model=model)
    assert rc == 0, (out.get("failure"), out.get("log_tail"), err[-2000:])
    client = json.loads((Path(out["run_dir"]) / "results" / "client.json").read_text())
    assert client["ok"] and client["style"] == "text" and client["model"] == "ensemble", client


@pytest.mark.skipif(not FT_FIXTURES.is_dir(), reason="needs ../shared/fixtures (the backend's all_models)")
@pytest.mark.parametrize(("name", "model_type"), [("gpt", "GPT"), ("gptj", "GPT-J")])
def test_backend_ensembles_serve_on_two_ranks(name: str, model_type: str, tmp_path: Path) -> None:
    """The backend's own ensembles (all_models/gpt and gptj: ensemble, preprocessing and
    postprocessing configs as shipped, e.g. their word-list and prompt-task tensors): only the
    tokenizer scripts are the demo's byte-level TEST ones (FT's need the GPT-2 vocabulary), and
    the FT model is the test model, spanning two ranks."""
    src = FT_FIXTURES / name
    repository = _repository(src, tmp_path / "repo")
    demo = TEST_MODEL.parents[2] / "ensemble_repository"
    for step in ("ensemble", "preprocessing", "postprocessing"):
        shutil.copytree(src / step, repository / step)
        (repository / step / "1").mkdir(exist_ok=True)   # the backend's repository keeps one there
    for step in ("preprocessing", "postprocessing"):
        shutil.copy(demo / step / "1" / "model.py", repository / step / "1" / "model.py")
    make_checkpoint(tmp_path / "ckpt", src, model_type, tp=1, weights=False)
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({"name": "ensemble", "model_type": model_type, "ft_model": "fastertransformer",
                                     "repository": str(repository), "checkpoint_root": str(tmp_path / "ckpt"),
                                     "client": {"batch_size": 2, "input_len": 4, "output_len": 3}}))
    rc, out, err = launch_json(write_cluster(tmp_path), "--nodes", "2", model=model)
    assert rc == 0, (out.get("failure"), out.get("log_tail"), err[-2000:])
    client = json.loads((Path(out["run_dir"]) / "results" / "client.json").read_text())
    assert client["ok"] and client["style"] == "text" and client["model"] == "ensemble", client


@pytest.fixture(scope="module")
def encoder_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One tritonserver with the test model under T5-Encoder's and (with the shared fixtures)
    bert's config.pbtxt, as `t5enc` and `bert`."""
    require_tritonserver()
    tmp = tmp_path_factory.mktemp("encoders")
    repos = [(r, t) for r, t in REPOS.items() if t in ("T5-Encoder", "bert")]
    for repo, model_type in repos:
        name = "t5enc" if model_type == "T5-Encoder" else "bert"
        src = _repository(repo, tmp / f"src-{name}") / "fastertransformer"
        ckpt = make_checkpoint(tmp / f"ckpt-{name}", repo, model_type, tp=1, weights=False)
        config = (src / "config.pbtxt").read_text().replace('name: "fastertransformer"', f'name: "{name}"')
        config = re.sub(r'(key: "model_checkpoint_path"\s*value: \{\s*string_value: )"[^"]*"',
                        lambda m, path=ckpt: f'{m.group(1)}"{path}"', config)
        # One server, one GPU's worth: FT (and the test model) refuse tp x pp != visible GPUs.
        config = re.sub(r'(key: "(?:tensor|pipeline)_para_size"\s*value: \{\s*string_value: )"\d+"',
                        r'\1"1"', config)
        shutil.copytree(src, tmp / "repo" / name)
        (tmp / "repo" / name / "config.pbtxt").write_text(config)
    with running_tritonserver([tmp / "repo"], log_dir=tmp / "logs") as server:
        yield server


def _encoders() -> list[tuple[str, int | None]]:
    return [("t5enc", None)] + ([("bert", 768)] if FT_FIXTURES.is_dir() else [])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("name", "hidden"), _encoders())
def test_encoder_identity_bench_and_text(encoder_server: TritonServer, protocol: str, name: str,
                                         hidden: int | None, tmp_path: Path) -> None:
    url = encoder_server.http_url if protocol == "http" else encoder_server.grpc_url
    ep = Endpoint.parse(url, protocol, 30)
    result = run_identity(ep, name, batch_size=3, input_len=5, hidden_size=hidden)
    assert result.ok and result.style == "encoder", format_identity(result)
    shape = np.asarray(result.outputs["output_hidden_state"]).shape
    assert shape == (3, 5, hidden or 16)   # d_model of the zoo's T5-Encoder config.ini
    bench = run_bench(ep, name, parse_steps("2", None), batch_size=2, input_len=4, warmup_s=0.1,
                      duration_s=0.4, hidden_size=hidden)
    assert bench.ok and bench.steps[0].tokens_per_s == pytest.approx(bench.steps[0].seq_per_s * 4)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    text = run_cli("client", "text", "--url", url, "--protocol", protocol, "--model", name,
                   "--prompts", str(prompts), "--tokenizer", "bytes")
    assert_one_line_error(text, "is an encoder", "hidden states, not text")
    if hidden:
        missing = run_cli("client", "identity", "--url", url, "--protocol", protocol, "--model", name)
        assert_one_line_error(missing, "--hidden-size", "input_hidden_state")
        wrong = run_identity(ep, name, batch_size=1, input_len=3, hidden_size=hidden // 2)
        assert not wrong.ok and "hidden size is 768" in (wrong.error or ""), wrong.to_dict()
