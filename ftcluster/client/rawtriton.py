"""Triton's HTTP/REST protocol (KServe v2 + the binary tensor extension) over `rawhttp`'s pool.

For the gateway's per-request path: one pool of keep-alive connections shared by all
requests, a request is one JSON header plus the tensors' raw bytes, a response is sliced
into numpy arrays without copies. tritonclient.http.aio's infer (aiohttp, InferInput
objects, its JSON handling) was about a third of the gateway's CPU per request (cProfile,
see bench/README.md). The client commands keep using tritonclient (`endpoint.AsyncTriton`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, triton_to_np_dtype

from ftcluster.client.rawhttp import HttpError, HttpPool, Reply, request_head

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


def encode_infer(arrays: Mapping[str, np.ndarray], outputs: Sequence[str]) -> tuple[bytes, int]:
    """(body, JSON header length) of an infer request; every tensor travels as binary data."""
    inputs = []
    blobs = []
    for name, arr in arrays.items():
        raw = _tensor_bytes(arr)
        blobs.append(raw)
        inputs.append({"name": name, "shape": list(arr.shape), "datatype": _triton_dtype(arr.dtype),
                       "parameters": {"binary_data_size": len(raw)}})
    head = _dumps({"inputs": inputs,
                   "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs]})
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
                raise TritonError(f"output {o['name']}: BF16 is not supported here", 500)
            else:
                arr = np.frombuffer(chunk, dtype=_np_dtype(dtype))
        else:
            data = o.get("data", [])
            arr = np.array([d.encode() for d in data] if dtype == "BYTES" else data, dtype=_np_dtype(dtype))
        out[o["name"]] = arr.reshape(shape)
    return out


def _error_message(reply: Reply) -> str:
    try:
        return str(_loads(reply.body)["error"])
    except (ValueError, KeyError, TypeError):
        return reply.body[:300].decode(errors="replace") or f"HTTP {reply.status}"


class TritonHttp:
    """Infer, model config and readiness against one Triton HTTP endpoint.

    Inference shares one pool of at most `max_connections` connections; config and health
    requests have their own small pool, so a saturated gateway still answers its health check.
    """

    def __init__(self, host_port: str, timeout: float, max_connections: int | None = None):
        self.url = host_port
        self.pool = HttpPool(host_port, timeout, max_connections)
        self._control = HttpPool(host_port, timeout)
        self._infer_heads: dict[str, tuple[bytes, bytes]] = {}

    async def close(self) -> None:
        await self.pool.close()
        await self._control.close()

    async def _get(self, path: str, timeout: float | None) -> Reply:
        return await self._control.request(request_head("GET", path, self.url), timeout)

    async def ready(self, model: str | None = None, timeout: float | None = None) -> bool:
        """Server ready (model None) or model ready; HttpError when unreachable."""
        path = "/v2/health/ready" if model is None else f"/v2/models/{quote(model, safe='')}/ready"
        return (await self._get(path, timeout)).status == 200

    async def model_config(self, model: str, timeout: float | None = None) -> dict[str, Any]:
        reply = await self._get(f"/v2/models/{quote(model, safe='')}/config", timeout)
        if reply.status != 200:
            raise TritonError(_error_message(reply), reply.status)
        return dict(_loads(reply.body))

    async def infer(self, model: str, arrays: Mapping[str, np.ndarray], outputs: Sequence[str],
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """Output arrays; TritonError when Triton refuses, HttpError (HttpTimeout, ...) on the wire."""
        body, json_size = encode_infer(arrays, outputs)
        parts = self._infer_heads.get(model)
        if parts is None:
            head = request_head("POST", f"/v2/models/{quote(model, safe='')}/infer", self.url,
                                {"Content-Type": "application/octet-stream"})[:-2]
            parts = self._infer_heads[model] = (head + b"Inference-Header-Content-Length: ", b"\r\n\r\n")
        payload = b"%s%d\r\nContent-Length: %d%s%s" % (parts[0], json_size, len(body), parts[1], body)
        reply = await self.pool.request(payload, timeout)
        if reply.status != 200:
            raise TritonError(_error_message(reply), reply.status)
        size = reply.headers.get("inference-header-content-length")
        try:
            return decode_infer(reply.body, int(size) if size is not None else None)
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(f"cannot read Triton's response: {type(exc).__name__}: {exc}") from exc


__all__ = ["HttpError", "TritonError", "TritonHttp", "decode_infer", "encode_infer"]
