"""A serving run's life on a real GPU: samples under load, a frozen rank found and the world
restarted, the same tokens after it, nothing left on the GPU.

    python bench/gpu_serving_life.py [--out DIR] [--plan 1x1] [--freeze-rank 0] [--freeze-at 60] [--duration 8]

On a machine with a CUDA GPU, torch, and ftcluster's dependencies (bench/gpu_serve.py says how).
One run of the test model's CUDA path, plan TPxPP (default 1x1; scheduler `local`),
server.metrics_interval 1 and a liveness probe every 2 s (deadline 5 s, 2 misses),
`FTCLUSTER_TEST_FREEZE_NODE=rank<R>@N`: rank R freezes (alive, silent) at its N-th request. Steps: `client identity --save` (the reference),
`client bench` under load through the freeze (requests hang, then fail when the world is
killed), until `status` shows the restart and the run serving again; `client identity
--against` the reference; `top --json`; `stop`; nvidia-smi's compute processes after. Writes
gpu_serving_life.json, the run's gpu-rank0.csv (nvidia-smi under load) and metrics.jsonl to
--out. Exits 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_serve import SAFE_ENV, ftc, gpu_apps, parse_json   # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plan", default="1x1", help="TPxPP (tp = GPUs per node, pp = nodes)")
    ap.add_argument("--freeze-rank", type=int, default=0)
    ap.add_argument("--freeze-at", type=int, default=60, help="the rank freezes at this request")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of load before and through the freeze")
    args = ap.parse_args()
    tp, pp = (int(x) for x in args.plan.split("x"))
    folder = Path(args.out or tempfile.mkdtemp(prefix="ftc-gpu-life-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FTCLUSTER_STATE_DIR", str(folder / "state"))
    cluster = folder / "gpu.yaml"
    cluster.write_text(json.dumps({
        "name": "gpu-life", "scheduler": "local", "gpus_per_node": tp, "workspace": str(folder / "runs"),
        "ports": {"http": 19700, "grpc": 19701, "metrics": 19702},
        "server": {"binary": "auto", "ready_timeout": 180, "exit_grace": 10, "restarts": 2, "restart_backoff": 1,
                   "metrics_interval": 1, "liveness": {"interval": 2, "deadline": 5, "failures": 2}},
        "env": dict(SAFE_ENV)}))
    os.environ["FTCLUSTER_TEST_FREEZE_NODE"] = f"rank{args.freeze_rank}@{args.freeze_at}"
    report: dict[str, Any] = {"plan": args.plan, "frozen": f"rank{args.freeze_rank}@{args.freeze_at}",
                              "gpu_apps_before": gpu_apps()}
    ok = True
    rc, out, err = ftc("launch", "--cluster", str(cluster), "--nodes", str(pp), "--keep-serving", "--no-client",
                       "--json", timeout=400)
    launch = parse_json(out)
    run_id, url = launch.get("run_id"), launch.get("endpoint")
    report["launch"] = {"rc": rc, "ready_s": (launch.get("phases") or {}).get("ready"), "failure": launch.get("failure"),
                        "err": err[-1500:] if rc else ""}
    if rc or not url:
        print(json.dumps(report, indent=1))
        return 1
    ref = folder / "identity.json"
    common = ["--batch-size", "4", "--input-len", "16", "--output-len", "16"]
    try:
        irc, iout, _ = ftc("client", "identity", "--url", url, *common, "--json", "--save", str(ref))
        report["identity_before"] = {"rc": irc}
        t0 = time.monotonic()
        brc, bout, _ = ftc("client", "bench", "--url", url, "--concurrency", "8", "--duration", str(args.duration),
                           "--warmup", "1", "--timeout", "60", "--json", timeout=300)
        bench = parse_json(bout)
        report["bench"] = {"rc": brc, "steps": [{k: s.get(k) for k in ("value", "requests", "errors", "tokens_per_s")}
                                                for s in bench.get("steps", [])]}
        # The freeze came mid-load: the job finds it and restarts the world.
        st: dict[str, Any] = {}
        while time.monotonic() - t0 < 240:
            st = parse_json(ftc("status", run_id, "--json")[1])
            if st.get("restarts") and st.get("phase") == "serving":
                break
            time.sleep(1)
        report["restart"] = {"restarts": st.get("restarts"), "phase": st.get("phase"), "health": st.get("health"),
                             "seen_after_s": round(time.monotonic() - t0, 1)}
        ok = ok and bool(st.get("restarts")) and st.get("phase") == "serving" and \
            "hung" in str((st.get("restarts") or [{}])[0].get("cause"))
        irc, iout, _ = ftc("client", "identity", "--url", url, *common, "--json", "--against", str(ref))
        ident = parse_json(iout)
        report["identity_after"] = {"rc": irc, "failed": [c["name"] for c in ident.get("checks", []) if not c["ok"]]}
        ok = ok and irc == 0
        time.sleep(3)   # a few samples of the restarted world
        top = parse_json(ftc("top", run_id, "--json")[1])
        report["top"] = top.get("runs")
        run_dir = Path(st.get("run_dir") or "")
        for name in ("gpu-rank0.csv", "metrics.jsonl"):
            for src in sorted(run_dir.glob(f"state/{name}*")) + sorted(run_dir.glob(f"logs/incarnation-*/{name}")):
                shutil.copy(src, folder / src.name)
        gpu_lines = (run_dir / "state" / "gpu-rank0.csv").read_text().splitlines() \
            if (run_dir / "state" / "gpu-rank0.csv").is_file() else []
        report["gpu_samples"] = {"lines": len(gpu_lines), "last": gpu_lines[-3:],
                                 "max_util": max((float(ln.split(", ")[3]) for ln in gpu_lines
                                                  if ln.split(", ")[3].replace(".", "").isdigit()), default=None)}
        ok = ok and bool(gpu_lines)
    finally:
        src, _, _ = ftc("stop", run_id, timeout=120)
        report["stop_rc"] = src
        time.sleep(1.0)
        report["gpu_apps_after"] = gpu_apps()
        ok = ok and src == 0 and not report["gpu_apps_after"]
    report["ok"] = ok
    (folder / "gpu_serving_life.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
