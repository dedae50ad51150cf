"""`ftcluster launch` with Slurm + Docker, for real: one dockerd per test-bed node, the CPU test
image, sshd in every container on per-run keys, mpirun over ssh from rank 0's container, the
client against rank 0; faults; Ctrl-C; and nothing left behind (containers, keys, processes)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import uuid
import os
from pathlib import Path

import pytest

from tests.launch_helpers import assert_served_like_ft

from tests.docker import image
from tests.docker.daemons import DockerNodes
from tests.docker.launching import (
    SSH_PORT,
    assert_nothing_left,
    assert_weird_path_launch,
    events,
    launch,
    launch_cmd,
    serve_detached,
    stop,
    wait_containers_ready,
    wait_no_containers,
    write_spec,
)

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.triton]


def test_two_nodes_mpirun_over_ssh_serves_and_cleans_up(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    rc, out, err = launch(dn, write_spec(tmp_path, dn), "--nodes", "2")
    assert rc == 0, (out, err)
    assert out["ok"] is True and out["client"]["ok"] is True, out
    run_dir = Path(out["run_dir"])
    kinds = [e[0] for e in events(run_dir)]
    for kind in ("containers_starting", "containers_ready", "mpicheck_ok", "servers_starting", "ready",
                 "client_done", "servers_stopped", "containers_stopped", "done"):
        assert kind in kinds, kinds
    # The MPI check ran over ssh: one rank on each of two different nodes.
    assert out["mpicheck"]["ok"] is True
    assert len({r["host"] for r in out["mpicheck"]["ranks"]}) == 2
    # Both ranks served from their own node's container, under this run's server ids.
    hosts = {(run_dir / "state" / f"rank{r}.host").read_text().strip() for r in (0, 1)}
    assert len(hosts) == 2 and hosts <= set(dn.nodes), hosts
    assert_served_like_ft(run_dir, out["run_id"], 2)
    assert_nothing_left(dn, run_dir)


def test_ctrl_c_removes_containers_and_keys(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    spec = write_spec(tmp_path, dn)
    proc = subprocess.Popen(launch_cmd(spec, "--nodes", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dn.tb.env)  # type: ignore[attr-defined]
    try:
        run_dir = wait_containers_ready(proc, tmp_path / "runs", dn)
        # While running: a per-run key pair, private and in the run folder, not in ~/.ssh.
        key = run_dir / "state" / "ssh" / "id_ed25519"
        assert key.stat().st_mode & 0o777 == 0o600
        assert (run_dir / "state" / "ssh").stat().st_mode & 0o777 == 0o700
        known = (run_dir / "state" / "ssh" / "known_hosts").read_text().splitlines()
        assert len(known) == 2 and all(ln.startswith("[node") and f"]:{SSH_PORT} ssh-ed25519 " in ln
                                       for ln in known), known
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "cancelled" in err, err
    assert "ready" not in [e[0] for e in events(run_dir)]  # interrupted on the way up
    kinds = [e[0] for e in events(run_dir)]
    assert "interrupted" in kinds and "containers_stopped" in kinds, kinds
    assert_nothing_left(dn, run_dir)


def test_container_that_fails_to_start(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    spec = write_spec(tmp_path, dn, devices=["/dev/ftc-no-such-device"])
    rc, out, err = launch(dn, spec, "--nodes", "2")
    assert rc != 0 and out["ok"] is False
    assert "containers failed to start on" in out["failure"], out["failure"]
    assert "docker run failed" in out["failure"] and "ftc-no-such-device" in out["failure"], out["failure"]
    run_dir = Path(out["run_dir"])
    failed = [e for e in events(run_dir) if e[0] == "node_failed"]
    assert len(failed) == 2, failed
    assert "servers_starting" not in [e[0] for e in events(run_dir)]
    assert_nothing_left(dn, run_dir)


def test_ssh_port_taken_on_one_node(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    node = dn.nodes[1]
    squatter = subprocess.Popen(
        [*dn.tb.net.enter(node), sys.executable, "-c",  # type: ignore[attr-defined]
         "import socket, time\n"
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('0.0.0.0', {SSH_PORT})); s.listen(); print('ok', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ok"
        rc, out, err = launch(dn, write_spec(tmp_path, dn), "--nodes", "2")
    finally:
        squatter.kill()
        squatter.wait()
    assert rc != 0 and out["ok"] is False
    assert f"ssh_port {SSH_PORT} is taken on {node}" in out["failure"], out["failure"]
    run_dir = Path(out["run_dir"])
    ready = [e[1] for e in events(run_dir) if e[0] == "node_ready"]
    assert node not in ready and len(ready) == 1, ready  # the other node came up, and was removed
    assert_nothing_left(dn, run_dir)


def test_image_missing_on_one_node(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    tag = f"ftcluster-test/only-on-{dn.nodes[0]}:{uuid.uuid4().hex[:8]}"
    dn.docker(dn.nodes[0], ["tag", image.IMAGE, tag], check=True)
    try:
        rc, out, err = launch(dn, write_spec(tmp_path, dn, image=tag), "--nodes", "2")
    finally:
        dn.docker(dn.nodes[0], ["rmi", tag])
    assert rc != 0 and out["ok"] is False
    assert f"image {tag} is not on {dn.nodes[1]} and docker pull failed" in out["failure"], out["failure"]
    assert "image_tar" in out["failure"]  # says what to do on a site without a registry
    assert_nothing_left(dn, Path(out["run_dir"]))


def test_keep_serving_then_stop(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    dn = docker_nodes
    rc, out, err = launch(dn, write_spec(tmp_path, dn), "--nodes", "2", "--keep-serving", "--no-client")
    assert rc == 0 and out["ok"] is True, (out, err)
    run_dir = Path(out["run_dir"])
    assert (run_dir / "state" / "ssh" / "id_ed25519").is_file()  # kept while serving
    try:
        assert all(len(dn.containers(n, f"org.ftcluster.run={run_dir.name}")) == 1 for n in dn.nodes[:2])
        for node in dn.nodes[:2]:
            assert_stock_container(dn, node, run_dir.name)
        assert_runs_as_the_user(dn, dn.nodes[0], run_dir)
    finally:
        stop(dn, out["run_id"])
    kinds = [e[0] for e in events(run_dir)]
    assert "containers_stopped" in kinds, kinds
    assert_nothing_left(dn, run_dir)


def test_a_hung_world_is_restarted_and_serves_again(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    """The restart smoke test on Slurm + Docker: rank 1 freezes while serving; mpirun's docker
    exec ends here, everything of the killed world inside the containers is reaped (a docker
    exec's process outlives its client), and mpirun starts the servers again in them."""
    from tests.integration.test_liveness import RESTARTS, restarted_and_serving

    dn = docker_nodes
    spec = write_spec(tmp_path, dn, top={"server": {"ready_timeout": 90, "exit_grace": 10, **RESTARTS},
                                         "env": {"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2"}})
    st = restarted_and_serving(launch(dn, spec, "--nodes", "2", "--keep-serving", "--no-client", "--no-mpi-check"),
                               "the MPI world is hung", env=dn.tb.env, host_tmp=False)  # type: ignore[attr-defined]
    run_dir = Path(st["run_dir"])
    assert len(list((run_dir / "logs").glob("docker-reap-*.log"))) == 2   # the reap ran on both nodes
    assert_nothing_left(dn, run_dir)


@pytest.mark.parametrize("fault", ["container removed", "sshd killed"])
def test_a_dead_container_or_its_sshd_is_mended_by_the_restart(tmp_path: Path, docker_nodes: DockerNodes,
                                                               fault: str) -> None:
    """A node's container gone while serving (the OOM killer, a dockerd restarted without
    live-restore, a `docker rm` by hand), or the run's sshd in it (mpirun's orted loses its link,
    the world hangs): the world is restarted as after any fault, and the restart makes the
    container again, or starts its sshd again (before: the reap failed, or the next mpirun could
    not reach the node, and the run ended)."""
    from tests.integration.test_liveness import RESTARTS, restarted_and_serving

    dn = docker_nodes
    spec = write_spec(tmp_path, dn, top={"server": {"ready_timeout": 90, "exit_grace": 10, **RESTARTS}})
    launched = launch(dn, spec, "--nodes", "2", "--keep-serving", "--no-client", "--no-mpi-check")
    rc, out, err = launched
    assert rc == 0 and out["ok"], err
    run_dir = Path(out["run_dir"])
    label = f"org.ftcluster.run={out['run_id']}"
    node = next(n for n in dn.nodes if n != out["endpoint"].split(":")[0] and dn.containers(n, label))
    (before,) = dn.containers(node, label)
    if fault == "container removed":
        dn.docker(node, ["rm", "-f", before], check=True)
    else:
        dn.docker(node, ["exec", "-u", "0", before, "pkill", "-KILL", "sshd"], check=True)
    st = restarted_and_serving(launched, "", env=dn.tb.env, host_tmp=False)  # type: ignore[attr-defined]
    said = {"container removed": "no longer runs: making it again", "sshd killed": "sshd in "}[fault]
    assert said in (run_dir / "logs" / f"docker-reap-{node}.log").read_text()
    assert dn.containers(node, label) == [] and st["failure"] is None   # stopped: removed again
    assert_nothing_left(dn, run_dir)


def assert_stock_container(dn: DockerNodes, node: str, run_id: str) -> None:
    """The docker SDK's view of a serving container: the node's GPU (through the "nvidia"
    runtime the spec asked for) and an image with nothing of ftcluster in it."""
    import docker

    client = docker.DockerClient(base_url=dn.env(node)["DOCKER_HOST"])
    try:
        (c,) = client.containers.list(filters={"label": f"org.ftcluster.run={run_id}"})
        assert c.attrs["HostConfig"]["Runtime"] == "nvidia"
        assert "NVIDIA_VISIBLE_DEVICES=0" in c.attrs["Config"]["Env"]  # gpus_per_node: 1
        probe = c.exec_run(["bash", "-c", "python3 -c 'import ftcluster' 2>&1; python3 -c 'import mpi4py' 2>&1;"
                            " python3 -c 'import pydantic' 2>&1; test -e /usr/bin/mpirun || echo no-usr-bin-mpirun;"
                            " test -x /usr/local/mpi/bin/mpirun && echo usr-local-mpi"])
        text = probe.output.decode()
        assert text.count("ModuleNotFoundError") == 3, text
        assert "no-usr-bin-mpirun" in text and "usr-local-mpi" in text, text
    finally:
        client.close()


def assert_runs_as_the_user(dn: DockerNodes, node: str, run_dir: Path) -> None:
    """What serves in a container runs as the launching user, and the container's root has no
    override of file permissions: nothing of the run folder is reached by a root that NFS's
    root_squash would turn into nobody. Here a file of another user's (0600) stands in for the
    run folder as a root-squashed root sees it."""
    (c,) = dn.containers(node, f"org.ftcluster.run={run_dir.name}")
    ranks = dn.docker(node, ["exec", c, "bash", "-c", "grep -l -- '--model-reposit[o]ry=' /proc/[0-9]*/cmdline 2>/dev/null; true"],
                      check=True).stdout.split()
    assert ranks, "no tritonserver in the container"
    for cmdline in ranks:
        status = dn.docker(node, ["exec", c, "cat", cmdline.replace("cmdline", "status")], check=True).stdout
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["Uid"].split()[0] == str(os.getuid()) and fields["Gid"].split()[0] == str(os.getgid())
        cap_eff = int(fields["CapEff"].strip(), 16)
        assert not cap_eff & (1 << 1 | 1 << 2), hex(cap_eff)   # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    other = run_dir / "state" / "not-yours"
    other.write_text("secret\n")
    os.chown(other, 65534, 65534)
    other.chmod(0o600)
    for user in ([], ["-u", "0"]):
        got = dn.docker(node, ["exec", *user, c, "cat", str(other)])
        assert got.returncode != 0 and "Permission denied" in got.stderr, (user, got)
    other.unlink()


def test_gpu_request_without_the_nvidia_toolkit_fails_cleanly(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    """`gpus: request` is `docker run --gpus "device=0"`: a daemon without the NVIDIA Container
    Toolkit refuses it, the launch names docker's reason, and nothing is left."""
    dn = docker_nodes
    rc, out, err = launch(dn, write_spec(tmp_path, dn, gpus="request"), "--nodes", "2")
    assert rc != 0 and out["ok"] is False
    assert "docker run failed" in out["failure"] and "gpu" in out["failure"], out["failure"]
    assert_nothing_left(dn, Path(out["run_dir"]))


def test_plain_scancel_is_cleaned_up_by_the_guards(tmp_path: Path, docker_nodes: DockerNodes) -> None:
    """A cancelled (or timed-out) job may start no new step, so its own teardown cannot run;
    Slurm ends the guard step with SIGTERM and each node's guard removes its containers."""
    dn = docker_nodes
    out, run_dir = serve_detached(dn, write_spec(tmp_path, dn))
    dn.tb.slurm(["scancel", out["job_id"]])  # type: ignore[attr-defined]
    assert wait_no_containers(dn, run_dir) == []
    stop(dn, out["run_id"])
    assert_nothing_left(dn, run_dir)


def test_weird_workspace_path(weird_tmp_path: Path, docker_nodes: DockerNodes) -> None:
    """Spaces, quotes and `'; touch` in the run folder's path survive sbatch, srun, docker and mpirun."""
    dn = docker_nodes
    assert_weird_path_launch(dn, write_spec(weird_tmp_path, dn), weird_tmp_path)


@pytest.mark.parametrize(("container", "env", "named"), [
    # No libmpi where the rank looks, or a library that is not an MPI: each rank says so.
    # (mpirun over ssh has no PMI plugin to get wrong; an unmatched mpi_if_include is ignored.)
    ({}, {"FTC_LIBMPI": "/nonexistent/libmpi.so.40"},
     r"rank [01] on node\d cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi\.so\.40: no such file"),
    ({}, {"FTC_LIBMPI": "/bin/bash"}, r"rank [01] on node\d cannot start MPI: cannot load /bin/bash: "),
    ({}, {"FTC_LIBMPI": "/lib/x86_64-linux-gnu/libc.so.6"},
     r"rank [01] on node\d cannot start MPI: /lib/x86_64-linux-gnu/libc\.so\.6 is not an MPI library"),
])
def test_mpi_check_fails_cleanly_when_the_world_cannot_form(tmp_path: Path, docker_nodes: DockerNodes,
                                                            container: dict[str, str], env: dict[str, str],
                                                            named: str) -> None:
    dn = docker_nodes
    rc, out, err = launch(dn, write_spec(tmp_path, dn, top={"env": env or None}, **container), "--nodes", "2")
    assert rc == 1 and out["ok"] is False, err
    assert out["failure"].startswith("MPI check failed: "), out["failure"]
    assert re.search(named, out["failure"]), out["failure"]
    kinds = [e[0] for e in events(Path(out["run_dir"]))]
    assert "mpicheck_ok" not in kinds and "servers_starting" not in kinds, kinds
    assert "containers_stopped" in kinds, kinds
    assert_nothing_left(dn, Path(out["run_dir"]))
