"""The FastAPI application: POST /v1/generate, GET /healthz, OpenAPI at /docs.

One shared tritonclient.http.aio client (the client package's `AsyncTriton`) for all requests,
so connections to Triton are pooled. The model's config is read at start-up and, when Triton
was not up yet, again on the next request, so the gateway may start before the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ftcluster.client.endpoint import AsyncTriton, ClientError, Endpoint
from ftcluster.client.modelio import ModelIO, parse_config
from ftcluster.gateway import request as rq
from ftcluster.gateway.schema import GenerateRequest, GenerateResponse, Health
from ftcluster.gateway.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class GatewayConfig:
    triton: str                      # HOST:PORT of Triton's HTTP endpoint
    model: str
    tokenizer: str | None = None     # "bytes" or a transformers name/path
    timeout_s: float = 60.0          # per request, Triton included; then 504
    limits: rq.Limits = field(default_factory=rq.Limits)
    max_connections: int = 256


class _State:
    def __init__(self, cfg: GatewayConfig, tok: Tokenizer | None):
        self.cfg = cfg
        self.tok = tok
        # Our own deadline (asyncio.timeout) answers 504; the transport's is only a backstop.
        self.triton = AsyncTriton(Endpoint.parse(cfg.triton, "http", cfg.timeout_s + 30), cfg.max_connections)
        self.io: ModelIO | None = None
        self._lock = asyncio.Lock()

    async def model_io(self) -> ModelIO:
        if self.io is None:
            async with self._lock:
                if self.io is None:
                    try:
                        cfg = await self.triton.model_config(self.cfg.model)
                    except ClientError as exc:
                        raise rq.RequestError(f"model {self.cfg.model!r} is not available on Triton at "
                                              f"{self.cfg.triton}: {exc}", 503) from None
                    io = parse_config(cfg)
                    rq.check_model(io)
                    self.io = io
        return self.io


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def create_app(cfg: GatewayConfig) -> FastAPI:
    tok = load_tokenizer(cfg.tokenizer)  # a bad tokenizer fails here, before serving

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = _State(cfg, tok)
        app.state.gw = state
        try:
            await state.model_io()
        except rq.RequestError as exc:
            if exc.status != 503:
                await state.triton.close()
                raise
        try:
            yield
        finally:
            await state.triton.close()

    app = FastAPI(title="ftcluster gateway", version="1",
                  description=f"Generation API in front of Triton model {cfg.model!r} at {cfg.triton}.",
                  lifespan=lifespan)

    @app.exception_handler(rq.RequestError)
    async def _request_error(_: Request, exc: rq.RequestError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.post("/v1/generate", response_model=GenerateResponse,
              responses={400: {"description": "a request the model cannot take"},
                         422: {"description": "malformed request"}, 502: {"description": "Triton failed"},
                         503: {"description": "Triton or the model is unavailable"},
                         504: {"description": "timed out"}})
    async def generate(body: GenerateRequest, request: Request) -> Any:
        state: _State = request.app.state.gw
        io = await state.model_io()
        prepared = rq.build(io, body, state.tok, cfg.limits)
        try:
            async with asyncio.timeout(cfg.timeout_s):
                got = await state.triton.infer_arrays(cfg.model, prepared.arrays, prepared.outputs)
        except TimeoutError:
            return _error(504, f"Triton did not answer within {cfg.timeout_s:g} s")
        except ClientError as exc:
            # Cannot reach Triton: 503 (retry later); Triton refused the request: 502.
            cause = type(exc.__cause__).__name__
            unreachable = isinstance(exc.__cause__, ConnectionError) or "Connect" in cause or "Disconnected" in cause
            return _error(503 if unreachable else 502, f"Triton: {exc}")
        return rq.response(io, prepared, got, state.tok)

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def healthz(request: Request) -> Any:
        state: _State = request.app.state.gw
        client = state.triton._client  # tritonclient's own calls: health is not a ClientError path
        try:
            async with asyncio.timeout(min(5.0, cfg.timeout_s)):
                server = await client.is_server_ready()
                model = server and await client.is_model_ready(cfg.model)
        except Exception as exc:  # noqa: BLE001  (unreachable, refused, timed out: all "not ready")
            body = Health(status="unavailable", triton="unreachable", model="unknown",
                          detail=f"{type(exc).__name__}: {exc}"[:300])
            return JSONResponse(body.model_dump(), status_code=503)
        ok = bool(server and model)
        body = Health(status="ok" if ok else "unavailable", triton="ready" if server else "not ready",
                      model="ready" if model else "not ready")
        return body if ok else JSONResponse(body.model_dump(), status_code=503)

    return app
