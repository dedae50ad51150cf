"""Which node the job runs on, by the names Slurm and a rank's record give it."""

from __future__ import annotations

import os
import socket


def this_node() -> str:
    """This node's name as Slurm knows it, else the short hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def is_this_node(name: str) -> bool:
    """Whether a rank's recorded host (its `hostname`, or Slurm's name for the node) is this one."""
    host = socket.gethostname()
    return name in {this_node(), host, host.split(".")[0]}
