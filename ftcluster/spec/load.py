"""Reading the spec files: a cluster and a model spec from their YAML files, the cluster's with
command-line overrides (with_values, with_image) checked together with the file's values. Errors
name the file and the field (``cluster.yaml: container.runtime: ...``), or the option that gave
the value, and are raised as `SpecError`, so the CLI prints one line and no traceback. Relative
paths in a spec are resolved against the spec file's folder, so specs can be moved together with
their models."""

from __future__ import annotations

import errno
import re
import stat
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from ftcluster.errors import SpecError, UserError, every
from ftcluster.spec import yaml_text
from ftcluster.spec.cluster import LOCAL_PORTS, ClusterSpec
from ftcluster.spec.errors import checked, cut, format_errors
from ftcluster.spec.engines import default_engine, model_spec_class
from ftcluster.spec.model import ModelSpec

_S = TypeVar("_S", bound=BaseModel)


# A spec is a few KB: a larger file is not one (nor one whose aliases expand past
# yaml_text.MAX_VALUES values).
SPEC_MAX_BYTES = 1 << 20


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        st = path.stat()
    except (OSError, ValueError):   # ValueError: a NUL in the path (the config file's)
        raise SpecError(f"spec file {path} does not exist",
                        hint="check the path given to --cluster/--model, $FTCLUSTER_CLUSTER/$FTCLUSTER_MODEL "
                             "or `ftcluster config`") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"spec file {path} is not a regular file", hint="give a YAML file")
    if st.st_size > SPEC_MAX_BYTES:
        raise SpecError(f"{path}: {st.st_size} bytes is too large for a spec (at most {SPEC_MAX_BYTES})")
    try:
        with open(path, "rb") as f:
            raw = f.read(SPEC_MAX_BYTES + 1)
        if len(raw) > SPEC_MAX_BYTES:
            raise SpecError(f"{path}: too large for a spec (at most {SPEC_MAX_BYTES} bytes)")
        data = yaml_text.load(raw.decode())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: {yaml_text.problem(exc)}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file") from None
    if data is None:
        raise SpecError(f"{path}: the file is empty", hint="see configs/ for examples")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def _validate(cls: type[_S], path: Path, data: dict[str, Any], names: dict[str, str] | None = None) -> _S:
    # Relative paths in a spec (the cluster's workspace) are taken from the spec's folder.
    spec, errors = checked(cls, data, {"base": str(path.resolve().parent)})
    if spec is None:
        raise SpecError(format_errors(path, errors, names))
    return spec


def load_cluster(path: str | Path, overrides: dict[str, Any] | None = None,
                 options: dict[str, str] | None = None) -> ClusterSpec:
    """The cluster spec, with top-level values replaced (command-line overrides), checked
    together: an error names the file's fields, and the options' (options: field -> option)."""
    p = Path(path).expanduser()
    data = _read_yaml(p)
    try:
        model_class = _model_class(data)
    except UserError:   # a backend no engine has: tell the keys apart by the shared fields
        model_class = ModelSpec
    _refuse_the_other_kind(p, data, ClusterSpec, model_class)
    # The default name comes from the file name, made a valid name (it names jobs and folders).
    data.setdefault("name", re.sub(r"[^A-Za-z0-9_.-]", "-", p.stem).lstrip("._-") or "cluster")
    given = "ports" in {**data, **(overrides or {})}
    if not given and {**data, **(overrides or {})}.get("scheduler") == "local":
        # What a render or dry run shows, and a run folder started by hand takes; a launch
        # picks a free block (schedulers.local).
        data = {**data, "ports": LOCAL_PORTS}
    spec = _with_values(p, data, overrides or {}, options)
    return spec.model_copy(update={"source": str(p.resolve()), "ports_given": given})


def _with_values(path: Path, data: dict[str, Any], values: dict[str, Any],
                 options: dict[str, str] | None) -> ClusterSpec:
    """`data` with top-level `values` replaced, checked together; a problem of a value given is
    named by the option that gave it (options: dotted field -> option)."""
    named = {field: opt for field, opt in (options or {}).items() if field.split(".")[0] in values}
    return _validate(ClusterSpec, path, {**data, **values}, named)


def with_values(cluster: ClusterSpec, values: dict[str, Any], options: dict[str, str] | None = None) -> ClusterSpec:
    """The spec with top-level values replaced (command-line overrides), each checked as the
    spec's own would be; an error names the field, or the option that gave it (options:
    dotted field -> option)."""
    path = Path(cluster.source or "cluster.yaml")
    return _with_values(path, cluster.model_dump(), values, options).model_copy(
        update={"source": cluster.source, "ports_given": cluster.ports_given or "ports" in values})


def with_image(cluster: ClusterSpec, image: str, option: str | None = None) -> ClusterSpec:
    """The spec with another container.image, checked as the spec's own value is."""
    return with_values(cluster, {"container": {**cluster.container.model_dump(), "image": image}},
                       {"container.image": option} if option else None)


def load_model(path: str | Path, to_make: tuple[str, ...] = ()) -> ModelSpec:
    """The model spec; its folders must exist, but for those in `to_make`, which the caller
    makes (`convert` writes checkpoint_root): those only must not be something else."""
    p = Path(path).expanduser()
    data = _read_yaml(p)
    try:
        cls = _model_class(data)
    except UserError as exc:
        raise SpecError(f"{p}: backend: {exc.message} ({exc.hint})") from None
    _refuse_the_other_kind(p, data, cls, ClusterSpec)
    base = p.resolve().parent
    for key in cls.folders:
        val = data.get(key)
        if isinstance(val, str) and val:
            data[key] = str(base / Path(val).expanduser())
    spec, errors = checked(cls, data, {"base": str(base)})
    problems = [format_errors(None, errors)] if errors else []
    failed = {err["loc"][0] for err in errors if err["loc"]}
    # The folders are checked also when another field is wrong: every problem at once (a folder
    # whose own value was refused, a NUL in it, is said once, by that).
    for key, hint in cls.folders.items():
        folder = data.get(key)
        if key in failed:
            continue
        if folder == "":
            problems.append(f"{key}: an empty path ({hint})")
        elif isinstance(folder, str) and (why := _not_a_folder(Path(folder))) and not (
                key in to_make and why == "does not exist"):
            problems.append(f"{key}: folder {cut(folder)} {why} ({hint})")
    if problems:
        raise SpecError(f"{p}: " + "; ".join(problems))
    assert spec is not None
    return spec.model_copy(update={"source": str(p.resolve())})


# The words for each kind of spec: what it is, the option that takes it.
_KINDS = {"ClusterSpec": ("a cluster spec", "--cluster"), "ModelSpec": ("a model spec", "--model")}


def _kind(cls: type[BaseModel]) -> str:
    return "ModelSpec" if issubclass(cls, ModelSpec) else cls.__name__


def _model_class(data: dict[str, Any]) -> type[ModelSpec]:
    """The model spec class the data's `backend` names (the shared one where it is no name: its
    check says so); UserError: no engine has that name."""
    backend = data.get("backend", default_engine())
    return model_spec_class(backend) if isinstance(backend, str) else ModelSpec


def _refuse_the_other_kind(path: Path, data: dict[str, Any], wanted: type[BaseModel], other: type[BaseModel]) -> None:
    """One line for a model spec given where a cluster spec goes (or the other way round, the
    options swapped), instead of a line per key it does not know."""
    keys = {str(k) for k in data} - {"name"}
    if not keys or keys & set(wanted.model_fields) or not keys <= set(other.model_fields):
        return
    (is_, its_option), (want, option) = _KINDS[_kind(other)], _KINDS[_kind(wanted)]
    named = ", ".join(sorted(keys)[:4]) + (", ..." if len(keys) > 4 else "")
    raise SpecError(f"{path}: this is {is_} ({named}), not {want}",
                    hint=f"give it as {its_option}, and {want} as {option}")


def load_specs(cluster_path: str | Path, model_path: str | Path,
               overrides: dict[str, Any] | None = None,
               options: dict[str, str] | None = None, to_make: tuple[str, ...] = ()) -> tuple[ClusterSpec, ModelSpec]:
    """Both specs (the cluster's with command-line overrides), or one error saying every
    problem of both (`to_make`: as load_model's)."""
    found, model = every(lambda: load_cluster(cluster_path, overrides, options),
                         lambda: load_model(model_path, to_make))
    return found, model


def _not_a_folder(path: Path) -> str | None:
    """Why a spec's folder cannot be used, or None. A name too long for the filesystem, or one
    behind a folder the user may not enter, is the spec's problem to report, not a crash."""
    try:
        st = path.stat()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        return f"cannot be used: {exc.strerror or exc}"
    except ValueError:   # a NUL, or a surrogate the file system's encoding cannot take
        return "cannot be a path: it holds a character no path can"
    return None if stat.S_ISDIR(st.st_mode) else "is not a folder"

