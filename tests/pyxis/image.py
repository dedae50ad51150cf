"""The test image (tests/docker/image.py) as an Enroot squashfs for the Pyxis tests.

Made by the product's own `ftcluster image import` (enroot import dockerd://) from a test
dockerd that holds the Docker tests' image, and cached beside that image's tar under the same
recipe key, so both container paths run the same root filesystem:

    <cache>/pyxis/triton-ft-like-<recipe key>.sqsh     (about 440 MB; 20 s to make)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.docker import image


def sqsh_path() -> Path:
    return image.cache_dir().parent / "pyxis" / f"triton-ft-like-{image.recipe_key()}.sqsh"


def build(docker_host: str) -> tuple[Path, float]:
    """Import the test image from the dockerd at `docker_host` with `ftcluster image import`;
    the .sqsh and the seconds the import took."""
    out = sqsh_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="import-", dir=out.parent) as work:
        part = Path(work) / "image.sqsh"
        spec = Path(work) / "cluster.yaml"
        spec.write_text(yaml.safe_dump({
            "name": "pyxis-image", "scheduler": "slurm", "workspace": str(Path(work) / "ws"),
            "container": {"runtime": "pyxis", "image": str(part)},
        }))
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "ftcluster", "image", "import", "--cluster", str(spec),
                            "--tag", image.IMAGE], capture_output=True, text=True, timeout=900,
                           env={**os.environ, "DOCKER_HOST": docker_host})
        took = time.monotonic() - t0
        if p.returncode != 0 or not part.is_file():
            raise RuntimeError(f"ftcluster image import failed ({p.returncode}): {p.stdout[-1500:]} {p.stderr[-1500:]}")
        part.chmod(0o644)
        os.replace(part, out)
    for old in out.parent.glob("triton-ft-like-*.sqsh"):
        if old != out:
            old.unlink(missing_ok=True)
    return out, took
