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
from typing import Any, Dict

from .text import write_json

ROTATION = "rotation"


class Rotation:
    def __init__(self, state: str):
        self.path = os.path.join(state, ROTATION)
        self.on = False
        self.address: Dict[str, Any] = {}

    def _write(self, data: Dict[str, Any]) -> None:
        data.update(self.address, time=time.time())
        write_json(self.path, data)

    def enter(self, host: str, http: int, grpc: int) -> None:
        self.on = True
        self.address = {"host": host, "http": http, "grpc": grpc}
        self._write({"in": True})

    def leave(self, why: str) -> None:
        self.on = False
        self._write({"in": False, "why": why})
