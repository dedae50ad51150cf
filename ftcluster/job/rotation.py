"""A replica set's member in and out of its balancer's rotation: state/rotation, read by the
front (ftcluster/job/front.py), which acknowledges each change in state/rotation.ack once
its balancer carries it. Standard library only: shipped with the supervisor."""

from __future__ import annotations

import json
import os
import time

ROTATION = "rotation"
ACK = "rotation.ack"


class Rotation:
    def __init__(self, state: str):
        self.path = os.path.join(state, ROTATION)
        self.ack_path = os.path.join(state, ACK)
        self.serial = 0
        self.on = False

    def _write(self, data: dict) -> None:
        self.serial += 1
        data.update(serial=self.serial, time=time.time())
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, self.path)   # the front never reads half a file

    def enter(self, host: str, http: int, grpc: int) -> None:
        self.on = True
        self._write({"in": True, "host": host, "http": http, "grpc": grpc})

    def leave(self, why: str) -> None:
        self.on = False
        self._write({"in": False, "why": why})

    def acked(self) -> bool:
        try:
            with open(self.ack_path) as f:
                return int(json.load(f).get("serial", 0)) >= self.serial
        except (OSError, ValueError, AttributeError):
            return False

    def wait_acked(self, limit: float) -> bool:
        deadline = time.monotonic() + limit
        while not self.acked():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True
