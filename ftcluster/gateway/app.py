"""The FastAPI application: POST /v1/generate, GET /healthz, OpenAPI at /docs.

Per request the gateway does as little as it can (bench/gateway_overhead.py measures it):
- one pool of keep-alive connections to Triton for all requests (`rawtriton.TritonHttp`:
  the binary tensor extension, no tritonclient/aiohttp objects per request);
- the model's input layout is worked out once, from its config read at start-up (or, when
  Triton was not up yet, on the first request, so the gateway may start before the server);
- POST /v1/generate is answered in front of FastAPI's middleware, routing and dependency
  machinery: the body is validated by pydantic-core straight from JSON bytes
  (`GenerateRequest.model_validate_json`, the same strict rules and 422 details FastAPI
  gives) and the response is a dict encoded once (orjson when installed). The route is
  still declared on the FastAPI app, with the same handler behind it, for the OpenAPI docs
  and for paths the shortcut does not match (a mounted app).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from ftcluster.client.modelio import parse_config
from ftcluster.client.rawhttp import HttpError, HttpTimeout
from ftcluster.client.rawtriton import TritonError, TritonHttp
from ftcluster.gateway import request as rq
from ftcluster.gateway.schema import GenerateRequest, GenerateResponse, Health
from ftcluster.client.tokenizer import Tokenizer, load_tokenizer

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover - orjson comes with the gateway extra
    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

log = logging.getLogger("ftcluster.gateway")
GENERATE_PATH = "/v1/generate"
_JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(frozen=True)
class GatewayConfig:
    triton: str                      # HOST:PORT of Triton's HTTP endpoint
    model: str
    tokenizer: str | None = None     # "bytes" or a transformers name/path
    timeout_s: float = 60.0          # per request, Triton included; then 504
    limits: rq.Limits = field(default_factory=rq.Limits)
    max_connections: int = 256       # to Triton, at once
    max_body_bytes: int | None = None  # request bodies above are a 413; None: from the limits
    token: str | None = field(default=None, repr=False)   # a private run's token, sent to its proxy
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)   # an https endpoint's trust

    @property
    def body_limit(self) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        # Room for max_batch prompts of max_input_tokens ids (or escaped characters) each.
        return max(1 << 20, self.limits.max_batch * self.limits.max_input_tokens * 16)


def _detail(status: int, message: str) -> tuple[int, bytes]:
    return status, _dumps({"detail": message})


def _validation_detail(exc: ValidationError) -> tuple[int, bytes]:
    """422 with FastAPI's error list (loc starts with "body"), every value JSON-safe."""
    errors = []
    for err in exc.errors(include_url=False):
        item: dict[str, Any] = {"type": err["type"], "loc": ["body", *err["loc"]], "msg": err["msg"]}
        if err["type"] != "json_invalid":
            item["input"] = err.get("input")
        if "ctx" in err:
            item["ctx"] = {k: v if isinstance(v, str | int | float | bool | None) else str(v)
                           for k, v in err["ctx"].items()}
        errors.append(item)
    try:
        return 422, _dumps({"detail": errors})
    except TypeError:  # an input orjson cannot encode: say what is wrong without echoing it
        return 422, _dumps({"detail": [{k: v for k, v in e.items() if k != "input"} for e in errors]})


def _is_json(content_type: bytes | None) -> bool:
    if not content_type:
        return False
    mime = content_type.split(b";", 1)[0].strip().lower()
    return mime == b"application/json" or (mime.startswith(b"application/") and mime.endswith(b"+json"))


class _State:
    def __init__(self, cfg: GatewayConfig, tok: Tokenizer | None):
        self.cfg = cfg
        self.tok = tok
        # Our own deadline (timeout_s) answers 504; connections are capped at max_connections.
        self.triton = TritonHttp(cfg.triton, cfg.timeout_s, cfg.max_connections, token=cfg.token,
                                 ssl_context=cfg.ssl_context)
        self.layout: rq.Layout | None = None
        self._lock = asyncio.Lock()

    async def load_layout(self) -> rq.Layout:
        async with self._lock:
            if self.layout is None:
                try:
                    cfg = await self.triton.model_config(self.cfg.model, min(10.0, self.cfg.timeout_s))
                except (TritonError, HttpError) as exc:
                    raise rq.RequestError(f"model {self.cfg.model!r} is not available on Triton at "
                                          f"{self.cfg.triton}: {exc}", 503) from None
                self.layout = rq.Layout.of(parse_config(cfg))
        return self.layout

    async def generate(self, req: GenerateRequest) -> tuple[int, bytes]:
        """(HTTP status, JSON body) for a validated request; never raises for a bad request."""
        try:
            lay = self.layout or await self.load_layout()
            prepared = rq.build(lay, req, self.tok, self.cfg.limits)
        except rq.RequestError as exc:
            return _detail(exc.status, str(exc))
        try:
            got = await self.triton.infer(self.cfg.model, prepared.arrays, prepared.outputs, self.cfg.timeout_s)
        except HttpTimeout:
            return _detail(504, f"Triton did not answer within {self.cfg.timeout_s:g} s")
        except TritonError as exc:  # Triton refused the request
            return _detail(502, f"Triton: {exc}")
        except HttpError as exc:    # cannot reach Triton, or it dropped the connection: retry later
            return _detail(503, f"Triton: {exc}")
        return 200, _dumps(rq.response(lay, prepared, got, self.tok))

    async def generate_raw(self, scope: Scope, receive: Receive) -> tuple[int, bytes] | None:
        """The shortcut's request: read, validate, generate; None when the client went away."""
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), None)
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.cfg.body_limit:
                return _detail(413, f"request body above {self.cfg.body_limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if not _is_json(content_type):
            return 422, _dumps({"detail": [{"type": "content_type", "loc": ["body"],
                                            "msg": "send a JSON body with Content-Type: application/json"}]})
        try:
            req = GenerateRequest.model_validate_json(body)
        except ValidationError as exc:
            return _validation_detail(exc)
        return await self.generate(req)


class GatewayAPI(FastAPI):
    """FastAPI with POST /v1/generate answered before its middleware stack (see the module doc)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == GENERATE_PATH and scope["method"] == "POST" \
                and hasattr(self.state, "gw"):
            await self._generate(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: _State = self.state.gw
        try:
            answer = await state.generate_raw(scope, receive)
        except Exception:  # what ServerErrorMiddleware would do: log it, answer 500
            log.exception("POST %s failed", GENERATE_PATH)
            answer = _detail(500, "Internal Server Error")
        if answer is None:
            return
        status, body = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [*_JSON_HEADERS, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


def create_app(cfg: GatewayConfig) -> GatewayAPI:
    tok = load_tokenizer(cfg.tokenizer)  # a bad tokenizer fails here, before serving

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = _State(cfg, tok)
        try:
            await state.load_layout()
        except rq.RequestError as exc:
            if exc.status != 503:
                await state.triton.close()
                raise
        app.state.gw = state
        try:
            yield
        finally:
            del app.state.gw
            await state.triton.close()

    app = GatewayAPI(title="ftcluster gateway", version="1",
                     description=f"Generation API in front of Triton model {cfg.model!r} at {cfg.triton}.",
                     lifespan=lifespan)

    @app.exception_handler(rq.RequestError)
    async def _request_error(_: Request, exc: rq.RequestError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.post(GENERATE_PATH, response_model=GenerateResponse,
              responses={400: {"description": "a request the model cannot take"},
                         413: {"description": "request body too large"},
                         422: {"description": "malformed request"}, 502: {"description": "Triton failed"},
                         503: {"description": "Triton or the model is unavailable"},
                         504: {"description": "timed out"}})
    async def generate(body: GenerateRequest, request: Request) -> Response:
        # Reached only where GatewayAPI's shortcut does not match (a mounted app); same answers.
        state: _State = request.app.state.gw
        status, data = await state.generate(body)
        return Response(data, status_code=status, media_type="application/json")

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def healthz(request: Request) -> Any:
        state: _State = request.app.state.gw
        timeout = min(5.0, cfg.timeout_s)
        try:
            server = await state.triton.ready(timeout=timeout)
            model = server and await state.triton.ready(cfg.model, timeout=timeout)
        except HttpError as exc:  # unreachable, refused, timed out: all "not ready"
            body = Health(status="unavailable", triton="unreachable", model="unknown",
                          detail=f"{type(exc).__name__}: {exc}"[:300])
            return JSONResponse(body.model_dump(), status_code=503)
        ok = bool(server and model)
        body = Health(status="ok" if ok else "unavailable", triton="ready" if server else "not ready",
                      model="ready" if model else "not ready")
        return body if ok else JSONResponse(body.model_dump(), status_code=503)

    return app
