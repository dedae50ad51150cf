"""A minimal keep-alive HTTP/1.1 sender for one fixed, pre-encoded Triton request.

Why not aiohttp: the load test sends the same request thousands of times per second, and a
general HTTP client spends ~0.3 ms of Python per request on headers, cookies and streams,
which capped HTTP throughput at ~0.45x perf_analyzer (C++/libcurl). Here a request is one
`transport.write` of ready bytes and a response is one header scan plus a Content-Length
read, in an asyncio.Protocol. The body is still encoded by tritonclient; only the load test
uses this (identity tests go through tritonclient's own client).
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote


class HttpError(Exception):
    """Transport-level failure: connection lost, timeout, or a response we cannot frame."""


class _Conn(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._head_end = -1
        self._need = -1
        self._status = 0
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(HttpError(f"connection lost: {exc or 'closed by server'}"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is None or self._waiter.done():
            return
        if self._need < 0:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            try:
                self._status = int(lines[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                self._fail(f"bad status line {lines[0]!r}")
                return
            length = -1
            for line in lines[1:]:
                name, _, value = line.partition(":")
                key = name.strip().lower()
                if key == "content-length":
                    length = int(value.strip())
                elif key == "transfer-encoding" and "chunked" in value.lower():
                    self._fail("chunked responses are not supported by the fast path")
                    return
            if length < 0:
                self._fail("response without Content-Length")
                return
            self._head_end = end + 4
            self._need = self._head_end + length
        if len(self._buf) >= self._need:
            body = bytes(self._buf[self._head_end:self._need])
            del self._buf[:self._need]
            self._need = -1
            self._waiter.set_result((self._status, body))

    def _fail(self, why: str) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(HttpError(why))
        if self.transport is not None:
            self.transport.close()

    async def roundtrip(self, payload: bytes, timeout: float) -> tuple[int, bytes]:
        assert self.transport is not None
        self._waiter = waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout, self._fail, f"no response within {timeout:g}s")
        try:
            self.transport.write(payload)
            return await waiter
        finally:
            timer.cancel()


class FixedRequestSender:
    """Sends one pre-encoded request over a pool of keep-alive connections (one per caller in flight)."""

    def __init__(self, host_port: str, model: str, body: bytes, json_size: int | None, timeout: float):
        host, _, port = host_port.rpartition(":")
        self._host = host.strip("[]")
        self._port = int(port)
        self._timeout = timeout
        headers = [f"POST /v2/models/{quote(model)}/infer HTTP/1.1", f"Host: {host_port}",
                   "Content-Type: application/octet-stream", f"Content-Length: {len(body)}"]
        if json_size is not None:
            headers.append(f"Inference-Header-Content-Length: {json_size}")
        self._payload = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + body
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), self._host, self._port), self._timeout)
        except (TimeoutError, OSError) as exc:
            raise HttpError(f"cannot connect to {self._host}:{self._port}: {exc or type(exc).__name__}") from exc
        self._all.add(conn)
        return conn

    async def send(self) -> tuple[int, bytes]:
        """(status, body) of one request; HttpError on transport failure."""
        conn = None
        while self._idle:
            cand = self._idle.pop()
            if not cand.closed and cand.transport is not None and not cand.transport.is_closing():
                conn = cand
                break
            self._drop(cand)
        if conn is None:
            conn = await self._connect()
        try:
            status, body = await conn.roundtrip(self._payload, self._timeout)
        except BaseException:
            self._drop(conn)
            raise
        if conn.closed:
            self._drop(conn)
        else:
            self._idle.append(conn)
        return status, body

    def _drop(self, conn: _Conn) -> None:
        self._all.discard(conn)
        if conn.transport is not None:
            conn.transport.close()

    async def close(self) -> None:
        for conn in list(self._all):
            self._drop(conn)
        self._idle.clear()
