"""A run folder submitted by hand (`render --out DIR`, then `sbatch scripts/job.sbatch`) as a
run record, so that `status`, `logs` and `stop DIR` follow it like a launched run: what ran comes
from the folder itself (scripts/job.json, run.json), the job id from the job's own first event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftcluster.run.events import EV, events_in
from ftcluster.job.config import JobConfig
from ftcluster.job.names import FILES
from ftcluster.run.layout import RunPaths
from ftcluster.run.procs import job_id_of
from ftcluster.run.store import RunRecord
from ftcluster.plan.facts import saved_style
from ftcluster.spec.launch_styles import STYLES


# The most nodes a run has (--nodes takes as many).
MAX_NODES = 1 << 20


def record_of_folder(folder: Path) -> RunRecord | None:
    """The record of the run in `folder`; None when it is no run folder. What the record takes
    from the folder's files is checked first: a value of another kind than a launch writes
    (a hand-edited or damaged file) makes the folder no run's, never a traceback later."""
    try:
        cfg = JobConfig.from_json((folder / "scripts" / FILES.job_config).read_text())
        RunPaths(cfg.run_id, folder)   # a run id of the form launch gives
    except (OSError, ValueError, TypeError):
        return None
    if not (_count(cfg.nodes) and isinstance(cfg.served_model, str)):
        return None
    try:
        meta = _mapping(json.loads((folder / "run.json").read_text()))
    except (OSError, ValueError):
        meta = {}
    cluster, plan = _mapping(meta.get("cluster")), _mapping(meta.get("plan"))
    scheduler = _text(cluster.get("scheduler")) or (
        "slurm" if (folder / "scripts" / "job.sbatch").is_file() else "local")
    style = saved_style(folder / "scripts" / FILES.specs, scheduler, _text(cluster.get("runtime")) or "none")
    if style not in STYLES:
        return None
    events = events_in(folder)
    started = [e for e in events if e.kind == EV.job_started and len(e.args) > 1]
    job_id = started[-1].args[1] if started else None
    if job_id is not None and STYLES[style].runs_here:
        # Such a job names itself by its pid; its launcher's id holds the start time too.
        job_id = job_id_of(int(job_id)) if job_id.isdigit() else None
    return RunRecord(run_id=cfg.run_id, created=(folder / "scripts" / FILES.job_config).stat().st_mtime,
                     cluster_name=_text(cluster.get("name")), cluster_source=_text(cluster.get("source")),
                     scheduler=scheduler, style=style, run_dir=str(folder.resolve()), nodes=cfg.nodes,
                     model=cfg.served_model, job_id=job_id, status="SUBMITTED" if job_id else "CREATED",
                     plan=plan, launcher=STYLES[style].launcher)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_NODES
