"""`ftcluster launch` on the Pyxis path with real NVIDIA Enroot 4.1.2 and Pyxis 0.24.0 on the
multi-node Slurm test bed: the stock-like test image as a squashfs (no ftcluster inside, the
checkpoint mounted as users mount theirs), end to end on 2 and 3 nodes, the MPI check inside
the image, faults, Ctrl-C, a hand scancel, a script submitted by hand, and a cluster whose
compute nodes do not load Pyxis. After every test: no job, no pyxis_* container, no Pyxis
squashfs and no process of a container run on any node (under both container scopes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.launch_helpers import assert_served_like_ft, ftcluster, launch_json, processes_matching, wait_for
from tests.pyxis import bed
from tests.pyxis.fixtures import PyxisBed

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEMO_CHECKPOINT = REPO / "ftcluster" / "demo" / "checkpoint"


@pytest.fixture
def pb(pyxis_bed: PyxisBed) -> Iterator[PyxisBed]:
    pyxis_bed.assert_clean(timeout=5)
    yield pyxis_bed
    pyxis_bed.assert_clean()


@pytest.fixture
def spec_dir(pyxis_bed: PyxisBed, shared_tmp: Path) -> Path:
    # On the filesystem the nodes share (/tmp), readable by the jobs (they run as root here).
    return shared_tmp


def _write_spec(folder: Path, pb: PyxisBed, *, server: dict[str, Any] | None = None,
                env: dict[str, str] | None = None, **container: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "tb-pyxis", "scheduler": "slurm", "partition": pb.tb.partition, "request_gpus": False,
        "exclusive": False, "gpus_per_node": 1, "time_limit": "00:10:00", "workspace": str(folder / "ws"),
        "container": {
            "runtime": "pyxis", "image": str(pb.sqsh),
            # The demo model's checkpoint, mounted as a user mounts theirs.
            "mounts": [f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}:ro"],
            **container,
        },
        # server.binary left at its default, `tritonserver` on the image's ENV PATH: Enroot starts
        # steps through a login shell, and the image's Debian /etc/profile replaces PATH.
        "server": {"ready_timeout": 90, "exit_grace": 5, **(server or {})},
    }
    if env:
        spec["env"] = env
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _events(run_dir: Path) -> str:
    try:
        return (run_dir / "state" / "events").read_text()
    except FileNotFoundError:
        return ""


def _newest_run(ws: Path) -> Path | None:
    runs = sorted(p.parent for p in ws.glob("*/state")) if ws.exists() else []
    return runs[-1] if runs else None


def _assert_run_gone(run_id: str) -> None:
    assert wait_for(lambda: not processes_matching(run_id), 20), processes_matching(run_id)


@pytest.mark.parametrize("nodes", [2, 3])
def test_launch_end_to_end(pb: PyxisBed, spec_dir: Path, nodes: int) -> None:
    rc, out, err = launch_json(_write_spec(spec_dir, pb), "--nodes", str(nodes))
    assert rc == 0, err
    assert out["ok"] and out["client"]["ok"]
    run_dir = Path(out["run_dir"])
    hosts = [(run_dir / "state" / f"rank{r}.host").read_text().strip() for r in range(nodes)]
    assert len(set(hosts)) == nodes, hosts
    assert out["endpoint"] == f"{hosts[0]}:8000"
    # The MPI check ran inside the image, over --mpi=pmix, on every node.
    assert out["mpicheck"]["ok"] and sorted(r["host"] for r in out["mpicheck"]["ranks"]) == sorted(hosts)
    assert_served_like_ft(run_dir, out["run_id"], nodes)
    events = _events(run_dir)
    assert "containers_ready" in events and "containers_stopped" in events, events
    # Each node's step saw the image's root, not the node's own.
    host_root = subprocess.run(["stat", "-Lc", "%d:%i", "/"], capture_output=True, text=True).stdout.strip()
    for h in hosts:
        assert (run_dir / "state" / "pyxis" / f"{h}.root").read_text().strip() != host_root
        assert (run_dir / "state" / "pyxis" / f"{h}.down").read_text().strip() == "ok"
    _assert_run_gone(out["run_id"])


def test_container_scope_job(pb: PyxisBed, spec_dir: Path) -> None:
    """Under container_scope=job the container is pyxis_<job>_<name>: removed all the same."""
    with pb.scope("job"):
        rc, out, err = launch_json(_write_spec(spec_dir, pb), "--nodes", "2", "--no-mpi-check")
        assert rc == 0, err
        log = (pb.tb.dir / "log" / "slurmd-node1.log").read_text()
        assert f"pyxis_{out['job_id']}_ftc-{out['run_id']}" in log   # the name Pyxis used
        pb.assert_clean()   # inside: Pyxis's own epilog reads the scope when the job ends
    assert "containers_stopped" in _events(Path(out["run_dir"]))


def test_rank_dying_at_startup_fails_fast_names_it_and_cleans_up(pb: PyxisBed, spec_dir: Path) -> None:
    rc, out, err = launch_json(_write_spec(spec_dir, pb), "--nodes", "2",
                               env={"FTCLUSTER_TEST_BREAK_NODE": "node2"})
    assert rc == 1, err
    assert out["failed_rank"]["rank"] == "1" and out["failed_rank"]["node"] == "node2", out
    assert out["failed_rank"]["exit_code"] != "0"
    assert out["phases"]["done"] - out["phases"]["servers_starting"] < 15
    assert "containers_stopped" in _events(Path(out["run_dir"]))
    _assert_run_gone(out["run_id"])


def test_a_hung_world_is_restarted_in_fresh_containers_and_serves_again(pb: PyxisBed, spec_dir: Path) -> None:
    """The restart smoke test on Pyxis: rank 1 freezes while serving; the world is killed, what
    ran in the named containers is reaped (a step entering a container with processes in it
    would join them without its mounts: pyxis#130), and the servers start again in them."""
    from tests.integration.test_liveness import RESTARTS, restarted_and_serving

    cluster = _write_spec(spec_dir, pb, server={"ready_timeout": 90, "exit_grace": 5, **RESTARTS})
    st = restarted_and_serving(launch_json(cluster, "--nodes", "2", "--keep-serving", "--no-client", "--no-mpi-check",
                                           env={"FTCLUSTER_TEST_FREEZE_NODE": "rank1@2"}),
                               "the MPI world is hung", host_tmp=False)
    run_dir = Path(st["run_dir"])
    assert len(list((run_dir / "logs").glob("pyxis-reap-node*.log"))) == 2   # the reap ran on both nodes
    _assert_run_gone(st["run_id"])


def test_the_successor_serves_in_its_own_containers_before_the_time_limit(pb: PyxisBed, spec_dir: Path) -> None:
    """The hand-over smoke test on Pyxis: near the time limit the job submits a successor
    (a new run: its own named containers, on another node), which serves; the old job ends
    before its limit and removes its containers."""
    from tests.integration.test_handover import HANDOVER, _status, _stop_chain

    cluster = _write_spec(spec_dir, pb, server={"ready_timeout": 90, "exit_grace": 5,
                                                "handover_lead": HANDOVER["server_handover_lead"]})
    spec = yaml.safe_load(cluster.read_text())
    cluster.write_text(yaml.safe_dump({**spec, "time_limit": HANDOVER["time_limit"]}))
    rc, out, err = launch_json(cluster, "--nodes", "1", "--keep-serving", "--no-client", "--no-mpi-check")
    assert rc == 0 and out["ok"], err
    run_id = out["run_id"]
    try:
        assert wait_for(lambda: (_status(run_id)["successor"] or {}).get("handed_over"), 110), _status(run_id)
        successor = _status(run_id)["successor"]
        assert successor["endpoint"] != out["endpoint"]
        # Private by default: the successor keeps the first run's token, and its clients theirs.
        token = ftcluster("token", run_id).stdout.strip()
        check = ftcluster("client", "identity", "--url", successor["endpoint"], "--model", "fastertransformer",
                          env={"FTCLUSTER_TOKEN": token})
        assert check.returncode == 0, check.stdout + check.stderr
        assert wait_for(lambda: "containers_stopped" in _events(Path(out["run_dir"])), 30)
        assert _events(Path(out["run_dir"])).rstrip().endswith("done 0")
    finally:
        _stop_chain(run_id)
    _assert_run_gone(run_id)


def test_a_killed_supervisor_is_started_again_in_fresh_containers(pb: PyxisBed, spec_dir: Path) -> None:
    """The supervisor's SIGKILL on Pyxis: its proxy dies with it, the entry script starts it
    again in the same job, which removes the earlier named containers, makes them again and
    serves with the same token and endpoint."""
    from tests.integration.test_supervisor_survival import _answers, _pids

    cluster = _write_spec(spec_dir, pb, server={"ready_timeout": 90, "exit_grace": 5, "restarts": 1,
                                                "liveness": {"interval": 1, "deadline": 2}})
    rc, out, err = launch_json(cluster, "--nodes", "1", "--keep-serving", "--no-client", "--no-mpi-check")
    assert rc == 0 and out["ok"], err
    run_dir, token = Path(out["run_dir"]), ftcluster("token", out["run_id"]).stdout.strip()
    try:
        (supervisor,) = _pids(f"ftcluster_job {run_dir}/scripts/job.json")
        (proxy,) = _pids(f"caddy run --config {run_dir}/scripts/proxy.json")
        subprocess.run(["kill", "-KILL", str(supervisor)], check=True)
        assert wait_for(lambda: proxy not in _pids(f"caddy run --config {run_dir}/scripts/proxy.json"), 2)
        assert wait_for(lambda: _events(run_dir).splitlines()[-1].split()[1:2] == ["serving"]
                        and "supervisor died" in _events(run_dir), 90), _events(run_dir)
        assert "containers_stopped" in _events(run_dir) and _answers(out["endpoint"], token)
    finally:
        assert ftcluster("stop", out["run_id"]).returncode == 0
    _assert_run_gone(out["run_id"])


def test_readiness_timeout_fails_cleanly(pb: PyxisBed, spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, pb, server={"ready_timeout": 4, "exit_grace": 3})
    rc, out, err = launch_json(cluster, "--nodes", "2", "--no-mpi-check", env={"FTCLUSTER_TEST_LOAD_DELAY": "120"})
    assert rc == 1, err
    assert "not ready after 4s" in out["failure"]
    _assert_run_gone(out["run_id"])


def _launch_until_servers_start(cluster: Path, ws: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(cluster), "--nodes", "2",
                             "--no-mpi-check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FTCLUSTER_TEST_LOAD_DELAY": "120"})
    assert wait_for(lambda: "servers_starting" in _events(_newest_run(ws) or ws), 90)
    run_dir = _newest_run(ws)
    assert run_dir is not None
    return proc, run_dir


def test_ctrl_c_cancels_and_removes_the_containers(pb: PyxisBed, spec_dir: Path) -> None:
    proc, run_dir = _launch_until_servers_start(_write_spec(spec_dir, pb), spec_dir / "ws")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "cancelled" in err
    # The batch shell got SIGTERM first and ran its teardown step.
    assert wait_for(lambda: "containers_stopped" in _events(run_dir), 30), _events(run_dir)
    _assert_run_gone(run_dir.name)


def test_hand_scancel_the_guards_remove_the_containers(pb: PyxisBed, spec_dir: Path) -> None:
    """A job cancelled behind ftcluster's back can start no teardown step: the per-node guard
    steps remove the container when Slurm ends them (container_scope=global keeps it otherwise)."""
    proc, run_dir = _launch_until_servers_start(_write_spec(spec_dir, pb), spec_dir / "ws")
    job = json.loads(ftcluster("status", run_dir.name, "--json").stdout)["job_id"]
    assert any(c.startswith("pyxis_ftc-") for cs in bed.containers(pb.nodes).values() for c in cs)
    subprocess.run(["scancel", job], check=True, env=pb.tb.env)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    pb.assert_clean()
    _assert_run_gone(run_dir.name)


def test_rendered_script_submitted_by_hand(pb: PyxisBed, spec_dir: Path) -> None:
    out = spec_dir / "by-hand"
    p = ftcluster("render", "--cluster", str(_write_spec(spec_dir, pb)), "--nodes", "2", "--out", str(out))
    assert p.returncode == 0, p.stderr
    # Not `sbatch --wait`: it asks at 2, 4, 8, 16, 32 s intervals and sees a 15 s job end up to 30 s late.
    sb = subprocess.run(["sbatch", "--parsable", "scripts/job.sbatch"], cwd=out, capture_output=True, text=True,
                        env=pb.tb.env, timeout=60)
    assert sb.returncode == 0, sb.stdout + sb.stderr
    job = sb.stdout.strip().split(";")[0]
    assert wait_for(lambda: job not in pb.jobs(), 300, interval=0.2), _events(out)
    events = _events(out)
    for want in ("containers_ready", "mpicheck_ok", "ready ", "client_done 0", "containers_stopped", "done 0"):
        assert want in events, events
    assert json.loads((out / "results" / "client.json").read_text())["ok"]


def test_pyxis_only_on_the_submitting_side_is_refused(pb: PyxisBed, spec_dir: Path) -> None:
    """srun loads Pyxis (the job script's SLURM_CONF names a plugstack file with it), the nodes'
    slurmstepd do not (their slurm.conf's plugstack file is empty): --container-image is
    accepted and the step runs on the host. The run must say so."""
    client_stack = spec_dir / "client-plugstack.conf"
    bed.write_plugstack(client_stack)
    client_conf = spec_dir / "slurm.conf"
    client_conf.write_text(pb.tb.conf_path.read_text().replace(f"PlugStackConfig={pb.tb.plugstack}",
                                                               f"PlugStackConfig={client_stack}"))
    node_stack = pb.tb.plugstack.read_text()
    pb.tb.plugstack.write_text("")   # the nodes: no plugin
    try:
        rc, out, err = launch_json(_write_spec(spec_dir, pb, env={"SLURM_CONF": str(client_conf)}), "--nodes", "2")
    finally:
        pb.tb.plugstack.write_text(node_stack)
    assert rc == 1, err
    assert "Pyxis is not active on the compute nodes" in out["failure"], out
    # The first step in the image (here the MPI check) found it out: no server was started.
    events = _events(Path(out["run_dir"]))
    assert "mpicheck_started" in events and "servers_starting" not in events and "mpicheck_ok" not in events, events
    _assert_run_gone(out["run_id"])


def test_missing_image_is_refused_before_submitting(pb: PyxisBed, spec_dir: Path) -> None:
    cluster = _write_spec(spec_dir, pb, image=str(spec_dir / "nowhere.sqsh"))
    p = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2")
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: container.image: "), p.stderr
    assert "does not exist" in p.stderr
    assert not pb.jobs()


@pytest.mark.parametrize("first", ["the MPI check", "the servers"])
def test_an_image_enroot_cannot_unpack_fails_naming_the_container(pb: PyxisBed, spec_dir: Path, first: str) -> None:
    """The containers come with the first step that runs in the image: when Enroot cannot create
    them (a file that is no squashfs), that step fails and the run says the container did not
    start, with Pyxis's own words; nothing is left."""
    broken = spec_dir / "broken.sqsh"
    broken.write_bytes(b"not a squashfs\n" * 64)
    cluster = _write_spec(spec_dir, pb, image=str(broken))
    rc, out, err = launch_json(cluster, "--nodes", "2", *(["--no-mpi-check"] if first == "the servers" else []))
    assert rc == 1 and "Traceback" not in err, err
    assert out["failure"].startswith("the container did not start: "), out["failure"]
    assert re.search(r"pyxis|enroot", out["failure"], re.I), out["failure"]
    _assert_run_gone(out["run_id"])
    assert wait_for(lambda: not pb.jobs(), 30), pb.jobs()


@pytest.mark.parametrize(("override", "named"), [
    # The image's MPI has no libmpi where the rank looks: each rank says so and why.
    ({"env": {"FTC_LIBMPI": "/nonexistent/libmpi.so.40"}},
     r"rank [01] on node{n} cannot start MPI: FTC_LIBMPI=/nonexistent/libmpi\.so\.40: no such file"),
    # The image's Open MPI needs PMIx from srun; without a plugin no world forms.
    ({"mpi": "none"}, "rank [01] on node{n} cannot join a world: srun started 2 tasks with --mpi=none"),
    # A PMI the image's Open MPI was not built with: it ends the rank inside MPI_Init.
    ({"mpi": "pmi2"}, r"rank [01] on node{n} \(Exited with exit code 1\): \S"),
])
def test_mpi_check_fails_cleanly_when_the_world_cannot_form(pb: PyxisBed, spec_dir: Path,
                                                            override: dict[str, Any], named: str) -> None:
    cluster = _write_spec(spec_dir, pb, env=override.get("env"))
    if "mpi" in override:
        spec = yaml.safe_load(cluster.read_text())
        cluster.write_text(yaml.safe_dump({**spec, "mpi": override["mpi"]}))
    rc, out, err = launch_json(cluster, "--nodes", "2")
    assert rc == 1, err
    failure = out["failure"]
    assert failure.startswith("MPI check failed: "), failure
    assert re.search(named.replace("{n}", r"\d"), failure), failure
    events = _events(Path(out["run_dir"]))
    assert "mpicheck_ok" not in events and "servers_starting" not in events, events
    assert "containers_stopped" in events, events
    _assert_run_gone(out["run_id"])


def test_mpi_check_alone_passes_in_the_image(pb: PyxisBed, spec_dir: Path) -> None:
    p = ftcluster("check", "--cluster", str(_write_spec(spec_dir, pb)), "--nodes", "2", "--json")
    assert p.returncode == 0, p.stderr
    mpi = json.loads(p.stdout)["mpicheck"]
    assert mpi["ok"] and mpi["problems"] == [], mpi
    assert sorted(r["host"] for r in mpi["ranks"]) == ["node1", "node2"]
    assert all(r["mpi_library"].startswith("Open MPI") for r in mpi["ranks"]), mpi["ranks"]
    # `tritonserver` found on the image's ENV PATH, though the step's login shell replaced PATH.
    assert {r["tritonserver"] for r in mpi["ranks"]} == {"/opt/tritonserver/bin/tritonserver"}, mpi["ranks"]
    _assert_run_gone(json.loads(p.stdout)["run_id"])
