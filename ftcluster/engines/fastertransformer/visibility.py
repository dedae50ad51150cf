"""Is the checkpoint the FT backend will read visible inside the rank containers?

FT reads `model_checkpoint_path` (from config.pbtxt) inside the container the rank runs in. The
container sees the host only through the cluster's mounts and the run folder (mounted at its own
path); a checkpoint outside them makes every rank fail at model load, minutes after submission.
This check refuses that before anything is written or submitted. Pure apart from reading where
host paths lead (realpath), and only for the container styles (Pyxis, Docker on Slurm or ssh).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from ftcluster.errors import PlanError
from ftcluster.spec.launch_styles import style_of
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.engines.fastertransformer.spec import FTModelSpec


@dataclass(frozen=True)
class Visible:
    """A container path prefix and the host path it shows (None: unknown, e.g. a docker volume)."""

    dst: str
    src: str | None


def _in_container(path: str) -> str:
    # Pyxis/Enroot resolve a relative target against the container's root.
    return posixpath.normpath(posixpath.join("/", path))


def _under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/")


def visible_paths(cluster: ClusterSpec, run_dir: Path | None = None) -> list[Visible]:
    """What the rank containers see of the host: the mounts, then the run folder."""
    out = []
    for m in cluster.container.mounts:
        if m.src in ("tmpfs", "umount"):
            continue   # an empty tmpfs, or a mount taken away: nothing of the host there
        host = m.src if m.src.startswith("/") else None   # docker volumes, relative paths
        out.append(Visible(_in_container(m.dst), host))
    if run_dir is not None:
        out.append(Visible(str(run_dir), str(run_dir)))
    return out


def server_checkpoint_path(model: FTModelSpec, tp: int) -> str:
    """model_checkpoint_path as the run's config.pbtxt will hold it (a `parameters` entry wins)."""
    given = model.parameters.get("model_checkpoint_path")
    if given:
        return given
    base = model.checkpoint_mount or str(model.checkpoint_root)
    return f"{base.rstrip('/')}/{tp}-gpu/"


def check_checkpoint_visible(cluster: ClusterSpec, model: FTModelSpec, tp: int, run_dir: Path | None = None) -> None:
    """Refuse a checkpoint the rank containers cannot see; no-op for ranks that run on the hosts."""
    if not style_of(cluster).in_image:
        return
    path = server_checkpoint_path(model, tp)
    inside = _in_container(path)
    covering = [v for v in visible_paths(cluster, run_dir) if _under(inside, v.dst)]
    root = str(model.checkpoint_root)
    if not covering:
        target = model.checkpoint_mount or root
        raise PlanError(
            f"model_checkpoint_path {path} is not visible inside the {cluster.container.runtime} containers: "
            "no container.mounts entry (nor the run folder) covers it",
            field="container.mounts",
            hint=f"add the mount {root}:{target}:ro to container.mounts"
                 + ("" if model.checkpoint_mount else ", or set checkpoint_mount to where an existing mount shows it"),
        )
    # The most specific mount decides what the container sees there.
    best = max(covering, key=lambda v: len(v.dst))
    if best.src is None or model.parameters.get("model_checkpoint_path"):
        return
    rel = posixpath.relpath(inside, best.dst)
    host = posixpath.normpath(posixpath.join(best.src, rel))
    expected = os.path.join(root, f"{tp}-gpu")
    # Only when both host paths exist here can a mismatch be told from a different mount layout.
    if os.path.exists(host) and os.path.exists(expected) and os.path.realpath(host) != os.path.realpath(expected):
        raise PlanError(
            f"model_checkpoint_path {path} is {host} on the host (mount {best.src}:{best.dst}), "
            f"not the checkpoint_root's {expected}",
            field="checkpoint_mount",
            hint=f"set checkpoint_mount to where the mounts show {root}, or mount {root}:{model.checkpoint_mount or root}:ro",
        )
