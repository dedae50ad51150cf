"""Small text helpers for what the job reads back from logs and per-node files."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional


def read_text(path: str) -> str:
    """The file's text; "" when it is not there (yet)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def mtime(path: str) -> Optional[float]:
    """When the file was last written; None when it is not there."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def squeeze(text: str) -> str:
    """On one line, runs of white space as one space."""
    return " ".join(text.split())


def first_match(text: str, pattern: str) -> str:
    rx = re.compile(pattern)
    return next((ln for ln in text.splitlines() if rx.search(ln)), "")


def last_line(text: str) -> str:
    """The last line that says something."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def write_json(path: str, data: Any, mode: Optional[int] = None) -> None:
    """Whole or not at all: a reader elsewhere (status on the login node, the front, Prometheus)
    may read the file at any moment. `mode`: its permissions (default: the umask's)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
