"""Gateway throughput vs direct tritonclient calls: same server, same request, same concurrency.

    python bench/gateway_overhead.py [--concurrency 8] [--seconds 3] [--repeats 3] [--model-ms 20]
                                     [--compare DIR]

Starts one CPU tritonserver with two models and one `ftcluster gateway` (uvicorn, its own
process) per model, then per repeat and per model alternates closed-loop phases:
  direct   tritonclient.http.aio (ftcluster.client's AsyncTriton.infer_arrays: build inputs,
           infer, decode outputs per request, as an application would)
  gateway  aiohttp POST /v1/generate {"input_ids": [...], "max_tokens": N}
The models:
  trivial  the demo TEST model as shipped: answers in well under a millisecond, so the ratio
           is the gateway's own CPU cost per request;
  model    the same model in a copied repository (temp dir; the demo is not touched) that
           sleeps --model-ms per batch, standing in for an FT forward pass (dynamic batching
           as in the demo config), so the ratio is what a real model would see.
--compare DIR adds a third phase: the gateway of another checkout (e.g. `mkdir /tmp/old &&
git archive REV ftcluster | tar -x -C /tmp/old`), same models and client: before/after
numbers from one run.
Prints per phase and repeat: req/s, median latency, CPU per request of this process (the
load generator: tritonclient for direct, aiohttp + JSON for the gateway) and of the gateway
process (/proc); then medians and the overhead ratio direct/gateway (1.0 = no overhead;
2.0 = the gateway halves throughput). Load generators and servers share this machine's cores,
so the ratio includes the gateway's CPU; its CPU per request is the steadier number.
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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NamedTuple

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
from load import Result, closed_loop

from ftcluster.client.endpoint import AsyncTriton, Endpoint
from tests.triton_server import free_ports, running_tritonserver, slow_demo_model

DEMO = ROOT / "ftcluster" / "demo"
TRIVIAL = "fastertransformer"
SLOW = "fastertransformer_slow"
@contextmanager
def gateway(src: Path, triton_url: str, model: str) -> Iterator[tuple[str, int]]:
    """`ftcluster gateway` of the checkout at `src` (its own process); yields its URL and pid."""
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "gateway", "--triton", triton_url,
                             "--model", model, "--port", str(port), "--max-batch", "64"],
                            cwd=src, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway of {src} for {model} did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=15)


class Phase(NamedTuple):
    name: str
    send: Callable[[], Awaitable[None]]
    pid: int | None = None   # the gateway process, for its CPU time


Results = dict[str, dict[str, list[Result]]]   # scenario -> phase -> one Result per repeat


async def run(phases: dict[str, list[Phase]], args: argparse.Namespace) -> Results:
    results: Results = {scenario: {ph.name: [] for ph in plist} for scenario, plist in phases.items()}
    for plist in phases.values():  # warm-up: connections, the models' first batches
        for ph in plist:
            await closed_loop(ph.send, args.concurrency, 0.5)
    for i in range(args.repeats):
        for scenario, plist in phases.items():
            line = []
            for ph in plist:
                res = await closed_loop(ph.send, args.concurrency, args.seconds, ph.pid)
                results[scenario][ph.name].append(res)
                cpu = f" gw cpu {res.cpu_ms:.2f}" if res.cpu_ms is not None else ""
                line.append(f"{ph.name} {res.rate:6.0f}/s p50 {res.p50_ms:5.1f} ms"
                            f" client cpu {res.client_ms:.2f}{cpu}")
            direct = results[scenario]["direct"][-1].rate
            ratios = " ".join(f"ratio {ph.name} {direct / results[scenario][ph.name][-1].rate:.2f}"
                              for ph in plist if ph.name != "direct")
            print(f"repeat {i + 1} {scenario:7s}: " + " | ".join(line) + " | " + ratios, flush=True)
    return results


async def main_async(args: argparse.Namespace, triton_url: str,
                     gateways: dict[str, dict[str, tuple[str, int]]]) -> Results:
    ids = list(range(1, args.input_len + 1))
    arrays = {"input_ids": np.array([ids], dtype=np.uint32),
              "input_lengths": np.array([[len(ids)]], dtype=np.uint32),
              "request_output_len": np.array([[args.output_len]], dtype=np.uint32)}
    outputs = ["output_ids", "sequence_length"]
    body = {"input_ids": ids, "max_tokens": args.output_len}
    want = args.input_len + args.output_len
    async with AsyncTriton(Endpoint(triton_url), max_connections=args.concurrency) as triton, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        def direct(model: str) -> Callable[[], Awaitable[None]]:
            async def send() -> None:
                got = await triton.infer_arrays(model, arrays, outputs)
                assert got["output_ids"].shape[-1] == want
            return send

        def via(url: str) -> Callable[[], Awaitable[None]]:
            async def send() -> None:
                async with http.post(f"{url}/v1/generate", json=body) as r:
                    data = await r.json()
                    assert r.status == 200, data
                    assert len(data["output_ids"][0][0]) == want
            return send

        phases: dict[str, list[Phase]] = {}
        for scenario, model in (("trivial", TRIVIAL), ("model", SLOW)):
            phases[scenario] = [Phase("direct", direct(model))]
            for name, (url, pid) in gateways[model].items():
                phases[scenario].append(Phase(name, via(url), pid))
        return await run(phases, args)


def summary(results: Results, args: argparse.Namespace) -> None:
    print(f"\nconcurrency {args.concurrency}, input {args.input_len} / output {args.output_len} tokens, "
          f"{args.seconds:g} s x {args.repeats} repeats; medians (trivial: <1 ms, model: "
          f"{args.model_ms:g} ms/batch):")
    runs = {f"{scenario} {phase}": [{k: v for k, v in r._asdict().items() if v is not None} for r in rows]
            for scenario, by_phase in results.items() for phase, rows in by_phase.items()}
    med = report.medians(runs)
    report.table(med, [("rate", "req/s", ".1f"), ("p50_ms", "p50 ms", ".2f"),
                       ("client_ms", "client CPU ms/req", ".2f"), ("cpu_ms", "gateway CPU ms/req", ".2f")])
    report.print_ratios(med, "rate", [(f"{scenario} direct", f"{scenario} {phase}")
                                      for scenario, by_phase in results.items() for phase in by_phase
                                      if phase != "direct"], what="req/s")
    report.print_json(med, concurrency=args.concurrency, seconds=args.seconds, repeats=args.repeats,
                      input_len=args.input_len, output_len=args.output_len, model_ms=args.model_ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--input-len", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--model-ms", type=float, default=20.0, help="the second model's time per batch")
    ap.add_argument("--compare", type=Path, default=None, metavar="DIR",
                    help="also measure the gateway of the checkout in DIR (before/after)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftc-gw-bench-") as tmp:
        repo = slow_demo_model(Path(tmp) / "repo", SLOW, args.model_ms)
        with running_tritonserver([DEMO / "model_repository", repo], log_dir=Path(tmp) / "logs") as server, \
                ExitStack() as stack:
            gateways: dict[str, dict[str, tuple[str, int]]] = {}
            for model in (TRIVIAL, SLOW):
                gateways[model] = {"gateway": stack.enter_context(gateway(ROOT, server.http_url, model))}
                if args.compare is not None:
                    gateways[model]["compare"] = stack.enter_context(
                        gateway(args.compare.resolve(), server.http_url, model))
            results = asyncio.run(main_async(args, server.http_url, gateways))
    summary(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
