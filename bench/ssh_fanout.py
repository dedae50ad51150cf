"""The ssh fan-out (ftcluster.hosts.fanout, fabric): does N hosts take about as long as one?

    python bench/ssh_fanout.py [--repeats 5] [--parallel 24] [--sleep 0.5]     (root, Debian 12)

On the namespace test bed (brought up with sshd if it is not), one fan-out per N runs
`sleep S` on N ssh sessions at once, at most --parallel at a time. The test bed has 3 nodes,
so N > 3 opens several sessions per node (as many hosts would, one each); keep
--parallel / 3 below sshd's MaxStartups (10). Prints, per N, the median wall time of the
whole fan-out (connect, authenticate, run, close) and ratio = t(N) / t(1): about 1 while N
fits in --parallel, about ceil(N / parallel) beyond, against N for one host after another.
It also prints this process's CPU time per host: on a real cluster every host's sshd and shell
run on that host, so what one more host costs the fan-out is this CPU time, while here all 3
test-bed "nodes" share this machine's cores with the fan-out.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftcluster.hosts.fanout import Fanout, FanoutConfig, exit_code  # noqa: E402
from tests.cluster.sshd import SSH_PORT  # noqa: E402
from tests.cluster.testbed import SlurmTestbed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=24)
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--counts", default="1,3,12,24,48")
    a = ap.parse_args()
    tb = SlurmTestbed()
    started = not tb.is_up()
    if started:
        tb.up()
    try:
        tb.start_sshd()
        work = Path(tempfile.mkdtemp(prefix="ftc-bench-fanout-"))
        scan = subprocess.run(["ssh-keyscan", "-p", str(SSH_PORT), "-t", "ed25519", *tb.nodes],
                              capture_output=True, text=True, timeout=60, check=True)
        (work / "known_hosts").write_text(scan.stdout)
        results: dict[int, float] = {}
        cpu: dict[int, float] = {}
        for n in (int(c) for c in a.counts.split(",")):
            hosts = tuple(tb.nodes[i % len(tb.nodes)] for i in range(n))
            cfg = FanoutConfig(hosts=hosts, user="root", port=SSH_PORT, identity_file=str(tb.key_path),
                               known_hosts=str(work / "known_hosts"), parallel=a.parallel)
            times, cpus = [], []
            for _ in range(a.repeats):
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.perf_counter()
                with open("/dev/null", "w") as sink:
                    res = Fanout(cfg).run(hosts, ["sleep", str(a.sleep)], None, stream=sink)
                times.append(time.perf_counter() - t0)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                if exit_code(res):
                    raise SystemExit(f"fan-out failed: {[r for r in res if r.exit_code]}")
            results[n] = statistics.median(times)
            cpu[n] = statistics.median(cpus)
    finally:
        if started:
            tb.down()
    base = results[min(results)]
    print(f"ssh fan-out of `sleep {a.sleep}`, parallel {a.parallel}, median of {a.repeats}:")
    for n, t in results.items():
        print(f"  N={n:>3}: {t:.2f}s  ratio t(N)/t(1) {t / base:.2f}  (one after another: ~{n * base:.1f}s)"
              f"  fan-out CPU {cpu[n]:.2f}s = {1000 * cpu[n] / n:.0f} ms/host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
