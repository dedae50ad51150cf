"""Input roles and request building from real FT configs and the demo TEST configs (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from ftcluster.client.identity import check_response
from ftcluster.client.modelio import build_request, output_names, parse_config
from ftcluster.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "ftcluster" / "demo"
FT_FIXTURES = ROOT.parent / "shared" / "fixtures" / "fastertransformer_backend" / "all_models"


def load(path: Path) -> dict[str, Any]:
    """A config.pbtxt as tritonclient's gRPC `as_json` returns it (int64 dims as strings)."""
    cfg = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def fixture(rel: str) -> Path:
    path = FT_FIXTURES / rel
    if not path.is_file():
        pytest.skip("../shared/fixtures absent")
    return path


def test_demo_gpt_roles_and_request() -> None:
    io = parse_config(load(DEMO / "model_repository" / "fastertransformer" / "config.pbtxt"))
    assert io.style == "decoder" and io.max_batch_size == 64 and io.model_type == "GPT"
    req = build_request(io, 3, 5, 7, seed=1)
    assert list(req.arrays) == ["input_ids", "input_lengths", "request_output_len"]  # optional ones left out
    assert req.arrays["input_ids"].shape == (3, 5) and req.arrays["input_ids"].dtype == np.uint32
    assert req.arrays["input_lengths"].tolist() == [[5]] * 3
    assert req.arrays["request_output_len"].tolist() == [[7]] * 3
    assert output_names(io) == ["output_ids", "sequence_length"]
    assert (req.arrays["input_ids"] > 0).all() and (req.arrays["input_ids"] < 50256).all()


def test_real_ft_gpt_and_t5_configs() -> None:
    gpt = parse_config(load(fixture("gpt/fastertransformer/config.pbtxt")))
    assert gpt.style == "decoder"
    assert list(build_request(gpt, 2, 4, 4).arrays) == ["input_ids", "input_lengths", "request_output_len"]
    t5 = parse_config(load(fixture("t5/fastertransformer/config.pbtxt")))
    assert t5.style == "encoder-decoder"
    req = build_request(t5, 2, 4, 6)
    assert list(req.arrays) == ["input_ids", "sequence_length", "max_output_len"]
    assert t5.output_ids is not None and t5.output_ids.dtype == "INT32"


def test_real_ft_gpt_ensemble_maps_inputs_through_the_steps() -> None:
    io = parse_config(load(fixture("gpt/ensemble/config.pbtxt")))
    assert io.style == "text"
    assert io.roles["INPUT_0"] == "text" and io.roles["INPUT_1"] == "output_len"
    assert io.roles["INPUT_2"] == "words_list" and io.roles["INPUT_3"] == "words_list"
    req = build_request(io, 2, 3, 5)
    assert set(req.arrays) == {"INPUT_0", "INPUT_1", "INPUT_2", "INPUT_3"}
    assert req.arrays["INPUT_2"].tolist() == [[b""], [b""]]
    assert req.prompts is not None and len(req.prompts[0].split()) == 3
    assert output_names(io) == ["OUTPUT_0", "sequence_length"]


def test_demo_ensemble_matches_the_ft_layout() -> None:
    io = parse_config(load(DEMO / "ensemble_repository" / "ensemble" / "config.pbtxt"))
    assert io.is_ensemble and io.style == "text"
    assert {i.name: i.key for i in io.inputs}["INPUT_0"] == "QUERY"
    assert io.sequence_length is not None and io.sequence_length.key == "sequence_length"


def test_the_ensemble_runs_the_same_test_model() -> None:
    a = DEMO / "model_repository" / "fastertransformer"
    b = DEMO / "ensemble_repository" / "fastertransformer"
    assert (a / "1" / "model.py").read_text() == (b / "1" / "model.py").read_text()
    assert (a / "config.pbtxt").read_text() == (b / "config.pbtxt").read_text()


def test_unknown_required_input_is_named() -> None:
    cfg = load(DEMO / "model_repository" / "fastertransformer" / "config.pbtxt")
    cfg["input"].append({"name": "mystery", "data_type": "TYPE_FP32", "dims": ["1"]})
    with pytest.raises(UserError, match="cannot make up: mystery"):
        build_request(parse_config(cfg), 1, 2, 2)


def test_batch_above_max_batch_size() -> None:
    io = parse_config(load(DEMO / "model_repository" / "fastertransformer" / "config.pbtxt"))
    with pytest.raises(UserError, match="max_batch_size 64"):
        build_request(io, 65, 2, 2)


def _gpt_response(prompt: np.ndarray, out_len: int, seq_dtype: Any = np.uint32) -> dict[str, np.ndarray]:
    b, n = prompt.shape
    gen = np.tile(np.arange(1, out_len + 1), (b, 1))
    ids = np.concatenate([prompt, gen], axis=1).reshape(b, 1, n + out_len).astype(np.uint32)
    return {"output_ids": ids, "sequence_length": np.full((b, 1), n + out_len, dtype=seq_dtype)}


def test_checks_pass_and_fail() -> None:
    io = parse_config(load(DEMO / "model_repository" / "fastertransformer" / "config.pbtxt"))
    req = build_request(io, 2, 4, 3)
    assert req.prompt_ids is not None
    good = _gpt_response(req.prompt_ids, 3)
    assert all(c.ok for c in check_response(io, req, good))

    def failed(out: dict[str, np.ndarray]) -> set[str]:
        return {c.name for c in check_response(io, req, out) if not c.ok}

    wrong_prompt = _gpt_response(req.prompt_ids + 1, 3)
    assert failed(wrong_prompt) == {"output_ids start with the prompt"}
    too_long = dict(good, sequence_length=np.full((2, 1), 99, np.uint32))
    assert "sequence_length in [input_len, input_len+output_len]" in failed(too_long)
    # The real FT backend returns sequence_length as INT32 under a config.pbtxt that says UINT32:
    # values are compared, the difference is a note (the check before failed it).
    notes: list[str] = []
    assert all(c.ok for c in check_response(io, req, _gpt_response(req.prompt_ids, 3, np.int32), notes))
    assert notes == ["sequence_length: the server returned INT32 where config.pbtxt declares UINT32 (its "
                     "backend's own type, which Triton passes through); its values fit UINT32"]
    negative = dict(good, sequence_length=np.full((2, 1), -1, np.int32))
    assert "sequence_length dtype" in failed(negative)
    assert "sequence_length dtype" in failed(_gpt_response(req.prompt_ids, 3, np.float32))
    assert "output_ids dtype" in failed(dict(good, output_ids=good["output_ids"].astype(np.float32)))
    flat = dict(good, output_ids=good["output_ids"][:, 0, :])
    assert "output_ids shape" in failed(flat)
    assert "output_ids returned" in failed({"sequence_length": good["sequence_length"]})
