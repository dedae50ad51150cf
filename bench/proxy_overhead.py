"""What a private endpoint's proxy costs: the same server, request and client, direct to Triton
and through Caddy as `access: private` runs it (its config from ftcluster.plan.endpoint, the token
checked on every request), HTTP and gRPC.

    python bench/proxy_overhead.py [--seconds 3] [--repeats 3] [--model-ms 20]

One CPU tritonserver with the demo model and a copy that sleeps --model-ms per batch (standing
in for an FT forward pass, dynamic batching as in the demo); per repeat, alternating direct and
proxied phases:
  latency     c=1, the trivial model: the proxy's added latency per request (goal <= 0.5 ms
              median);
  throughput  c=16, the 20 ms model: req/s through the proxy against direct (goal >= 0.95x).
The client is ftcluster's own lean sender (one pre-encoded request, the response read, not
decoded), so the client's CPU stays out of the ratio as far as it can. Client, proxy and server
share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
from load import Result, closed_loop

from ftcluster.client.endpoint import AsyncTriton, Endpoint
from ftcluster.job.config import PROXY_TOKEN_ENV
from ftcluster.plan.endpoint import caddy_config_text, new_token, proxy_binary
from ftcluster.spec.cluster import Ports, Proxy
from tests.triton_server import free_ports, running_tritonserver, slow_demo_model

DEMO = ROOT / "ftcluster" / "demo"
TRIVIAL = "fastertransformer"
SLOW = "fastertransformer_slow"


@contextmanager
def caddy(triton: Ports, token: str, folder: Path) -> Iterator[Ports]:
    """Caddy with a private run's config in front of `triton`; yields its public ports."""
    http, grpc, metrics = free_ports(3)
    public = Ports(http=http, grpc=grpc, metrics=metrics)
    config = folder / "proxy.json"
    config.write_text(caddy_config_text(public, triton, Proxy()))
    env = {**os.environ, "HOME": str(folder), "XDG_CONFIG_HOME": str(folder), "XDG_DATA_HOME": str(folder),
           PROXY_TOKEN_ENV: token}
    proc = subprocess.Popen([proxy_binary(Proxy()), "run", "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        for port in (http, grpc):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("caddy did not start") from None
                    time.sleep(0.05)
        yield public
    finally:
        proc.terminate()
        proc.wait(timeout=15)


Results = dict[str, list[Result]]   # "<scenario> <protocol> <direct|proxy>" -> one Result per repeat


async def measure(direct: Ports, proxied: Ports, token: str, args: argparse.Namespace) -> Results:
    ids = list(range(1, 9))
    arrays = {"input_ids": np.array([ids], dtype=np.uint32),
              "input_lengths": np.array([[len(ids)]], dtype=np.uint32),
              "request_output_len": np.array([[8]], dtype=np.uint32)}
    outputs = ["output_ids", "sequence_length"]
    senders: dict[str, Callable[[], Awaitable[int]]] = {}
    clients = []
    for protocol in ("http", "grpc"):
        for how, ports, tok in (("direct", direct, None), ("proxy", proxied, token)):
            port = ports.http if protocol == "http" else ports.grpc
            client = AsyncTriton(Endpoint(f"127.0.0.1:{port}", protocol, 60.0, tok), max_connections=32)  # type: ignore[arg-type]
            clients.append(client)
            for scenario, model in (("latency", TRIVIAL), ("throughput", SLOW)):
                senders[f"{scenario} {protocol} {how}"] = client.fast_sender(model, arrays, outputs)

    def as_none(send: Callable[[], Awaitable[int]]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await send()
        return run

    results: Results = {name: [] for name in senders}
    try:
        for name, send in senders.items():   # warm-up: connections, the models' first batches
            await closed_loop(as_none(send), 16 if name.startswith("throughput") else 1, 0.5)
        for i in range(args.repeats):
            line = []
            for name, send in senders.items():
                res = await closed_loop(as_none(send), 16 if name.startswith("throughput") else 1, args.seconds)
                results[name].append(res)
                line.append(f"{name} {res.rate:.0f}/s p50 {res.p50_ms:.3f} ms")
            print(f"repeat {i + 1}: " + " | ".join(line), flush=True)
    finally:
        for client in clients:
            await client.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model-ms", type=float, default=20.0, help="the second model's time per batch")
    args = ap.parse_args()
    token = new_token()
    with tempfile.TemporaryDirectory(prefix="ftc-proxy-bench-") as tmp:
        repo = slow_demo_model(Path(tmp) / "repo", SLOW, args.model_ms)
        with running_tritonserver([DEMO / "model_repository", repo], log_dir=Path(tmp) / "logs") as server:
            triton = Ports(http=server.http_port, grpc=server.grpc_port, metrics=server.metrics_port)
            with caddy(triton, token, Path(tmp)) as public:
                results = asyncio.run(measure(triton, public, token, args))
    runs = {name: [{k: v for k, v in r._asdict().items() if v is not None} for r in rows]
            for name, rows in results.items()}
    med = report.medians(runs)
    print(f"\n{args.seconds:g} s x {args.repeats} repeats; medians (latency: c=1, <1 ms model; throughput: c=16, "
          f"{args.model_ms:g} ms/batch):")
    report.table(med, [("rate", "req/s", ".1f"), ("p50_ms", "p50 ms", ".3f"), ("client_ms", "client CPU ms/req", ".3f")])
    for protocol in ("http", "grpc"):
        added = med[f"latency {protocol} proxy"]["p50_ms"] - med[f"latency {protocol} direct"]["p50_ms"]
        ratio = med[f"throughput {protocol} proxy"]["rate"] / med[f"throughput {protocol} direct"]["rate"]
        print(f"{protocol}: the proxy adds {added:.3f} ms at c=1 (goal <= 0.5); throughput at c=16 "
              f"{ratio:.3f}x direct (goal >= 0.95)")
    report.print_json(med, seconds=args.seconds, repeats=args.repeats, model_ms=args.model_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
