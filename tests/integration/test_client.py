"""The client against a real CPU tritonserver serving the demo TEST models (no mocks)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ftcluster.client import Endpoint, parse_steps, run_bench, run_identity
from ftcluster.client.bench import write_csv
from ftcluster.client.identity import check_response, format_identity
from ftcluster.client.modelio import build_request, parse_config
from ftcluster.errors import UserError
from tests.triton_server import (
    TritonServer, copy_test_model_code, require_tritonserver, running_tritonserver, start_tritonserver, t5_config,
)

pytestmark = pytest.mark.triton

DEMO = Path(__file__).resolve().parents[2] / "ftcluster" / "demo"
MODEL_PY = DEMO / "model_repository" / "fastertransformer" / "1" / "model.py"



@pytest.fixture(scope="module")
def gpt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The shipped demo repository, plus a T5-style model from the same model.py."""
    require_tritonserver()
    tmp = tmp_path_factory.mktemp("t5")
    ckpt = tmp / "ckpt" / "1-gpu"
    ckpt.mkdir(parents=True)
    (ckpt / "config.ini").write_text(
        "[encoder]\nnum_heads=8\nnum_layers=6\nvocab_size=32128\n"
        "[decoder]\nnum_heads=8\nnum_layers=6\nvocab_size=32128\nend_id=1\n")
    model = tmp / "repo" / "t5"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(t5_config("t5", 16, ckpt))
    copy_test_model_code(model / "1")
    with running_tritonserver([DEMO / "model_repository", tmp / "repo"], log_dir=tmp / "logs") as server:
        yield server


@pytest.fixture(scope="module")
def ensemble_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    require_tritonserver()
    logs = tmp_path_factory.mktemp("ens-logs")
    with running_tritonserver([DEMO / "ensemble_repository"], log_dir=logs) as server:
        yield server


def _ep(server: TritonServer, protocol: str) -> Endpoint:
    return Endpoint.parse(server.http_url if protocol == "http" else server.grpc_url, protocol, 30)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_gpt(gpt_server: TritonServer, protocol: str) -> None:
    result = run_identity(_ep(gpt_server, protocol), "fastertransformer", batch_size=3, input_len=5,
                          output_len=7, repeats=2)
    assert result.ok, result.to_dict()
    assert result.style == "decoder"
    assert result.inputs_sent == ["input_ids", "input_lengths", "request_output_len"]
    assert len(result.latencies_ms) == 2
    names = {c.name for c in result.checks}
    assert "output_ids start with the prompt" in names
    assert result.sample["sequence_length"] == [12]
    assert result.sample["output_ids"][0][:5] == result.sample["prompt_ids"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_t5_style(gpt_server: TritonServer, protocol: str) -> None:
    result = run_identity(_ep(gpt_server, protocol), "t5", batch_size=2, input_len=6, output_len=4)
    assert result.ok, result.to_dict()
    assert result.style == "encoder-decoder"
    assert result.inputs_sent == ["input_ids", "sequence_length", "max_output_len"]
    assert result.sample["sequence_length"] == [4]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_ensemble_text(ensemble_server: TritonServer, protocol: str) -> None:
    result = run_identity(_ep(ensemble_server, protocol), "ensemble", batch_size=2, input_len=4, output_len=3)
    assert result.ok, result.to_dict()
    assert result.style == "text"
    assert result.inputs_sent == ["INPUT_0", "INPUT_1", "INPUT_2", "INPUT_3"]
    # The byte-level test tokenizer round-trips: the text starts with the prompt.
    assert result.sample["echoes_prompt"] is True
    assert result.sample["OUTPUT_0"][0].startswith(result.sample["prompt"])


def test_check_fails_on_a_wrong_response(gpt_server: TritonServer) -> None:
    """The checks catch a model that does not echo the prompt (T5 output checked as GPT)."""
    import asyncio

    from ftcluster.client.endpoint import AsyncTriton

    async def fetch() -> tuple[dict, dict]:
        async with AsyncTriton(_ep(gpt_server, "http")) as client:
            cfg = await client.model_config("t5")
            io = parse_config(cfg)
            req = build_request(io, 2, 6, 4)
            out = await client.infer_arrays("t5", req.arrays, ["output_ids", "sequence_length"])
            return cfg, out

    cfg, out = asyncio.run(fetch())
    cfg["parameters"]["model_type"]["string_value"] = "GPT"   # pretend it is decoder-only
    io = parse_config(cfg)
    req = build_request(io, 2, 6, 4)
    failed = {c.name for c in check_response(io, req, out) if not c.ok}
    assert "output_ids start with the prompt" in failed
    out["output_ids"] = out["output_ids"].astype(np.float32)
    assert "output_ids dtype" in {c.name for c in check_response(io, req, out) if not c.ok}


def test_the_test_model_returns_what_the_real_ft_returns(gpt_server: TritonServer) -> None:
    """FT returns sequence_length as INT32 under GPT configs that declare it UINT32 (T5's configs
    declare INT32, as it returns); the test model does the same, a check that compared types
    exactly fails on it (as it failed every launch on the real backend), and identity passes with
    a note where the types differ."""
    import asyncio

    from ftcluster.client.endpoint import AsyncTriton

    async def fetch(model: str) -> tuple[dict, dict]:
        async with AsyncTriton(_ep(gpt_server, "http")) as client:
            cfg = await client.model_config(model)
            req = build_request(parse_config(cfg), 2, 4, 3)
            return cfg, await client.infer_arrays(model, req.arrays, [o["name"] for o in cfg["output"]])

    returned = {"fastertransformer": {"output_ids": "uint32", "sequence_length": "int32",
                                      "response_input_lengths": "int32"},
                "t5": {"output_ids": "int32", "sequence_length": "int32"}}
    for model, want in returned.items():
        cfg, out = asyncio.run(fetch(model))
        assert {k: out[k].dtype.name for k in want} == want
        declared = {o["name"]: o["data_type"].removeprefix("TYPE_").lower() for o in cfg["output"]}
        differ = [k for k in ("output_ids", "sequence_length") if declared[k] != want[k]]
        assert differ == (["sequence_length"] if model == "fastertransformer" else [])
        result = run_identity(_ep(gpt_server, "http"), model, repeats=1)
        assert result.ok, format_identity(result)
        assert [n.split(":")[0] for n in result.notes] == differ
    # The check before compared types exactly: it failed the real backend's GPT answer.
    assert "note: sequence_length: the server returned INT32 where config.pbtxt declares UINT32" in \
        format_identity(run_identity(_ep(gpt_server, "grpc"), "fastertransformer", repeats=1))


def test_unknown_model_is_a_clear_user_error(gpt_server: TritonServer) -> None:
    with pytest.raises(UserError, match="model 'nope' is not ready.*ready models: fastertransformer, t5"):
        run_identity(_ep(gpt_server, "grpc"), "nope")


def test_unreachable_server_is_a_user_error() -> None:
    from tests.triton_server import free_ports

    with pytest.raises(UserError, match="cannot reach Triton"):
        run_identity(Endpoint.parse(f"127.0.0.1:{free_ports(1)[0]}", "http", 5), "fastertransformer")


def test_cli_identity_result_file_and_exit_codes(gpt_server: TritonServer, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "identity.json"
    ok = subprocess.run([sys.executable, "-m", "ftcluster.client", "identity", "--url", gpt_server.http_url,
                         "--model", "fastertransformer", "--result-file", str(out)],
                        capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "PASS" in ok.stdout
    assert json.loads(out.read_text())["ok"] is True
    bad = subprocess.run([sys.executable, "-m", "ftcluster.client", "identity", "--url", gpt_server.http_url,
                          "--model", "missing"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 3
    assert "error: --model: model 'missing' is not ready" in bad.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_short_bench(gpt_server: TritonServer, protocol: str, tmp_path: Path) -> None:
    steps = parse_steps("1,4", "50")
    result = run_bench(_ep(gpt_server, protocol), "fastertransformer", steps, batch_size=2,
                       warmup_s=0.2, duration_s=0.6, windows=2)
    assert result.ok, result.to_dict()
    assert [(s.mode, s.value) for s in result.steps] == [("concurrency", 1), ("concurrency", 4), ("rate", 50)]
    for s in result.steps:
        assert s.requests > 0 and s.errors == 0
        assert s.seq_per_s == pytest.approx(2 * s.req_per_s)
        assert s.tokens_per_s == pytest.approx(8 * s.seq_per_s)
        assert 0 < s.latency_ms.p50 <= s.latency_ms.p99 <= s.latency_ms.max
    rate = result.steps[2]
    assert 10 < rate.req_per_s < 120   # Poisson at 50/s over 0.6 s: loose bounds
    write_csv(result, str(tmp_path / "b.csv"))
    assert (tmp_path / "b.csv").read_text().count("\n") == 4
    json.dumps(result.to_dict())


def test_bench_on_the_ensemble_with_two_processes(ensemble_server: TritonServer) -> None:
    result = run_bench(_ep(ensemble_server, "http"), "ensemble", parse_steps("2", None),
                       warmup_s=0.2, duration_s=0.6, processes=2)
    assert result.ok, result.to_dict()
    assert result.style == "text" and result.processes == 2


def test_break_node_makes_the_server_fail_to_load(tmp_path: Path) -> None:
    """FTCLUSTER_TEST_BREAK_NODE=<this host> makes the test model refuse to load; the server exits."""
    import socket

    require_tritonserver()
    with pytest.raises(RuntimeError, match="FTCLUSTER_TEST_BREAK_NODE"):
        start_tritonserver([DEMO / "model_repository"], log_dir=tmp_path,
                           env={"FTCLUSTER_TEST_BREAK_NODE": socket.gethostname()}, ready_timeout=60)


def test_load_delay_and_other_hosts_unaffected(tmp_path: Path) -> None:
    import time

    require_tritonserver()
    t0 = time.monotonic()
    env = {"FTCLUSTER_TEST_LOAD_DELAY": "1.5", "FTCLUSTER_TEST_BREAK_NODE": "some-other-host"}
    with running_tritonserver([DEMO / "model_repository"], log_dir=tmp_path, env=env) as server:
        assert time.monotonic() - t0 >= 1.5
        assert run_identity(_ep(server, "http"), "fastertransformer", repeats=1).ok
