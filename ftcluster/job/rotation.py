"""A replica set's member in and out of its balancer's rotation. Standard library only: shipped
with the supervisor.

The member's own proxy is its door: in rotation, the proxy listens on the member's ports; out of
it, the proxy is stopped, so the balancer's connections are refused and it sends every request
to another member at once, with no change to its config. Caddy cannot retry a request that was
in flight across a config load, so a member's fault must not cost one: a request in flight in a
member that fails is dropped by the member's proxy (its connection closed, not a 502) and the
balancer sends it on. state/rotation says which, and where the member serves (status, and the
front, which follows the members' addresses: a restarted or successor member may be elsewhere).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

from .text import Room, write_json

ROTATION = "rotation"


class Rotation:
    def __init__(self, state: str, room: Optional[Room] = None):
        self.path = os.path.join(state, ROTATION)
        self.on = False
        self.address: Dict[str, Any] = {}
        self.room = room or Room()
        self.unsaved: Optional[Dict[str, Any]] = None   # found no room: saved at the next `save`

    def _write(self, data: Dict[str, Any]) -> None:
        data.update(self.address, time=time.time())
        self.unsaved = data
        self.save()

    def save(self) -> None:
        """The rotation as it is, should it not be written yet. Until it is, the balancer goes by
        its own health checks: a member out of rotation has closed its door (its proxy) anyway."""
        data = self.unsaved
        if data is not None and self.room.attempt("state/rotation", lambda: write_json(self.path, data)):
            self.unsaved = None

    def enter(self, host: str, http: int, grpc: int) -> None:
        self.on = True
        self.address = {"host": host, "http": http, "grpc": grpc}
        self._write({"in": True})

    def leave(self, why: str) -> None:
        self.on = False
        self._write({"in": False, "why": why})
