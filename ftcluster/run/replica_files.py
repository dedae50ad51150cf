"""A replica set's files in its front's run folder, read: the members the front balances over,
what its balancer carries now, the front's settings and endpoint. The launching side
(replica_set) writes them; status, logs and a client's access read them from here, below the
launch in the pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftcluster.run.events import EV, events_in

MEMBERS_FILE = "replicas.json"       # in the front's run folder: the members it balances over
ROTATION_FILE = "rotation.json"      # in the front's state/: what its balancer carries now
FRONT_SETTINGS = "front.json"
FRONT_CADDY = "front_caddy.json"



def read_members(set_dir: Path) -> list[dict[str, Any]]:
    try:
        found = json.loads((set_dir / MEMBERS_FILE).read_text()).get("members", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [m for m in found if isinstance(m, dict)]


def rotation_now(set_dir: Path) -> dict[str, Any]:
    """What the front's balancer carries (its state/rotation.json); {} before it wrote any."""
    try:
        found = json.loads((set_dir / "state" / ROTATION_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def front_endpoint(set_dir: Path) -> str | None:
    """The set's endpoint: the front's HTTP address, on its job's host where it listens on
    every address; None before the front's job started."""
    try:
        caddy = json.loads((set_dir / "scripts" / FRONT_CADDY).read_text())
        listen = caddy["apps"]["http"]["servers"]["http"]["listen"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    host, _, port = str(listen).rpartition(":")
    if host:
        return str(listen)
    hosts = [e.args[0] for e in events_in(set_dir) if e.kind == EV.job_started and e.args]
    return f"{hosts[-1]}:{port}" if hosts else None
