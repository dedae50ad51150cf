"""The run folder's layout, shared by rendering, schedulers, logs and status.

Kept free of heavy imports (no specs, no templates) so that `status`, `logs` and `stop` start fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ftcluster.job.names import FILES, RunFiles  # noqa: F401  (defined with the supervisor)
from ftcluster.spec.plaintext import describe
from ftcluster.spec.launch_styles import STYLES

SCRIPTS = "scripts"
LOGS = "logs"
STATE = "state"
RESULTS = "results"
REPO = "model_repository"
EVENTS = f"{STATE}/{FILES.events}"

# Styles whose job script runs on this host (as a process group), not through sbatch.
HERE_STYLES = tuple(name for name, style in STYLES.items() if style.runs_here)

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class RunPaths:
    run_id: str
    run_dir: Path
    # What chose the folder, for messages about its path: the workspace, or `render --out`.
    origin: str = field(default="workspace", compare=False)

    def __post_init__(self) -> None:
        # The run id names jobs, containers and server ids; keep it plain.
        if not _RUN_ID_RE.fullmatch(self.run_id):
            raise ValueError(f"run id {self.run_id!r} must match {_RUN_ID_RE.pattern}")
        # What no script or file of the run can carry: a C0 control, or a byte that is no UTF-8
        # (argv and the OS give it as a lone surrogate). Wider Unicode that a folder made by an
        # earlier version may hold stays readable by status, logs and stop.
        bad = next((c for c in str(self.run_dir) if ord(c) < 32 or 0xD800 <= ord(c) < 0xE000), None)
        if bad is not None:
            raise ValueError(f"a run folder's path cannot hold {describe(bad)}")

    @classmethod
    def for_folder(cls, run_dir: Path) -> RunPaths:
        return cls(re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.name).lstrip("._-") or "run", run_dir, origin="--out")

    def gone(self) -> str | None:
        """Words for a run folder that is not there any more, or None: its events, logs and
        rank records went with it (a scratch filesystem's purge, a hand's rm), so what the run
        did cannot be read, only what its record and the scheduler still know."""
        try:
            if self.run_dir.is_dir():
                return None
        except OSError:
            pass
        return f"its run folder {self.run_dir} is gone (removed, or purged from a scratch filesystem)"

    @property
    def scripts(self) -> Path:
        return self.run_dir / SCRIPTS

    @property
    def logs(self) -> Path:
        return self.run_dir / LOGS

    @property
    def state(self) -> Path:
        return self.run_dir / STATE

    @property
    def repo(self) -> Path:
        return self.run_dir / REPO

    @property
    def events(self) -> Path:
        return self.run_dir / EVENTS

    @property
    def results(self) -> Path:
        return self.run_dir / RESULTS

    def rank_file(self, rank: int | str, what: str) -> Path:
        return (self.logs if what == "stdout" else self.state) / FILES.rank(rank, what)

    def server_log(self, rank: int | str) -> Path:
        return self.logs / FILES.server_log(rank)

    def job_script(self, style: str) -> Path:
        return self.scripts / ("job.sh" if style in HERE_STYLES else "job.sbatch")
