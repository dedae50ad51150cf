"""What replicas behind one endpoint give and cost, on real runs: `ftcluster launch --replicas 2`
(local style, each member one CPU tritonserver with the demo model behind its own proxy, the
front's Caddy before them), measured with ftcluster's lean sender.

    python bench/replicas.py [--seconds 3] [--repeats 3] [--model-ms 20] [--kills 3]

  latency     c=1, the trivial model: the balancer's added latency per request, through the
              front against one member's own endpoint (goal <= 0.5 ms median);
  throughput  c=16, each request 20 ms longer on the model (FTCLUSTER_TEST_SLOW_NODE): 2 members
              through the balancer against 1 member through it and 1 member direct, same run
              (on this CPU machine the cores bound it: report it);
  failover    a member's tritonserver SIGKILLed: seconds until the front shows it out of
              rotation (goal <= server.liveness.interval), and until it is back.
Client, balancer, proxies and servers share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
from load import Result, closed_loop

from ftcluster.client.endpoint import AsyncTriton, Endpoint
from tests.launch_helpers import free_port_base

MODEL = "fastertransformer"


def ftc(env: dict[str, str], *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, env=env,
                         timeout=300)
    if out.returncode:
        raise SystemExit(f"ftcluster {' '.join(args)} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout) if "--json" in args else {}


def launch(folder: Path, env: dict[str, str], interval: float) -> tuple[str, dict[str, Any]]:
    base = free_port_base(ranks=7)
    spec = {"name": "bench", "scheduler": "local", "gpus_per_node": 1, "workspace": str(folder / "ws"),
            "ports": {"http": base, "grpc": base + 1, "metrics": base + 2}, "balancer": {"port_step": 20},
            "server": {"binary": "auto", "ready_timeout": 60, "exit_grace": 5, "restart_backoff": 1, "restarts": 100,
                       "liveness": {"interval": interval, "deadline": interval, "failures": 2}}}
    (folder / "cluster.yaml").write_text(yaml.safe_dump(spec))
    out = ftc(env, "launch", "--cluster", str(folder / "cluster.yaml"), "--nodes", "1", "--keep-serving",
              "--no-client", "--replicas", "2", "--json")
    return str(out["run_id"]), ftc(env, "status", str(out["run_id"]), "--json")


async def measure(urls: dict[str, str], concurrency: int, seconds: float) -> dict[str, Result]:
    ids = list(range(1, 9))
    arrays = {"input_ids": np.array([ids], dtype=np.uint32), "input_lengths": np.array([[8]], dtype=np.uint32),
              "request_output_len": np.array([[8]], dtype=np.uint32)}
    out: dict[str, Result] = {}
    for name, url in urls.items():
        client = AsyncTriton(Endpoint(url, "http", 60.0, None), max_connections=32)
        try:
            send = client.fast_sender(MODEL, arrays, ["output_ids", "sequence_length"])

            async def run() -> None:
                await send()
            await closed_loop(run, concurrency, 0.5)   # warm-up
            out[name] = await closed_loop(run, concurrency, seconds)
        finally:
            await client.close()
    return out


def repeat(runs: dict[str, list[dict[str, float]]], urls: dict[str, str], concurrency: int,
           args: argparse.Namespace) -> None:
    """Each endpoint in turn, `args.repeats` times: rate and median latency into `runs`."""
    for i in range(args.repeats):
        res = asyncio.run(measure(urls, concurrency, args.seconds))
        for k, r in res.items():
            runs.setdefault(k, []).append({"rate": r.rate, "p50_ms": r.p50_ms})
        print(f"repeat {i + 1}: " + " | ".join(f"{k} {r.rate:.0f}/s p50 {r.p50_ms:.3f} ms" for k, r in res.items()),
              flush=True)


def tritonserver_of(run_id: str) -> int:
    for line in subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines():
        if "bin/tritonserver" in line and f"--id=ftc-{run_id}-rank0" in line:
            return int(line.split()[0])
    raise SystemExit(f"no tritonserver of {run_id}")


def in_rotation(set_dir: Path, run_dir: str) -> bool:
    try:
        rot = json.loads((set_dir / "state" / "rotation.json").read_text())
    except (OSError, ValueError):
        return False
    return any(m["run_dir"] == run_dir and m["in"] for m in rot.get("members", []))


def failover(status: dict[str, Any], env: dict[str, str], kills: int) -> list[dict[str, float]]:
    set_dir = Path(status["run_dir"])
    member = status["replicas"][1]
    run_dir = ftc(env, "status", member["run_id"], "--json")["run_dir"]
    found = []
    for _ in range(kills):
        os.kill(tritonserver_of(member["run_id"]), signal.SIGKILL)
        t0 = time.monotonic()
        while in_rotation(set_dir, run_dir):
            time.sleep(0.01)
        out = time.monotonic() - t0
        while not in_rotation(set_dir, run_dir):
            time.sleep(0.05)
        found.append({"out_s": out, "back_s": time.monotonic() - t0})
        print(f"failover: out of rotation {out:.2f} s after the kill, back after {found[-1]['back_s']:.1f} s",
              flush=True)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model-ms", type=float, default=20.0)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--interval", type=float, default=2.0, help="server.liveness.interval of the members")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ftc-replicas-bench-") as tmp:
        env = {**os.environ, "FTCLUSTER_STATE_DIR": str(Path(tmp) / "state")}
        # The trivial model: latency at c=1, and failover.
        fast = Path(tmp) / "fast"
        fast.mkdir()
        set_id, st = launch(fast, env, args.interval)
        try:
            repeat(runs, {"latency front": st["endpoint"], "latency member": st["replicas"][0]["endpoint"]}, 1, args)
            fails = failover(st, env, args.kills)
        finally:
            ftc(env, "stop", set_id)
        # Every request 20 ms longer (a stand-in for an FT forward pass): throughput at c=16.
        slow = Path(tmp) / "slow"
        slow.mkdir()
        slow_env = {**env, "FTCLUSTER_TEST_SLOW_NODE": f"rank0@{args.model_ms / 1000:g}"}
        set_id, st = launch(slow, slow_env, args.interval)
        try:
            direct = st["replicas"][0]["endpoint"]
            repeat(runs, {"throughput 2 via front": st["endpoint"], "throughput 1 direct": direct}, 16, args)
            ftc(env, "stop", set_id, "--replica", "1")
            repeat(runs, {"throughput 1 via front": st["endpoint"], "throughput 1 direct": direct}, 16, args)
        finally:
            ftc(env, "stop", set_id)
    med = report.medians(runs)
    print(f"\n{args.seconds:g} s x {args.repeats} repeats; medians:")
    report.table(med, [("rate", "req/s", ".1f"), ("p50_ms", "p50 ms", ".3f")])
    added = med["latency front"]["p50_ms"] - med["latency member"]["p50_ms"]
    r2 = med["throughput 2 via front"]["rate"]
    print(f"the balancer adds {added:.3f} ms at c=1 (goal <= 0.5); at c=16 ({args.model_ms:g} ms a request): "
          f"2 replicas via the front {r2 / med['throughput 1 via front']['rate']:.2f}x 1 via the front, "
          f"{r2 / med['throughput 1 direct']['rate']:.2f}x 1 direct ({os.cpu_count()} cores)")
    outs = sorted(f["out_s"] for f in fails)
    print(f"failover: out of rotation after a median {outs[len(outs) // 2]:.2f} s (goal <= {args.interval:g} s, "
          f"the liveness interval); back in after {sorted(f['back_s'] for f in fails)[len(fails) // 2]:.1f} s")
    report.print_json(med, seconds=args.seconds, repeats=args.repeats, model_ms=args.model_ms, failover=fails)
    return 0


if __name__ == "__main__":
    sys.exit(main())
