"""Per-run copy of the Triton model repository with the plan's values set.

The user's repository is never edited. Small files are copied; large files and converted
`N-gpu` checkpoint folders inside the repository are symlinked, so preparing a run does not
copy gigabytes of weights. config.pbtxt files are rewritten through the protobuf schema.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Callable

from ftcluster.engines.triton_config import model_config_pb2

from ftcluster.engines.fastertransformer.checkpoint import GPU_DIR
from ftcluster.errors import UserError
from ftcluster.engines.base import Prepared
from ftcluster.engines.triton_config import dump_model_config, read_model_config, scan_repository, set_param
from ftcluster.engines.fastertransformer.modeltypes import backend_type
from ftcluster.plan.parallel import Plan
from ftcluster.engines.fastertransformer.spec import FTModelSpec

_COPY_LIMIT = 1 << 20  # bytes; bigger files are linked, not copied


def checkpoint_path_for_server(model: FTModelSpec, plan: Plan) -> str:
    """model_checkpoint_path as the server sees it (container-side when mounted elsewhere)."""
    base = model.checkpoint_mount or str(model.checkpoint_root)
    return f"{base.rstrip('/')}/{plan.tensor_para_size}-gpu/"


def _precision(weight_data_type: str | None) -> str:
    return weight_data_type if weight_data_type in ("fp32", "fp16", "bf16") else "fp16"


def ft_parameters(model: FTModelSpec, plan: Plan, source: dict[str, str] | None = None) -> dict[str, str]:
    """The FT backend parameters a run sets; pure.

    Only the plan's values and what the spec sets explicitly: every other parameter stays what
    the source config.pbtxt (`source`, its parameters) says. data_type is added from the
    checkpoint only when the source has none (the backend refuses a model without it).
    """
    source = source or {}
    params = {
        "tensor_para_size": str(plan.tensor_para_size),
        "pipeline_para_size": str(plan.pipeline_para_size),
        "model_checkpoint_path": checkpoint_path_for_server(model, plan),
    }
    wanted_type = backend_type(model.model_type)
    # The backend defaults a missing model_type to GPT; only a different one is written.
    if source.get("model_type", "GPT") != wanted_type:
        params["model_type"] = wanted_type
    if model.data_type is not None:
        params["data_type"] = model.data_type
    elif "data_type" not in source:
        params["data_type"] = _precision(plan.details.get("weight_data_type"))
    if model.int8_mode is not None:
        params["int8_mode"] = str(model.int8_mode)
    if model.enable_custom_all_reduce is not None:
        params["enable_custom_all_reduce"] = "1" if model.enable_custom_all_reduce else "0"
    params.update(model.parameters)
    return params


def apply_plan(
    cfg: model_config_pb2.ModelConfig, params: dict[str, str], max_batch_size: int | None
) -> None:
    """Set the FT model's parameters in place; nothing else is touched."""
    for key, value in params.items():
        set_param(cfg, key, value)
    if max_batch_size is not None:
        cfg.max_batch_size = max_batch_size


def _resolve_relative_links(src: Path, dst: Path, copy: Callable[[str, str], str]) -> None:
    """A relative link would dangle in the copy: a small file is copied (every node and container
    that sees the run folder then sees it too), anything else is linked by its absolute path --
    and so is a file outside the repository that others may not read: a link to ~/.ssh would
    otherwise copy a 0600 key into a run folder others may read."""
    root = os.path.realpath(src)
    for folder, dirs, files in os.walk(dst):
        for name in [*dirs, *files]:
            link = os.path.join(folder, name)
            if not os.path.islink(link) or os.path.isabs(os.readlink(link)):
                continue
            target = os.path.realpath(os.path.join(src, os.path.relpath(link, dst)))
            os.unlink(link)
            private = os.path.commonpath([root, target]) != root and os.path.isfile(target) \
                and not os.stat(target).st_mode & stat.S_IROTH
            if os.path.isfile(target) and not private:
                copy(target, link)
            else:
                os.symlink(target, link)


def _copy_tree(src: Path, dst: Path) -> None:
    def copy(s: str, d: str) -> str:
        if not stat.S_ISREG(os.stat(s).st_mode):
            raise UserError(f"{s} is not a regular file (a FIFO, socket or device) and cannot be copied "
                            "into the run's model repository", field="model.repository",
                            hint="remove it from the repository")
        if os.path.getsize(s) > _COPY_LIMIT:
            os.symlink(os.path.abspath(s), d)
            return d
        return str(shutil.copy2(s, d))

    def ignore(folder: str, names: list[str]) -> list[str]:
        # Link converted weight folders instead of copying them.
        skipped = []
        for name in names:
            if GPU_DIR.fullmatch(name) and os.path.isdir(os.path.join(folder, name)):
                rel = os.path.relpath(os.path.join(folder, name), src)
                target = dst / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.abspath(os.path.join(folder, name)), target)
                skipped.append(name)
            elif name in ("__pycache__",):
                skipped.append(name)
        return skipped

    shutil.copytree(src, dst, copy_function=copy, ignore=ignore, symlinks=True, dirs_exist_ok=True)
    _resolve_relative_links(src, dst, copy)
    # copy2/copystat keep the source's modes; a read-only source (a shared or read-only
    # mount) must still give a per-run copy the owner can rewrite and delete.
    for folder, dirs, files in os.walk(dst):
        for name in [*dirs, *files]:
            p = os.path.join(folder, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    os.chmod(dst, os.stat(dst).st_mode | stat.S_IWUSR)


def _write_config(path: Path, cfg: model_config_pb2.ModelConfig) -> None:
    # Never write through a link: a symlinked model folder or config.pbtxt is the user's.
    if path.parent.is_symlink():
        target = path.parent.resolve()
        path.parent.unlink()
        _copy_tree(target, path.parent)
    if path.is_symlink():
        path.unlink()
    path.write_text(dump_model_config(cfg))


def prepare_repository(model: FTModelSpec, plan: Plan, out: Path) -> Prepared:
    """Copy `model.repository` to `out` and set the plan on the FT model's config.pbtxt."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder", field="--out",
                        hint="choose a new folder; runs never overwrite each other")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} already exists and is not empty", field="--out",
                        hint="choose a new folder; runs never overwrite each other")
    if out.exists():
        out.rmdir()
    out.parent.mkdir(parents=True, exist_ok=True)
    _copy_tree(model.repository, out)
    cfg_path = out / plan.engine_model / "config.pbtxt"
    cfg = read_model_config(cfg_path)
    params = ft_parameters(model, plan, {k: v.string_value for k, v in cfg.parameters.items()})
    apply_plan(cfg, params, model.max_batch_size)
    _write_config(cfg_path, cfg)
    if model.max_batch_size is not None:
        _cap_ensembles(out, plan.engine_model, model.max_batch_size)
    return Prepared(out, plan.engine_model, params)


def _cap_ensembles(repo: Path, ft_model: str, mbs: int) -> None:
    # An ensemble may not batch more than the models it calls.
    for name, m in scan_repository(repo).items():
        steps = m.config.ensemble_scheduling.step
        if any(s.model_name == ft_model for s in steps) and m.config.max_batch_size > mbs:
            m.config.max_batch_size = mbs
            _write_config(m.path / "config.pbtxt", m.config)
