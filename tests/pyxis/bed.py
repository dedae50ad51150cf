"""Real NVIDIA Enroot + Pyxis on the Slurm test bed: what is installed, the bed's plugstack file,
and what a run may leave behind on the nodes.

tests/pyxis/install.sh builds both from ../shared/third_party (as root). The bed enables Pyxis
through a PlugStackConfig= line in the slurm.conf it renders, naming a plugstack file in the
bed's folder; slurmstepd reads that file for every step, so a test can change Pyxis's
arguments (container_scope=job) for the jobs it submits without restarting anything.
Enroot's paths are per node ($(hostname) in /etc/enroot/enroot.conf.d/ftc-testbed.conf):
    /var/lib/enroot/data/<node>.user-<uid>/<container>
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

PLUGIN = Path("/usr/local/lib/slurm/spank_pyxis.so")
ENROOT_CONF = Path("/etc/enroot/enroot.conf.d/ftc-testbed.conf")
ENROOT_DATA = Path("/var/lib/enroot/data")
PYXIS_RUNTIME = Path("/run/pyxis")   # Pyxis's runtime_path: <uid>/<job>.<step>.squashfs imports
THIRD_PARTY = Path(__file__).resolve().parents[3] / "shared" / "third_party"
PLUGSTACK_NAME = "plugstack.conf"


def sources_present() -> bool:
    return all((THIRD_PARTY / f).is_file() for f in ("enroot.tar.gz", "pyxis.tar.gz"))


def unavailable() -> str | None:
    """Why the Pyxis tests cannot run here (None when they can)."""
    if not sources_present():
        return f"no Enroot/Pyxis sources in {THIRD_PARTY} (../shared/third_party)"
    missing = [str(p) for p in (PLUGIN, ENROOT_CONF) if not p.exists()]
    if shutil.which("enroot") is None:
        missing.insert(0, "enroot")
    if missing:
        return f"Enroot/Pyxis not installed ({', '.join(missing)} missing): run tests/pyxis/install.sh as root"
    return None


def plugstack_text(args: Sequence[str] = ()) -> str:
    return " ".join(["required", str(PLUGIN), *args]) + "\n"


def write_plugstack(path: Path, args: Sequence[str] = ()) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(plugstack_text(args))
    tmp.replace(path)


@contextlib.contextmanager
def plugstack_args(path: Path, args: Sequence[str]) -> Iterator[None]:
    """Pyxis's arguments (e.g. container_scope=job) for the steps started meanwhile."""
    old = path.read_text()
    write_plugstack(path, args)
    try:
        yield
    finally:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(old)
        tmp.replace(path)


def containers(nodes: Sequence[str]) -> dict[str, list[str]]:
    """Enroot containers (any user) on each node, by node."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        names: list[str] = []
        for d in sorted(ENROOT_DATA.glob(f"{node}.user-*")):
            with contextlib.suppress(FileNotFoundError):
                names += sorted(e.name for e in d.iterdir())
        out[node] = names
    return out


def leftovers(nodes: Sequence[str]) -> list[str]:
    """Named Pyxis containers and Pyxis's imported squashfs files still on the nodes."""
    left = [f"{n}:{c}" for n, cs in containers(nodes).items() for c in cs if c.startswith("pyxis_")]
    if PYXIS_RUNTIME.is_dir():
        left += [str(p) for p in PYXIS_RUNTIME.glob("*/*.squashfs")]
    return left


def remove_leftovers(nodes: Sequence[str]) -> None:
    for node in nodes:
        for d in ENROOT_DATA.glob(f"{node}.user-*"):
            for c in d.glob("pyxis_*"):
                shutil.rmtree(c, ignore_errors=True)
    if PYXIS_RUNTIME.is_dir():
        for p in PYXIS_RUNTIME.glob("*/*.squashfs"):
            p.unlink(missing_ok=True)
