"""Poll intervals that back off while nothing changes and snap back when something does.

A launch follows files on the shared filesystem and asks the scheduler for up to
server.ready_timeout (20 minutes by default): polling at the fastest rate all that time is
metadata load a site's Lustre/NFS servers and slurmctld feel, for nothing to see.
"""

from __future__ import annotations


class Backoff:
    """`fast` after a change, then `factor` times longer per quiet poll, up to `slow`."""

    def __init__(self, fast: float, slow: float, factor: float = 1.5):
        self.fast, self.slow, self.factor = fast, max(slow, fast), factor
        self.interval = fast

    def next(self, changed: bool) -> float:
        """The wait before the next poll, after one that saw something (changed) or nothing."""
        self.interval = self.fast if changed else min(self.slow, self.interval * self.factor)
        return self.interval
