"""ftcluster's load test against perf_analyzer 2.51, same server, model and request.

Starts one CPU tritonserver with the demo TEST model (or uses --url), then for each repeat and
each concurrency runs perf_analyzer and `ftcluster client bench` (order alternating between
repeats, so neither always runs on a warmer server) and prints the median throughputs and
the ratio client / perf_analyzer. Issue 7's goal: >= 0.8 at concurrency 16.

    python bench/client_vs_perf_analyzer.py [--protocol http,grpc] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from ftcluster.client import Endpoint, parse_steps, run_bench
from ftcluster.client.bench import prepare_load
from ftcluster.service.triton_local import perf_analyzer_env, perf_analyzer_path
from ftcluster.client.ready import http_get, model_path


def perf_analyzer_input(arrays: dict[str, np.ndarray], path: Path) -> None:
    """The client's exact request (batch 1) as perf_analyzer --input-data JSON."""
    entry: dict[str, Any] = {}
    for name, arr in arrays.items():
        row = arr[0]
        content = [v.decode() if isinstance(v, bytes) else v for v in row.ravel().tolist()]
        entry[name] = {"content": content, "shape": list(row.shape)}
    path.write_text(json.dumps({"data": [entry]}))


def run_perf_analyzer(pa: Path, url: str, protocol: str, model: str, concurrency: int,
                      input_json: Path, window_ms: int, workdir: Path, stability_pct: int) -> float:
    # perf_analyzer retries until 3 windows agree within stability_pct; on a small shared box
    # the default 10 % is often never reached, so the default here is looser (--pa-stability).
    out = workdir / f"pa-{protocol}-{concurrency}-{time.monotonic_ns()}.csv"
    cmd = [str(pa), "-m", model, "-u", url, "-i", protocol, "--input-data", str(input_json),
           "--concurrency-range", f"{concurrency}:{concurrency}", "-p", str(window_ms),
           "--max-trials", "10", "-s", str(stability_pct), "-f", str(out)]
    r = subprocess.run(cmd, env=perf_analyzer_env(), capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"perf_analyzer failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    return float(rows[0]["Inferences/Second"])


def server_successes(http_url: str, model: str) -> int:
    """Triton's own count of successful inferences of `model` (statistics extension)."""
    host, _, port = http_url.rpartition(":")
    _, body = http_get(host, int(port), model_path(model, "stats"), timeout=10)
    stats = json.loads(body)
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


def run_client(url: str, http_url: str, protocol: str, model: str, concurrency: int, warmup_s: float,
               duration_s: float, processes: int) -> float:
    before = server_successes(http_url, model)
    result = run_bench(Endpoint.parse(url, protocol), model, parse_steps(str(concurrency), None),
                       batch_size=1, warmup_s=warmup_s, duration_s=duration_s, processes=processes)
    served = server_successes(http_url, model) - before
    step = result.steps[0]
    if step.errors or not step.requests:
        raise RuntimeError(f"client bench failed: {step.first_error}")
    # The client only counts requests inside its window; the server saw those plus warm-up.
    if served < step.requests:
        raise RuntimeError(f"client counted {step.requests} requests, server served only {served}")
    return step.seq_per_s


def compare(urls: dict[str, str], model: str, protocols: list[str], concurrencies: list[int], repeats: int,
            window_s: float, processes: int, pa_stability: int) -> list[dict[str, Any]]:
    pa = perf_analyzer_path()
    if pa is None:
        sys.exit("perf_analyzer not found: pip install 'tritonclient[http,grpc]==2.51.0'")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ftc-pa-") as tmp:
        work = Path(tmp)
        for protocol in protocols:
            url = urls[protocol]
            import asyncio

            _, arrays, _, _ = asyncio.run(prepare_load(Endpoint.parse(url, protocol), model, 1, 8, 8, 0))
            input_json = work / "input.json"
            perf_analyzer_input(arrays, input_json)
            for c in concurrencies:
                client_runs, pa_runs = [], []
                for rep in range(repeats):
                    order = ("client", "pa") if rep % 2 == 0 else ("pa", "client")
                    for who in order:
                        if who == "pa":
                            pa_runs.append(run_perf_analyzer(pa, url, protocol, model, c, input_json,
                                                             int(window_s * 1000), work, pa_stability))
                        else:
                            client_runs.append(run_client(url, urls['http'], protocol, model, c, 1.0, window_s,
                                                          processes))
                cm, pm = statistics.median(client_runs), statistics.median(pa_runs)
                row = {"protocol": protocol, "concurrency": c, "client_infer_per_s": round(cm, 1),
                       "perf_analyzer_infer_per_s": round(pm, 1), "ratio": round(cm / pm, 3),
                       "client_runs": [round(x, 1) for x in client_runs],
                       "perf_analyzer_runs": [round(x, 1) for x in pa_runs]}
                rows.append(row)
                print(f"{protocol:5} c={c:<3} client {cm:9.1f}/s  perf_analyzer {pm:9.1f}/s  "
                      f"ratio {cm / pm:5.2f}   (client {row['client_runs']}, pa {row['perf_analyzer_runs']})",
                      flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use this server's HTTP HOST:PORT instead of starting one")
    ap.add_argument("--grpc-url", help="gRPC HOST:PORT of that server")
    ap.add_argument("--model", default="fastertransformer")
    ap.add_argument("--protocol", default="http", help="http, grpc or http,grpc")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=float, default=3.0, help="measurement window, seconds")
    ap.add_argument("--processes", type=int, default=1, help="client load processes")
    ap.add_argument("--pa-stability", type=int, default=50, help="perf_analyzer -s (percent)")
    ap.add_argument("--json", dest="json_out", help="write the rows as JSON here")
    args = ap.parse_args()
    protocols = [p.strip() for p in args.protocol.split(",") if p.strip()]
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    def go(urls: dict[str, str]) -> list[dict[str, Any]]:
        return compare(urls, args.model, protocols, concurrencies, args.repeats, args.window, args.processes,
                       args.pa_stability)

    if args.url:
        rows = go({"http": args.url, "grpc": args.grpc_url or args.url})
    else:
        from tests.triton_server import running_tritonserver

        repo = ROOT / "ftcluster" / "demo" / "model_repository"
        with tempfile.TemporaryDirectory(prefix="ftc-bench-") as logs, \
                running_tritonserver([repo], log_dir=Path(logs)) as server:
            print(f"tritonserver {server.server_id} on :{server.http_port} (http) :{server.grpc_port} (grpc), "
                  f"model {args.model}, batch 1, input 8, output 8", flush=True)
            rows = go({"http": server.http_url, "grpc": server.grpc_url})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
