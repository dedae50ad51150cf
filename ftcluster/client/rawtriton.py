"""Triton's HTTP/REST protocol (KServe v2 + the binary tensor extension) over `rawhttp`'s pool.

The inference hot paths only: the gateway (a request is one JSON header plus the tensors' raw
bytes, a response is sliced into numpy arrays without copies) and the load test (one encoded
request sent again and again, `infer_payload`). Against tritonclient.http.aio on the test
model at realistic sizes it sends 1.5-4x the requests per second for a quarter of the client
CPU (bench/http_transport.py, bench/README.md). Everything else -- the client commands,
config reads, readiness -- uses tritonclient (`endpoint.AsyncTriton`) or `triton_probe`.
"""

from __future__ import annotations

import json
import ssl
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, triton_to_np_dtype

from ftcluster.client.rawhttp import HttpError, HttpPool, Reply, request_head
from ftcluster.client.ready import READY_PATH, model_path

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson comes with the gateway extra
    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    _loads = json.loads


class TritonError(Exception):
    """Triton answered with an error (HTTP status >= 400); `status` is its HTTP status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


_TRITON_DTYPE: dict[np.dtype[Any], str] = {}
_NP_DTYPE: dict[str, Any] = {}


def _triton_dtype(dtype: np.dtype[Any]) -> str:
    name = _TRITON_DTYPE.get(dtype)
    if name is None:
        name = _TRITON_DTYPE[dtype] = str(np_to_triton_dtype(dtype))
    return name


def _np_dtype(name: str) -> Any:
    dtype = _NP_DTYPE.get(name)
    if dtype is None:
        dtype = _NP_DTYPE[name] = np.object_ if name == "BYTES" else triton_to_np_dtype(name)
    return dtype


def _tensor_bytes(arr: np.ndarray) -> bytes:
    if arr.dtype == np.object_:  # BYTES: 4-byte little-endian length, then the bytes, per element
        parts: list[bytes] = []
        for item in arr.flat:
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts += (struct.pack("<I", len(raw)), raw)
        return b"".join(parts)
    return np.ascontiguousarray(arr).tobytes()


def encode_infer(arrays: Mapping[str, np.ndarray], outputs: Sequence[str],
                 parameters: Mapping[str, Any] | None = None) -> tuple[bytes, int]:
    """(body, JSON header length) of an infer request; every tensor travels as binary data;
    `parameters`: the request's own (a sequence's id, start and end)."""
    inputs = []
    blobs = []
    for name, arr in arrays.items():
        raw = _tensor_bytes(arr)
        blobs.append(raw)
        inputs.append({"name": name, "shape": list(arr.shape), "datatype": _triton_dtype(arr.dtype),
                       "parameters": {"binary_data_size": len(raw)}})
    request: dict[str, Any] = {"inputs": inputs,
                               "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs]}
    if parameters:
        request["parameters"] = dict(parameters)
    head = _dumps(request)
    return head + b"".join(blobs), len(head)


def decode_infer(body: bytes, json_size: int | None) -> dict[str, np.ndarray]:
    """Output name -> array, from binary outputs (sliced from `body`) or JSON `data`."""
    header = _loads(body[:json_size] if json_size is not None else body)
    offset = json_size or 0
    view = memoryview(body)
    out: dict[str, np.ndarray] = {}
    for o in header.get("outputs", []):
        dtype, shape = o["datatype"], o["shape"]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            chunk = view[offset:offset + size]
            offset += size
            if dtype == "BYTES":
                arr = deserialize_bytes_tensor(bytes(chunk))
            elif dtype == "BF16":
                # An FT encoder with data_type bf16 answers in BF16, which numpy lacks: a bfloat16
                # is the upper half of a float32 (what tritonclient's deserialize_bf16_tensor gives).
                arr = (np.frombuffer(chunk, "<u2").astype("<u4") << 16).view("<f4")
            else:
                arr = np.frombuffer(chunk, dtype=_np_dtype(dtype))
        else:
            data = o.get("data", [])
            arr = np.array([d.encode() for d in data] if dtype == "BYTES" else data, dtype=_np_dtype(dtype))
        out[o["name"]] = arr.reshape(shape)
    return out


def error_message(reply: Reply) -> str:
    """Triton's error text of a failed reply."""
    try:
        return str(_loads(reply.body)["error"])
    except (ValueError, KeyError, TypeError):
        return reply.body[:300].decode(errors="replace") or f"HTTP {reply.status}"


class TritonHttp:
    """Infer, model config and readiness against one Triton HTTP endpoint.

    Inference shares one pool of at most `max_connections` connections; config and health
    requests have their own small pool, so a saturated gateway still answers its health check.
    """

    def __init__(self, host_port: str, timeout: float, max_connections: int | None = None,
                 token: str | None = None, ssl_context: ssl.SSLContext | None = None):
        self.url = host_port
        self.pool = HttpPool(host_port, timeout, max_connections, ssl_context)
        self._control = HttpPool(host_port, timeout, ssl_context=ssl_context)
        self._infer_heads: dict[str, bytes] = {}
        # A private run's proxy passes a request on only with the run's token.
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    async def close(self) -> None:
        await self.pool.close()
        await self._control.close()

    async def _get(self, path: str, timeout: float | None) -> Reply:
        return await self._control.request(request_head("GET", path, self.url, self._auth), timeout)

    async def ready(self, model: str | None = None, timeout: float | None = None) -> bool:
        """Server ready (model None) or model ready; HttpError when unreachable."""
        path = READY_PATH if model is None else model_path(model)
        return (await self._get(path, timeout)).status == 200

    async def model_config(self, model: str, timeout: float | None = None) -> dict[str, Any]:
        reply = await self._get(model_path(model, "config"), timeout)
        if reply.status != 200:
            raise TritonError(error_message(reply), reply.status)
        return dict(_loads(reply.body))

    def infer_payload(self, model: str, body: bytes, json_size: int | None) -> bytes:
        """The bytes of an infer request with an encoded body (`encode_infer`, tritonclient's
        generate_request_body); send them with `self.pool.request` as often as wanted."""
        head = self._infer_heads.get(model)
        if head is None:  # the head without its final blank line; the lengths follow
            head = self._infer_heads[model] = request_head(
                "POST", model_path(model, "infer"), self.url,
                {"Content-Type": "application/octet-stream", **self._auth})[:-2]
        size = b"" if json_size is None else b"Inference-Header-Content-Length: %d\r\n" % json_size
        return b"%s%sContent-Length: %d\r\n\r\n%s" % (head, size, len(body), body)

    async def infer(self, model: str, arrays: Mapping[str, np.ndarray], outputs: Sequence[str],
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """Output arrays; TritonError when Triton refuses, HttpError (HttpTimeout, ...) on the wire."""
        body, json_size = encode_infer(arrays, outputs)
        reply = await self.pool.request(self.infer_payload(model, body, json_size), timeout)
        if reply.status != 200:
            raise TritonError(error_message(reply), reply.status)
        size = reply.headers.get("inference-header-content-length")
        try:
            return decode_infer(reply.body, int(size) if size is not None else None)
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(f"cannot read Triton's response: {type(exc).__name__}: {exc}") from exc


__all__ = ["HttpError", "TritonError", "TritonHttp", "decode_infer", "encode_infer", "error_message"]
