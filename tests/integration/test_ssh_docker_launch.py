"""`ftcluster launch` with scheduler `ssh` + Docker, for real: the job script runs here and
reaches the test bed's nodes over their sshd (fabric, in parallel); one dockerd per node, sshd
in every container on per-run keys, mpirun over ssh from rank 0's container, the client against
rank 0; faults; Ctrl-C; and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.launch_helpers import assert_served_like_ft

from tests.cluster.sshd import SSH_PORT as NODE_SSHD_PORT
from tests.docker import image
from tests.docker.daemons import DockerNodes
from tests.docker.launching import (
    SSH_PORT, assert_nothing_left, assert_weird_path_launch, events, launch, launch_cmd, serve_detached, stop,
    wait_containers_ready, wait_no_containers, write_spec,
)

pytestmark = [pytest.mark.docker, pytest.mark.cluster, pytest.mark.triton]


@pytest.fixture
def ssh_nodes(docker_nodes: DockerNodes, sshd_nodes: Any) -> DockerNodes:
    return docker_nodes


def known_hosts(tmp_path: Path, hosts: list[str]) -> Path:
    """The nodes' host keys under the names the spec uses, as a user would have them."""
    scan = subprocess.run(["ssh-keyscan", "-p", str(NODE_SSHD_PORT), "-t", "ed25519", *hosts],
                          capture_output=True, text=True, timeout=60, check=False)
    assert scan.returncode == 0 and len(scan.stdout.splitlines()) == len(hosts), scan.stderr
    path = tmp_path / "known_hosts"
    path.write_text(scan.stdout)
    return path


def ssh_spec(tmp_path: Path, dn: DockerNodes, known: Path | None = None, **container: Any) -> Path:
    hosts = list(dn.nodes)
    node_ssh = {"user": "root", "port": NODE_SSHD_PORT, "identity_file": str(dn.tb.key_path),  # type: ignore[attr-defined]
                "known_hosts": str(known or known_hosts(tmp_path, hosts)), "parallel": 8}
    top = {"name": "tb-ssh-docker", "scheduler": "ssh", "hosts": hosts, "node_ssh": node_ssh,
           "partition": None, "time_limit": None}
    return write_spec(tmp_path, dn, top=top, **container)


def test_two_hosts_over_ssh_serve_and_clean_up(tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    dn = ssh_nodes
    rc, out, err = launch(dn, ssh_spec(tmp_path, dn), "--nodes", "2")
    assert rc == 0, (out, err)
    assert out["ok"] is True and out["client"]["ok"] is True, out
    assert out["job_id"].startswith("local:")
    run_dir = Path(out["run_dir"])
    kinds = [e[0] for e in events(run_dir)]
    for kind in ("containers_starting", "containers_ready", "mpicheck_ok", "servers_starting", "ready",
                 "client_done", "servers_stopped", "containers_stopped", "done"):
        assert kind in kinds, kinds
    # Rank 0 is the first host; the MPI check and the servers spanned the two hosts.
    assert out["endpoint"].startswith(f"{dn.nodes[0]}:")
    assert {r["host"] for r in out["mpicheck"]["ranks"]} == set(dn.nodes[:2])
    for r in (0, 1):
        assert (run_dir / "state" / f"rank{r}.host").read_text().strip() == dn.nodes[r]
    assert_served_like_ft(run_dir, out["run_id"], 2)
    # The node steps ran on the hosts through ssh, one output file per host.
    for h in dn.nodes[:2]:
        assert (run_dir / "logs" / f"docker-up-{h}.log").is_file()
        assert (run_dir / "state" / "docker" / f"{h}.down").read_text().strip() == "ok"
    assert not dn.containers(dn.nodes[2], f"org.ftcluster.run={run_dir.name}")  # not in the plan
    assert_nothing_left(dn, run_dir)


def test_unknown_host_key_is_refused_and_named(tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    dn = ssh_nodes
    known = known_hosts(tmp_path, [dn.nodes[0]])  # the second host's key is not known
    rc, out, _ = launch(dn, ssh_spec(tmp_path, dn, known=known), "--nodes", "2")
    assert rc != 0 and out["ok"] is False
    failure = out["failure"]
    assert f"containers failed to start on {dn.nodes[1]}" in failure, failure
    assert "cannot connect" in failure and "known_hosts" in failure, failure
    # It cannot be reached for the teardown either, which is said, not hidden.
    assert failure.endswith(f"then teardown failed on {dn.nodes[1]}"), failure
    run_dir = Path(out["run_dir"])
    assert [e[1] for e in events(run_dir) if e[0] == "node_ready"] == [dn.nodes[0]]
    assert_nothing_left(dn, run_dir)  # the first host's container was removed


def test_ssh_port_taken_and_more_nodes_than_hosts(tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    dn = ssh_nodes
    # Asking for more nodes than hosts is refused before anything starts.
    p = subprocess.run(launch_cmd(ssh_spec(tmp_path, dn), "--nodes", str(len(dn.nodes) + 1)),
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "--nodes" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # The containers' sshd port is the node sshd's: the clear message names it.
    spec = ssh_spec(tmp_path, dn)
    spec.write_text(spec.read_text().replace(f"ssh_port: {SSH_PORT}", f"ssh_port: {NODE_SSHD_PORT}"))
    rc, out, _ = launch(dn, spec, "--nodes", "2")
    assert rc != 0 and f"ssh_port {NODE_SSHD_PORT} is taken on {dn.nodes[0]}" in out["failure"], out
    assert_nothing_left(dn, Path(out["run_dir"]))


def test_ctrl_c_tears_down_over_ssh(tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    dn = ssh_nodes
    proc = subprocess.Popen(launch_cmd(ssh_spec(tmp_path, dn), "--nodes", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_dir = wait_containers_ready(proc, tmp_path / "runs", dn)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "cancelled" in err, err
    kinds = [e[0] for e in events(run_dir)]
    assert "interrupted" in kinds and "containers_stopped" in kinds, kinds
    assert_nothing_left(dn, run_dir)


def test_mpi_check_fails_when_a_hosts_tritonserver_differs(tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    """Same image name on both hosts, but the second host's build has another tritonserver."""
    dn = ssh_nodes
    first, second = dn.nodes[:2]
    tag = f"ftcluster-test/mixed-{uuid.uuid4().hex[:8]}:1"
    builder = f"ftc-test-builder-{uuid.uuid4().hex[:8]}"
    dn.docker(first, ["tag", image.IMAGE, tag], check=True)
    try:
        dn.docker(second, ["run", "--name", builder, "--entrypoint", "sh", image.IMAGE, "-c",
                           f"echo '# another build' >> {image.TRITON_BIN}"], check=True)
        dn.docker(second, ["commit", builder, tag], check=True)
        dn.docker(second, ["rm", builder], check=True)
        rc, out, _ = launch(dn, ssh_spec(tmp_path, dn, image=tag), "--nodes", "2")
    finally:
        dn.docker(second, ["rm", "-f", builder])
        for node in (first, second):
            dn.docker(node, ["rmi", tag])
    assert rc != 0 and out["ok"] is False
    failure = out["failure"]
    assert "MPI check failed" in failure and f"rank 1 on {second}" in failure, failure
    assert "differs from rank 0's" in failure, failure
    run_dir = Path(out["run_dir"])
    assert "servers_starting" not in [e[0] for e in events(run_dir)]  # refused before serving
    assert_nothing_left(dn, run_dir)


@pytest.mark.parametrize("what", ["group", "job"])
def test_killed_job_script_is_cleaned_up_by_the_guards(tmp_path: Path, ssh_nodes: DockerNodes, what: str) -> None:
    """kill -9 of the whole job (as when the machine running it is lost), or of the job's own
    process alone (the OOM killer): no teardown runs there, but the ssh sessions drop (the job's
    guard ends what is left of it here) and each host's guard removes its containers."""
    dn = ssh_nodes
    out, run_dir = serve_detached(dn, ssh_spec(tmp_path, dn))
    pid = int(out["job_id"].split(":")[1].split("@")[0])  # local:PID@START
    if what == "group":
        os.killpg(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)
    assert wait_no_containers(dn, run_dir) == []
    assert "containers_stopped" not in [e[0] for e in events(run_dir)]  # the guards did it
    # `stop` then finds the job gone and removes what is left here: the run's keys.
    stop(dn, out["run_id"])
    assert_nothing_left(dn, run_dir)


def test_air_gapped_hosts_load_the_image_from_image_tar(tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    """No registry: a host without the image loads it from container.image_tar on the shared
    filesystem; a tar that does not hold the image is named clearly."""
    dn = ssh_nodes
    tag = f"ftcluster-test/from-tar-{uuid.uuid4().hex[:8]}:1"
    tar = dn.save_image(tag, tmp_path / "image.tar")
    try:
        assert all(dn.docker(n, ["image", "inspect", tag]).returncode != 0 for n in dn.nodes)
        rc, out, err = launch(dn, ssh_spec(tmp_path, dn, image=tag, image_tar=str(tar)), "--nodes", "2",
                              "--no-mpi-check")
        assert rc == 0 and out["client"]["ok"] is True, (out, err)
        assert all(dn.docker(n, ["image", "inspect", tag]).returncode == 0 for n in dn.nodes[:2])
        assert_nothing_left(dn, Path(out["run_dir"]))
        # A tar without this image: the message says which tar and which image.
        other = f"ftcluster-test/not-in-tar-{uuid.uuid4().hex[:8]}:1"
        rc, out, _ = launch(dn, ssh_spec(tmp_path, dn, image=other, image_tar=str(tar)), "--nodes", "2")
        assert rc != 0 and f"{tar} does not hold image {other}" in out["failure"], out["failure"]
        assert_nothing_left(dn, Path(out["run_dir"]))
    finally:
        for node in dn.nodes:
            dn.docker(node, ["rmi", tag])


def test_weird_workspace_path_over_ssh(weird_tmp_path: Path, ssh_nodes: DockerNodes) -> None:
    """Spaces, quotes and `'; echo` in the run folder's path survive ssh, docker and mpirun."""
    dn = ssh_nodes
    assert_weird_path_launch(dn, ssh_spec(weird_tmp_path, dn), weird_tmp_path)
