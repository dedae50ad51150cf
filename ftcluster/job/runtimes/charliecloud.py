"""Charliecloud: every step task inside `ch-run IMAGE` (charliecloud_node.sh). ch-run execs the
command in new user and mount namespaces, in the node's process tree and the scheduler's
tracking, so a step's end ends its container and there is none to bring up, reap or remove.
The node's /dev/shm and /tmp are shared: what killed ranks leave there goes as without a
container (the scheduler's node teardown)."""

from __future__ import annotations

from typing import List

from .base import Runtime


class CharliecloudRuntime(Runtime):
    def in_image(self, argv: List[str]) -> List[str]:
        return ["bash", self.script("charliecloud_node.sh"), *argv]
