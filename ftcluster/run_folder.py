"""A run folder submitted by hand (`render --out DIR`, then `sbatch scripts/job.sbatch`) as a
run record, so that `status`, `logs` and `stop DIR` follow it like a launched run: what ran comes
from the folder itself (scripts/job.json, run.json), the job id from the job's own first event."""

from __future__ import annotations

import json
from pathlib import Path

from ftcluster.events import EV, parse_events
from ftcluster.job.config import JobConfig
from ftcluster.job.names import FILES
from ftcluster.store import RunRecord
from ftcluster.styles import STYLES, style_name


def record_of_folder(folder: Path) -> RunRecord | None:
    """The record of the run in `folder`; None when it is no run folder."""
    try:
        cfg = JobConfig.from_json((folder / "scripts" / FILES.job_config).read_text())
    except (OSError, ValueError, TypeError):
        return None
    try:
        meta = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        meta = {}
    cluster = meta.get("cluster") or {}
    scheduler = cluster.get("scheduler") or ("slurm" if (folder / "scripts" / "job.sbatch").is_file() else "local")
    style = style_name(scheduler, cluster.get("runtime") or "none")
    if style not in STYLES:
        return None
    try:
        events = parse_events((folder / "state" / FILES.events).read_text())
    except OSError:
        events = []
    started = [e for e in events if e.kind == EV.job_started and len(e.args) > 1]
    job_id = started[-1].args[1] if started else None
    return RunRecord(run_id=cfg.run_id, created=(folder / "scripts" / FILES.job_config).stat().st_mtime,
                     cluster_name=str(cluster.get("name") or ""), cluster_source=str(cluster.get("source") or ""),
                     scheduler=scheduler, style=style, run_dir=str(folder.resolve()), nodes=cfg.nodes,
                     model=cfg.served_model, job_id=job_id, status="SUBMITTED" if job_id else "CREATED",
                     plan=meta.get("plan") or {}, launcher=STYLES[style].launcher)
