"""A minimal keep-alive HTTP/1.1 client: a pool of connections to one server.

Why not tritonclient.http.aio (aiohttp): on the test model at realistic sizes (batch 8 x 512
tokens in, 128 out) it costs 4-6x the client CPU per request and about 3 ms more latency
(bench/http_transport.py, figures in bench/README.md). Here a request is one
`transport.write` of ready bytes and a response is one header scan plus a Content-Length
read, in an asyncio.Protocol. Its only user is `ftcluster.client.rawtriton` (Triton's
inference protocol) for the two inference hot paths: the gateway and the load test.
Only what Triton's HTTP server sends is understood: Content-Length framing, no chunked
bodies, no pipelining (one request in flight per connection).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import NamedTuple, cast


class HttpError(Exception):
    """Transport-level failure: cannot connect, connection lost, or a response we cannot frame."""


class HttpConnectError(HttpError):
    """The server could not be reached at all (nothing was sent)."""


class HttpTimeout(HttpError):
    """No (complete) response before the deadline."""


class Reply(NamedTuple):
    status: int
    headers: dict[str, str]   # lower-case names
    body: bytes


class _Conn(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buf = bytearray()
        self._waiter: asyncio.Future[Reply] | None = None
        self._head_end = -1
        self._need = -1
        self._status = 0
        self._headers: dict[str, str] = {}
        self._close_after = False
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.got_bytes = False      # any byte of the current response arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave like one.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(HttpError(f"connection lost: {exc or 'closed by server'}"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self.got_bytes = True
        if self._waiter is None or self._waiter.done():
            return
        if self._need < 0:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            try:
                self._status = int(lines[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                self._fail(f"bad status line {lines[0]!r}")
                return
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._fail("chunked responses are not supported")
                return
            try:
                length = int(headers["content-length"])
            except (KeyError, ValueError):
                self._fail("response without Content-Length")
                return
            self._headers = headers
            self._close_after = headers.get("connection", "").lower() == "close"
            self._head_end = end + 4
            self._need = self._head_end + length
        if len(self._buf) >= self._need:
            body = bytes(self._buf[self._head_end:self._need])
            del self._buf[:self._need]
            self._need = -1
            if self._close_after and self.transport is not None:
                self.transport.close()
            self._waiter.set_result(Reply(self._status, self._headers, body))

    def _fail(self, why: str, exc_type: type[HttpError] = HttpError) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc_type(why))
        if self.transport is not None:
            self.transport.close()

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    async def roundtrip(self, payload: bytes, timeout: float) -> Reply:
        assert self.transport is not None
        self._waiter = waiter = self._loop.create_future()
        self.got_bytes = False
        timer = self._loop.call_later(timeout, self._fail, f"no response within {timeout:g} s", HttpTimeout)
        try:
            self.transport.write(payload)
            return await waiter
        finally:
            timer.cancel()


class HttpPool:
    """Keep-alive connections to one HOST:PORT, reused most-recent first.

    At most `limit` requests are in flight (None: no limit; a connection per caller in
    flight). A request that finds its reused connection closed by the server before any
    response byte came back is sent once more on a new connection.
    """

    def __init__(self, host_port: str, timeout: float, limit: int | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        host, _, port = host_port.rpartition(":")
        self.host_port = host_port
        self._ssl = ssl_context   # TLS (an https endpoint), verified against the host's name
        self._host = host.strip("[]")
        self._port = int(port)
        self.timeout = timeout
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._slots = asyncio.Semaphore(limit) if limit else None

    async def _connect(self, timeout: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), self._host, self._port, ssl=self._ssl), timeout)
        except (TimeoutError, OSError) as exc:
            raise HttpConnectError(f"cannot connect to {self.host_port}: "
                                   f"{exc or type(exc).__name__}") from exc
        self._all.add(conn)
        return conn

    def _take_idle(self) -> _Conn | None:
        while self._idle:
            cand = self._idle.pop()
            if cand.usable():
                return cand
            self._drop(cand)
        return None

    async def request(self, payload: bytes, timeout: float | None = None) -> Reply:
        """One request (head and body, ready bytes); HttpError on transport failure or timeout."""
        if self._slots is None:
            return await self._request(payload, self.timeout if timeout is None else timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        if self._slots.locked():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError:
                raise HttpTimeout(f"no free connection to {self.host_port} in time") from None
        else:
            await self._slots.acquire()
        try:
            return await self._request(payload, max(deadline - loop.time(), 0.001))
        finally:
            self._slots.release()

    async def _request(self, payload: bytes, timeout: float) -> Reply:
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            conn = await self._connect(timeout)
            timeout = max(timeout - (loop.time() - start), 0.001)
        try:
            reply = await conn.roundtrip(payload, timeout)
        except HttpTimeout:
            self._drop(conn)
            raise
        except HttpError:
            self._drop(conn)
            if not (reused and conn.closed and not conn.got_bytes):
                raise
            # The server had closed the idle connection: the request never reached it.
            conn = await self._connect(timeout)
            try:
                reply = await conn.roundtrip(payload, timeout)
            except BaseException:
                self._drop(conn)
                raise
        except BaseException:
            self._drop(conn)
            raise
        if conn.usable():
            self._idle.append(conn)
        else:
            self._drop(conn)
        return reply

    def _drop(self, conn: _Conn) -> None:
        self._all.discard(conn)
        if conn.transport is not None:
            conn.transport.close()

    async def close(self) -> None:
        for conn in list(self._all):
            self._drop(conn)
        self._idle.clear()


def request_head(method: str, path: str, host_port: str, headers: dict[str, str] | None = None,
                 body_length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
