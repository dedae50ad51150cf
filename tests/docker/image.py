"""The TEST image for the Slurm + Docker path: Debian 12 + sshd + Open MPI + CPU tritonserver.

Not a product image. No registry is reachable from the test machines, so the root filesystem
is made with debootstrap from Debian's mirror, the python packages the rank/client code needs
are installed with the host's pip (`--target`, cp311 wheels: the image's python3 is Debian's
3.11), and the CPU tritonserver 2.51 bundle is copied from the host's nvidia-pytriton wheel.
The result is a `docker import`-able tar, cached by a hash of this recipe:

    python -m tests.docker.image build      # prints the tar's path (about 2-3 min the first time)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IMAGE = "ftcluster-test/triton-cpu:2.51"
LABEL = "org.ftcluster.test-image=true"
SUITE = "bookworm"
MIRROR = os.environ.get("FTC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Debian packages: sshd, mpirun, bash, curl, python3 (+ libpython for the python backend stub).
DEB_PACKAGES = (
    "bash", "openssh-server", "openssh-client", "openmpi-bin", "curl", "ca-certificates",
    "python3", "libpython3.11", "python3-numpy", "python3-mpi4py", "procps", "iproute2",
)
# What ftcluster's rank and client code import inside the container (ftcluster itself is
# mounted from the checkout by the tests, so code changes need no rebuild).
PIP_PACKAGES = (
    "tritonclient[http,grpc]==2.51.0", "pyyaml>=6", "pydantic>=2.6", "jinja2>=3.1",
    "click>=8.1", "rich>=13", "protobuf>=4.21,<6",
)
TRITON_DIR = "/opt/tritonserver"
TRITON_BIN = f"{TRITON_DIR}/bin/tritonserver-cpu"
# docker import --change lines: what a Dockerfile would say.
CHANGES = (
    f"LABEL {LABEL}",
    "ENV PATH=/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    'CMD ["/bin/bash"]',
)


def cache_dir() -> Path:
    env = os.environ.get("FTC_TEST_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "ftcluster-tests"
    return base / "docker"


def _pytriton() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed (pip install 'ftcluster[cpu-triton]')")
    return Path(list(spec.submodule_search_locations)[0])


def recipe_key() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(importlib.metadata.version("nvidia-pytriton").encode())
    return h.hexdigest()[:12]


def rootfs_tar() -> Path:
    return cache_dir() / f"rootfs-{recipe_key()}.tar"


def _run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]


def _wrapper() -> str:
    # The stub finds python3 on PATH (Debian's); the wheel's libs are under lib/.
    return "\n".join([
        "#!/bin/bash",
        "# CPU tritonserver 2.51 from nvidia-pytriton (ftcluster TEST image)",
        f'export LD_LIBRARY_PATH={TRITON_DIR}/lib"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
        f'exec {TRITON_DIR}/bin/tritonserver --backend-directory={TRITON_DIR}/backends "$@"',
        "",
    ])


def _add_triton(root: Path) -> None:
    pyt = _pytriton()
    dst = root / TRITON_DIR.lstrip("/")
    for part in ("bin", "backends", "caches"):
        if (pyt / "tritonserver" / part).is_dir():
            shutil.copytree(pyt / "tritonserver" / part, dst / part)
    shutil.copytree(pyt.parent / "nvidia_pytriton.libs", dst / "lib")
    stub = pyt / "tritonserver" / "python_backend_stubs" / "3.11" / "triton_python_backend_stub"
    (dst / "backends" / "python").mkdir(parents=True, exist_ok=True)
    shutil.copy2(stub, dst / "backends" / "python" / "triton_python_backend_stub")
    wrapper = root / TRITON_BIN.lstrip("/")
    wrapper.write_text(_wrapper())
    wrapper.chmod(0o755)


def build(force: bool = False) -> Path:
    """The cached root filesystem tar, built when missing (root only: debootstrap)."""
    out = rootfs_tar()
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=out.parent))
    root = work / "root"
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(DEB_PACKAGES)}",
              SUITE, str(root), MIRROR], stdout=subprocess.DEVNULL)
        # Host pip, cp311 manylinux wheels, straight into the image's site directory.
        site = root / "usr/local/lib/python3.11/dist-packages"
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--no-compile", "--only-binary=:all:", "--python-version", "3.11",
              "--implementation", "cp", "--platform", "manylinux2014_x86_64",
              "--platform", "manylinux_2_28_x86_64", "--target", str(site), *PIP_PACKAGES])
        # numpy/mpi4py come from Debian (built for its Open MPI); drop pip's copies.
        for extra in site.glob("numpy*"):
            shutil.rmtree(extra, ignore_errors=True)
        _add_triton(root)
        # No host keys or caches baked in: every run brings its own host key.
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
        (root / "run/sshd").mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tar.part")
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."])
        os.replace(tmp, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in out.parent.glob("rootfs-*.tar"):
        if old != out:
            old.unlink(missing_ok=True)
    return out


def import_argv(docker: list[str], tar: Path, tag: str = IMAGE) -> list[str]:
    """`docker import` with the recipe's metadata (for one daemon's CLI prefix)."""
    argv = [*docker, "import"]
    for change in CHANGES:
        argv += ["--change", change]
    return [*argv, str(tar), tag]


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        print(build(force="--force" in sys.argv))
    else:
        print(__doc__)
        sys.exit(2)
