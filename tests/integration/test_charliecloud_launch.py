"""`ftcluster launch` on Slurm + Charliecloud (Debian's ch-run 0.31) on the multi-node test bed:
the stock-like test image unpacked to a folder as `ch-convert -i tar` makes it (its ENV in
ch/environment), the checkpoint mounted as users mount theirs, end to end on 2 and 3 nodes with
the MPI check inside the image, a rank dying at start-up, Ctrl-C, and the refusals for what
ch-run cannot do. After every test: no job, no process of the run, nothing of it in /dev/shm."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker import image
from tests.integration.test_pyxis_preflight import _tiny_gpt_spec
from tests.launch_helpers import assert_served_like_ft, ftcluster, launch_json, processes_matching, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.triton]

REPO = Path(__file__).resolve().parents[2]
DEMO_CHECKPOINT = REPO / "ftcluster" / "demo" / "checkpoint"
TRITON = "/opt/tritonserver/bin/tritonserver"


def _unpacked_image() -> Path:
    """The test image as a Charliecloud image folder, cached beside its tar under the same
    recipe key: the root filesystem unpacked and the Dockerfile's ENV lines in ch/environment,
    which is what `ch-convert -i tar` / `-i docker` write."""
    out = image.cache_dir().parent / "charliecloud" / f"triton-ft-like-{image.recipe_key()}"
    if not (out / "ch" / "environment").is_file():
        tar = image.build()
        part = out.with_name(out.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(tar), "-C", str(part)], check=True)
        (part / "ch").mkdir(exist_ok=True)
        env = [c[len("ENV "):] for c in image.CHANGES if c.startswith("ENV ")]
        (part / "ch" / "environment").write_text("".join(f"{line}\n" for line in env))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(part, out)
        for old in out.parent.glob("triton-ft-like-*"):
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
    # The checkpoint's mount point, as the README tells a user to make it once.
    (out / str(DEMO_CHECKPOINT).lstrip("/")).mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def ch_image() -> Path:
    if shutil.which("ch-run") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but ch-run is not installed (tests/run.sh installs charliecloud-runtime)")
        pytest.skip("ch-run is not installed (apt-get install charliecloud-runtime)")
    return _unpacked_image()


@pytest.fixture
def spec_dir(slurm_cluster: Any, shared_tmp: Path) -> Path:
    return shared_tmp


def _write_spec(folder: Path, ch_image: Path, **container: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "tb-charliecloud", "scheduler": "slurm", "partition": "debug", "request_gpus": False,
        "exclusive": False, "gpus_per_node": 1, "time_limit": "00:10:00", "workspace": str(folder / "ws"),
        "container": {"runtime": "charliecloud", "image": str(ch_image),
                      "mounts": [f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}"], **container},
        "server": {"binary": TRITON, "ready_timeout": 90, "exit_grace": 5},
    }
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _assert_run_gone(run_id: str) -> None:
    assert wait_for(lambda: not processes_matching(run_id), 20), processes_matching(run_id)
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"ftc+{run_id}+")]


def _events(run_dir: Path) -> str:
    try:
        return (run_dir / "state" / "events").read_text()
    except FileNotFoundError:
        return ""


@pytest.mark.parametrize("nodes", [2, 3])
def test_launch_end_to_end(ch_image: Path, spec_dir: Path, nodes: int) -> None:
    rc, out, err = launch_json(_write_spec(spec_dir, ch_image), "--nodes", str(nodes))
    assert rc == 0, (out.get("failure"), out.get("log_tail"), err[-2000:])
    assert out["ok"] and out["client"]["ok"]
    run_dir = Path(out["run_dir"])
    hosts = [(run_dir / "state" / f"rank{r}.host").read_text().strip() for r in range(nodes)]
    assert len(set(hosts)) == nodes, hosts
    # The MPI check ran in the image on every node: the tritonserver it hashed is the image's
    # own (the host has no /opt/tritonserver).
    assert not Path(TRITON).exists()
    import hashlib
    inside = hashlib.sha256((ch_image / TRITON.lstrip("/")).read_bytes()).hexdigest()
    ranks = out["mpicheck"]["ranks"]
    assert out["mpicheck"]["ok"] and sorted(r["host"] for r in ranks) == sorted(hosts)
    assert {r["tritonserver_sha256"] for r in ranks} == {inside}, ranks
    assert_served_like_ft(run_dir, out["run_id"], nodes)
    _assert_run_gone(out["run_id"])


def test_rank_dying_at_startup_fails_fast_names_it_and_cleans_up(ch_image: Path, spec_dir: Path) -> None:
    rc, out, err = launch_json(_write_spec(spec_dir, ch_image), "--nodes", "2",
                               env={"FTCLUSTER_TEST_BREAK_NODE": "node2"})
    assert rc == 1, err
    assert out["failed_rank"]["rank"] == "1" and out["failed_rank"]["node"] == "node2", out
    assert out["phases"]["done"] - out["phases"]["servers_starting"] < 15
    _assert_run_gone(out["run_id"])


def test_ctrl_c_cancels_and_leaves_nothing(ch_image: Path, spec_dir: Path) -> None:
    ws = spec_dir / "ws"
    proc = subprocess.Popen([sys.executable, "-m", "ftcluster", "launch", "--cluster", str(_write_spec(spec_dir, ch_image)),
                             "--nodes", "2", "--no-mpi-check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FTCLUSTER_TEST_LOAD_DELAY": "120"})
    runs = lambda: sorted(p.parent for p in ws.glob("*/state")) if ws.exists() else []  # noqa: E731
    assert wait_for(lambda: bool(runs()) and "servers_starting" in _events(runs()[-1]), 90)
    run_dir = runs()[-1]
    # The servers run inside ch-run: their root is the image's.
    assert wait_for(lambda: bool(processes_matching(run_dir.name)), 30)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "cancelled" in err
    _assert_run_gone(run_dir.name)


def test_what_ch_run_cannot_do_is_refused_before_submitting(ch_image: Path, spec_dir: Path, tmp_path: Path) -> None:
    # A mount onto a folder the read-only image lacks: named with the mkdir that fixes it.
    missing = "/srv/ftc-no-such-mount-point"
    cluster = _write_spec(spec_dir, ch_image, mounts=[f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}", f"{tmp_path}:{missing}"])
    p = ftcluster("launch", "--cluster", str(cluster), "--nodes", "2")
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
    assert "container.mounts.1" in p.stderr and f"mkdir -p {ch_image}{missing}" in p.stderr, p.stderr
    assert not (spec_dir / "ws").exists() or not any((spec_dir / "ws").iterdir())
    # An image folder that does not exist; mount flags ch-run has not; a squashfs file.
    cluster = _write_spec(spec_dir, Path("/nonexistent/image"))
    p = ftcluster("launch", "--cluster", str(cluster), "--nodes", "1")
    assert p.returncode == 3 and "/nonexistent/image does not exist" in p.stderr, p.stderr
    for container, words in (({"mounts": [f"{DEMO_CHECKPOINT}:{DEMO_CHECKPOINT}:ro"]}, "no mount flags"),
                             ({"image": "/images/triton.sqsh"}, "unpacked image folder")):
        spec = yaml.safe_load(_write_spec(spec_dir, ch_image).read_text())
        spec["container"].update(container)
        (spec_dir / "bad.yaml").write_text(yaml.safe_dump(spec))
        p = ftcluster("plan", "--cluster", str(spec_dir / "bad.yaml"), "--nodes", "1")
        assert p.returncode != 0 and words in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_preflight_runs_in_the_image(ch_image: Path, spec_dir: Path) -> None:
    import platform

    p = ftcluster("preflight", "--cluster", str(_write_spec(spec_dir, ch_image)), "--nodes", "2", "--allow-no-gpu",
                  "--json", timeout=240)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["host"] for r in ranks}) == 2
    # The image's python3 found the image's tritonserver, and the image's os-release speaks.
    os_release = (ch_image / "usr" / "lib" / "os-release").read_text()
    pretty = next(ln.split("=", 1)[1].strip('"') for ln in os_release.splitlines() if ln.startswith("PRETTY_NAME="))
    for r in ranks:
        assert r["tritonserver"] == TRITON and r["os_release"] == pretty, r
        assert r["python"] != platform.python_version(), r
    assert report["bandwidth_skipped"] == "torch is not importable on this rank"
    _assert_run_gone(report["run_id"])


def test_convert_runs_in_the_image_with_its_paths_bound(ch_image: Path, spec_dir: Path) -> None:
    converter = REPO / "tests" / "data" / "ft_converter"
    # The converter's folder is outside /tmp: its mount point in the image, made once by the user.
    (ch_image / str(converter).lstrip("/")).mkdir(parents=True, exist_ok=True)
    ckpt, model = _tiny_gpt_spec(spec_dir, REPO)
    p = ftcluster("convert", "--cluster", str(_write_spec(spec_dir, ch_image)), "--model", str(model),
                  "--converter-root", str(converter), "--input", str(converter / "hf_tiny_gpt"), timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    run_id = p.stdout.split()[1].rstrip(":")
    assert (ckpt / "1-gpu" / "config.ini").is_file()
    assert "TEST CONVERTER: wrote" in ftcluster("logs", run_id).stdout
    _assert_run_gone(run_id)
