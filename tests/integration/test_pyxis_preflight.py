"""`ftcluster preflight` on the Pyxis path with real Enroot + Pyxis: the ranks run inside the
stock-like test image (no ftcluster in it) through the servers' own container flags, report
what only the image has, and a CPU-only rank says "no GPU". The run is recorded: status, logs
and stop find it. After every test: no job, no pyxis_* container, nothing of the run running."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_pyxis_launch import _assert_run_gone, _events, _write_spec, pb, spec_dir  # noqa: F401
from tests.launch_helpers import ftcluster, wait_for
from tests.pyxis.fixtures import PyxisBed

pytestmark = pytest.mark.cluster

IMAGE_TRITON = "/opt/tritonserver/bin/tritonserver"   # in the test image; the nodes' host has none


def test_preflight_runs_in_the_image(pb: PyxisBed, spec_dir: Path) -> None:  # noqa: F811
    assert not Path(IMAGE_TRITON).exists()   # the host, which the nodes share, has no such server
    cluster = _write_spec(spec_dir, pb)
    p = ftcluster("preflight", "--cluster", str(cluster), "--nodes", "2", "--allow-no-gpu", "--json", timeout=240)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["host"] for r in ranks}) == 2
    # In the image: its python3 (not the launching interpreter) found the image's tritonserver,
    # and its /etc/os-release speaks.
    os_release = subprocess.run(["unsquashfs", "-cat", str(pb.sqsh), "/usr/lib/os-release"], capture_output=True,
                                text=True, check=True).stdout
    pretty = next(ln.split("=", 1)[1].strip('"') for ln in os_release.splitlines() if ln.startswith("PRETTY_NAME="))
    for r in ranks:
        assert r["tritonserver"] == IMAGE_TRITON, r
        assert r["os_release"] == pretty, r
        assert r["python"].rsplit(".", 1)[0] == "3.11" and r["python"] != platform.python_version(), r
        assert r["gpus"] == [] and r["note"], r                      # a CPU-only rank: no GPU
    # Without torch in the image the bandwidth test says why it did not run.
    assert report["bandwidth"] == [] and report["bandwidth_skipped"] == "torch is not importable on this rank"
    run_dir = Path(report["logs"]).parent
    events = _events(run_dir)
    for want in ("containers_ready", "step_started preflight", "step_done preflight 0", "containers_stopped", "done 0"):
        assert want in events, events
    # status / logs / stop find the run and its launcher.
    st = json.loads(ftcluster("status", report["run_id"], "--json").stdout)
    assert (st["state"], st["style"], st["ranks"]) == ("COMPLETED", "preflight", [])
    logs = ftcluster("logs", report["run_id"])
    assert "FTC_PREFLIGHT_RANK" in logs.stdout and "no GPU" in logs.stdout
    assert ftcluster("stop", report["run_id"]).returncode == 0
    _assert_run_gone(report["run_id"])


def test_preflight_without_gpus_fails_naming_the_nodes(pb: PyxisBed, spec_dir: Path) -> None:  # noqa: F811
    p = ftcluster("preflight", "--cluster", str(_write_spec(spec_dir, pb)), "--nodes", "2", "--no-bandwidth",
                  timeout=240)
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert "no GPU" in p.stdout
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: preflight failed: no GPU on rank 0 (node"), last
    assert "nvidia-smi not found" in last


def _tiny_gpt_spec(folder: Path, repo: Path) -> tuple[Path, Path]:
    """An empty checkpoint root and a model spec of the tiny GPT test repository."""
    ckpt = folder / "ckpt"
    ckpt.mkdir()
    model = folder / "model.yaml"
    model.write_text(json.dumps({"name": "tinygpt", "model_type": "GPT", "checkpoint_root": str(ckpt),
                                 "repository": str(repo / "tests" / "data" / "models" / "tiny" / "repo"),
                                 "ft_model": "fastertransformer", "data_type": "fp16"}))
    return ckpt, model


def test_convert_runs_in_the_image_with_its_paths_mounted(pb: PyxisBed, spec_dir: Path) -> None:  # noqa: F811
    """`convert` through the same request: one task in the image, the converter, its input and
    the checkpoint root mounted at their own paths; the result checked; the run recorded."""
    repo = Path(__file__).resolve().parents[2]
    converter = repo / "tests" / "data" / "ft_converter"
    ckpt, model = _tiny_gpt_spec(spec_dir, repo)
    p = ftcluster("convert", "--cluster", str(_write_spec(spec_dir, pb)), "--model", str(model),
                  "--converter-root", str(converter), "--input", str(converter / "hf_tiny_gpt"), timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    run_id = p.stdout.split()[1].rstrip(":")
    assert (ckpt / "1-gpu" / "config.ini").is_file()
    run_dir = spec_dir / "ws" / run_id
    events = _events(run_dir)
    for want in ("containers_ready", "step_done convert 0", "containers_stopped", "done 0"):
        assert want in events, events
    assert "TEST CONVERTER: wrote" in ftcluster("logs", run_id).stdout
    # The image's python3 ran it: the run's step names no interpreter of this machine.
    step = json.loads((run_dir / "scripts" / "job.json").read_text())["step"]
    assert step["argv"][0] == "python3"
    _assert_run_gone(run_id)


def test_stop_a_running_convert_removes_its_container(pb: PyxisBed, spec_dir: Path) -> None:  # noqa: F811
    """A step still running when `ftcluster stop` comes: the batch shell stops the step, its
    teardown removes the container on the node (the fixture checks), the run is not RUNNING."""
    repo = Path(__file__).resolve().parents[2]
    slow = spec_dir / "slow-ft"
    script = slow / "examples" / "pytorch" / "gpt" / "utils" / "huggingface_gpt_convert.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time\nprint('SLOW CONVERTER started', flush=True)\ntime.sleep(300)\n")
    _, model = _tiny_gpt_spec(spec_dir, repo)
    p = ftcluster("convert", "--cluster", str(_write_spec(spec_dir, pb)), "--model", str(model),
                  "--converter-root", str(slow), "--input", str(spec_dir), "--detach", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    run_id = p.stdout.split()[1].rstrip(":")
    run_dir = spec_dir / "ws" / run_id
    assert wait_for(lambda: "SLOW CONVERTER started" in ftcluster("logs", run_id).stdout, 90), _events(run_dir)
    assert json.loads(ftcluster("status", run_id, "--json").stdout)["state"] == "RUNNING"
    stopped = ftcluster("stop", run_id, timeout=180)
    assert stopped.returncode == 0 and "Traceback" not in stopped.stderr, stopped.stderr
    events = _events(run_dir)
    assert "interrupted" in events and "containers_stopped" in events, events
    assert json.loads(ftcluster("status", run_id, "--json").stdout)["state"] != "RUNNING"
    _assert_run_gone(run_id)
