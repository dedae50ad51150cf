"""Gateway throughput vs direct tritonclient calls: same server, same request, same concurrency.

    python bench/gateway_overhead.py [--concurrency 8] [--seconds 3] [--repeats 3] [--output-len 8]

Starts a CPU tritonserver on the demo TEST model and `ftcluster gateway` (uvicorn, its own
process) in front of it, then alternates two closed-loop phases per repeat:
  direct   tritonclient.http.aio (ftcluster.client's AsyncTriton.infer_arrays: build inputs,
           infer, decode outputs per request, as an application would)
  gateway  aiohttp POST /v1/generate {"input_ids": [...], "max_tokens": N}
Prints requests/s of both, and the overhead ratio direct/gateway per repeat and its median
(1.0 = no overhead; 2.0 = the gateway halves throughput). Both load generators and both servers
share this machine's cores, so the ratio includes the gateway's CPU cost, which is the point.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftcluster.client.endpoint import AsyncTriton, Endpoint
from tests.triton_server import free_ports, running_tritonserver

MODEL = "fastertransformer"


async def closed_loop(send: Callable[[], Awaitable[None]], concurrency: int, seconds: float) -> float:
    stop = time.monotonic() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await send()
            done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.monotonic() - t0)


async def run(triton_url: str, gateway_url: str, args: argparse.Namespace) -> list[tuple[float, float]]:
    ids = list(range(1, args.input_len + 1))
    arrays = {"input_ids": np.array([ids], dtype=np.uint32),
              "input_lengths": np.array([[len(ids)]], dtype=np.uint32),
              "request_output_len": np.array([[args.output_len]], dtype=np.uint32)}
    outputs = ["output_ids", "sequence_length"]
    body = {"input_ids": ids, "max_tokens": args.output_len}
    results = []
    async with AsyncTriton(Endpoint(triton_url), max_connections=args.concurrency) as triton, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as http:

        async def direct() -> None:
            got = await triton.infer_arrays(MODEL, arrays, outputs)
            assert got["output_ids"].shape[-1] == args.input_len + args.output_len

        async def gateway() -> None:
            async with http.post(f"{gateway_url}/v1/generate", json=body) as r:
                data = await r.json()
                assert r.status == 200, data
                assert len(data["output_ids"][0][0]) == args.input_len + args.output_len

        for send in (direct, gateway):  # warm-up: connections, the model's first batches
            await closed_loop(send, args.concurrency, 0.5)
        for i in range(args.repeats):
            d = await closed_loop(direct, args.concurrency, args.seconds)
            g = await closed_loop(gateway, args.concurrency, args.seconds)
            print(f"repeat {i + 1}: direct {d:8.1f} req/s  gateway {g:8.1f} req/s  ratio {d / g:.2f}", flush=True)
            results.append((d, g))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--input-len", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftc-gw-bench-") as tmp, \
            running_tritonserver([ROOT / "ftcluster" / "demo" / "model_repository"], log_dir=Path(tmp)) as server:
        (port,) = free_ports(1)
        gw = subprocess.Popen([sys.executable, "-m", "ftcluster", "gateway", "--triton", server.http_url,
                               "--model", MODEL, "--port", str(port), "--max-batch", "64"],
                              cwd=ROOT, stderr=subprocess.DEVNULL)
        try:
            import socket

            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if gw.poll() is not None or time.monotonic() > deadline:
                        print("gateway did not start", file=sys.stderr)
                        return 1
                    time.sleep(0.1)
            results = asyncio.run(run(server.http_url, f"http://127.0.0.1:{port}", args))
        finally:
            gw.terminate()
            gw.wait(timeout=15)
    ratios = [d / g for d, g in results]
    print(f"concurrency {args.concurrency}, {args.seconds:g} s x {args.repeats}: direct median "
          f"{statistics.median(d for d, _ in results):.1f} req/s, gateway median "
          f"{statistics.median(g for _, g in results):.1f} req/s")
    print(f"overhead ratio (direct/gateway, median of {len(ratios)}): {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
