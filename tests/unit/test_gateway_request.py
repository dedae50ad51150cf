"""The gateway's request -> Triton inputs and outputs -> response mapping, from the demo configs.

The layout (which input takes what) is worked out once per model config; these pin down what
it sends, without a server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from ftcluster.client.modelio import parse_config
from ftcluster.gateway import request as rq
from ftcluster.gateway.schema import GenerateRequest
from ftcluster.client.tokenizer import ByteTokenizer

DEMO = Path(__file__).resolve().parents[2] / "ftcluster" / "demo"


def layout(rel: str) -> rq.Layout:
    cfg = text_format.Parse((DEMO / rel).read_text(), model_config_pb2.ModelConfig())
    return rq.Layout.of(parse_config(json_format.MessageToDict(cfg, preserving_proto_field_name=True)))


GPT = "model_repository/fastertransformer/config.pbtxt"
ENSEMBLE = "ensemble_repository/ensemble/config.pbtxt"


def req(**kw: Any) -> GenerateRequest:
    return GenerateRequest.model_validate(kw)


def test_gpt_layout_and_arrays() -> None:
    lay = layout(GPT)
    assert lay.ids is not None and lay.ids.name == "input_ids" and lay.text is None
    assert [s.name for s in lay.lengths] == ["input_lengths"]
    assert [s.name for s in lay.output_lens] == ["request_output_len"]
    assert lay.words == ()   # the demo's stop/bad words lists are optional
    assert lay.sampling["top_k"].name == "runtime_top_k" and lay.sampling["top_p"].name == "runtime_top_p"
    assert lay.outputs == ("output_ids", "sequence_length")
    p = rq.build(lay, req(input_ids=[[5, 6, 7], [9]], max_tokens=2, top_k=1, random_seed=2**64 - 1, end_id=7),
                 None, rq.Limits())
    a = p.arrays
    assert a["input_ids"].tolist() == [[5, 6, 7], [9, 7, 7]] and a["input_ids"].dtype == np.uint32  # end_id pads
    assert a["input_lengths"].tolist() == [[3], [1]] and a["request_output_len"].tolist() == [[2], [2]]
    assert a["runtime_top_k"].tolist() == [[1], [1]] and a["random_seed"].dtype == np.uint64
    assert a["random_seed"].tolist() == [[2**64 - 1]] * 2 and a["end_id"].tolist() == [[7], [7]]
    assert p.batch == 2 and set(a) == {"input_ids", "input_lengths", "request_output_len", "runtime_top_k",
                                       "random_seed", "end_id"}
    one = rq.build(lay, req(prompt="hi", max_tokens=3), ByteTokenizer(), rq.Limits())
    assert one.arrays["input_ids"].tolist() == [[104, 105]] and one.arrays["input_lengths"].tolist() == [[2]]


def test_response_cuts_at_sequence_length_and_decodes() -> None:
    lay = layout(GPT)
    p = rq.build(lay, req(input_ids=[[1, 2], [3]], max_tokens=1), None, rq.Limits())
    got = {"output_ids": np.array([[[104, 105, 0]], [[106, 0, 0]]], dtype=np.uint32),
           "sequence_length": np.array([[3], [1]], dtype=np.uint32)}
    body = rq.response(lay, p, got, ByteTokenizer())
    assert body == {"model": "fastertransformer", "output_ids": [[[104, 105, 0]], [[106]]],
                    "sequence_length": [[3], [1]], "text": [["hi\x00"], ["j"]]}
    assert rq.response(lay, p, got, None)["text"] is None


def test_ensemble_takes_text_and_returns_text() -> None:
    lay = layout(ENSEMBLE)
    assert lay.ids is None and lay.text is not None and lay.text.name == "INPUT_0"
    assert lay.out_text == "OUTPUT_0" and lay.outputs == ("OUTPUT_0", "sequence_length")
    p = rq.build(lay, req(prompt=["Hi", "h\u00e9"], max_tokens=2), None, rq.Limits())
    assert p.arrays["INPUT_0"].tolist() == [[b"Hi"], ["h\u00e9".encode()]]
    assert p.arrays["INPUT_1"].tolist() == [[2], [2]]
    got = {"OUTPUT_0": np.array([[b"Hijk"], [b"x"]], dtype=np.object_),
           "sequence_length": np.array([[4], [1]], dtype=np.uint32)}
    body = rq.response(lay, p, got, None)
    assert body["text"] == [["Hijk"], ["x"]] and body["output_ids"] is None
    ids = rq.build(lay, req(input_ids=[104, 105]), ByteTokenizer(), rq.Limits())  # decoded to text here
    assert ids.arrays["INPUT_0"].tolist() == [[b"hi"]]


@pytest.mark.parametrize("rel, kw, tok, msg", [
    (GPT, {"prompt": "x"}, None, "send 'input_ids'"),
    (GPT, {"input_ids": [1] * 9}, None, "9 tokens is above the limit of 8"),
    (GPT, {"input_ids": [1], "max_tokens": 17}, None, "max_tokens 17 is above the limit of 16"),
    (GPT, {"input_ids": [[1]] * 3}, None, "batch of 3 is above the limit of 2"),
    (ENSEMBLE, {"input_ids": [1]}, None, "takes text"),
    (ENSEMBLE, {"prompt": "x", "top_k": 1}, None, "does not take top_k"),
    (ENSEMBLE, {"prompt": "123456789"}, None, "9 characters is above the limit of 8"),
])
def test_refusals_are_400(rel: str, kw: dict[str, Any], tok: Any, msg: str) -> None:
    with pytest.raises(rq.RequestError, match=msg) as err:
        rq.build(layout(rel), req(**kw), tok, rq.Limits(max_input_tokens=8, max_tokens=16, max_batch=2))
    assert err.value.status == 400


def test_model_the_gateway_cannot_fill_is_refused() -> None:
    io = layout(GPT).io
    bad = parse_config({"name": "m", "max_batch_size": 1, "input": [
        {"name": "input_ids", "data_type": "TYPE_UINT32", "dims": [-1]},
        {"name": "mystery", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "output_ids", "data_type": "TYPE_UINT32", "dims": [-1]}]})
    with pytest.raises(rq.RequestError, match="cannot fill: mystery") as err:
        rq.Layout.of(bad)
    assert err.value.status == 500 and rq.Layout.of(io).io is io
