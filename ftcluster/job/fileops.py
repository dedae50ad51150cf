"""File operations of the job's own: a private copy, a size that is 0 when absent, a removal
that never follows a link."""

from __future__ import annotations

import os
import shutil


def copy_private(src: str, dst: str, mode: int) -> None:
    """A copy of a file, created with `mode` (a key's copy is never readable by others)."""
    with open(src, "rb") as f, os.fdopen(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def remove_entry(path: str) -> None:
    """A folder with what is in it, or a file or link (a link is never followed); what is gone
    already is no error."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass
