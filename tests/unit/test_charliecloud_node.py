"""The rendered charliecloud_node.sh run for real with a stand-in `ch-run` that prints the argv
it gets (the real one needs an unpacked image: tests/integration/test_charliecloud_launch.py):
which binds it asks for, what it leaves to the shared /tmp, the image's environment, the
PMIx folder, and the refusal of a mount point the read-only image lacks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ftcluster.render.scripts import RenderOptions, RunPaths, render
from tests.helpers_specs import cluster, model
from tests.unit.test_render import _plan

FAKE_CH_RUN = "#!/bin/bash\nprintf '%s\\n' \"$@\"\n"


def _node_script(tmp_path: Path, image: Path, run_dir: Path, mounts: list[str]) -> Path:
    c = cluster(name="ch", scheduler="slurm", partition="gpu", gpus_per_node=1,
                container={"runtime": "charliecloud", "image": str(image), "mounts": mounts},
                server={"binary": "/opt/tritonserver/bin/tritonserver"})
    m = model(name="ensemble", repository="/shared/models/gpt/all_models/gpt", checkpoint_root="/shared/ckpt")
    scripts = render(c, m, _plan(c, 2), RunPaths("run-1", run_dir), RenderOptions(python="/usr/bin/python3"))
    folder = run_dir / "scripts"
    folder.mkdir(parents=True)
    for name in ("charliecloud_node.sh", "env.sh"):
        (folder / name).write_text(scripts.files[name])
    return folder / "charliecloud_node.sh"


def _run(script: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ch-run").write_text(FAKE_CH_RUN)
    (bin_dir / "ch-run").chmod(0o755)
    full = {k: v for k, v in os.environ.items() if not k.startswith("PMIX_")}
    full.update(PATH=f"{bin_dir}:{os.environ['PATH']}", **env)
    return subprocess.run(["bash", str(script), "python3", "-c", "print(1)"], capture_output=True, text=True,
                          env=full, check=False)


def test_binds_the_mounts_the_workspace_and_pmix_and_execs_the_command(tmp_path: Path) -> None:
    image = tmp_path / "img"
    workspace = Path("/shared/runs")   # outside /tmp: bound, so the image needs the folder
    for folder in ("models", "shared/runs", "var/spool/slurmd", "ch"):
        (image / folder).mkdir(parents=True)
    (image / "ch" / "environment").write_text("PATH=/usr/bin\n")
    # The script is written under tmp_path, but RUN_DIR (what it binds) is the workspace's run.
    script = _node_script(tmp_path, image, tmp_path / "r", ["/data/models:/models"])
    text = script.read_text().replace(f"RUN_DIR={tmp_path / 'r'}", f"RUN_DIR={workspace / 'run-1'}")
    script.write_text(text)
    p = _run(script, tmp_path, PMIX_SERVER_TMPDIR="/var/spool/slurmd/pmix.12.0/", PMIX_GDS_MODULE="ds21,hash")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "--bind=/data/models:/models", "--bind=/shared/runs:/shared/runs",
        "--bind=/var/spool/slurmd:/var/spool/slurmd", "--set-env", str(image), "--", "python3", "-c", "print(1)"]


def test_tmp_is_shared_not_bound_and_a_missing_mount_point_is_named(tmp_path: Path) -> None:
    image = tmp_path / "img"
    image.mkdir()
    run_dir = tmp_path / "ws" / "run-1"     # under /tmp: ch-run shares it, no bind
    assert str(run_dir).startswith("/tmp/")
    script = _node_script(tmp_path, image, run_dir, [])
    p = _run(script, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [str(image), "--", "python3", "-c", "print(1)"]
    script = _node_script(tmp_path / "b", image, tmp_path / "b" / "run", ["/data/models:/models"])
    p = _run(script, tmp_path)
    assert p.returncode == 1 and p.stdout == ""
    assert "the image has no folder /models to mount /data/models on" in p.stderr
    assert f"mkdir -p {image}/models" in p.stderr


def test_a_path_under_a_folder_bound_at_its_own_path_is_not_bound_again(tmp_path: Path) -> None:
    image = tmp_path / "img"
    (image / "data").mkdir(parents=True)
    script = _node_script(tmp_path, image, tmp_path / "r", ["/data:/data", "/data/models:/data/models"])
    p = _run(script, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "--bind=/data:/data" and "--bind=/data/models:/data/models" not in p.stdout
