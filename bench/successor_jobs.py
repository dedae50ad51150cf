"""A serving run beyond one allocation: how long a lost node leaves it without service, and the
serving gap when it hands over before its time limit.

    python bench/successor_jobs.py [--repeats 3] [--requeue-repeats 1]

On the real Slurm test cluster (bare Slurm style, FT-shaped test model, liveness every 1 s,
deadline 1 s, 2 misses), per repeat:
- lost node: `launch --nodes 2 --keep-serving`, then rank 1's machine lost (its slurmd stopped,
  the job's processes there killed). Time from the loss to the successor's `serving`, split into
  finding it (the old job's `node_lost`) and the successor's submission to serving; against the
  first launch's own submission to serving, measured in the same repeat;
- lost batch host (`--requeue-repeats`): the same with rank 0's machine, which runs the job's
  supervisor: Slurm requeues the job after SlurmdTimeout and cred_expire (the bed's, printed);
- hand-over: `launch --nodes 1 --keep-serving` with a 2-minute limit and a 90 s lead. The serving
  gap is the time between the old rank 0's last moment of service (the hand-over, when it is
  asked to stop) and the successor's first (its `serving`), 0 when they overlap (goal 0 s); the
  overlap is reported too.
Prints medians of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
import yaml  # noqa: E402

from ftcluster.run.events import parse_events  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402


def ftc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True, timeout=300)


def launch(cluster: Path, nodes: int) -> dict[str, Any]:
    t0 = time.time()
    proc = ftc("launch", "--cluster", str(cluster), "--nodes", str(nodes), "--keep-serving", "--no-client", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    out["t_submit"] = t0
    return out


def status(run_id: str) -> dict[str, Any]:
    return json.loads(ftc("status", run_id, "--json").stdout)  # type: ignore[no-any-return]


def events(run_dir: str) -> list[Any]:
    path = Path(run_dir) / "state" / "events"
    return parse_events(path.read_text()) if path.is_file() else []


def first(evs: list[Any], kind: str, after: float = 0.0) -> float | None:
    return next((e.time for e in evs if e.kind == kind and e.time >= after), None)


def wait(pred: Any, timeout: float) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"not within {timeout:.0f} s")


def stop_chain(run_id: str) -> None:
    for _ in range(3):
        ftc("stop", run_id)
        time.sleep(2)
        st, live = status(run_id), False
        while st.get("successor") and st["successor"].get("run_id"):
            st = status(st["successor"]["run_id"])
            live = live or st["state"] in ("PENDING", "RUNNING")
        if not live:
            return


def successor_serving(run_id: str) -> tuple[str, float] | None:
    s = status(run_id).get("successor") or {}
    if not s.get("run_id"):
        return None
    run_dir = status(s["run_id"])["run_dir"]
    t = first(events(run_dir), "serving")
    return (run_dir, t) if t else None


def first_start(out: dict[str, Any]) -> float:
    """The first launch's submission to serving, from its own events (the job's start counted
    from the launcher's submit time)."""
    t = first(events(out["run_dir"]), "serving")
    assert t is not None
    return t - float(out["t_submit"])


def lost_node(tb: Any, cluster: Path, rank: int) -> dict[str, float]:
    out = launch(cluster, 2)
    run_id = out["run_id"]
    try:
        node = status(run_id)["nodes"][rank]
        with tb.node_lost(node, out["job_id"]):
            t0 = time.time()
            if rank == 0:
                ev = wait(lambda: [e for e in events(out["run_dir"]) if e.kind == "serving" and e.time > t0], 240)
                back = ev[0].time
                return {"loss_to_serving_s": back - t0, "first_launch_to_serving_s": first_start(out)}
            run_dir, back = wait(lambda: successor_serving(run_id), 120)
            found = first(events(out["run_dir"]), "node_lost")
            submitted = first(events(out["run_dir"]), "successor_submitted")
            assert found is not None and submitted is not None
            return {"loss_to_serving_s": back - t0, "finding_s": found - t0,
                    "found_to_submitted_s": submitted - found, "successor_submit_to_serving_s": back - submitted,
                    "first_launch_to_serving_s": first_start(out)}
    finally:
        stop_chain(run_id)


def hand_over(cluster: Path) -> dict[str, float]:
    out = launch(cluster, 1)
    run_id = out["run_id"]
    try:
        wait(lambda: (status(run_id).get("successor") or {}).get("handed_over"), 150)
        run_dir, new_serving = wait(lambda: successor_serving(run_id), 10)
        wait(lambda: first(events(out["run_dir"]), "done"), 60)   # the old job drained and ended
        old = events(out["run_dir"])
        handed = first(old, "handed_over")
        stopped = first(old, "servers_stopped", handed or 0.0)
        assert handed is not None and stopped is not None
        return {"gap_s": max(0.0, new_serving - handed), "overlap_s": max(0.0, handed - new_serving),
                "old_stopped_after_s": stopped - new_serving}
    finally:
        stop_chain(run_id)


def slurm_waits(config: str) -> str:
    """SlurmdTimeout and cred_expire, as `scontrol show config` prints them."""
    timeout = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", config, re.M)
    cred = re.search(r"cred_expire=(\d+)", config)
    return (f"SlurmdTimeout {timeout.group(1) if timeout else '?'} s, "
            f"cred_expire {cred.group(1) if cred else '120 (the default)'} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requeue-repeats", type=int, default=1)
    args = ap.parse_args()
    from tests.cluster.testbed import running_testbed

    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-successor-"))
    os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")

    def cluster(name: str, time_limit: str, lead: int) -> Path:
        spec = {"name": "bench", "scheduler": "slurm", "partition": "debug", "gpus_per_node": 1,
                "request_gpus": False, "exclusive": False, "workspace": str(tmp / "ws"), "time_limit": time_limit,
                "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5,
                           "liveness": {"interval": 1, "deadline": 1, "failures": 2}, "restarts": 2,
                           "restart_backoff": 1, "handover_lead": lead}}
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    runs: dict[str, list[dict[str, float]]] = {"lost node": [], "lost batch host": [], "hand-over": []}
    with running_testbed() as tb:
        waits = slurm_waits(tb.slurm(["scontrol", "show", "config"]).stdout)
        for i in range(args.repeats):
            runs["lost node"].append(lost_node(tb, cluster("long", "10", 0), 1))
            print(f"repeat {i + 1}: lost node {runs['lost node'][-1]}", file=sys.stderr)
            runs["hand-over"].append(hand_over(cluster("short", "2", 90)))
            print(f"repeat {i + 1}: hand-over {runs['hand-over'][-1]}", file=sys.stderr)
        for i in range(args.requeue_repeats):
            runs["lost batch host"].append(lost_node(tb, cluster("long", "10", 0), 0))
            print(f"repeat {i + 1}: lost batch host {runs['lost batch host'][-1]}", file=sys.stderr)
    med = report.medians(runs)
    n, h = med["lost node"], med["hand-over"]
    print(f"bare Slurm, test bed ({waits}); medians of {args.repeats}")
    print(f"lost node (rank 1's): serving again {n['loss_to_serving_s']:.1f} s after the loss "
          f"(finding it {n['finding_s']:.1f} s, submitting the successor {n['found_to_submitted_s']:.1f} s, "
          f"its start to serving {n['successor_submit_to_serving_s']:.1f} s); the first launch took {n['first_launch_to_serving_s']:.1f} s "
          f"from submission to serving: ratio {n['loss_to_serving_s'] / n['first_launch_to_serving_s']:.2f}")
    if "lost batch host" in med:
        b = med["lost batch host"]
        print(f"lost batch host (Slurm's requeue, {args.requeue_repeats} run(s)): serving again "
              f"{b['loss_to_serving_s']:.1f} s after the loss")
    print(f"hand-over before the time limit: serving gap {h['gap_s']:.2f} s (goal 0), both serving for "
          f"{h['overlap_s']:.2f} s; the old servers stopped {h['old_stopped_after_s']:.2f} s after the successor served")
    report.print_json(med, repeats=args.repeats)


if __name__ == "__main__":
    main()
