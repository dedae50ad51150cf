"""What a job style's parts share: the scheduler, the runtime and the MPI world of one run each
hold the style (to reach the other parts), the job and its values."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .styles import JobStyle


class Part:
    def __init__(self, style: JobStyle):
        self.style = style
        self.job = style.job
        self.cfg = style.job.cfg

    def script(self, name: str) -> str:
        return os.path.join(self.cfg.scripts, name)

    def state_file(self, name: str) -> str:
        return os.path.join(self.cfg.state, name)
