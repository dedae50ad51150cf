"""The raw HTTP/1.1 pool and Triton's binary tensor encoding (a local asyncio server, no Triton).

Run under the standard event loop and, when installed, uvloop (what uvicorn picks for the
gateway): uvloop's transports are not asyncio.Transport subclasses.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from ftcluster.client.rawhttp import (
    HttpConnectError,
    HttpError,
    HttpPool,
    HttpTimeout,
    Reply,
    request_head,
)
from ftcluster.client.rawtriton import (
    TritonError,
    TritonHttp,
    decode_infer,
    encode_infer,
    error_message,
)
from tests.triton_server import free_ports

LOOPS = ["asyncio", "uvloop"]


def run(loop: str, main: Callable[[], Awaitable[Any]]) -> Any:
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(main())  # type: ignore[arg-type]
    return asyncio.run(main())  # type: ignore[arg-type]


class Server:
    """Answers each request with `reply(request_head)`; counts connections."""

    def __init__(self, reply: Callable[[bytes], bytes | None], delay: float = 0.0):
        self.reply = reply
        self.delay = delay
        self.connections = 0
        self.requests = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                answer = self.reply(head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.srv = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.srv.sockets[0].getsockname()[1]}"

    async def close_idle_connections(self) -> None:
        for w in self.writers:
            w.close()
        await asyncio.sleep(0.05)


def ok(body: bytes = b"ok", extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.mark.parametrize("loop", LOOPS)
def test_keep_alive_limit_and_reply(loop: str) -> None:
    async def main() -> None:
        srv = Server(lambda head: ok(b"hello", "Inference-Header-Content-Length: 2\r\n"), delay=0.05)
        url = await srv.start()
        pool = HttpPool(url, timeout=5, limit=2)
        reply = await pool.request(request_head("GET", "/x", url))
        assert reply.status == 200 and reply.body == b"hello"
        assert reply.headers["inference-header-content-length"] == "2"
        await pool.request(request_head("GET", "/x", url))
        assert srv.connections == 1                       # reused
        await asyncio.gather(*(pool.request(request_head("GET", "/x", url)) for _ in range(5)))
        assert srv.connections == 2 and srv.requests == 7   # never more than `limit` at once
        await pool.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_server_closed_idle_connection_is_retried(loop: str) -> None:
    async def main() -> None:
        srv = Server(lambda head: ok())
        url = await srv.start()
        pool = HttpPool(url, timeout=5)
        await pool.request(request_head("GET", "/", url))
        await srv.close_idle_connections()
        assert (await pool.request(request_head("GET", "/", url))).body == b"ok"
        assert srv.connections == 2
        await pool.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_connection_close_timeout_refused_and_bad_framing(loop: str) -> None:
    async def main() -> None:
        srv = Server(lambda head: ok(extra="Connection: close\r\n") if b"/close" in head
                     else None if b"/drop" in head
                     else b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" if b"/chunked" in head
                     else ok())
        url = await srv.start()
        pool = HttpPool(url, timeout=5)
        await pool.request(request_head("GET", "/close", url))
        await pool.request(request_head("GET", "/", url))
        assert srv.connections == 2                        # the closed one was not reused
        with pytest.raises(HttpError, match="connection lost"):
            await pool.request(request_head("GET", "/drop", url))
        with pytest.raises(HttpError, match="chunked"):
            await pool.request(request_head("GET", "/chunked", url))
        slow = Server(lambda head: ok(), delay=2)
        slow_url = await slow.start()
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(HttpTimeout):
            await HttpPool(slow_url, timeout=5).request(request_head("GET", "/", slow_url), timeout=0.2)
        assert asyncio.get_running_loop().time() - t0 < 1.5
        (port,) = free_ports(1)
        with pytest.raises(HttpConnectError, match="cannot connect"):
            await HttpPool(f"127.0.0.1:{port}", timeout=2).request(b"GET / HTTP/1.1\r\n\r\n")
        await pool.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_fixed_infer_payload_sent_again(loop: str) -> None:
    """The load test's path: one encoded infer request, sent as often as wanted on the pool."""
    async def main() -> None:
        heads: list[bytes] = []
        srv = Server(lambda head: heads.append(head) or ok(b"x" * 10))  # type: ignore[func-returns-value]
        url = await srv.start()
        triton = TritonHttp(url, timeout=5)
        payload = triton.infer_payload("my model/v", b"{}body", 2)
        for _ in range(3):
            reply = await triton.pool.request(payload)
            assert (reply.status, reply.body) == (200, b"x" * 10)
        assert heads[0] == heads[2] and srv.connections == 1
        assert heads[0].startswith(b"POST /v2/models/my%20model%2Fv/infer HTTP/1.1\r\n")
        assert b"Inference-Header-Content-Length: 2\r\n" in heads[0] and b"Content-Length: 6\r\n" in heads[0]
        assert b"Inference-Header-Content-Length" not in triton.infer_payload("m", b"{}", None)
        bad = Reply(400, {}, b'{"error":"unexpected shape for input \'x\'"}')
        assert error_message(bad) == "unexpected shape for input 'x'"
        assert error_message(Reply(502, {}, b"")) == "HTTP 502"
        await triton.close()

    run(loop, main)


def test_encode_matches_tritonclient() -> None:
    import tritonclient.http as th

    arrays = {"ids": np.array([[1, 2, 3]], dtype=np.uint32), "p": np.array([[0.5]], dtype=np.float32),
              "text": np.array([[b"hi"], ["h\u00e9".encode()]], dtype=np.object_)}
    body, size = encode_infer(arrays, ["out"])
    inputs = []
    for (name, arr), dtype in zip(arrays.items(), ["UINT32", "FP32", "BYTES"]):
        inp = th.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr, binary_data=True)
        inputs.append(inp)
    want, want_size = th.InferenceServerClient.generate_request_body(
        inputs, outputs=[th.InferRequestedOutput("out", binary_data=True)])
    assert json.loads(body[:size]) == json.loads(want[:want_size])
    assert body[size:] == want[want_size:]


def test_decode_binary_json_and_bytes_outputs() -> None:
    ids = np.arange(6, dtype=np.uint32).reshape(1, 2, 3)
    text = b"\x02\x00\x00\x00hi\x03\x00\x00\x00abc"
    head = json.dumps({"outputs": [
        {"name": "ids", "datatype": "UINT32", "shape": [1, 2, 3], "parameters": {"binary_data_size": 24}},
        {"name": "len", "datatype": "INT32", "shape": [1, 2], "data": [3, 2]},
        {"name": "text", "datatype": "BYTES", "shape": [2, 1], "parameters": {"binary_data_size": len(text)}},
        {"name": "json_text", "datatype": "BYTES", "shape": [1], "data": ["x"]},
    ]}).encode()
    got = decode_infer(head + ids.tobytes() + text, len(head))
    assert got["ids"].tolist() == ids.tolist() and got["ids"].dtype == np.uint32
    assert got["len"].tolist() == [[3, 2]]
    assert got["text"].tolist() == [[b"hi"], [b"abc"]]
    assert got["json_text"].tolist() == [b"x"]
    assert decode_infer(json.dumps({"outputs": []}).encode(), None) == {}
    assert issubclass(TritonError, Exception)


def test_decode_bf16_outputs_as_tritonclient_does() -> None:
    """An FT encoder (bert, T5-Encoder) with data_type bf16 sends output_hidden_state as BF16."""
    from tritonclient.utils import deserialize_bf16_tensor, serialize_bf16_tensor

    want = np.array([[1.5, -2.25, 3.0e-3], [65280.0, -0.0, 7.0]], np.float32)
    raw = serialize_bf16_tensor(want).item()
    head = json.dumps({"outputs": [{"name": "output_hidden_state", "datatype": "BF16", "shape": [1, 2, 3],
                                    "parameters": {"binary_data_size": len(raw)}}]}).encode()
    got = decode_infer(head + raw, len(head))["output_hidden_state"]
    assert got.dtype == np.float32 and got.shape == (1, 2, 3)
    assert got.ravel().tolist() == deserialize_bf16_tensor(raw).ravel().tolist()
    assert got[0, 0, :2].tolist() == [1.5, -2.25]   # exact in bf16
