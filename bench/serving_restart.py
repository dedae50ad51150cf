"""A serving run that stays up: how fast a frozen world is found and torn down, how fast it
serves again, what clients lose meanwhile, and what the probe costs.

    python bench/serving_restart.py [--repeats 3] [--interval 1] [--deadline 1] [--failures 2]
                                    [--fault freeze|stop] [--rank R] [--style slurm|local]

On the real Slurm test cluster (bare Slurm style, 2 nodes, FT-shaped test model; or the local
style on this machine), per repeat: `ftcluster launch --keep-serving --no-client` with a rank set
to fail at its FREEZE_AT-th request, while a client sends the probe's own request every 0.2 s
(2 s timeout). The fault: `freeze` (rank 1's stub alive and silent, its server's frontend up) or
`stop` (rank 0's whole server process SIGSTOPped, as a real FT rank: frontend and metrics too).
- found: the job's `restarting` minus the moment the rank failed (its log line), and minus the
  first missed probe's start (its `unanswered` event: when the fault meets a client request, the
  next probe comes up to an interval later); goal for the latter <= (failures - 1) x interval +
  deadline + 1 s; torn down: its `servers_stopped` after that, minus the fault;
- restart to serving: the restart's `ready` minus `restarting` (stopping every rank, starting
  them, readiness), less the back-off, against the first start's `mpicheck_ok` (the servers
  start next) -> `ready` on the same nodes (goal <= 1.1x);
- requests the client lost between the freeze and serving again;
- the probe's CPU: the job supervisor's CPU seconds over a quiet minute with probes every
  INTERVAL against the same with none (liveness.interval 0), per probe, times the default rate.
Prints medians of the repeats.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
import yaml  # noqa: E402

from ftcluster.run.events import parse_events  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402

FREEZE_AT = 25          # with the client's 5 requests a second and a probe a second: ~4 s in
PROBE_FREEZE_AT = 4     # probes alone: the 4th probe freezes
FROZE = re.compile(r"FTCLUSTER_TEST_(?:FREEZE|STOP)_NODE: rank \d+ (?:froze|stopped) at ([\d.]+)")
FAULT_VAR = {"freeze": "FTCLUSTER_TEST_FREEZE_NODE", "stop": "FTCLUSTER_TEST_STOP_NODE"}


class Client(threading.Thread):
    """The probe's request every 0.2 s with a 2 s timeout; (time sent, ok) for each. A private
    run (the default on Slurm) is asked with its token (scripts/token, beside job.json)."""

    def __init__(self, endpoint: str, job_json: Path):
        super().__init__(daemon=True)
        live = json.loads(job_json.read_text())["liveness"]
        self.host, _, port = endpoint.partition(":")
        self.port = int(port)
        self.model, self.body, self.size = live["model"], base64.b64decode(live["body"]), live["json_size"]
        token = job_json.parent / "token"
        self.auth = {"Authorization": f"Bearer {token.read_text().strip()}"} if token.is_file() else {}
        self.sent: list[tuple[float, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.time()
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("POST", f"/v2/models/{self.model}/infer", body=self.body,
                             headers={"Inference-Header-Content-Length": str(self.size), **self.auth})
                ok = conn.getresponse().status == 200
                conn.close()
            except OSError:
                ok = False
            self.sent.append((t, ok))
            self.stop.wait(max(0.0, 0.2 - (time.time() - t)))


def launch(tmp: Path, cluster: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2",
                           "--keep-serving", "--no-client", "--json"], cwd=str(tmp), capture_output=True, text=True,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def stop(run_id: str) -> None:
    subprocess.run([sys.executable, "-m", "ftcluster", "stop", run_id], check=True, capture_output=True)


def events(run_dir: Path) -> list[Any]:
    return parse_events((run_dir / "state" / "events").read_text())


def supervisor_pid(run_dir: Path) -> int:
    """The run's job supervisor: the one process started with the run's job.json."""
    job = str(run_dir / "scripts" / "job.json").encode()
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if job in cmd:
            found.append(int(pid))
    if len(found) != 1:
        raise RuntimeError(f"no single supervisor of {run_dir}: {found}")
    return found[0]


def supervisor_cpu(run_dir: Path) -> float:
    """CPU seconds (user + system) of the run's job supervisor so far."""
    fields = Path(f"/proc/{supervisor_pid(run_dir)}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def restart_once(tmp: Path, cluster: Path, args: argparse.Namespace, by: str) -> dict[str, float]:
    """by "client": the client's traffic runs all along and one of its requests meets the
    freeze (the next probe comes up to one interval later); by "probe": no traffic before, the
    freeze meets a probe (the case the goal's formula counts from), the client starts then."""
    freeze_at = FREEZE_AT if by == "client" else PROBE_FREEZE_AT
    out = launch(tmp, cluster, {FAULT_VAR[args.fault]: f"rank{args.rank}@{freeze_at}"})
    run_dir = Path(out["run_dir"])
    client = Client(out["endpoint"], run_dir / "scripts" / "job.json")
    log = run_dir / "logs" / f"server-rank{args.rank}.log"
    if by == "probe":
        deadline = time.time() + 60
        while time.time() < deadline and not FROZE.search(log.read_text() if log.exists() else ""):
            time.sleep(0.05)
    client.start()
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            kinds = [e.kind for e in events(run_dir)]
            if kinds.count("serving") >= 2:
                break
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        client.stop.set()
        client.join()
        stop(out["run_id"])
    ev = events(run_dir)
    found = FROZE.search((run_dir / "logs" / "incarnation-0" / f"server-rank{args.rank}.log").read_text())
    assert found, f"rank {args.rank} did not {args.fault}"
    froze = float(found.group(1))
    restarting = next(e.time for e in ev if e.kind == "restarting")
    torn_down = next(e.time for e in ev if e.kind == "servers_stopped" and e.time >= restarting)
    # The servers start right after the MPI check (the local style has none: they start then).
    first_start = next(e.time for e in ev if e.kind in ("mpicheck_ok", "servers_starting"))
    first_ready = next(e.time for e in ev if e.kind == "ready")
    again = next(e.time for e in ev if e.kind == "ready" and e.time > restarting)
    lost = sum(1 for t, ok in client.sent if froze - 2 <= t <= again and not ok)
    missed = float(next(e.args[0] for e in ev if e.kind == "unanswered"))
    return {"found_s": restarting - froze, "found_after_probe_s": restarting - missed, "detect_s": torn_down - froze, "goal_s": (args.failures - 1) * args.interval + args.deadline + 1,
            "first_ready_s": first_ready - first_start, "restart_ready_s": again - restarting - args.backoff,
            "lost_requests": float(lost), "sent": float(len(client.sent))}


def probe_cpu(tmp: Path, cluster_of: Any, seconds: float) -> dict[str, float]:
    """The supervisor's CPU seconds over `seconds` of quiet serving, with and without probes."""
    out: dict[str, float] = {}
    for name, interval in (("probes", 1.0), ("none", 0.0)):
        run = launch(tmp, cluster_of(interval), {})
        run_dir = Path(run["run_dir"])
        try:
            t0, c0 = time.time(), supervisor_cpu(run_dir)
            time.sleep(seconds)
            out[f"cpu_{name}_s"] = supervisor_cpu(run_dir) - c0
            out[f"window_{name}_s"] = time.time() - t0
        finally:
            stop(run["run_id"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--deadline", type=float, default=1.0)
    ap.add_argument("--failures", type=int, default=2)
    ap.add_argument("--backoff", type=float, default=1.0)
    ap.add_argument("--cpu-seconds", type=float, default=30.0, help="0: no probe CPU measurement")
    ap.add_argument("--fault", choices=sorted(FAULT_VAR), default="freeze")
    ap.add_argument("--rank", type=int, help="the rank that fails (freeze: 1, stop: 0)")
    ap.add_argument("--style", choices=("slurm", "local"), default="slurm")
    args = ap.parse_args()
    if args.rank is None:
        args.rank = 0 if args.fault == "stop" else 1
    from tests.cluster.testbed import running_testbed

    tmp = Path(tempfile.mkdtemp(prefix="ftc-bench-restart-"))
    os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")

    def cluster_of(interval: float) -> Path:
        where: dict[str, Any] = ({"scheduler": "slurm", "partition": "debug", "request_gpus": False,
                                  "exclusive": False} if args.style == "slurm" else
                                 {"scheduler": "local", "ports": {"http": 18300, "grpc": 18301, "metrics": 18302}})
        spec = {"name": "bench", **where, "gpus_per_node": 1, "workspace": str(tmp / "ws"),
                "server": {"binary": str(find_tritonserver()), "ready_timeout": 60, "exit_grace": 5,
                           "liveness": {"interval": interval, "deadline": args.deadline, "failures": args.failures},
                           "restarts": 1, "restart_backoff": args.backoff}}
        path = tmp / f"cluster-{interval:g}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    cases = {by: f"{args.fault} meets a {'probe' if by == 'probe' else 'client request'}" for by in ("probe", "client")}
    runs: dict[str, list[dict[str, float]]] = {cases["probe"]: [], cases["client"]: [],
                                               "cpu": []}
    with running_testbed() if args.style == "slurm" else contextlib.nullcontext():
        for i in range(args.repeats):
            for by in ("probe", "client"):
                key = cases[by]
                runs[key].append(restart_once(tmp, cluster_of(args.interval), args, by))
                print(f"repeat {i + 1}/{args.repeats} {key}: {runs[key][-1]}", file=sys.stderr)
        if args.cpu_seconds:
            runs["cpu"].append(probe_cpu(tmp, cluster_of, args.cpu_seconds))
    med = report.medians({k: v for k, v in runs.items() if v})
    print(f"2 nodes, {'bare Slurm' if args.style == 'slurm' else 'local style'}; fault: {args.fault} of rank "
          f"{args.rank}; liveness every {args.interval:g} s, deadline {args.deadline:g} s, "
          f"{args.failures} misses; median of {args.repeats}")
    for key in cases.values():
        r = med[key]
        print(f"{key}:")
        print(f"  found: {r['found_after_probe_s']:.2f} s after the first missed probe (goal <= {r['goal_s']:.1f} s), "
              f"{r['found_s']:.2f} s after the {args.fault}; torn down {r['detect_s']:.2f} s after it")
        print(f"  restart to ready (less the {args.backoff:g} s back-off): {r['restart_ready_s']:.2f} s; first start "
              f"to ready: {r['first_ready_s']:.2f} s; ratio {r['restart_ready_s'] / r['first_ready_s']:.2f} "
              "(goal <= 1.1)")
        print(f"  requests lost from the freeze to serving again: {r['lost_requests']:.0f} of {r['sent']:.0f} "
              "sent (one every 0.2 s, 2 s timeout)")
    if "cpu" not in med:
        report.print_json(med, repeats=args.repeats, interval=args.interval, deadline=args.deadline,
                          failures=args.failures, fault=args.fault, style=args.style)
        return
    c = med["cpu"]
    per_probe = (c["cpu_probes_s"] - c["cpu_none_s"]) / max(c["window_probes_s"] / args.interval, 1)
    print(f"probe CPU (supervisor): {c['cpu_probes_s']:.2f} s with probes every {args.interval:g} s vs "
          f"{c['cpu_none_s']:.2f} s without, over {c['window_probes_s']:.0f} s: {per_probe * 1000:.1f} ms a probe, "
          f"{per_probe * 6 * 1000:.0f} ms a minute at the default interval (10 s)")
    report.print_json(med, repeats=args.repeats, interval=args.interval, deadline=args.deadline,
                      failures=args.failures, per_probe_s=per_probe)


if __name__ == "__main__":
    main()
