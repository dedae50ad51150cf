"""No container: every step runs on the nodes as it is; what killed ranks leave there is the
scheduler's node teardown's (the base runtime's behaviour, named)."""

from __future__ import annotations

from .base import Runtime


class NoRuntime(Runtime):
    pass
