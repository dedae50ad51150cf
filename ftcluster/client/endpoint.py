"""One place that knows the difference between Triton's HTTP and gRPC asyncio clients.

Everything else in ftcluster.client speaks numpy arrays and plain dict configs. The asyncio
clients are used for identity tests too, so there is one code path, and because a single
event loop keeps many requests in flight for the load test without Python threads.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor

from ftcluster.errors import UserError
from ftcluster.extras import need

Protocol = Literal["http", "grpc"]
PROTOCOLS: tuple[Protocol, ...] = ("http", "grpc")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[^\s:/\[\]]+):(\d{1,5})$")


@dataclass(frozen=True)
class Endpoint:
    url: str                 # HOST:PORT, no scheme
    protocol: Protocol = "http"
    timeout_s: float = 60.0
    token: str | None = None   # a private run's bearer token (its proxy refuses requests without)
    tls: bool = False          # https (gRPC over TLS): a run whose proxy has proxy.tls_cert
    ca: str | None = None      # a certificate to trust besides the system's (the run's own)

    def __repr__(self) -> str:   # never the token
        return (f"Endpoint({self.url!r}, {self.protocol!r}, {self.timeout_s!r}, "
                f"token={'<hidden>' if self.token else None}, tls={self.tls!r})")

    def ssl_context(self) -> ssl.SSLContext:
        """The system's trust, and the run's own certificate (a self-signed one works)."""
        ctx = ssl.create_default_context()
        if self.ca:
            try:
                ctx.load_verify_locations(cafile=self._readable_ca())
            except ssl.SSLError as exc:
                raise self._ca_problem(exc) from None
        return ctx

    def root_certificates(self) -> str | None:
        """gRPC's trust (tritonclient takes a file): the run's certificate where there is one,
        else gRPC's default roots."""
        return self._readable_ca() if self.ca else None

    def _readable_ca(self) -> str:
        assert self.ca
        try:
            Path(self.ca).read_bytes()
        except OSError as exc:
            raise self._ca_problem(exc) from None
        return self.ca

    def _ca_problem(self, exc: Exception) -> UserError:
        return UserError(f"cannot read the certificate {self.ca}: {getattr(exc, 'strerror', None) or exc}",
                         field="proxy.tls_cert")

    @property
    def headers(self) -> dict[str, str] | None:
        """What every request carries: the token, as HTTP's Authorization or gRPC's metadata."""
        if not self.token:
            return None
        return {"authorization" if self.protocol == "grpc" else "Authorization": f"Bearer {self.token}"}

    @staticmethod
    def parse(url: str, protocol: str = "http", timeout_s: float = 60.0, token: str | None = None,
              tls: bool = False, ca: str | None = None, option: str = "--url") -> Endpoint:
        """HOST:PORT, or a URL: https:// and grpcs:// ask for TLS."""
        if protocol not in PROTOCOLS:
            raise UserError(f"unknown protocol {protocol!r}", field="--protocol", hint="http or grpc")
        tls = tls or bool(re.match(r"^(https|grpcs)://", url.strip()))
        bare = re.sub(r"^(https?|grpcs?)://", "", url.strip()).rstrip("/")
        m = _HOST_PORT.fullmatch(bare)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise UserError(f"{url!r} is not HOST:PORT", field=option, hint="e.g. localhost:8000")
        return Endpoint(bare, protocol, timeout_s, token or None, tls, ca)  # type: ignore[arg-type]


# Correlation ids: unique per process (pid in the high bits) so that several load processes
# and clients never share a sequence slot; 0 means "no sequence" to Triton.
_SEQUENCE_IDS = itertools.count((os.getpid() << 32) + random.randrange(1, 1 << 31))


def next_sequence_id() -> int:
    return next(_SEQUENCE_IDS)


class ClientError(Exception):
    """A request failed on the server or the wire (not a user mistake in the options)."""


def _message(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        return str(exc.message() or exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class AsyncTriton:
    """A thin asyncio facade over tritonclient.http.aio / tritonclient.grpc.aio."""

    def __init__(self, endpoint: Endpoint, max_connections: int = 100):
        self.endpoint = endpoint
        self.protocol = endpoint.protocol

        if self.protocol == "http":
            mod = need("tritonclient.http", "the Triton client over HTTP")
            # optional extra: client (tritonclient[http]: gevent)
            from tritonclient.http import aio

            self._mod: Any = mod
            self._client: Any = aio.InferenceServerClient(
                endpoint.url, conn_limit=max_connections, conn_timeout=endpoint.timeout_s,
                **({"ssl": True, "ssl_context": endpoint.ssl_context()} if endpoint.tls else {}))
        else:
            gmod = need("tritonclient.grpc", "the Triton client over gRPC")
            # optional extra: client (tritonclient[grpc]: grpcio)
            import tritonclient.grpc.aio as gaio

            self._mod = gmod
            self._client = gaio.InferenceServerClient(
                endpoint.url, **({"ssl": True, "root_certificates": endpoint.root_certificates()} if endpoint.tls else {}))
        self._headers = endpoint.headers
        self._max_connections = max_connections
        self._closers: list[Callable[[], Awaitable[Any]]] = []

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for closer in self._closers:
            await closer()
        self._closers.clear()
        await self._client.close()

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self.endpoint.timeout_s)
        except (TimeoutError, InferenceServerException, OSError) as exc:
            raise ClientError(f"{what}: {_message(exc)}") from exc
        except Exception as exc:  # aiohttp/grpc raise their own connection errors
            if type(exc).__module__.split(".")[0] in ("aiohttp", "grpc"):
                raise ClientError(f"{what}: {_message(exc)}") from exc
            raise

    async def check_model(self, model: str) -> None:
        """UserError with a clear message when the server is unreachable or lacks the model."""
        where = f"{self.protocol}://{self.endpoint.url}"
        try:
            live = await self._call("server live", self._client.is_server_live(headers=self._headers))
        except ClientError as exc:
            if "status: 401" in str(exc):   # gRPC: the proxy's answer, as grpc words it
                raise self._refused(where) from None
            raise UserError(f"cannot reach Triton at {where}: {exc}", field="--url",
                            hint="check host, port and --protocol (HTTP and gRPC use different ports)") from None
        if not live:
            if self.protocol == "http" and await self._http_status("/v2/health/live") == 401:
                raise self._refused(where)
            raise UserError(f"Triton at {where} is not live", field="--url")
        try:
            ready = await self._call("model ready", self._client.is_model_ready(model, headers=self._headers))
        except ClientError:
            ready = False
        if not ready:
            names = await self.model_names()
            raise UserError(f"model {model!r} is not ready on {where}", field="--model",
                            hint=f"ready models: {', '.join(names) or 'none'}")

    def _refused(self, where: str) -> UserError:
        if self.endpoint.token:
            return UserError(f"the proxy at {where} refuses this token", field="--token",
                             hint="the run's own token: `ftcluster token RUN`, or --run RUN")
        return UserError(f"{where} is a private run's endpoint: it wants the run's token", field="--token",
                         hint="--run RUN, --token-file FILE or $FTCLUSTER_TOKEN (`ftcluster token RUN`)")

    async def _http_status(self, path: str) -> int | None:
        # startup: the raw HTTP client only for an http endpoint (the gRPC one never needs it)
        from ftcluster.client.rawhttp import HttpError, HttpPool, request_head

        pool = HttpPool(self.endpoint.url, self.endpoint.timeout_s,
                        ssl_context=self.endpoint.ssl_context() if self.endpoint.tls else None)
        try:
            return (await pool.request(request_head("GET", path, self.endpoint.url))).status
        except HttpError:
            return None
        finally:
            await pool.close()

    async def model_names(self) -> list[str]:
        try:
            index = await self._call("repository index", self._client.get_model_repository_index(
                headers=self._headers, **({"as_json": True} if self.protocol == "grpc" else {})))
        except ClientError:
            return []
        rows = index.get("models", []) if isinstance(index, dict) else index
        return sorted(r["name"] for r in rows if r.get("state", "READY") == "READY")

    async def model_config(self, model: str) -> dict[str, Any]:
        """The model's config as a dict with snake_case keys (both protocols)."""
        if self.protocol == "grpc":
            got = await self._call(f"config of {model}", self._client.get_model_config(
                model, headers=self._headers, as_json=True))
            return dict(got.get("config", got))
        return dict(await self._call(f"config of {model}", self._client.get_model_config(model, headers=self._headers)))

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> list[Any]:
        """InferInput objects; build once and reuse for repeated requests (they are not mutated)."""
        inputs = []
        for name, arr in arrays.items():
            inp = self._mod.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
            if self.protocol == "http":
                inp.set_data_from_numpy(arr, binary_data=True)
            else:
                inp.set_data_from_numpy(arr)
            inputs.append(inp)
        return inputs

    def make_outputs(self, names: list[str]) -> list[Any]:
        if self.protocol == "http":
            return [self._mod.InferRequestedOutput(n, binary_data=True) for n in names]
        return [self._mod.InferRequestedOutput(n) for n in names]

    async def infer(self, model: str, inputs: list[Any], outputs: list[Any] | None = None,
                    sequence_id: int = 0) -> Any:
        # The hot path of the load test: native timeouts, no wait_for task per request.
        # sequence_id: a one-request sequence (start and end) under that correlation id.
        seq: dict[str, Any] = ({"sequence_id": sequence_id, "sequence_start": True, "sequence_end": True}
                               if sequence_id else {})
        try:
            if self.protocol == "grpc":
                return await self._client.infer(model, inputs, outputs=outputs, headers=self._headers,
                                                client_timeout=self.endpoint.timeout_s, **seq)
            return await self._client.infer(model, inputs, outputs=outputs, headers=self._headers, **seq)
        except (TimeoutError, InferenceServerException, OSError) as exc:
            raise ClientError(f"infer {model}: {_message(exc)}") from exc
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("aiohttp", "grpc"):
                raise ClientError(f"infer {model}: {_message(exc)}") from exc
            raise

    async def infer_arrays(self, model: str, arrays: dict[str, np.ndarray],
                           output_names: list[str], sequence: bool = False) -> dict[str, np.ndarray]:
        """Output arrays by name. `sequence`: the model batches sequences (FT's interactive GPT):
        the request is a sequence of its own with a fresh correlation id, and the pseudo batch
        dimension (1) in front of every output is taken off."""
        result = await self.infer(model, self.make_inputs(arrays), self.make_outputs(output_names),
                                  sequence_id=next_sequence_id() if sequence else 0)
        out: dict[str, np.ndarray] = {}
        for name in output_names:
            arr = result.as_numpy(name)
            if arr is not None:
                out[name] = arr[0] if sequence and arr.ndim >= 1 and arr.shape[0] == 1 else arr
        return out

    def fast_sender(self, model: str, arrays: dict[str, np.ndarray],
                    output_names: list[str], sequence: bool = False) -> Callable[[], Awaitable[int]]:
        """An async callable sending the same request again and again; returns response bytes.

        The request is encoded once (tritonclient's encoders) and the response is read but not
        decoded: per-request Python work is what limits a Python load generator, and the
        identity test, not the load test, checks content.
        """
        if sequence:  # every request needs its own correlation id: no pre-encoded request
            inputs, outputs = self.make_inputs(arrays), self.make_outputs(output_names)

            async def send_sequence() -> int:
                result = await self.infer(model, inputs, outputs, sequence_id=next_sequence_id())
                return sum(result.as_numpy(n).nbytes for n in output_names if result.as_numpy(n) is not None)

            return send_sequence
        if self.protocol == "http":
            return self._http_sender(model, arrays, output_names)
        return self._grpc_sender(model, arrays, output_names)

    def _http_sender(self, model: str, arrays: dict[str, np.ndarray],
                     output_names: list[str]) -> Callable[[], Awaitable[int]]:
        # startup: the raw HTTP client only for an http endpoint (the gRPC one never needs it)
        from ftcluster.client.rawhttp import HttpError
        from ftcluster.client.rawtriton import TritonHttp, error_message

        body, json_size = self._mod.InferenceServerClient.generate_request_body(
            self.make_inputs(arrays), outputs=self.make_outputs(output_names))
        # The hand-written keep-alive client: it sends up to 5.8x the requests per second of
        # tritonclient's for a third to a sixth of its CPU (bench/http_transport.py).
        triton = TritonHttp(self.endpoint.url, self.endpoint.timeout_s, token=self.endpoint.token,
                            ssl_context=self.endpoint.ssl_context() if self.endpoint.tls else None)
        self._closers.append(triton.close)
        payload = triton.infer_payload(model, body, json_size)

        async def send() -> int:
            try:
                reply = await triton.pool.request(payload)
            except HttpError as exc:
                raise ClientError(f"infer {model}: {exc}") from exc
            if reply.status != 200:
                raise ClientError(f"infer {model}: HTTP {reply.status}: {error_message(reply)[:300]}")
            return len(reply.body)

        return send

    def _grpc_sender(self, model: str, arrays: dict[str, np.ndarray],
                     output_names: list[str]) -> Callable[[], Awaitable[int]]:
        # optional extra: client (tritonclient[grpc]: grpcio)
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        request = service_pb2.ModelInferRequest(model_name=model)
        for name, arr in arrays.items():
            tensor = request.inputs.add()
            tensor.name = name
            tensor.datatype = np_to_triton_dtype(arr.dtype)
            tensor.shape.extend(arr.shape)
            if arr.dtype == np.object_:
                request.raw_input_contents.append(serialize_byte_tensor(arr).item())
            else:
                request.raw_input_contents.append(np.ascontiguousarray(arr).tobytes())
        for name in output_names:
            request.outputs.add().name = name
        channel = grpc.aio.insecure_channel(self.endpoint.url, options=[
            ("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)])
        self._closers.append(channel.close)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        timeout = self.endpoint.timeout_s
        metadata = tuple((self.endpoint.headers or {}).items()) or None

        async def send() -> int:
            try:
                resp = await stub.ModelInfer(request, timeout=timeout, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                raise ClientError(f"infer {model}: {exc.code().name}: {exc.details()}") from exc
            return sum(len(r) for r in resp.raw_output_contents)

        return send
