"""The run folder's layout, shared by rendering, launchers, logs and status.

Kept free of heavy imports (no specs, no templates) so that `status`, `logs` and `stop` start fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ftcluster.styles import STYLES

SCRIPTS = "scripts"
LOGS = "logs"
STATE = "state"
RESULTS = "results"
REPO = "model_repository"


@dataclass(frozen=True)
class RunFiles:
    """The names of the files in the run's folders, defined once: the templates get this object
    as `files` ("$STATE/{{ files.rank('$RANK', 'pid') }}"), Python uses FILES or RunPaths."""

    events: str = "events"                 # state/: one line per milestone (ftcluster.events)
    job_out: str = "job.out"               # logs/: the job script's output (styles run here)
    client_log: str = "client.log"         # logs/
    mpicheck_log: str = "mpicheck.log"     # logs/
    mpirun_log: str = "mpirun.log"         # logs/
    step_log: str = "step.log"             # logs/: the output of a preflight's or convert's step
    preflight_dir: str = "preflight"       # results/: the preflight's rank files and preflight.json
    client_json: str = "client.json"       # results/
    mpicheck_json: str = "mpicheck.json"   # results/

    # Per-rank files: state/rank<R>.{pid,host,exit,loaded,problem} (written by rank_server.sh),
    # logs/rank<R>.stdout (the wrapper's own output).
    RANK_FILES = ("pid", "host", "exit", "loaded", "problem", "stdout")

    def rank(self, rank: int | str, what: str) -> str:
        if what not in self.RANK_FILES:
            raise ValueError(f"no per-rank file {what!r}")
        return f"rank{rank}.{what}"

    def server_log(self, rank: int | str) -> str:   # logs/: tritonserver's log of a rank
        return f"server-rank{rank}.log"


FILES = RunFiles()
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
        if any(ord(c) < 32 for c in str(self.run_dir)):
            raise ValueError("the run folder path may not contain control characters")

    @classmethod
    def for_folder(cls, run_dir: Path) -> RunPaths:
        return cls(re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.name).lstrip("._-") or "run", run_dir, origin="--out")

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
