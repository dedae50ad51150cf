"""Re-attach to a recorded run: its state from the scheduler and its run folder; stop it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftcluster import sshkeys
from ftcluster.errors import UserError
from ftcluster.events import parse_events
from ftcluster.launch import PHASES
from ftcluster.launchers import launcher_for_scheduler
from ftcluster.render import RunPaths
from ftcluster.store import RunRecord, RunStore


def paths_of(rec: RunRecord) -> RunPaths:
    return RunPaths(rec.run_id, Path(rec.run_dir))


def _rank_states(paths: RunPaths, nodes: int, job_running: bool, rank0_ready: bool) -> list[dict[str, Any]]:
    """Each rank's state from the files its wrapper writes: never an HTTP probe (FT's ranks != 0
    never answer; only rank 0's readiness, which the job script saw, is known)."""
    ranks = []
    for r in range(nodes):
        host_file = paths.state / f"rank{r}.host"
        node = host_file.read_text().strip() if host_file.is_file() else None
        exit_info = rank_exit(paths.state, r)
        if exit_info is not None:
            code, how = exit_info
            state = f"{how} (exit {code})"
        elif node and job_running:
            if r == 0:
                state = "ready" if rank0_ready else "loading"
            else:
                state = ("loaded, waiting for rank 0 (FT)" if (paths.state / f"rank{r}.loaded").exists()
                         else "loading")
        elif node:
            state = "ended"
        else:
            state = "not started"
        ranks.append({"rank": r, "node": node, "state": state})
    return ranks


def rank_exit(state: Path, rank: int) -> tuple[str, str] | None:
    """(exit code, 'died' | 'stopped') from state/rank<R>.exit ("CODE EPOCH HOW", written by
    rank_server.sh); None when the rank was killed outright (its wrapper too) and wrote none."""
    try:
        parts = (state / f"rank{rank}.exit").read_text().split()
    except OSError:
        return None
    if not parts:
        return None
    return parts[0], parts[2] if len(parts) > 2 else "exited"


def run_status(rec: RunRecord) -> dict[str, Any]:
    paths = paths_of(rec)
    events = parse_events(paths.events.read_text()) if paths.events.is_file() else []
    phase_events = [e for e in events if e.kind in PHASES]
    phase = PHASES[phase_events[-1].kind] if phase_events else ("queued" if rec.job_id else "created")
    ready = [e for e in events if e.kind == "ready"]
    failed = [e for e in events if e.kind == "failed"]
    st: dict[str, Any] = {"run_id": rec.run_id, "job_id": rec.job_id, "run_dir": rec.run_dir,
                          "phase": phase, "endpoint": ready[-1].args[0] if ready and ready[-1].args else None,
                          "failure": " ".join(failed[-1].args) if failed else None}
    if rec.job_id:
        info = launcher_for_scheduler(rec.scheduler, style=rec.style).info(rec.job_id, paths)
        st.update(state=info.state.value, raw_state=info.raw_state, reason=info.reason,
                  nodes=list(info.nodes), source=info.source, exit_code=info.exit_code)
        running = info.state.value == "RUNNING"
    else:
        st.update(state=rec.status, source="store")
        running = False
    st["ranks"] = _rank_states(paths, rec.nodes, running, bool(ready))
    return st


def stop_run(rec: RunRecord, store: RunStore | None = None) -> RunRecord:
    if not rec.job_id:
        raise UserError(f"run {rec.run_id} was never submitted")
    launcher = launcher_for_scheduler(rec.scheduler, style=rec.style)
    launcher.cancel(rec.job_id, paths_of(rec))
    sshkeys.remove(paths_of(rec).state)  # the docker style's per-run keys, if any
    return (store or RunStore()).update(rec, status="STOPPED")
