"""A serving run's whole life: many faults in a row under load, what each restart leaves behind,
and whether `report` tells the outages a client saw.

    python bench/soak.py [--cycles 20] [--nodes 2] [--healthy 6] [--slurm] [--log-max-mb MB]

Local style (every rank on this machine), or with --slurm bare Slurm on the test cluster (its
nodes share this machine's /proc, /tmp and /dev/shm; the job's live steps are counted too), the
embedded test model, `server.liveness` {interval
1, deadline 1, failures 2}, restarts enough for every cycle, and a world that served
`--healthy` s starts afresh (`restart_reset`: each fault is a first one, its back-off 0.1 s). A
client sends the probe's own request every 0.2 s (2 s timeout) all along. Each cycle: a fault
in rank 1, by real signals, alternating
- kill: rank 1's tritonserver SIGKILLed;
- freeze: rank 1's tritonserver and its python backend stubs SIGSTOPped (alive, silent: rank 0
  waits for it and every request hangs);
then the run is waited for until it serves again and has served `--healthy` s, and measured:
the job supervisor's resident memory, open files and threads; the run's processes; /dev/shm and
/tmp entries; the run folder's size. After the last cycle the run is stopped and checked for
leftovers, and `report --json` is compared with the client: per outage, its length as the
report tells it against the client's (first failed request after the fault to the first answer
after it).
Prints the per-cycle figures, each figure's growth per cycle (least squares, over the cycles
after the first KEEP_INCARNATIONS: the run keeps that many earlier incarnations' logs), and the
medians of the outages. Exit 1 on growth (memory over 1 MiB a cycle, anything counted over 0),
leftovers, or a report that misses an outage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
from serving_restart import Client, supervisor_pid  # noqa: E402

from ftcluster.run.events import EV, parse_events  # noqa: E402
from ftcluster.job.names import FILES  # noqa: E402
from ftcluster.job.ranks import KEEP_INCARNATIONS  # noqa: E402
from ftcluster.spec.defaults import embedded_model_path  # noqa: E402
from ftcluster.service.triton_local import find_tritonserver  # noqa: E402

BASE_PORT = 28100


def ftc(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcluster", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def processes() -> dict[int, tuple[int, str, bytes]]:
    """Every process: pid -> (parent pid, comm, cmdline)."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z":
            found[int(d)] = (int(rest[1]), comm, cmd)
    return found


def descendants(root: int, procs: dict[int, tuple[int, str, bytes]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, (pp, _, _) in procs.items() if pp == p]
        out += kids
        todo += kids
    return out


def rank_wrapper(run_dir: Path, rank: int) -> int:
    """The rank's wrapper (its pid file names it with its start time: checked)."""
    pid, start = (run_dir / "state" / FILES.rank(rank, "pid")).read_text().split()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    if fields[19] != start:
        raise RuntimeError(f"rank {rank}'s pid {pid} names another process now")
    return int(pid)


def fault(run_dir: Path, kind: str) -> float:
    """The fault in rank 1, by signals; its time."""
    procs = processes()
    tree = descendants(rank_wrapper(run_dir, 1), procs)
    server = [p for p in tree if procs[p][1] == "tritonserver"]
    if len(server) != 1:
        raise RuntimeError(f"rank 1's tritonserver not found alone: {server}")
    t = time.time()
    if kind == "kill":
        os.kill(server[0], signal.SIGKILL)
    else:
        for p in [server[0], *descendants(server[0], procs)]:
            os.kill(p, signal.SIGSTOP)
    return t


def status(run_id: str) -> dict[str, Any]:
    got = ftc("status", run_id, "--json")
    if got.returncode:
        raise RuntimeError(got.stderr)
    return json.loads(got.stdout)  # type: ignore[no-any-return]


def serving_again(run_id: str, restarts: int, healthy: float, limit: float = 120) -> None:
    """Restarted `restarts` times, serving, the last probe answered, for `healthy` s."""
    deadline = time.monotonic() + limit
    since = None
    while time.monotonic() < deadline:
        st = status(run_id)
        if st["failure"]:
            raise RuntimeError(f"the run failed: {st['failure']}")
        ok = len(st["restarts"]) == restarts and st["phase"] == "serving" and \
            ((st["health"] or {}).get("last_probe") or {}).get("answered") is True
        since = (since or time.monotonic()) if ok else None
        if since is not None and time.monotonic() - since >= healthy:
            return
        time.sleep(0.5)
    raise RuntimeError(f"not serving again after {restarts} restart(s) in {limit:g} s")


def live_steps(job_id: str) -> float:
    """The Slurm job's steps running now."""
    out = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], capture_output=True, text=True,
                         check=False).stdout
    return float(len(out.split()))


def measure(run_dir: Path, run_id: str, job_id: str) -> dict[str, float]:
    procs = processes()
    pid = supervisor_pid(run_dir)
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    mark = run_id.encode()
    sizes = files_of(run_dir)
    # The metrics samples grow with time, to metrics_max_mb (then cut): apart from the rest.
    metrics = sum(v for k, v in sizes.items() if k.startswith(f"state/{FILES.metrics}"))
    size = sum(sizes.values()) - metrics
    return {"rss_mib": rss / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task")),
            "processes": sum(1 for _, _, cmd in procs.values() if mark in cmd) + 0.0,
            "shm": float(len(os.listdir("/dev/shm"))), "tmp": float(len(os.listdir("/tmp"))),
            "run_mib": size / 2**20, "metrics_mib": metrics / 2**20, **({"steps": live_steps(job_id)} if job_id.isdigit() else {})}


def files_of(run_dir: Path) -> dict[str, int]:
    """The run folder's files and their sizes."""
    return {str(f.relative_to(run_dir)): f.stat().st_size for f in run_dir.rglob("*")
            if f.is_file() and not f.is_symlink()}


def slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def client_outages(sent: list[tuple[float, bool]], faults: list[float]) -> list[float]:
    """Per fault: the first failed request sent after it to the first answered one after that
    (a request that hangs counts from when it was sent)."""
    out = []
    for t in faults:
        after = [(s, ok) for s, ok in sent if s >= t - 0.2]
        first_bad = next((s for s, ok in after if not ok), None)
        back = next((s for s, ok in after if ok and first_bad is not None and s > first_bad), None)
        out.append(back - first_bad if first_bad is not None and back is not None else float("nan"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--healthy", type=float, default=6.0)
    ap.add_argument("--slurm", action="store_true", help="bare Slurm on the test cluster (started here)")
    ap.add_argument("--log-max-mb", type=float, help="server.log_max_mb (the spec's default when left out)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ftc-soak-"))
    os.environ["FTCLUSTER_STATE_DIR"] = str(tmp / "state")   # the run store: this bench's own
    cluster = tmp / "cluster.yaml"
    where: dict[str, Any] = {"scheduler": "local", "ports": {"http": BASE_PORT, "grpc": BASE_PORT + 1,
                                                              "metrics": BASE_PORT + 2}}
    if args.slurm:
        where = {"scheduler": "slurm", "partition": "debug", "request_gpus": False, "exclusive": False,
                 "time_limit": "02:00:00"}
    cluster.write_text(yaml.safe_dump({
        "name": "bench-soak", **where, "gpus_per_node": 1, "workspace": str(tmp / "ws"),
        "server": {"binary": str(find_tritonserver()), "ready_timeout": 300, "exit_grace": 5,
                   "liveness": {"interval": 1, "deadline": 1, "failures": 2}, "restarts": args.cycles + 5,
                   "restart_backoff": 0.1, "restart_reset": max(1.0, args.healthy - 1),
                   **({"log_max_mb": args.log_max_mb} if args.log_max_mb else {})}}))
    if not args.slurm:
        return soak(args, tmp, cluster)
    from tests.cluster.testbed import running_testbed

    with running_testbed():
        return soak(args, tmp, cluster)


def soak(args: argparse.Namespace, tmp: Path, cluster: Path) -> int:
    before = {"shm": set(os.listdir("/dev/shm")), "tmp": set(os.listdir("/tmp"))}
    got = ftc("launch", "--cluster", str(cluster), "--model", str(embedded_model_path()), "--nodes",
              str(args.nodes), "--keep-serving", "--no-client", "--json")
    out = json.loads(got.stdout) if got.stdout.strip().startswith("{") else {}
    if got.returncode or not out.get("ok"):
        print(got.stderr[-3000:], file=sys.stderr)
        return 1
    run_id, run_dir, job_id = out["run_id"], Path(out["run_dir"]), str(out.get("job_id") or "")
    client = Client(out["endpoint"], run_dir / "scripts" / FILES.job_config)
    client.start()
    rows: list[dict[str, float]] = []
    faults: list[float] = []
    snapshots: dict[str, dict[str, int]] = {}   # the run folder's files when steady, and at the end
    failed = ""
    try:
        serving_again(run_id, 0, args.healthy)
        rows.append(measure(run_dir, run_id, job_id))
        for i in range(args.cycles):
            kind = "kill" if i % 2 == 0 else "freeze"
            faults.append(fault(run_dir, kind))
            serving_again(run_id, i + 1, args.healthy)
            rows.append({**measure(run_dir, run_id, job_id), "kind": 0.0 if kind == "kill" else 1.0})
            if i + 1 == 1 + KEEP_INCARNATIONS:   # the first of the cycles the growth is taken over
                snapshots["steady"] = files_of(run_dir)
            snapshots["last"] = files_of(run_dir)
            r = rows[-1]
            print(f"cycle {i + 1:3} {kind:6}: supervisor {r['rss_mib']:.1f} MiB, {r['fds']:.0f} fds, "
                  f"{r['threads']:.0f} threads; {r['processes']:.0f} run processes; /dev/shm {r['shm']:.0f}, "
                  f"/tmp {r['tmp']:.0f}; run folder {r['run_mib']:.2f} MiB"
                  + (f"; {r['steps']:.0f} job steps" if "steps" in r else ""), flush=True)
    except RuntimeError as e:
        failed = str(e)
    finally:
        client.stop.set()
        client.join(5)
        stopped = ftc("stop", run_id)
    time.sleep(1)
    left = {"processes": [p for p, (_, _, cmd) in processes().items() if run_id.encode() in cmd],
            "shm": sorted(set(os.listdir("/dev/shm")) - before["shm"]),
            "tmp": sorted(set(os.listdir("/tmp")) - before["tmp"])}
    problems = [f"stop: {stopped.stderr[-500:]}"] if stopped.returncode else []
    problems += [f"the soak ended early: {failed}"] if failed else []
    problems += [f"left after stop: {k} {v}" for k, v in left.items() if v]

    steady = rows[1 + KEEP_INCARNATIONS:]
    judged = len(steady) >= 3   # the first KEEP_INCARNATIONS cycles still add kept incarnations
    growth = {k: slope([r[k] for r in steady]) for k in ("rss_mib", "fds", "threads", "processes", "shm", "tmp",
                                                         "run_mib", "metrics_mib", "steps") if judged and all(k in r for r in steady)}
    if "steady" in snapshots and "last" in snapshots:
        a, b = snapshots["steady"], snapshots["last"]
        grew = sorted(((b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b)), reverse=True)[:6]
        print("the run folder's files that grew most from the first steady cycle to the last: "
              + ", ".join(f"{k} {d:+d} B" for d, k in grew if d))
    if judged:
        print(f"\ngrowth per cycle over cycles {KEEP_INCARNATIONS + 1}..{len(rows) - 1} (least squares): " +
              ", ".join(f"{k} {v:+.3f}" for k, v in growth.items()))
        problems += [f"supervisor memory grows {growth['rss_mib']:.2f} MiB a cycle"] if growth["rss_mib"] > 1.0 else []
        problems += [f"{k} grow {growth[k]:.2f} a cycle" for k in ("fds", "threads", "processes", "shm", "tmp",
                                                                    "steps") if growth.get(k, 0.0) > 0.05]
        problems += [f"the run folder grows {growth['run_mib']:.3f} MiB a cycle"] if growth["run_mib"] > 0.05 else []
    else:
        print(f"\ngrowth per cycle: not judged, {len(steady)} steady cycle(s) (--cycles {KEEP_INCARNATIONS + 3} "
              "or more for 3)")

    rep = ftc("report", run_id, "--json")
    av = json.loads(rep.stdout)["availability"] if rep.returncode == 0 else {}
    told = [o for o in av.get("outages", []) if o["cause"] != "still serving"]
    seen = client_outages(client.sent, faults)
    print(f"client: {len(client.sent)} requests, {sum(ok for _, ok in client.sent)} answered")
    print(f"report: answered {av.get('served_s')} s of {av.get('span_s')} s ({av.get('fraction')}), "
          f"{len(told)} outage(s) for {len(faults)} fault(s)")
    if len(told) != len(faults):
        problems.append(f"report tells {len(told)} outage(s) for {len(faults)} fault(s)")
    else:
        for parity, name in ((0, "kill"), (1, "freeze")):
            pairs = [(o["seconds"], c, o["from"] - t) for k, (o, c, t) in enumerate(zip(told, seen, faults))
                     if k % 2 == parity]
            if pairs:
                print(f"  {name:6} (median of {len(pairs)}): report {statistics.median(p[0] for p in pairs):.2f} s, "
                      f"client {statistics.median(p[1] for p in pairs):.2f} s, the report's outage starts "
                      f"{statistics.median(p[2] for p in pairs):+.2f} s after the fault")
    events = parse_events((run_dir / "state" / FILES.events).read_text())
    quiet = [e.time - float(e.args[0]) for e in events if e.kind == EV.unanswered and e.args]
    print(f"events: {len(events)} lines, {len(quiet)} unanswered, {sum(1 for e in events if e.kind == EV.restarting)} "
          f"restarting; a hang's verdict came {statistics.median(quiet) if quiet else float('nan'):.2f} s (median) "
          "after its first missed probe, where its outage starts")
    print(json.dumps({"rows": rows, "growth": growth, "availability": av, "client_outages": seen,
                      "problems": problems}))
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
