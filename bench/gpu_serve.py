"""Serve the test model on real GPUs through ftcluster, per parallel plan, in one run.

    python bench/gpu_serve.py [--repeats 3] [--plans 1x1,2x1,1x2] [--duration 5] [--out DIR]

On a machine with CUDA GPUs, torch, Open MPI's mpirun and ftcluster's dependencies. For each
plan TPxPP (tp = gpus_per_node, pp = nodes; scheduler `local`, the ranks under mpirun), each
repeat: `ftcluster launch --keep-serving --json` (time to ready = its `ready` phase, from
submit), `ftcluster client identity` (the first 1x1 run saves the reference with --save, every
other run is checked --against it), `ftcluster client bench` (tokens/s, closed loop), then
`ftcluster stop` and nvidia-smi's compute processes (must be none). Before the plans:
`ftcluster preflight` for 1 node x 2 GPUs and 2 nodes x 1 GPU. Prints per plan the medians of
time to ready and tokens/s, tokens/s relative to 1x1, the identity results and what
nvidia-smi showed after each teardown; writes everything as JSON to --out. Exits 1 when a
launch, an identity check or a teardown failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def sh(argv: list[str], timeout: float = 600) -> tuple[int, str, str]:
    env = dict(os.environ, **SAFE_ENV, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False)
    return p.returncode, p.stdout, p.stderr


def ftc(*args: str, timeout: float = 600) -> tuple[int, str, str]:
    return sh([sys.executable, "-m", "ftcluster", *args], timeout)


def gpu_apps() -> list[str]:
    rc, out, _ = sh(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                     "--format=csv,noheader"])
    return [ln.strip() for ln in out.splitlines() if ln.strip()] if rc == 0 else [f"nvidia-smi rc {rc}"]


def write_cluster(folder: Path, tp: int, base_port: int) -> Path:
    path = folder / f"gpu-{tp}.yaml"
    path.write_text(json.dumps({
        "name": f"gpu-local-{tp}", "scheduler": "local", "gpus_per_node": tp, "max_nodes": 8,
        "workspace": str(folder / "runs"),
        "ports": {"http": base_port, "grpc": base_port + 1, "metrics": base_port + 2},
        "server": {"binary": "auto", "ready_timeout": 120, "exit_grace": 10},
        "env": dict(SAFE_ENV),
    }))
    return path


def parse_json(text: str) -> dict[str, Any]:
    start = text.find("{")
    return json.loads(text[start:]) if start >= 0 else {}


def one_run(tp: int, pp: int, repeat: int, folder: Path, ref: Path, args: argparse.Namespace) -> dict[str, Any]:
    cluster = write_cluster(folder, tp, 19000 + 100 * repeat + 10 * tp + pp)
    res: dict[str, Any] = {"plan": f"{tp}x{pp}", "repeat": repeat}
    rc, out, err = ftc("launch", "--cluster", str(cluster), "--nodes", str(pp), "--keep-serving", "--json",
                       timeout=400)
    launch = parse_json(out)
    res["launch_rc"], res["ready_s"] = rc, (launch.get("phases") or {}).get("ready")
    res["failure"] = launch.get("failure") or (None if rc == 0 else (err.strip().splitlines() or ["?"])[-1])
    run_id, url = launch.get("run_id"), launch.get("endpoint")
    try:
        if rc == 0 and url:
            save = ["--save", str(ref)] if not ref.exists() else ["--against", str(ref)]
            irc, iout, _ = ftc("client", "identity", "--url", url, "--batch-size", "4", "--input-len", "16",
                               "--output-len", "16", "--json", *save)
            ident = parse_json(iout)
            res["identity_rc"] = irc
            res["identity"] = [c["name"] for c in ident.get("checks", []) if not c["ok"]] or "PASS"
            res["identity_role"] = save[0]
            res["tokens_row0"] = (ident.get("sample") or {}).get("output_ids")
            brc, bout, berr = ftc("client", "bench", "--url", url, "--concurrency", args.concurrency,
                               "--duration", str(args.duration), "--warmup", "1", "--input-len", "16",
                               "--output-len", "16", "--json")
            bench = parse_json(bout)
            res["bench_rc"] = brc
            if brc:
                res["bench_err"] = berr.strip().splitlines()[-5:]
            res["tokens_per_s"] = {str(s["value"]): s["tokens_per_s"] for s in bench.get("steps", [])}
            res["p50_ms"] = {str(s["value"]): s["latency_ms"]["p50"] for s in bench.get("steps", [])}
    finally:
        if run_id:
            src, _, _ = ftc("stop", run_id, timeout=120)
            res["stop_rc"] = src
        time.sleep(1.0)   # the driver releases a killed process's context asynchronously
        res["gpu_apps_after"] = gpu_apps()
        rank_logs = sorted((folder / "runs").glob(f"{run_id}/logs/server-rank*.log")) if run_id else []
        res["engine"] = [ln.split("] ", 1)[-1] for p in rank_logs[:1]
                         for ln in p.read_text(errors="replace").splitlines() if "CUDA test decoder" in ln]
        if res.get("failure") and run_id:
            client_log = sorted((folder / "runs").glob(f"{run_id}/logs/client.log"))
            res["log_tail"] = {p.name: p.read_text(errors="replace").splitlines()[-15:]
                               for p in [*client_log, *rank_logs]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--plans", default="1x1,2x1,1x2", help="TPxPP, comma separated; 1x1 first is the reference")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-preflight", action="store_true")
    ap.add_argument("--preflight-plans", default="2x1,1x2",
                    help="GPUSxNODES for the preflights, comma separated (1x1 on a one-GPU machine)")
    args = ap.parse_args()
    plans = [tuple(int(x) for x in p.split("x")) for p in args.plans.split(",")]
    folder = Path(args.out or tempfile.mkdtemp(prefix="ftc-gpu-bench-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FTCLUSTER_STATE_DIR", str(folder / "state"))
    # Resumable: a --out folder that holds an earlier call's gpu_serve.json (and its 1x1
    # reference) goes on from there; preflights and (plan, repeat) runs done are not run again.
    saved = folder / "gpu_serve.json"
    report: dict[str, Any] = json.loads(saved.read_text()) if saved.is_file() else {
        "gpus": sh(["nvidia-smi", "-L"])[1].strip().splitlines(), "gpu_apps_before": gpu_apps(),
        "preflight": {}, "runs": []}
    _, out, _ = sh([sys.executable, "-c", "import torch; print(torch.__version__, torch.cuda.nccl.version())"])
    report["torch"] = out.strip()
    _, out, _ = sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    report["driver"] = out.strip().splitlines()[0] if out.strip() else None

    def save() -> None:
        saved.write_text(json.dumps(report, indent=2, default=str) + "\n")

    if not args.no_preflight:
        for tp, nodes in (tuple(int(x) for x in p.split("x")) for p in args.preflight_plans.split(",")):
            if report["preflight"].get(f"{nodes}x{tp}", {}).get("rc") == 0:
                continue
            cluster = write_cluster(folder, tp, 18500)
            prc, pout, perr = ftc("preflight", "--cluster", str(cluster), "--nodes", str(nodes), "--json", timeout=300)
            pre = parse_json(pout)
            report["preflight"][f"{nodes}x{tp}"] = {"rc": prc, "summary": {k: v for k, v in pre.items()
                                                                         if k != "ranks"} if pre else perr[-500:]}
            print(f"preflight {nodes} node(s) x {tp} GPU(s): rc {prc}", flush=True)
            save()
    ref = folder / "identity-1x1.json"
    for repeat in range(args.repeats):
        for tp, pp in plans:   # interleaved, so drift hits every plan alike
            if any(r["plan"] == f"{tp}x{pp}" and r["repeat"] == repeat for r in report["runs"]):
                continue
            res = one_run(tp, pp, repeat, folder, ref, args)
            report["runs"].append(res)
            save()
            print(json.dumps({k: v for k, v in res.items() if k != "log_tail"}), flush=True)
            if res.get("log_tail"):
                print(json.dumps(res["log_tail"], indent=1), flush=True)

    summary = {}
    base_tps: dict[str, float] = {}
    for tp, pp in plans:
        runs = [r for r in report["runs"] if r["plan"] == f"{tp}x{pp}"]
        ready = [r["ready_s"] for r in runs if r.get("ready_s") is not None]
        tps: dict[str, list[float]] = {}
        for r in runs:
            for c, v in (r.get("tokens_per_s") or {}).items():
                tps.setdefault(c, []).append(v)
        med = {c: statistics.median(v) for c, v in tps.items()}
        if (tp, pp) == plans[0]:
            base_tps = med
        summary[f"{tp}x{pp}"] = {
            "ready_s_median": statistics.median(ready) if ready else None,
            "tokens_per_s_median": med,
            "vs_first_plan": {c: round(v / base_tps[c], 3) for c, v in med.items() if base_tps.get(c)},
            "identity": [r.get("identity") for r in runs],
            "gpu_apps_after_teardown": sorted({a for r in runs for a in r.get("gpu_apps_after", [])}),
            "launch_failures": [r["failure"] for r in runs if r.get("failure")],
        }
    report["summary"] = summary
    save()
    print(json.dumps({"gpus": report["gpus"], "torch": report["torch"], "summary": summary}, indent=2))
    bad = any(s["launch_failures"] or s["gpu_apps_after_teardown"] or any(i != "PASS" for i in s["identity"])
              for s in summary.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
