"""The TEST image of the container paths, shaped like a user's Triton + FT image.

Not a product image. It imitates what the FT backend's docker/Dockerfile builds on NVIDIA's
tritonserver image, inconvenient parts included: tritonserver under /opt/tritonserver/bin with
the backends folder beside it, Open MPI under /usr/local/mpi, on the image's PATH but NOT on
the PATH that ssh sessions get (the FT README adds it by hand), openssh-server, and the image's own python3 with
numpy and tritonclient -- but no ftcluster, no mpi4py, no pydantic, and not the launching
interpreter's path. Its python3 is Debian 12's 3.11: tritonserver 2.51 needs glibc >= 2.35, so
no older Debian (with an older python3) can run it; tests/unit checks that what runs inside an
image parses as Python 3.8. Torch and transformers are left out (large, and nothing of the
container paths uses them). The faithful test model stands in for the FT backend and brings its
own MPI binding (ctmpi.py beside its model.py, as FT's MPI lives inside its .so).

No registry is reachable from the test machines, so the root filesystem is made with
debootstrap from Debian's mirror, tritonclient is installed with the host's pip (`--target`,
the image python's wheels), and the CPU tritonserver 2.51 bundle is copied from the host's
nvidia-pytriton wheel. The result is a `docker import`-able tar, cached by a hash of this recipe:

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

IMAGE = "ftcluster-test/triton-ft-like:2.51"
LABEL = "org.ftcluster.test-image=true"
# Which recipe an imported image came from: a daemon's older import under the same tag is
# replaced, not reused.
RECIPE_LABEL = "org.ftcluster.test-image-recipe"
SUITE = "bookworm"
PY_VERSION = "3.11"
MIRROR = os.environ.get("FTC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Debian packages: sshd, Open MPI, bash, curl, python3 (+ libpython and numpy for the python
# backend stub, which the real image has too).
DEB_PACKAGES = (
    "bash", "openssh-server", "openssh-client", "openmpi-bin", "curl", "ca-certificates",
    "python3", f"libpython{PY_VERSION}", "python3-numpy", "procps", "iproute2",
)
# What the FT Dockerfile pip-installs and is cheap here.
PIP_PACKAGES = ("tritonclient[http]==2.51.0",)
TRITON_DIR = "/opt/tritonserver"
# The name a user's image has: a wrapper that adds the CPU bundle's library and backend paths.
TRITON_BIN = f"{TRITON_DIR}/bin/tritonserver"
MPI_DIR = "/usr/local/mpi"
# docker import --change lines: what a Dockerfile would say.
CHANGES = (
    f"LABEL {LABEL}",
    # As NVIDIA's images: the image's PATH has Open MPI (a singleton MPI_Init needs its orted),
    # but sshd's sessions -- mpirun's remote orted -- get sshd's default PATH without it.
    "ENV PATH=/opt/tritonserver/bin:/usr/local/mpi/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
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
        f'exec {TRITON_DIR}/bin/tritonserver.bin --backend-directory={TRITON_DIR}/backends "$@"',
        "",
    ])


def _add_triton(root: Path) -> None:
    pyt = _pytriton()
    dst = root / TRITON_DIR.lstrip("/")
    for part in ("bin", "backends", "caches"):
        if (pyt / "tritonserver" / part).is_dir():
            shutil.copytree(pyt / "tritonserver" / part, dst / part)
    shutil.copytree(pyt.parent / "nvidia_pytriton.libs", dst / "lib")
    stub = pyt / "tritonserver" / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub"
    (dst / "backends" / "python").mkdir(parents=True, exist_ok=True)
    shutil.copy2(stub, dst / "backends" / "python" / "triton_python_backend_stub")
    # The FT backend's folder, as the real image has it (the test model is a python model).
    (dst / "backends" / "fastertransformer").mkdir(parents=True, exist_ok=True)
    wrapper = root / TRITON_BIN.lstrip("/")
    os.replace(wrapper, dst / "bin" / "tritonserver.bin")
    wrapper.write_text(_wrapper())
    wrapper.chmod(0o755)


def _move_mpi(root: Path) -> None:
    """Open MPI's commands to /usr/local/mpi/bin, off the default PATH, as in NVIDIA's images
    (its libraries stay where the dynamic linker finds them, and /usr/local/mpi/lib links them;
    orted stays in Debian's bindir, where Open MPI itself looks for it)."""
    bindir = root / MPI_DIR.lstrip("/") / "bin"
    libdir = root / MPI_DIR.lstrip("/") / "lib"
    bindir.mkdir(parents=True)
    libdir.mkdir(parents=True)
    usr_bin = root / "usr/bin"
    # orted stays: Open MPI finds it in its compiled-in bindir (a singleton MPI_Init forks it
    # from there), as NVIDIA's images find theirs in /usr/local/mpi/bin, their install prefix.
    moved = [e for e in usr_bin.iterdir()
             if e.name.startswith(("mpirun", "mpiexec", "orte", "ompi", "opal", "osh")) and e.name != "orted"]
    names = {e.name for e in moved}
    for entry in moved:
        dest = bindir / entry.name
        if not entry.is_symlink():
            shutil.move(str(entry), dest)
            continue
        # Debian's alternatives and relative links, re-pointed from their new place.
        target = os.readlink(entry)
        if target.startswith("/etc/alternatives/"):
            target = os.readlink(root / target.lstrip("/"))
        if target.startswith("/usr/bin/") and Path(target).name in names:
            target = Path(target).name
        elif not target.startswith("/") and "/" in target:
            target = os.path.normpath(os.path.join("/usr/bin", target))
        dest.symlink_to(target)
        entry.unlink()
    for lib in (root / "usr/lib/x86_64-linux-gnu").glob("libmpi.so*"):
        (libdir / lib.name).symlink_to(f"/usr/lib/x86_64-linux-gnu/{lib.name}")
    if not (bindir / "mpirun").exists() and not (bindir / "mpirun").is_symlink():
        raise RuntimeError(f"no mpirun moved to {MPI_DIR}/bin: {sorted(p.name for p in bindir.iterdir())}")


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
        # Host pip, the image python's manylinux wheels, straight into its site directory.
        site = root / f"usr/local/lib/python{PY_VERSION}/dist-packages"
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--no-compile", "--only-binary=:all:", "--python-version", PY_VERSION,
              "--implementation", "cp", "--platform", "manylinux2014_x86_64",
              "--platform", "manylinux_2_28_x86_64", "--target", str(site), *PIP_PACKAGES])
        # numpy comes from Debian (the stub's); drop pip's copy.
        for extra in site.glob("numpy*"):
            shutil.rmtree(extra, ignore_errors=True)
        _add_triton(root)
        _move_mpi(root)
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
    for change in (*CHANGES, f"LABEL {RECIPE_LABEL}={recipe_key()}"):
        argv += ["--change", change]
    return [*argv, str(tar), tag]


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        print(build(force="--force" in sys.argv))
    else:
        print(__doc__)
        sys.exit(2)
