"""Re-attach to a recorded run: its state from the scheduler and its run folder; stop it.

`run_status` returns the documented `status` object (docs/reference.md, "JSON output"): machine values in
`phase`, `state` and each rank's `state`, display words only in the `*_label` keys.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftcluster.observe.documents import document, run_hosts
from ftcluster.errors import UserError
from ftcluster.run.events import EV, events_in
from ftcluster.schedulers import scheduler_for_record, scheduler_named, record_launcher
from ftcluster.run.layout import FILES, RunPaths
from ftcluster.run.phases import PHASES
from ftcluster.plan.facts import saved_access
from ftcluster.run.replica_files import front_endpoint, read_members, rotation_now
from ftcluster.run.state import run_state
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.spec.launch_styles import STEP_STYLES

if TYPE_CHECKING:
    from ftcluster.job.ranks import LoadProgress
    from ftcluster.run.job_info import JobInfo

# A rank's state (machine value) -> the words `ftcluster status` shows.
RANK_STATES = {
    "ready": "ready",
    "loading": "loading",
    "loaded": "loaded, waiting for rank 0 (FT)",
    "died": "died",
    "stopped": "stopped",
    "exited": "exited",
    "ended": "ended",
    "not_started": "not started",
}


def paths_of(rec: RunRecord) -> RunPaths:
    return RunPaths(rec.run_id, Path(rec.run_dir))


def _rank_states(paths: RunPaths, nodes: int, job_running: bool, rank0_ready: bool) -> list[dict[str, Any]]:
    """Each rank's state from the files its wrapper writes: never an HTTP probe (FT's ranks != 0
    never answer; only rank 0's readiness, which the job script saw, is known)."""
    # One listing of state/ rather than a look per rank and file: on a shared filesystem each
    # look, a missing file's too, is a round trip to its metadata server.
    try:
        present = set(os.listdir(paths.state))
    except OSError:
        present = set()
    ranks = []
    for r in range(nodes):
        node = _rank_host(paths, r) if FILES.rank(r, "host") in present else None
        exit_info = rank_exit(paths.state, r) if FILES.rank(r, "exit") in present else None
        code: str | None = None
        if exit_info is not None:
            code, state = exit_info
            state = state if state in RANK_STATES else "exited"
        elif node and job_running:
            if r == 0:
                state = "ready" if rank0_ready else "loading"
            else:
                state = "loaded" if FILES.rank(r, "loaded") in present else "loading"
        elif node:
            state = "ended"
        else:
            state = "not_started"
        label = RANK_STATES[state] + (f" (exit {code})" if code is not None else "")
        # A loading rank's figures from its node (no HTTP then under FT): what it read, its log.
        progress = _progress(paths, r) if state == "loading" and FILES.rank(r, "progress") in present else None
        if progress is not None:
            label += f" ({progress.words()}; last moved {progress.still_for:.0f} s ago)"
        ranks.append({"rank": r, "node": node, "state": state, "exit_code": exit_number(code), "state_label": label,
                      "progress": None if progress is None else {
                          "read_bytes": progress.read, "log_bytes": progress.log, "gpu_mib": progress.gpu_mib,
                          "still_s": progress.still_for}})
    return ranks


def _rank_host(paths: RunPaths, rank: int) -> str | None:
    try:
        return paths.rank_file(rank, "host").read_text(errors="replace").strip()
    except OSError:
        return None


def exit_number(code: str | None) -> int | None:
    """An exit code as a number: sacct's CODE:SIGNAL gives its code; none or "?" gives null."""
    head = (code or "").split(":", 1)[0].strip()
    return int(head) if head.lstrip("-").isdigit() else None


def _progress(paths: RunPaths, rank: int) -> LoadProgress | None:
    # Imported for a loading rank only: ftcluster.job.ranks brings http.client, ssl and email
    # (~25 ms, more than the rest of this module's imports together).
    from ftcluster.job.ranks import load_progress

    try:
        return load_progress(paths.rank_file(rank, "progress").read_text(errors="replace"))
    except OSError:
        return None


def rank_exit(state: Path, rank: int) -> tuple[str, str] | None:
    """(exit code, 'died' | 'stopped') from state/rank<R>.exit; None when the rank was killed
    outright (its wrapper too) and wrote none, or not whole."""
    # startup: the rank-side readers only when a rank has exited (`status` stays light)
    from ftcluster.job.ranks import parse_exit

    try:
        found = parse_exit((state / FILES.rank(rank, "exit")).read_text(errors="replace"))
    except OSError:
        return None
    return None if found is None else (found[0], found[2])


def _health(paths: RunPaths) -> dict[str, Any] | None:
    """The serving run's liveness probes as its job last wrote them (state/health.json)."""
    try:
        found = json.loads((paths.state / FILES.health).read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _room(paths: RunPaths) -> str | None:
    """Words when the run folder's filesystem is nearly full: the running job then skips its
    records (health, metrics), keeps its events in memory, and a restart waits for room."""
    # startup: the job side's text helpers only when a run folder is looked at (`list` stays light)
    from ftcluster.job.text import ROOM_NEEDED, free_bytes

    free = free_bytes(str(paths.state))
    if free is None or free >= ROOM_NEEDED:
        return None
    return (f"the run folder's filesystem has {free >> 10} KiB free: the job's "
            f"records wait (health and metrics are skipped), and a restart waits for room")


def health_label(health: dict[str, Any]) -> str:
    """The probes in words, for `status`."""
    last = health.get("last_probe") or {}
    words = [f"{health.get('probes', 0)} probes"]
    if last:
        seen = "answered" if last.get("answered") else "missed"
        words.append(f"last {seen} in {last.get('latency_ms', 0):.0f} ms "
                     f"({time.time() - float(last.get('time', 0)):.0f} s ago)")
    words.append(f"{health.get('consecutive_misses', 0)} missed in a row of {health.get('failures', '?')} allowed")
    return ", ".join(words)


def run_status(rec: RunRecord) -> dict[str, Any]:
    """The `status` object of a run (schema in docs/reference.md)."""
    paths = paths_of(rec)
    events = events_in(paths.run_dir)
    phase_events = [e for e in events if e.kind in PHASES]
    phase = phase_events[-1].kind if phase_events else ("submitted" if rec.job_id else "created")
    ready = [e for e in events if e.kind == EV.ready]
    failed = [e for e in events if e.kind == EV.failed]
    st: dict[str, Any] = {
        "run_id": rec.run_id, "job_id": rec.job_id, "run_dir": rec.run_dir, "scheduler": rec.scheduler,
        "style": rec.style, "phase": phase, "phase_label": PHASES.get(phase, phase),
        "endpoint": ready[-1].args[0] if ready and ready[-1].args else None,
        "failure": " ".join(failed[-1].args) if failed else None,
        "num_nodes": rec.nodes, "raw_state": None, "reason": None, "exit_code": None,
        # private: the endpoint is the proxy's, which wants the run's token (`ftcluster token`).
        "access": run_access(paths),
    }
    scheduler_nodes: list[str] = []
    if rec.job_id:
        info = run_state(scheduler_for_record(rec).info(rec.job_id, paths), events, rec.status)
        st.update(state=info.state.value, raw_state=info.raw_state, reason=info.reason or None,
                  source=info.source, exit_code=exit_number(info.exit_code))
        scheduler_nodes = list(dict.fromkeys(info.nodes))
        # Slurm not answering (a busy or restarting slurmctld) says nothing of the job: its ranks
        # are told from their own files, as for a running job, and the reason says so.
        running = info.state.value == "RUNNING" or info.unreachable
        if info.unreachable:
            st["reason"] = f"Slurm did not answer ({info.reason}): the ranks and phase are as the run's own files say"
        if info.state.value == "PENDING" and any(e.kind == EV.job_started for e in events):
            # It ran, and waits again: Slurm requeued it (preempted, its batch host lost, or
            # by hand); its events' last word ("done") is the earlier attempt's.
            st.update(phase="requeued", phase_label=PHASES["requeued"])
    else:
        st.update(state=rec.status, source="store")
        running = False
    # The scheduler's node list where it has one (Slurm), else the ranks' own records.
    st["nodes"] = scheduler_nodes or run_hosts(rec.run_dir, rec.nodes, rec.plan)
    st["health"] = _health(paths)
    st["room"] = None if paths.gone() else _room(paths)
    # Every restart of the world while serving: when, why, in which job (this allocation; a
    # requeue keeps the job id), the nodes of the incarnation it ended, and its place among the
    # faults counted against server.restarts then (1: the first since a healthy stretch).
    st["restarts"] = [{"time": e.time, "cause": " ".join(e.args[1:]), "job_id": rec.job_id,
                       "nodes": _incarnation_nodes(paths, i, rec.nodes),
                       "in_a_row": int(e.args[0]) if e.args and e.args[0].isdigit() else None}
                      for i, e in enumerate(e for e in events if e.kind == EV.restarting)]
    st["predecessor"] = rec.predecessor
    st["successor"] = _successor(events)
    # A step run (`ftcluster preflight`, `convert`) has no server ranks; a run whose folder is
    # gone has no rank records left to tell their states.
    gone = paths.gone()
    st["ranks"] = [] if rec.style in STEP_STYLES or gone else _rank_states(paths, rec.nodes, running, bool(ready))
    if gone and not (st["reason"] or "").startswith(gone):
        st["reason"] = f"{gone}; {st['reason']}" if st["reason"] else gone
    if gone and not events:
        st["phase_label"] = "not known (its events went with the folder)"
    st["replica_of"], st["replica"] = rec.replica_of, rec.replica
    st["replicas"] = None
    st["same_host"] = same_host_note(paths) if st["access"] == "private" else None
    if rec.style == "front":
        _set_status(rec, st)
    return document("status", st)


def run_access(paths: RunPaths) -> str:
    """The run's access as its launch resolved and saved it (scripts/specs.json's facts)."""
    saved = saved_access(paths.scripts / FILES.specs)
    if saved is not None:
        return saved
    # Only a folder that an earlier ftcluster wrote saves no facts: its token file tells (a
    # private run's launch made one). Never a rule of access applied again.
    return "private" if (paths.scripts / FILES.token).is_file() else "cluster"


def same_host_note(paths: RunPaths) -> str | None:
    """Who besides the run can reach a private run's Triton on rank 0's loopback, without the
    token, as the run's values record it (ftcluster.plan.endpoint.same_host_note); None: nobody."""
    # startup: the job's values (~3 ms) only when a private run's note is asked for (`list` stays light)
    from ftcluster.job.config import JobConfig

    try:
        cfg = JobConfig.from_json((paths.scripts / FILES.job_config).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return (cfg.proxy.same_host_note or None) if cfg.proxy is not None else None


def _set_status(rec: RunRecord, st: dict[str, Any]) -> None:
    """A replica set (its front's run): each member's state and rotation, the set's endpoint,
    and nodes and num_nodes for the whole (the front's node and every member's)."""
    store = RunStore()
    set_dir = Path(rec.run_dir)
    rotation = {m.get("run_dir"): m for m in rotation_now(set_dir).get("members", [])}
    members = []
    notes: list[str | None] = []
    nodes = list(st["nodes"])
    st["balancer_nodes"] = list(nodes)   # the front's own job's; `nodes` becomes the whole set's
    for m in read_members(set_dir):
        chain = member_records(rec, store, int(m.get("replica", -1)))
        serving = [r for r in chain if r.status != "STOPPED"] or chain
        if not serving:
            continue
        mrec = serving[-1]
        ms = run_status(mrec)
        notes.append(ms["same_host"])
        r = rotation.get(mrec.run_dir, {})
        members.append({"replica": m.get("replica"), "run_id": mrec.run_id, "job_id": mrec.job_id,
                        "state": ms["state"], "phase": ms["phase"], "endpoint": ms["endpoint"],
                        "nodes": ms["nodes"], "num_nodes": ms["num_nodes"], "in_rotation": bool(r.get("in")),
                        "rotation_why": r.get("why") or None, "restarts": len(ms["restarts"]),
                        "failure": ms["failure"]})
        nodes += [n for n in ms["nodes"] if n not in nodes]
    st["replicas"] = members
    # The members' Triton behind their own proxies: what one of theirs says, the set says.
    st["same_host"] = st["same_host"] or next((n for n in notes if n), None)
    st["endpoint"] = front_endpoint(set_dir)
    st["nodes"] = nodes
    st["num_nodes"] = len(nodes) if nodes else rec.nodes + sum(m["num_nodes"] for m in members)


def _incarnation_nodes(paths: RunPaths, n: int, nodes: int) -> list[str]:
    """The nodes of incarnation n's ranks, from the rank files kept with its logs."""
    found = []
    for r in range(nodes):
        try:
            host_file = paths.logs / FILES.incarnation_dir.format(n=n) / FILES.rank(r, "host")
            found.append(host_file.read_text(errors="replace").strip())
        except OSError:
            continue
    return found


def _successor(events: list[Any]) -> dict[str, Any] | None:
    """The run this one hands over to before its time limit, as its job's events and the
    successor's own job state say (a pending successor names Slurm's reason)."""
    submitted = [e for e in events if e.kind == EV.successor_submitted]
    handed = [e for e in events if e.kind == EV.handed_over]
    failed = [e for e in events if e.kind == EV.handover_failed]
    if not (submitted or failed):
        return None
    lost = [n for e in events if e.kind == EV.node_lost for n in e.args]
    found: dict[str, Any] = {"run_id": None, "job_id": None, "excluded": [], "state": None, "reason": None,
                             "cause": f"node lost: {', '.join(lost)}" if lost else "time limit",
                             "handed_over": bool(handed), "endpoint": handed[-1].args[1] if handed else None,
                             "failure": " ".join(failed[-1].args) if failed else None}
    if submitted:
        args = submitted[-1].args
        found.update(run_id=args[0], job_id=args[1],
                     excluded=[n for n in (args[3] if len(args) > 3 else "").split(",") if n])
        rec = RunStore().exact(args[0])
        if rec is not None and rec.job_id:
            info = run_state(scheduler_for_record(rec).info(rec.job_id, paths_of(rec)), events_in(Path(rec.run_dir)),
                             rec.status)
            found.update(state=info.state.value, reason=info.reason or None)
    return found


def moved_to(status: dict[str, Any]) -> str | None:
    """The run id of the successor the service moved to: one the run handed over to (it serves),
    or one submitted when the run ended without it (a lost node); else None."""
    succ = status.get("successor") or {}
    if not succ.get("run_id"):
        return None
    if succ.get("handed_over") or (status.get("state") != "RUNNING" and not succ.get("failure")):
        return str(succ["run_id"])
    return None


def successor_label(found: dict[str, Any] | None) -> str | None:
    """The hand-over in words, for `status`."""
    if not found:
        return None
    if found["handed_over"]:
        return (f"handed over to run {found['run_id']} (job {found['job_id']}), serving at {found['endpoint']}: "
                "clients must use that endpoint now")
    if found["run_id"] is None:
        return f"hand-over failed: {found['failure']}"
    words = f"run {found['run_id']} (job {found['job_id']}, {found['state'] or 'state unknown'}"
    words += f": {found['reason']})" if found["reason"] else ")"
    if found["cause"] != "time limit":
        return f"moved to {words} after a {found['cause'].replace(': ', ' (', 1)}); see its status for its endpoint"
    if found["failure"]:
        return f"{words} failed: {found['failure']}; this run serves to its time limit"
    return f"{words} is starting; this run serves until it does"


def successors(rec: RunRecord, store: RunStore) -> list[RunRecord]:
    """The runs that followed this one, in order (each hand-over's successor)."""
    chain: list[RunRecord] = []
    seen = {rec.run_id}
    while True:
        paths = paths_of(chain[-1] if chain else rec)
        events = events_in(paths.run_dir)
        submitted = [e for e in events if e.kind == EV.successor_submitted and e.args]
        nxt = store.exact(submitted[-1].args[0]) if submitted else None
        if nxt is None or nxt.run_id in seen:
            return chain
        seen.add(nxt.run_id)
        chain.append(nxt)


def member_records(set_rec: RunRecord, store: RunStore, replica: int | None = None) -> list[RunRecord]:
    """The records of a set's members (each with its successors), or of member `replica` alone."""
    found: list[RunRecord] = []
    for m in read_members(Path(set_rec.run_dir)):
        if replica is not None and m.get("replica") != replica:
            continue
        rec = store.exact(str(m.get("run_id")))
        if rec is not None:
            found += [rec, *successors(rec, store)]
    return found


# A run recorded as one of these may still have a live job: `list` asks its scheduler.
LIVE_STATUSES = ("SUBMITTED", "SERVING")


def still_needed(records: Sequence[RunRecord], may_live: set[str]) -> set[str]:
    """The ended runs that runs which may still live need: every predecessor of such a run
    (`status OLD` and `stop OLD` follow the chain from the first run, and a set's balancer
    follows each member from its first run's folder), and every member of such a set."""
    by_id = {r.run_id: r for r in records}
    needed: set[str] = set()
    for run_id in may_live:
        rec = by_id.get(run_id)
        while rec is not None and rec.predecessor and rec.predecessor not in needed:
            needed.add(rec.predecessor)
            rec = by_id.get(rec.predecessor)
    needed |= {r.run_id for r in records if r.replica_of in may_live}
    return needed - may_live


def live_states(records: Sequence[RunRecord]) -> dict[str, JobInfo]:
    """The state now (ftcluster.run.state) of each run that may still have a live job, by run
    id: each launcher is asked once for all its runs (one squeue for every Slurm run)."""
    groups: dict[str, list[RunRecord]] = {}
    for rec in records:
        if rec.job_id and rec.scheduler != "remote" and rec.status in LIVE_STATUSES:
            groups.setdefault(record_launcher(rec), []).append(rec)
    states: dict[str, JobInfo] = {}
    for name, recs in groups.items():
        found = scheduler_named(name).infos([(r.job_id or "", paths_of(r)) for r in recs])
        states.update({r.run_id: run_state(found[r.job_id or ""], events_in(Path(r.run_dir)), r.status) for r in recs})
    return states



def stop_run(rec: RunRecord, store: RunStore | None = None) -> RunRecord:
    if not rec.job_id:
        raise UserError(f"run {rec.run_id} was never submitted")
    launcher = scheduler_for_record(rec)
    paths = paths_of(rec)
    # The job's teardown reads this to tell this stop from Slurm's own TERM (its `stopped`, a
    # clean end); it lasts as long as the stop, so a folder submitted again never finds it.
    request = paths.state / FILES.stop_request
    try:
        request.write_text(f"{rec.job_id}\n")
    except OSError:
        pass   # a folder gone or read-only: the job ends as interrupted, the record still says STOPPED
    launcher.cancel(rec.job_id, paths)
    launcher.release_resources(paths)
    try:
        request.unlink(missing_ok=True)
    except OSError:
        pass
    return (store or RunStore()).update(rec, status="STOPPED")
