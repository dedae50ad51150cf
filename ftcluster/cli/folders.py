"""The folder an --out names (render, prepare, compose, serve): refused when it would overwrite
something, and removed again, as far as the command made it, when writing there fails."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ftcluster.errors import UserError, os_error_words


def out_folder(out: str, option: str = "--out") -> Path:
    """The folder an --out names, refused when empty ('' would be the current folder), when
    it holds something already (it would be overwritten) or is a dangling link."""
    if not out.strip():
        raise UserError("an empty path", field=option, hint="name a new or empty folder")
    path = Path(out).expanduser()
    refuse_dangling_link(path, option)
    try:
        taken = path.exists() and (not path.is_dir() or any(path.iterdir()))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}", field=option) from None
    if taken:
        raise UserError(f"{path} is not empty (or not a folder); nothing was written", field=option,
                        hint="name a new or empty folder")
    return path


def refuse_dangling_link(path: Path, option: str) -> None:
    """Writing through a link to nothing would make its target, somewhere else."""
    try:
        dangling = path.is_symlink() and not path.exists()
    except OSError:   # a name too long to be a path: the write reports it
        return
    if dangling:
        raise UserError(f"{path} is a link to {os.readlink(path)}, which does not exist; nothing was written",
                        field=option, hint="name a new or empty folder, or create the link's target first")


@contextmanager
def new_folder(out: Path, option: str = "--out") -> Iterator[Path]:
    """Yield `out`; if the body fails, remove every folder it created there (a retry then works),
    and report an unwritable place as one line naming the option."""
    try:
        created = [p for p in (out, *out.parents) if not p.exists()]
    except OSError as exc:   # a name too long for the filesystem
        raise UserError(f"cannot write {out}: {exc.strerror or exc}", field=option,
                        hint="choose a folder you can write to") from None
    try:
        yield out
    except BaseException as exc:
        for p in reversed(created):   # the outermost new folder holds everything made
            if p.exists():
                shutil.rmtree(p, ignore_errors=True)
                break
        if isinstance(exc, OSError):
            # The words name the file where the error does (a copy's first failure); else the folder.
            where = "" if exc.filename or isinstance(exc, shutil.Error) else f"{out}: "
            raise UserError(f"cannot write {where}{os_error_words(exc)}", field=option,
                            hint="choose a folder you can write to") from None
        raise
