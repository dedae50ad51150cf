"""Docker path: wall time to prepare N nodes at once against the sum of single-node times.

    python bench/docker_prepare.py [--repeats 3] [--scheduler both|slurm|ssh]   (root, Debian 12)

"Prepare" is the node-side step of a Docker run, from the job's `containers_starting` event
to `containers_ready`: on every node, image check, `docker run`, sshd on the run's key and the
check that it answers. The job script runs it as one srun step over all nodes, so N nodes
should take about as long as one. Each measurement is a real `ftcluster check` (the MPI check
over ssh, then teardown) on the namespace test bed with one dockerd per node; single-node runs
are pinned to each node in turn with --nodelist. With scheduler `ssh` the same steps reach
the nodes over their sshd through ftcluster.hosts.fanout (fabric, bounded parallel) instead of srun;
single-node runs list one host. Prints the median per N and
ratio = t(N nodes at once) / sum(t(each node alone)); well below 1 means parallel fan-out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from tests.cluster.sshd import SSH_PORT as NODE_SSHD_PORT  # noqa: E402
from tests.cluster.testbed import SlurmTestbed  # noqa: E402
from tests.docker import image  # noqa: E402
from tests.docker.daemons import DockerNodes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def spec(dir: Path, dn: DockerNodes, partition: str, nodelist: str | None,
         ssh: dict[str, object] | None = None) -> Path:
    data: dict[str, object] = {
        "name": "bench-docker", "scheduler": "slurm", "partition": partition,
        "request_gpus": False, "exclusive": False, "time_limit": "10",
        "workspace": str(dir / "runs"), "ssh_port": 11168,
        "sbatch_args": [f"--nodelist={nodelist}"] if nodelist else [],
        "container": {"runtime": "docker", "image": image.IMAGE, "docker_host": dn.docker_host_template,
                      "shm_size": "256m", "gpus": "none"},
        "server": {"binary": image.TRITON_BIN},
    }
    if ssh is not None:
        # scheduler ssh: the hosts are the nodes (one, or all); node_ssh reaches their sshd.
        hosts = [nodelist] if nodelist else list(ssh.pop("hosts"))  # type: ignore[call-overload]
        ssh = {k: v for k, v in ssh.items() if k != "hosts"}
        data.update(scheduler="ssh", hosts=hosts, node_ssh=ssh)
        for key in ("partition", "time_limit", "sbatch_args"):
            data.pop(key)
    path = dir / f"cluster-{'ssh-' if ssh is not None else ''}{nodelist or 'all'}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def prepare_seconds(tb: SlurmTestbed, cluster: Path, nodes: int) -> float:
    p = subprocess.run([sys.executable, "-m", "ftcluster", "check", "--cluster", str(cluster),
                        "--nodes", str(nodes), "--json"], capture_output=True, text=True,
                       env=tb.env, timeout=300)
    out = json.loads(p.stdout)
    if not out.get("ok"):
        raise SystemExit(f"check failed: {out.get('failure')}\n{p.stderr}")
    ev = {}
    for line in (Path(out["run_dir"]) / "state" / "events").read_text().splitlines():
        t, kind, *_ = line.split()
        ev.setdefault(kind, float(t))
    return ev["containers_ready"] - ev["containers_starting"]


def node_ssh(tb: SlurmTestbed, work: Path) -> dict[str, object]:
    tb.start_sshd()
    scan = subprocess.run(["ssh-keyscan", "-p", str(NODE_SSHD_PORT), "-t", "ed25519", *tb.nodes],
                          capture_output=True, text=True, timeout=60, check=True)
    (work / "known_hosts").write_text(scan.stdout)
    return {"hosts": list(tb.nodes), "user": "root", "port": NODE_SSHD_PORT,
            "identity_file": str(tb.key_path), "known_hosts": str(work / "known_hosts")}


def measure(tb: SlurmTestbed, dn: DockerNodes, work: Path, repeats: int,
            ssh: dict[str, object] | None) -> None:
    def cluster(nodelist: str | None) -> Path:
        return spec(work, dn, tb.partition, nodelist, dict(ssh) if ssh is not None else None)

    single = {n: [prepare_seconds(tb, cluster(n), 1) for _ in range(repeats)] for n in tb.nodes}
    together = {k: [prepare_seconds(tb, cluster(None), k) for _ in range(repeats)]
                for k in range(2, len(tb.nodes) + 1)}
    med = {n: statistics.median(v) for n, v in single.items()}
    how = "ssh fan-out (fabric)" if ssh is not None else "srun step"
    print(f"[{how}] prepare, one node alone (median of {repeats}): "
          + ", ".join(f"{n} {t:.2f}s" for n, t in med.items()))
    for k, v in together.items():
        t = statistics.median(v)
        total = sum(list(med.values())[:k])
        print(f"[{how}] N={k}: {t:.2f}s at once vs {total:.2f}s sum of single-node times -> ratio {t / total:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scheduler", choices=("both", "slurm", "ssh"), default="both")
    ap.add_argument("--dir", default="/tmp/ftc-bench-docker")
    a = ap.parse_args()
    tb = SlurmTestbed(a.dir, 3, octet=79, system_conf=False)
    tb.up()
    dn = DockerNodes(tb)
    try:
        dn.up()
        dn.ensure_image()
        work = Path(tempfile.mkdtemp(prefix="ftc-bench-"))
        if a.scheduler in ("both", "slurm"):
            measure(tb, dn, work, a.repeats, None)
        if a.scheduler in ("both", "ssh"):
            measure(tb, dn, work, a.repeats, node_ssh(tb, work))
    finally:
        dn.down()
        tb.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
