"""A runnable tritonserver (and perf_analyzer) on a machine without a Triton install.

`tritonserver` on PATH wins. Otherwise the `nvidia-pytriton` wheel ships a CPU tritonserver
with the python backend, but it only runs from inside the wheel with the right environment
(see TESTBED.md section 3). We copy it once into a cached standalone bundle and write a
wrapper script that sets that environment, so the launcher and tests run one plain command.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from ftcluster.errors import UserError, os_error_words
from ftcluster.run.store import cache_root

WRAPPER_NAME = "tritonserver-wrapper"
_INSTALL_HINT = "pip install 'ftcluster[cpu-triton]'"
# pytriton release -> the tritonserver release it bundles (used only to name the cache folder).
_TRITON_OF_PYTRITON = {"0.7.0": "2.51.0"}
# Where the loader already looks; the interpreter's lib dir is only added when elsewhere.
_SYSTEM_LIB_DIRS = {"/lib", "/usr/lib", "/lib64", "/usr/lib64",
                    "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                    "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"}


def _pytriton_dir() -> Path | None:
    # find_spec, not import: importing pytriton pulls in numpy, zmq and more.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root if (root / "tritonserver" / "bin" / "tritonserver").is_file() else None


def _python_lib_dir() -> str | None:
    """The interpreter's lib dir when the loader would not find libpython there by itself.

    The python backend stub links libpython3.X; a non-distro Python (pyenv, conda) keeps it
    off the default search path, and a mismatched system libpython gives `_thread.RLock`
    errors, so ours must come first.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir or os.path.realpath(libdir) in _SYSTEM_LIB_DIRS or not Path(libdir).is_dir():
        return None
    return str(libdir)


def _bundle_env(site_packages: Path) -> dict[str, str]:
    """Environment entries the wrapper prepends (values are paths joined with ':')."""
    libs = [str(site_packages / "nvidia_pytriton.libs")]
    pylib = _python_lib_dir()
    if pylib:
        libs.insert(0, pylib)
    # The stub runs `python3` from PATH; it must be this interpreter (same numpy, same version).
    return {"LD_LIBRARY_PATH": ":".join(libs), "PATH": str(Path(sys.executable).parent)}


def _bundle_name(pytriton: Path) -> str:
    # The distribution beside the package found: one folder read, not every one on sys.path.
    found = next(iter(importlib.metadata.distributions(path=[str(pytriton.parent)], name="nvidia-pytriton")), None)
    version = found.version if found is not None else importlib.metadata.version("nvidia-pytriton")
    triton = _TRITON_OF_PYTRITON.get(version, f"pytriton{version}")
    # The wrapper bakes in this interpreter's paths: a second venv must get its own bundle.
    key = f"{pytriton.resolve()}|{sys.executable}|{sys.version_info[:2]}"
    return f"tritonserver-{triton}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _wrapper_text(bundle: Path, real_binary: Path, env: dict[str, str]) -> str:
    lines = ["#!/usr/bin/env bash", "# Written by ftcluster.service.triton_local: runs the CPU tritonserver",
             "# from the nvidia-pytriton wheel with the environment it needs.", "set -e"]
    for key, value in env.items():
        lines.append(f'export {key}={shlex.quote(value)}"${{{key}:+:${key}}}"')
    backends = shlex.quote(f"--backend-directory={bundle / 'backends'}")
    lines.append(f'exec {shlex.quote(str(real_binary))} {backends} "$@"')
    return "\n".join(lines) + "\n"


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the cache and the wheel share a filesystem (each venv's bundle then
    takes no room of its own: ~22 MB each before), else a copy."""
    try:
        os.link(src, dst)
        shutil.copystat(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _build_bundle(pytriton: Path, bundle: Path) -> None:
    """Build into a temp folder next to `bundle`, then rename: readers never see half a bundle."""
    bundle.parent.mkdir(parents=True, exist_ok=True)
    stub = (pytriton / "tritonserver" / "python_backend_stubs"
            / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub")
    if not stub.is_file():
        raise UserError(f"nvidia-pytriton has no python backend stub for Python "
                        f"{sys.version_info.major}.{sys.version_info.minor}",
                        hint="use Python 3.8-3.13, or put a tritonserver on PATH")
    tmp = Path(tempfile.mkdtemp(prefix=f".{bundle.name}.", dir=bundle.parent))
    try:
        for part in ("bin", "backends", "caches"):
            src = pytriton / "tritonserver" / part
            if src.is_dir():
                shutil.copytree(src, tmp / part, ignore=shutil.ignore_patterns("__pycache__"),
                                copy_function=_link_or_copy)
        (tmp / "backends" / "python").mkdir(parents=True, exist_ok=True)
        placed = tmp / "backends" / "python" / "triton_python_backend_stub"
        placed.unlink(missing_ok=True)   # a hard link to the wheel's file: never written through
        shutil.copy2(stub, placed)
        site_packages = pytriton.parent
        wrapper = tmp / "bin" / WRAPPER_NAME
        # The wrapper names its final location: it is only run after the rename.
        wrapper.write_text(_wrapper_text(bundle, bundle / "bin" / "tritonserver", _bundle_env(site_packages)))
        wrapper.chmod(0o755)
        try:
            os.rename(tmp, bundle)
        except OSError:
            # Another process won the race (the target exists and is non-empty): use theirs.
            if not (bundle / "bin" / WRAPPER_NAME).is_file():
                raise UserError(f"{bundle} exists but is not a complete tritonserver bundle",
                                hint="delete that folder; it is rebuilt on the next run") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def pytriton_bundle() -> Path | None:
    """The cached bundle's wrapper, built on first use; None when nvidia-pytriton is absent."""
    pytriton = _pytriton_dir()
    if pytriton is None:
        return None
    bundle = cache_root() / _bundle_name(pytriton)
    wrapper = bundle / "bin" / WRAPPER_NAME
    if not wrapper.is_file():
        try:
            _build_bundle(pytriton, bundle)
        except OSError as exc:   # a full cache, a file size limit: the half-built folder is gone
            raise UserError(f"cannot set up the CPU tritonserver in {bundle.parent}: {os_error_words(exc)}",
                            field="server.binary",
                            hint="free space there, or point FTCLUSTER_CACHE at a folder with room") from None
    return wrapper


def find_tritonserver() -> Path:
    """The command that runs tritonserver here: the one on PATH, else the pytriton bundle."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    wrapper = pytriton_bundle()
    if wrapper is None:
        raise UserError("no tritonserver found: none on PATH and nvidia-pytriton is not installed",
                        field="server.binary", hint=_INSTALL_HINT)
    return wrapper


def _perf_lib_dir(site_packages: Path) -> Path | None:
    """A folder with the sonames perf_analyzer asks for, linked to the wheel's hashed copies.

    auditwheel renamed them (libb64-98cb6333.so.0d), so LD_LIBRARY_PATH alone is not enough.
    """
    libs = site_packages / "nvidia_pytriton.libs"
    if not libs.is_dir():
        return None
    wanted = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}
    target = cache_root() / f"perf-analyzer-libs-{hashlib.sha256(str(libs).encode()).hexdigest()[:10]}"
    target.mkdir(parents=True, exist_ok=True)
    for soname, pattern in wanted.items():
        found = sorted(libs.glob(pattern))
        link = target / soname
        if not found:
            return None
        if not link.exists():
            tmp = target / f".{soname}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(found[0])
            os.replace(tmp, link)  # atomic: racing processes both end with a good link
    return target


def perf_analyzer_path() -> Path | None:
    """perf_analyzer from the tritonclient 2.51 wheel (or PATH), None when there is none."""
    candidates = [Path(sys.executable).parent / "perf_analyzer"]
    which = shutil.which("perf_analyzer")
    if which:
        candidates.append(Path(which))
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def perf_analyzer_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which perf_analyzer finds libb64 and libcudart."""
    env = dict(os.environ if base is None else base)
    pytriton = _pytriton_dir()
    libdir = _perf_lib_dir(pytriton.parent) if pytriton else None
    if libdir is not None:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{libdir}:{old}" if old else str(libdir)
    return env
