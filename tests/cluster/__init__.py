"""A real multi-node Slurm test cluster in namespaces (see TESTBED.md and testbed.py)."""

from .testbed import DEFAULT_DIR, SlurmTestbed
from .util import TestbedError

__all__ = ["DEFAULT_DIR", "SlurmTestbed", "TestbedError"]
