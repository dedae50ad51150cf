"""The gateway against a real CPU tritonserver serving the demo TEST ensemble (no mocks).

The server holds the byte-level ensemble (text path inside Triton), its `fastertransformer`
TEST model (token ids; text through the gateway's `bytes` tokenizer) and `slow`, the same
model sleeping 2 s per batch, for the timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from ftcluster.gateway import GatewayConfig, create_app
from ftcluster.gateway.request import Limits
from tests.triton_server import (
    TritonServer, free_ports, require_tritonserver, running_tritonserver, slow_demo_model,
)

pytestmark = pytest.mark.triton

DEMO = Path(__file__).resolve().parents[2] / "ftcluster" / "demo"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    require_tritonserver()
    tmp = slow_demo_model(tmp_path_factory.mktemp("slowrepo"), "slow", 2000)
    logs = tmp_path_factory.mktemp("logs")
    with running_tritonserver([DEMO / "ensemble_repository", tmp], log_dir=logs) as s:
        yield s


@pytest.fixture(scope="module")
def ids_client(server: TritonServer) -> Iterator[TestClient]:
    cfg = GatewayConfig(server.http_url, "fastertransformer", "bytes", timeout_s=10,
                        limits=Limits(max_input_tokens=32, max_tokens=64, max_batch=4))
    with TestClient(create_app(cfg)) as c:
        yield c


@pytest.fixture(scope="module")
def text_client(server: TritonServer) -> Iterator[TestClient]:
    with TestClient(create_app(GatewayConfig(server.http_url, "ensemble", timeout_s=10))) as c:
        yield c


def test_token_ids_and_sampling(ids_client: TestClient) -> None:
    r = ids_client.post("/v1/generate", json={"input_ids": [[5, 6, 7], [9]], "max_tokens": 2, "top_k": 1,
                                              "top_p": 0.5, "temperature": 1, "repetition_penalty": 1.1,
                                              "random_seed": 3, "end_id": 50256, "beam_width": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output_ids"] == [[[5, 6, 7, 8, 9]] * 2, [[9, 10, 11]] * 2]   # cut at sequence_length
    assert body["sequence_length"] == [[5, 5], [3, 3]]
    assert body["text"][0][0] == "\x05\x06\x07\x08\x09"


def test_prompt_through_gateway_tokenizer(ids_client: TestClient) -> None:
    r = ids_client.post("/v1/generate", json={"prompt": "abc", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == [["abcdef"]] and r.json()["output_ids"] == [[[97, 98, 99, 100, 101, 102]]]


def test_prompt_through_ensemble_tokenizer(text_client: TestClient) -> None:
    r = text_client.post("/v1/generate", json={"prompt": ["Hi", "héllo"], "max_tokens": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"][0] == ["Hijk"] and body["text"][1][0].startswith("héllo")
    assert body["sequence_length"] == [[4], [8]] and body["output_ids"] is None


@pytest.mark.parametrize("payload, where", [
    ({"max_tokens": 4}, "exactly one of 'prompt' or 'input_ids'"),
    ({"prompt": "x", "input_ids": [1], "max_tokens": 4}, "exactly one"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "4"}, "max_tokens"),
    ({"prompt": 5, "max_tokens": 4}, "prompt"),
    ({"input_ids": [1.5, 2], "max_tokens": 4}, "input_ids"),
    ({"input_ids": [[]], "max_tokens": 4}, "empty row"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "temperature": 0}, "temperature"),
    ({"prompt": "x", "top_k": True}, "top_k"),
    ({"prompt": "x", "surprise": 1}, "surprise"),
    ({"prompt": ""}, "empty"),
])
def test_malformed_requests_are_422(ids_client: TestClient, payload: dict[str, Any], where: str) -> None:
    r = ids_client.post("/v1/generate", json=payload)
    assert r.status_code == 422, r.text
    assert where in json.dumps(r.json()["detail"])


@pytest.mark.parametrize("payload, msg", [
    ({"prompt": "x" * 33}, "33 tokens is above the limit of 32"),
    ({"input_ids": list(range(1, 40))}, "39 tokens is above the limit of 32"),
    ({"prompt": "x", "max_tokens": 65}, "max_tokens 65 is above the limit of 64"),
    ({"prompt": ["a"] * 5}, "batch of 5 is above the limit of 4"),
])
def test_too_long_or_too_big_is_400(ids_client: TestClient, payload: dict[str, Any], msg: str) -> None:
    r = ids_client.post("/v1/generate", json=payload)
    assert r.status_code == 400 and msg in r.json()["detail"], r.text


def test_model_specific_400s(text_client: TestClient) -> None:
    r = text_client.post("/v1/generate", json={"prompt": "x", "top_k": 1})
    assert r.status_code == 400 and "does not take top_k" in r.json()["detail"]
    r = text_client.post("/v1/generate", json={"input_ids": [1, 2]})
    assert r.status_code == 400 and "takes text" in r.json()["detail"]


def test_ids_model_without_tokenizer_wants_ids(server: TritonServer) -> None:
    with TestClient(create_app(GatewayConfig(server.http_url, "fastertransformer"))) as c:
        r = c.post("/v1/generate", json={"prompt": "x"})
        assert r.status_code == 400 and "--tokenizer" in r.json()["detail"]
        assert c.post("/v1/generate", json={"input_ids": [1]}).json()["text"] is None


def test_timeout_is_504(server: TritonServer) -> None:
    with TestClient(create_app(GatewayConfig(server.http_url, "slow", timeout_s=0.5))) as c:
        t0 = time.monotonic()
        r = c.post("/v1/generate", json={"input_ids": [1, 2], "max_tokens": 1})
        assert r.status_code == 504 and "0.5 s" in r.json()["detail"]
        assert time.monotonic() - t0 < 1.9   # answered at the deadline, not after the model


def test_health_and_unreachable_triton(ids_client: TestClient) -> None:
    r = ids_client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    (port,) = free_ports(1)   # nothing listens: start-up survives, health and requests say 503
    with TestClient(create_app(GatewayConfig(f"127.0.0.1:{port}", "fastertransformer", timeout_s=2))) as c:
        r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["triton"] == "unreachable"
        r = c.post("/v1/generate", json={"input_ids": [1]})
        assert r.status_code == 503 and "not available" in r.json()["detail"]
    with TestClient(create_app(GatewayConfig(ids_client.app.state.gw.cfg.triton, "nope"))) as c:  # type: ignore[attr-defined]
        r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["model"] == "not ready"


def test_body_must_be_json_and_not_too_big(server: TritonServer, ids_client: TestClient) -> None:
    r = ids_client.post("/v1/generate", content=b'{"input_ids": [1]}', headers={"content-type": "text/plain"})
    assert r.status_code == 422 and "Content-Type: application/json" in r.text
    r = ids_client.post("/v1/generate", content=b'{"input_ids": [1],', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    r = ids_client.post("/v1/generate", content=b'{"input_ids": [1]}',
                        headers={"content-type": "application/vnd.api+json; charset=utf-8"})
    assert r.status_code == 200, r.text
    r = ids_client.post("/v1/generate", json={"prompt": "x", "random_seed": 2**64})
    assert r.status_code == 422 and "random_seed" in r.text   # an input orjson cannot echo
    cfg = GatewayConfig(server.http_url, "fastertransformer", max_body_bytes=64)
    with TestClient(create_app(cfg)) as c:
        assert c.post("/v1/generate", json={"input_ids": [1] * 8}).status_code == 200
        r = c.post("/v1/generate", json={"input_ids": [1] * 30})
        assert r.status_code == 413 and "above 64 bytes" in r.json()["detail"]


def test_fastapi_route_answers_like_the_shortcut(server: TritonServer, ids_client: TestClient) -> None:
    """Mounted under a prefix, POST /v1/generate goes through FastAPI's own route: same answers."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    gw = create_app(GatewayConfig(server.http_url, "fastertransformer", "bytes", timeout_s=10,
                                  limits=Limits(max_input_tokens=32, max_tokens=64, max_batch=4)))
    outer = Starlette(routes=[Mount("/api", app=gw)],
                      lifespan=lambda _: gw.router.lifespan_context(gw))  # type: ignore[arg-type]
    payloads: list[dict[str, Any]] = [{"input_ids": [[5, 6, 7], [9]], "max_tokens": 2, "top_k": 1},
                                      {"prompt": "abc", "max_tokens": 3}, {"prompt": "x" * 33},
                                      {"input_ids": [[]]}]
    with TestClient(outer) as c:
        for payload in payloads:
            via_route = c.post("/api/v1/generate", json=payload)
            direct = ids_client.post("/v1/generate", json=payload)
            assert via_route.status_code == direct.status_code, (payload, via_route.text, direct.text)
            if direct.status_code != 422:  # 422 details differ in form (FastAPI's own), not in substance
                assert via_route.json() == direct.json()


def test_triton_refusal_is_502_and_triton_gone_is_503(server: TritonServer, ids_client: TestClient) -> None:
    state = ids_client.app.state.gw  # type: ignore[attr-defined]
    good = state.layout
    try:
        state.layout = dataclasses.replace(good, outputs=("no_such_output",))
        r = ids_client.post("/v1/generate", json={"input_ids": [1]})
        assert r.status_code == 502 and "no_such_output" in r.json()["detail"], r.text
    finally:
        state.layout = good
    (port,) = free_ports(1)   # started without Triton, then given the layout: every request 503s
    with TestClient(create_app(GatewayConfig(f"127.0.0.1:{port}", "fastertransformer", timeout_s=2))) as c:
        c.app.state.gw.layout = good  # type: ignore[attr-defined]
        r = c.post("/v1/generate", json={"input_ids": [1]})
        assert r.status_code == 503 and "cannot connect" in r.json()["detail"], r.text


def test_raw_triton_client_matches_tritonclient(server: TritonServer) -> None:
    import numpy as np

    from ftcluster.client.endpoint import AsyncTriton, Endpoint
    from ftcluster.client.rawtriton import TritonError, TritonHttp

    arrays = {"input_ids": np.array([[5, 6, 7]], dtype=np.uint32),
              "input_lengths": np.array([[3]], dtype=np.uint32),
              "request_output_len": np.array([[4]], dtype=np.uint32)}
    outputs = ["output_ids", "sequence_length"]

    async def main() -> None:
        raw = TritonHttp(server.http_url, timeout=10, max_connections=2)
        async with AsyncTriton(Endpoint(server.http_url)) as tc:
            want = await tc.infer_arrays("fastertransformer", arrays, outputs)
            got = await raw.infer("fastertransformer", arrays, outputs)
            assert {k: (v.dtype, v.tolist()) for k, v in got.items()} == \
                {k: (v.dtype, v.tolist()) for k, v in want.items()}
            assert await raw.model_config("fastertransformer") == await tc.model_config("fastertransformer")
        assert await raw.ready() and await raw.ready("fastertransformer") and not await raw.ready("nope")
        with pytest.raises(TritonError, match="unknown model") as err:
            await raw.model_config("nope")
        assert err.value.status == 404
        bad = {**arrays, "input_ids": np.array([[5, 6, 7]], dtype=np.float32)}
        with pytest.raises(TritonError, match="input_ids"):
            await raw.infer("fastertransformer", bad, outputs)
        await raw.close()

    asyncio.run(main())


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "gateway exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("gateway did not listen")


def test_cli_serves_with_uvicorn(server: TritonServer) -> None:
    (port,) = free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "gateway", "--triton", server.http_url,
                             "--model", "ensemble", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_port(port, proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10) as c:
            assert c.get("/healthz").json()["status"] == "ok"
            paths = c.get("/openapi.json").json()["paths"]
            assert "/v1/generate" in paths and "/healthz" in paths
            assert c.get("/docs").status_code == 200
            r = c.post("/v1/generate", json={"prompt": "ok", "max_tokens": 1})
            assert r.status_code == 200 and r.json()["text"] == [["okl"]]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    bad = subprocess.run([sys.executable, "-m", "ftcluster", "gateway", "--triton", "nohost", "--model", "m"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode != 0 and "HOST:PORT" in bad.stderr
