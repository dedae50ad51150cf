"""The serving image: build it (Docker SDK), push it, import it for Enroot/Pyxis.

What is built is the engine's (its ImageRecipe, ftcluster.engines.base): a Dockerfile of a source
tree the user has, with the Triton release as a build arg, on the daemon DOCKER_HOST names; what
this module does with it is the same for every engine. What was built is recorded as JSON in
`<workspace>/images/<tag>.json` (image id, TRITON_VERSION, the .sqsh once imported), so a launch
can record which image served a run: `image_metadata(cluster)`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ftcluster.engines.base import Engine, ImageRecipe
from ftcluster.errors import UserError
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.engines import default_engine, engine_named

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class ImageError(UserError):
    exit_code = 1


@dataclass(frozen=True)
class ImageMetadata:
    tag: str
    image_id: str
    triton_version: str
    ft_backend: str                 # the source it was built from (the key of every record written so far)
    built: float
    pushed: str | None = None       # the registry reference, once pushed
    sqsh: str | None = None         # the Enroot image, once imported

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- the engine's recipe -------------------------------------------------------------------

def recipe_of(engine: Engine) -> ImageRecipe | None:
    """The engine's image recipe (None: it has none; an engine written before `Engine.image` has none)."""
    recipe: ImageRecipe | None = getattr(engine, "image", None)
    return recipe


def engine_recipe(name: str | None = None) -> tuple[Engine, ImageRecipe]:
    """The engine `name` (default: the default engine) and its image recipe; UserError where it has none."""
    engine: Engine = engine_named(name or default_engine())
    recipe = recipe_of(engine)
    if recipe is None:
        raise UserError(f"the engine {engine.name} has no image build", field="--engine",
                        hint="build its image with its own tools and name it in container.image")
    return engine, recipe


# ---- names --------------------------------------------------------------------------------

def _is_sqsh(ref: str | None) -> bool:
    return bool(ref) and (ref or "").endswith(".sqsh")


def image_tag(cluster: ClusterSpec, override: str | None = None,
              triton_version: str | None = None, recipe: ImageRecipe | None = None) -> str:
    """--tag, else image.tag, else container.image when it names an image, else the recipe's
    (default: the default engine's) repository tagged with the Triton release."""
    if override:
        return override
    if cluster.image.tag:
        return cluster.image.tag
    if cluster.container.image and not _is_sqsh(cluster.container.image) \
            and not cluster.container.image.startswith("/"):
        return cluster.container.image
    repository = (recipe or engine_recipe()[1]).repository
    return f"{repository}:{triton_version or cluster.image.triton_version}"


def _safe(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


def images_dir(cluster: ClusterSpec) -> Path:
    return Path(cluster.workspace) / "images"   # expanded once, by the spec


def metadata_path(cluster: ClusterSpec, tag: str | None = None) -> Path:
    return images_dir(cluster) / f"{_safe(tag or image_tag(cluster))}.json"


def sqsh_path(cluster: ClusterSpec, tag: str | None = None) -> Path:
    """image.sqsh, else container.image when it is a .sqsh path, else <workspace>/images/<tag>.sqsh."""
    if cluster.image.sqsh:
        return Path(os.path.expandvars(cluster.image.sqsh)).expanduser()
    if _is_sqsh(cluster.container.image):
        return Path(os.path.expandvars(cluster.container.image or "")).expanduser()
    return images_dir(cluster) / f"{_safe(tag or image_tag(cluster))}.sqsh"


def write_metadata(cluster: ClusterSpec, meta: ImageMetadata) -> Path:
    path = metadata_path(cluster, meta.tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps(meta.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def image_metadata(cluster: ClusterSpec, tag: str | None = None) -> ImageMetadata | None:
    """What `image build` recorded for this cluster's image (None when it was not built here).

    Launch calls this to record the image id and TRITON_VERSION with a run.
    """
    path = metadata_path(cluster, tag)
    try:
        return ImageMetadata(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


# ---- build --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildEvent:
    kind: str           # "step" | "log"
    text: str
    step: int = 0
    steps: int = 0


def check_source(recipe: ImageRecipe, source: Path, option: str = "--source") -> Path:
    """The recipe's Dockerfile in `source` (UserError naming `option` where it is not a file)."""
    dockerfile = source / recipe.dockerfile
    if not dockerfile.is_file():
        raise UserError(f"{dockerfile} does not exist", field=option, hint=f"point it at {recipe.source}")
    return dockerfile


def docker_client() -> Any:
    """A Docker SDK client for DOCKER_HOST (or the default socket); builds take their time."""
    # startup: the Docker service code only when a daemon is asked
    from ftcluster.service.serve import docker_client as client_for

    return client_for(None, timeout=600, field="DOCKER_HOST")


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def build_events(stream: Iterable[dict[str, Any]]) -> Iterator[BuildEvent]:
    """The daemon's JSON build stream as steps and log lines; raises ImageError on the error.

    The error names the step that failed (`Step 3/5 : RUN make`) and the daemon's message.
    """
    step = BuildEvent("step", "", 0, 0)
    for chunk in stream:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            msg = " ".join(str(detail.get("message") or chunk.get("error") or "").split())
            where = f"step {step.step}/{step.steps} ({step.text})" if step.step else "the build"
            raise ImageError(f"{where} failed: {msg}")
        text = chunk.get("stream")
        if not isinstance(text, str):
            continue
        for line in text.splitlines():
            m = _STEP.match(line.strip())
            if m:
                step = BuildEvent("step", m.group(3), int(m.group(1)), int(m.group(2)))
                yield step
            elif line.strip():
                yield BuildEvent("log", line.rstrip())


def build_image(client: Any, recipe: ImageRecipe, source: Path, tag: str, triton_version: str,
                on_event: Callable[[BuildEvent], None], network_mode: str | None = None) -> str:
    """Build the recipe's Dockerfile of `source` (the build's context); the new image's id."""
    # optional extra: docker (the Docker SDK)
    from docker.errors import APIError

    check_source(recipe, source)
    try:
        stream = client.api.build(path=str(source), dockerfile=recipe.dockerfile, tag=tag, rm=True,
                                  forcerm=True, decode=True, network_mode=network_mode,
                                  buildargs=recipe.build_args(triton_version))
        for event in build_events(stream):
            on_event(event)
        image_id: str = client.images.get(tag).id
    except APIError as exc:
        raise ImageError(f"the Docker daemon refused the build: {_short(exc.explanation or exc)}") from None
    return image_id


def push_image(client: Any, tag: str, registry: str, on_line: Callable[[str], None]) -> str:
    """Tag `tag` under `registry` and push it; the pushed reference."""
    # optional extra: docker (the Docker SDK)
    from docker.errors import APIError
    from docker.utils import parse_repository_tag

    repo, version = parse_repository_tag(tag)
    version = version or "latest"
    first = repo.split("/")[0]
    if "/" in repo and ("." in first or ":" in first or first == "localhost"):
        repo = repo.split("/", 1)[1]   # drop the registry host the tag already names
    ref_repo = f"{registry.rstrip('/')}/{repo}"
    try:
        client.images.get(tag).tag(ref_repo, tag=version)
        for chunk in client.api.push(ref_repo, tag=version, stream=True, decode=True):
            if "error" in chunk or "errorDetail" in chunk:
                msg = (chunk.get("errorDetail") or {}).get("message") or chunk.get("error")
                raise ImageError(f"push of {ref_repo}:{version} failed: {' '.join(str(msg).split())}")
            if chunk.get("status"):
                on_line(f"{chunk.get('id', '')} {chunk['status']}".strip())
    except APIError as exc:
        raise ImageError(f"push of {ref_repo}:{version} failed: {_short(exc.explanation or exc)}") from None
    return f"{ref_repo}:{version}"


def record_build(cluster: ClusterSpec, tag: str, image_id: str, triton_version: str,
                 source: Path, pushed: str | None) -> Path:
    old = image_metadata(cluster, tag)
    meta = ImageMetadata(tag=tag, image_id=image_id, triton_version=triton_version,
                         ft_backend=str(source.resolve()), built=time.time(), pushed=pushed,
                         sqsh=old.sqsh if old and old.image_id == image_id else None)
    return write_metadata(cluster, meta)


# ---- enroot import ------------------------------------------------------------------------

def enroot_argv(tag: str, sqsh: Path) -> list[str]:
    # dockerd:// reads the image from the local Docker daemon, no registry needed.
    return ["enroot", "import", "-o", str(sqsh), f"dockerd://{tag}"]


def import_script(tag: str, sqsh: Path) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        "# Written by `ftcluster image import`: the image as an Enroot squashfs for Pyxis",
        f"# (srun --container-image={shlex.quote(str(sqsh))}).",
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(str(sqsh.parent))}",
        shlex.join(enroot_argv(tag, sqsh)),
        "",
    ])


def write_import_script(cluster: ClusterSpec, tag: str, sqsh: Path) -> Path:
    path = images_dir(cluster) / f"import-{_safe(tag)}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(import_script(tag, sqsh))
    path.chmod(0o755)
    return path


def run_import(cluster: ClusterSpec, tag: str, sqsh: Path, script: Path, force: bool) -> None:
    if shutil.which("enroot") is None:
        raise ImageError("enroot is not installed on this machine", field="image import",
                         hint=f"run {script} on a node with enroot and access to the Docker daemon, "
                              "or use --dry-run to print the command")
    if sqsh.exists():
        if not force:
            raise ImageError(f"{sqsh} already exists", hint="pass --force to replace it")
        sqsh.unlink()
    p = subprocess.run(["bash", str(script)], check=False)
    if p.returncode != 0:
        raise ImageError(f"enroot import exited {p.returncode}", hint=f"see its output above; script {script}")
    meta = image_metadata(cluster, tag)
    if meta is not None:
        write_metadata(cluster, ImageMetadata(**{**meta.to_dict(), "sqsh": str(sqsh)}))
