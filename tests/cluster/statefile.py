"""DIR/state.json, shared by the test bed and its supervisor: reads, and updates under a lock."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_state(folder: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((folder / "state.json").read_text())
        return data
    except (FileNotFoundError, ValueError):
        return {}


def locked_update(folder: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read, change and atomically replace state.json while holding DIR/state.lock."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "state.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_state(folder)
        change(state)
        tmp = folder / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(folder / "state.json")
        return state
