"""No container runtime: the ranks run on the hosts themselves (bare Slurm, the local style)."""

from __future__ import annotations

from ftcluster.runtimes.base import Runtime


class NoRuntime(Runtime):
    name = "none"
