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
from pathlib import Path

import pytest
import yaml

from tests.launch_helpers import launch_json, write_cluster
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
