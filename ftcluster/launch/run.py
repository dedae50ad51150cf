"""`launch`: prepare, render, submit, follow the run to its end, and clean up on failure.

The job script does the node-side work (start ranks, wait for rank 0, run the client) and
writes milestones to state/events; this module follows that file and the scheduler's view of
the job, shows progress, and cancels the job on any failure or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ftcluster import __version__
from ftcluster.errors import Interrupted, PlanError, UserError, every, os_error_words
from ftcluster.run.events import EV, Event
from ftcluster.job.poll import CLOCK, EVENTS, LOGS, STARTING, Backoff, Clock
from ftcluster.render.launched import LaunchedSpecs, write_specs
from ftcluster.schedulers import scheduler_for, scheduler_named
from ftcluster.schedulers.base import Scheduler
from ftcluster.run.layout import FILES
from ftcluster.engines import engine_for
from ftcluster.run.phases import PHASES
from ftcluster.plan.parallel import Plan
from ftcluster.plan.endpoint import access_problems, proxy_binary
from ftcluster.plan.facts import RunFacts
from ftcluster.render.scripts import JobStep, RenderOptions, RunPaths, run_facts
from ftcluster.spec.launch_styles import style_of
from ftcluster.render.request import JobRequest, build_request
from ftcluster.run.job_info import JobInfo, JobState
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.model import ModelSpec
from ftcluster.run.store import RunRecord, RunStore, new_run_id

if TYPE_CHECKING:
    from ftcluster.schedulers.watch import JobWatch
    from ftcluster.run.logs import Follower


@dataclass
class LaunchOptions:
    keep_serving: bool = False
    detach: bool = False
    dry_run: bool = False
    client: bool = True
    mpi_check: bool = True
    servers: bool = True
    step: JobStep | None = None    # a preflight or convert run: this step instead of the servers
    token: str | None = None       # access: private: the run's token (None: a new one; a successor keeps its predecessor's)
    member_of: str | None = None   # a replica set's member: the set's run id
    member: int | None = None      # ... and the member's index
    carried_faults: tuple[str, ...] = ()   # a successor's: its predecessor's faults still counted
    # The service's name in the metrics targets' labels, across hand-overs: a successor's is its
    # chain's first run's id; None: a replica set's id for a member, else the run's own id.
    service: str | None = None
    # What the run is made from, saved in its folder (ftcluster.render.launched): a successor's and a
    # replica set's member's are those of the launch they come from (the spec this run gets is
    # derived from them: excluded nodes, a member's ports); None: this run's own spec and plan.
    specs: LaunchedSpecs | None = None
    # The run's facts (ftcluster.plan.facts) as the run it continues saved them: a successor's
    # are its predecessor's (its ports, access, restarts); None: resolved from its spec.
    facts: RunFacts | None = None


@dataclass
class LaunchOutcome:
    record: RunRecord
    ok: bool
    phases: dict[str, float] = field(default_factory=dict)   # phase -> seconds since submit
    endpoint: str | None = None
    client: dict[str, Any] | None = None
    mpicheck: dict[str, Any] | None = None
    failure: str | None = None
    failed_rank: dict[str, str] | None = None
    log_tail: list[str] = field(default_factory=list)
    detached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.record.run_id, "job_id": self.record.job_id, "ok": self.ok,
            "run_dir": self.record.run_dir, "phases": self.phases, "endpoint": self.endpoint,
            "client": self.client, "mpicheck": self.mpicheck, "failure": self.failure, "failed_rank": self.failed_rank,
            "log_tail": self.log_tail, "detached": self.detached,
        }


Progress = Callable[[str, float, str], None]   # (phase, seconds, detail)


@dataclass
class _Watch:
    """What following a run carries from one poll to the next (Launch._follow)."""

    t0: float
    outcome: LaunchOutcome
    job: JobWatch
    rank0_log: Follower
    # Until ready: STARTING's. Then fast while things happen (a new event or log line), slower
    # while nothing does.
    tick: Backoff
    next_log: float = 0.0                           # when to read rank 0's log next
    last_detail: str = ""                           # the pending reason shown last
    unreachable_since: float | None = None
    next_load_shown: float = 0.0                    # when to show the ranks' load progress next
    load_said: str = ""


def workspace_dir(cluster: ClusterSpec) -> Path:
    # Already expanded by the spec (expand_workspace); expanding again would rewrite a '$' or
    # '~' that came from a variable's value.
    return Path(cluster.workspace).resolve()


def run_paths(cluster: ClusterSpec, run_id: str) -> RunPaths:
    """A run's folder in the workspace; a run id that cannot name one is the user's to fix."""
    try:
        return RunPaths(run_id, workspace_dir(cluster) / run_id)
    except ValueError as exc:
        raise UserError(str(exc), field="--run-id", hint="letters, digits, '_', '.' and '-', at most 100") from None


def resolve_tritonserver(cluster: ClusterSpec, build: bool = True) -> str:
    if cluster.server.binary != "auto":
        return cluster.server.binary
    if not build:
        return shutil.which("tritonserver") or "tritonserver"
    # startup: the tritonserver bundle's lookup (~3 ms) only when server.binary is "auto"
    from ftcluster.service.triton_local import find_tritonserver

    return str(find_tritonserver())


def render_options(cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, paths: RunPaths,
                   opts: LaunchOptions, build: bool = True) -> RenderOptions:
    """What the templates need beyond the specs: the binaries found on this machine."""
    mpi: dict[str, Any] = {}
    if style_of(cluster).one_host and build and (opts.step is None or opts.step.per_node):
        # startup: Open MPI's lookup (ctypes) only for the local style
        from ftcluster.schedulers.local_mpi import find_local_mpi

        local = find_local_mpi()
        mpi = {"mpirun": local.mpirun, "extra_env": {"FTC_LIBMPI": local.libmpi} if local.libmpi else {}}
    if opts.step is not None:
        # No server, client or MPI check: the step alone.
        return RenderOptions(client=False, mpi_check=False, servers=False, step=opts.step,
                             tritonserver=cluster.server.binary, **mpi)
    assert model is not None, "a run with servers needs its model"
    if style_of(cluster).one_host and build and opts.servers:
        _check_local_gpus(cluster, plan)
    # Before anything is written: a checkpoint no mount shows inside the container fails at
    # model load on every rank, after the allocation.
    engine_for(model).check_visible(cluster, model, plan, paths.run_dir)
    if opts.servers:
        problems = access_problems(cluster)
        if problems:
            raise UserError("; ".join(problems))
    rendered = RenderOptions(keep_serving=opts.keep_serving, client=opts.client, mpi_check=opts.mpi_check,
                             servers=opts.servers, rotation=opts.member_of is not None,
                             carried_faults=opts.carried_faults, service=opts.service or opts.member_of or "",
                             front_rotation=str(workspace_dir(cluster) / opts.member_of / "state" / "rotation.json")
                             if opts.member_of else "", tritonserver=resolve_tritonserver(cluster, build=build),
                             facts=opts.facts, **mpi)
    # Resolved here, once: the render reads these.
    facts = run_facts(cluster, model, plan, rendered)
    if opts.servers and build and facts.private:
        proxy_binary(cluster.proxy)   # Caddy is there, or the launch stops here naming proxy.binary
    return replace(rendered, facts=facts)


def workspace_error(run_dir: Path, why: str) -> UserError:
    return UserError(f"cannot make the run folder {run_dir}: {why}", field="workspace",
                     hint="choose a workspace you can write to")


def check_workspace(run_dir: Path) -> None:
    """Refuse a run folder that cannot be made, without making it: its nearest existing folder
    must be a folder this user may write and enter (a read-only filesystem says no here too)."""
    folder = run_dir.parent
    while not folder.exists() and folder != folder.parent:
        if folder.is_symlink():   # dangling: mkdir would fail on it
            raise workspace_error(run_dir, f"{folder} is a link to nothing")
        folder = folder.parent
    if not folder.is_dir():
        raise workspace_error(run_dir, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise workspace_error(run_dir, f"{folder} is not writable by this user"
                                       + (" (a read-only filesystem)" if _read_only(folder) else ""))


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _check_local_gpus(cluster: ClusterSpec, plan: Plan) -> None:
    # startup: a local launch's alone (a dry run or another style's launch has no use for it)
    from ftcluster.schedulers.host_gpus import host_gpus, local_gpu_problem

    visible = cluster.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    problem = local_gpu_problem(plan.nodes, plan.gpus_per_node, visible, host_gpus())
    if problem:
        raise PlanError(problem, field="--nodes", hint="fewer --nodes or a smaller --gpus-per-node")


def job_request(cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, paths: RunPaths, opts: LaunchOptions,
                build: bool = True) -> JobRequest:
    """The run's job request; build=False resolves nothing that would build or probe (dry run)."""
    request = build_request(cluster, model, plan, paths, render_options(cluster, model, plan, paths, opts, build))
    return replace(request, token=opts.token) if opts.token else request


class Launch:
    """One run from submission to its end: the servers, the MPI check alone, or a job step
    (preflight, convert; `model` is None for a run that has none). `record_plan` replaces the
    plan in the run record (a conversion records what it converts)."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, opts: LaunchOptions,
                 progress: Progress | None = None, store: RunStore | None = None,
                 launcher: Scheduler | None = None, run_id: str | None = None,
                 record_plan: dict[str, Any] | None = None, clock: Clock = CLOCK,
                 predecessor: str | None = None):
        self.cluster, self.model, self.plan, self.opts = cluster, model, plan, opts
        self.clock = clock
        self.progress = progress or (lambda phase, t, detail: None)
        self._store = store
        self.launcher = launcher or scheduler_for(cluster)
        self.record_plan = record_plan
        self.predecessor = predecessor
        if opts.step is None:
            assert model is not None, "a run with servers needs its model"
            name = model.name
        else:
            name = opts.step.what + (f"-{model.name}" if model else "")
        self.paths = run_paths(cluster, run_id or new_run_id(name))

    @property
    def store(self) -> RunStore:
        # Opened on first use: a dry run writes nothing, not even the run store.
        if self._store is None:
            self._store = RunStore()
        return self._store

    def dry_run(self) -> JobRequest:
        """The job request, whose str() is the dry run, once `check` passed: the scheduler is
        only asked (its partitions), nothing is written or submitted."""
        self.check(dry=True)
        return self.request()

    def request(self) -> JobRequest:
        """The job request as a dry run shows it: nothing asked, built or written."""
        return job_request(self.cluster, self.model, self.plan, self.paths, self.opts, build=False)

    def check(self, dry: bool = False) -> None:
        """What a launch refuses before it writes or submits anything, every problem at once
        (a dry run refuses the same): what the launcher's cluster cannot run (an unknown
        partition, one smaller than --nodes, a port in use here), a workspace it cannot write, a
        run id that is taken. A dry run picks no ports: those of a spec that leaves them out
        (a free block picked at launch) are not probed."""
        servers = self.opts.step is None and (not dry or self.cluster.ports_given)

        def run_id_free() -> None:
            taken = self._taken(self.store if self._store is not None or RunStore.exists() else None)
            if taken:
                raise self._id_taken(taken)

        every(lambda: self.launcher.check(self.cluster, self.plan, servers=servers),
              lambda: check_workspace(self.paths.run_dir), run_id_free)

    def prepare(self) -> tuple[JobRequest, RunRecord]:
        servers = self.opts.step is None
        if servers and self.opts.member_of is None:   # a replica set's members take the set's ports
            self.cluster = self.launcher.with_ports(self.cluster, self.plan)
        self.check()
        request = job_request(self.cluster, self.model, self.plan, self.paths, self.opts)
        self._claim_run()
        try:
            write_run(request, self.cluster, self.model, self.plan, self.launcher, self._replica(), self.opts.specs)
        except BaseException as exc:
            shutil.rmtree(self.paths.run_dir, ignore_errors=True)   # ours: _claim_run made it
            if isinstance(exc, OSError):   # a full or read-only workspace: nothing was submitted
                raise UserError(f"cannot write the run folder {self.paths.run_dir}: {os_error_words(exc)}; "
                                "nothing was submitted", field="workspace",
                                hint="free space there, or choose another workspace") from None
            raise
        record = RunRecord(
            run_id=self.paths.run_id, created=time.time(), cluster_name=self.cluster.name,
            cluster_source=self.cluster.source or "", scheduler=request.scheduler,
            # A step's run is named by what it does (`status` shows no server ranks for it);
            # the launcher recorded beside it runs it.
            style=request.style if servers else request.kind, run_dir=str(self.paths.run_dir),
            nodes=self.plan.nodes, model=self.model.name if self.model else "",
            plan=self.record_plan if self.record_plan is not None else self.plan.to_dict(),
            launcher=request.launcher, predecessor=self.predecessor,
            replica_of=self.opts.member_of, replica=self.opts.member,
        )
        self.store.add(record)
        return request, record

    def _replica(self) -> dict[str, Any] | None:
        """run.json's `replica`: which set this member is of (a successor stays its member)."""
        if self.opts.member_of is None:
            return None
        return {"set": self.opts.member_of, "index": self.opts.member}

    def _claim_run(self) -> None:
        """Make the run folder, refusing a run id that is taken (folder or record): from here on
        the folder is this launch's, and only then may a failure remove it."""
        taken = self._taken(self.store)
        if taken is None:
            try:
                self.paths.run_dir.parent.mkdir(parents=True, exist_ok=True)
                self.paths.run_dir.mkdir(mode=0o700)   # yours alone from the start (request.write_files)
                return
            except FileExistsError:
                taken = "a run folder"   # made since _taken looked
            except OSError as exc:
                raise workspace_error(self.paths.run_dir, exc.strerror or str(exc)) from None
        raise self._id_taken(taken)

    def _taken(self, store: RunStore | None) -> str | None:
        """What holds this run's id already -- "a run record" or "a run folder" -- else None; reads
        only (store None: there is none yet). The one check of the launch and its dry run."""
        if store is not None and store.exact(self.paths.run_id) is not None:
            return "a run record"
        if os.path.lexists(self.paths.run_dir):
            return "a run folder"
        return None

    def _id_taken(self, taken: str) -> UserError:
        return UserError(f"run {self.paths.run_id} exists already ({taken} at {self.paths.run_dir}); nothing was "
                         "changed", field="--run-id", hint="choose a new run id, or leave --run-id out for a fresh one")

    def run(self) -> LaunchOutcome:
        request, record = self.prepare()
        try:
            job_id = self.launcher.submit(request)
        except BaseException:
            # Nothing was submitted: leave no run folder, keys or record behind.
            shutil.rmtree(self.paths.run_dir, ignore_errors=True)
            self.store.remove(record.run_id)
            raise
        record = self.store.update(record, job_id=job_id, status="SUBMITTED")
        t0 = time.time()
        self.progress("submitted", 0.0, f"job {job_id}")
        if self.opts.detach:
            return LaunchOutcome(record, True, {"submitted": 0.0}, detached=True)
        try:
            outcome = self._follow(record, t0)
        except KeyboardInterrupt:
            self.progress("cancelling", time.time() - t0, "interrupted: cancelling the job")
            self.launcher.cancel(job_id, self.paths, self.cluster.server.exit_grace)
            self.launcher.release_resources(self.paths)
            self.store.update(record, status="CANCELLED")
            raise Interrupted(f"interrupted; job {job_id} of run {record.run_id} was cancelled") from None
        status = "SERVING" if outcome.ok and self.opts.keep_serving else ("COMPLETED" if outcome.ok else "FAILED")
        outcome.record = self.store.update(outcome.record, status=status, endpoint=outcome.endpoint)
        return outcome

    def _follow(self, record: RunRecord, t0: float) -> LaunchOutcome:
        """Follow the run to its end: its events (every tick), rank 0's log until it is ready
        (every LOGS ceiling) and the scheduler (as JobWatch paces it). A handler's True ends
        the launch."""
        assert record.job_id is not None
        # startup: following the job's events, log and scheduler; once it is submitted, not before
        from ftcluster.schedulers.watch import JobWatch
        from ftcluster.run.logs import Follower, LogSource

        w = _Watch(t0, LaunchOutcome(record, False, {"submitted": 0.0}),
                   JobWatch(self.launcher, record.job_id, self.paths, self.clock),
                   Follower([LogSource("rank0", str(self.paths.server_log(0)))], clock=self.clock),
                   STARTING.backoff())
        try:
            while True:
                new = w.job.new_events()
                if self._on_events(w, new):
                    break
                changed = bool(new)
                now = self.clock.monotonic()
                if EV.ready not in w.outcome.phases and now >= w.next_log:
                    changed = self._on_log_due(w, now) or changed
                info = w.job.ask()
                if info is not None and self._on_info(w, info, now):
                    break
                if EV.ready in w.outcome.phases and w.tick.cadence is STARTING:
                    w.tick = EVENTS.backoff()
                self.clock.sleep(w.tick.next(changed))
            return self._finish(w.outcome, w.job)
        finally:
            w.job.close()
            w.rank0_log.close()

    def _on_events(self, w: _Watch, events: list[Event]) -> bool:
        """The job's milestones, in order; True at the one that ends the launch."""
        return any(self._on_event(ev, w.outcome, w.t0) for ev in events)

    def _on_log_due(self, w: _Watch, now: float) -> bool:
        """Rank 0's new log lines, the ones worth it shown, and the ranks' load progress (at most
        every LOAD_SHOWN_S); True when there were new lines."""
        # startup: read once the job runs (rank 0's log), not on the way to its submission
        from ftcluster.job.ranks import HARMLESS_ERRORS

        w.next_log = now + LOGS.slow
        lines = w.rank0_log.poll()
        for _, line in lines:
            # Triton's errors about a GPU a CPU server does not have are no news.
            if _WORTH_SHOWING.search(line) and not HARMLESS_ERRORS.search(line):
                self.progress("log", time.time() - w.t0, line.strip())
        if now >= w.next_load_shown:
            w.next_load_shown = now + LOAD_SHOWN_S
            said = self._load_progress()
            if said and said != w.load_said:
                w.load_said = said
                self.progress("loading", time.time() - w.t0, said)
        return bool(lines)

    def _load_progress(self) -> str:
        """Each loading rank's figures in words (state/rank<R>.progress, from its node)."""
        # startup: read once the job runs (the ranks' progress), not on the way to its submission
        from ftcluster.job.ranks import load_progress

        words = []
        for r in range(self.plan.mpi_ranks):
            try:
                p = load_progress(self.paths.rank_file(r, "progress").read_text(errors="replace"))
            except OSError:
                continue
            if p is not None and not self.paths.rank_file(r, "loaded").exists():
                words.append(f"rank {r}: {p.words()}")
        return "; ".join(words)

    def _on_info(self, w: _Watch, info: JobInfo, now: float) -> bool:
        """The scheduler's answer; True when it ends the launch."""
        if info.unreachable:
            return self._on_unreachable(w, info, now)
        w.unreachable_since = None
        requeued = self._requeued(info, w.outcome)
        if requeued:
            w.outcome.failure = requeued   # _finish cancels the job
            return True
        if info.state is JobState.PENDING and info.reason and info.reason != w.last_detail:
            w.last_detail = info.reason
            self.progress("submitted", time.time() - w.t0, f"pending: {info.reason}")
        if info.gone:
            self._on_gone(w, info)
            return True
        return False

    def _on_unreachable(self, w: _Watch, info: JobInfo, now: float) -> bool:
        """The scheduler could not be asked (a busy slurmctld times out): not an answer. The
        job's own events still end the launch; a scheduler that stays unreachable does."""
        w.unreachable_since = w.unreachable_since or now
        if now - w.unreachable_since < SCHEDULER_UNREACHABLE_LIMIT:
            return False
        w.outcome.failure = (f"the scheduler could not be asked about job {w.job.job_id} for "
                             f"{SCHEDULER_UNREACHABLE_LIMIT:.0f}s: {info.reason}")
        return True

    def _on_gone(self, w: _Watch, info: JobInfo) -> None:
        """The job is gone; read the events it left once more before judging."""
        if self._on_events(w, w.job.new_events()):
            return
        w.outcome.failure = w.outcome.failure or (
            f"the job ended ({info.raw_state}{': ' + info.reason if info.reason else ''}) "
            "before the run finished")

    def _on_event(self, ev: Event, outcome: LaunchOutcome, t0: float) -> bool:
        """Record one milestone; True when the launch is over (for good or bad)."""
        t = max(0.0, ev.time - t0)
        if ev.kind in PHASES:
            outcome.phases.setdefault(ev.kind, round(t, 3))
            self.progress(ev.kind, t, _detail(ev))
        if ev.kind == EV.ready:
            outcome.endpoint = ev.args[0] if ev.args else None
        elif ev.kind == EV.rank_failed and len(ev.args) >= 2:
            outcome.failed_rank = {"rank": ev.args[0], "node": ev.args[1],
                                   "exit_code": ev.args[2] if len(ev.args) > 2 else "?"}
        elif ev.kind == EV.failed:
            # The first failure is the cause; later ones (a teardown) are added, not swapped in.
            text = " ".join(ev.args) or "the job script failed"
            outcome.failure = f"{outcome.failure}; then {text}" if outcome.failure else text
        elif ev.kind == EV.client_done:
            rc = ev.args[0] if ev.args else "?"
            if rc != "0":
                outcome.failure = f"the client failed (exit {rc}); see logs/client.log"
        elif ev.kind == EV.serving and self.opts.keep_serving:
            outcome.ok = True
            return True
        elif ev.kind == EV.interrupted:
            outcome.failure = outcome.failure or (
                "the job script was stopped by a signal (scancel, a requeue, preemption or the time limit)")
        elif ev.kind == EV.done:
            return True
        return False

    def _finish(self, outcome: LaunchOutcome, job: JobWatch) -> LaunchOutcome:
        assert outcome.record.job_id is not None
        done = [e for e in job.events.events if e.kind == EV.done]
        if not outcome.ok:
            outcome.ok = bool(done and done[-1].args[:1] == ("0",) and outcome.failure is None)
        outcome.client = _read_json(self.paths.results / FILES.client_json)
        outcome.mpicheck = _read_json(self.paths.results / FILES.mpicheck_json)
        if outcome.ok and self.opts.keep_serving:
            return outcome
        if not outcome.ok:
            if outcome.failed_rank:
                outcome.log_tail = self._rank_log_tail(outcome.failed_rank["rank"])
            elif EV.client_done in outcome.phases:
                client_log = self.paths.logs / FILES.client_log
                if client_log.is_file():
                    outcome.log_tail = [f"{FILES.client_log}: {line}" for line in
                                        client_log.read_text(errors="replace").splitlines()[-15:]]
        # Whatever happened, nothing of this run may be left running. After `done` the job
        # ends by itself; give it a moment (the scheduler asked at the fast pace) before
        # cancelling.
        gone = job.info is not None and job.info.gone
        if not gone and done:
            job.soon()
            gone = job.wait_gone(10.0)
        elif not gone:
            info = self.launcher.info(outcome.record.job_id, self.paths)
            gone = info.gone
            requeued = None if outcome.ok else self._requeued(info, outcome)
            if requeued:
                outcome.failure = requeued
        if not gone:
            self.launcher.cancel(outcome.record.job_id, self.paths, self.cluster.server.exit_grace)
        self.launcher.release_resources(self.paths)
        return outcome

    def _requeued(self, info: JobInfo, outcome: LaunchOutcome) -> str | None:
        """The failure to report when the scheduler put the job back in the queue after it
        started (the launcher knows how its scheduler shows that)."""
        return self.launcher.requeued(info) if EV.job_started in outcome.phases else None

    def _rank_log_tail(self, rank: str, n: int = 12) -> list[str]:
        return rank_log_tail(self.paths, rank, n)


def write_run(request: JobRequest, cluster: ClusterSpec, model: ModelSpec | None, plan: Plan,
              launcher: Scheduler | None = None, replica: dict[str, Any] | None = None,
              specs: LaunchedSpecs | None = None) -> list[Path]:
    """Lay out the run folder as its job expects it: the request's files, the model repository
    (a run with servers), what its launcher prepares (the Docker styles' per-run ssh keys),
    run.json and the specs it is launched from (`specs`, else its own) with the run's own facts
    (the request's). `launch` and `render --out` both write a run this way."""
    paths = request.paths
    if request.kind in ("serve", "check") and model is not None:
        engine_for(model).prepare(model, plan, paths.repo)
    written = request.write_files()
    (launcher or scheduler_named(request.launcher)).prepare_resources(request)
    if model is not None:
        written.append(write_run_metadata(paths, cluster, model, plan, replica))
        specs = specs or LaunchedSpecs(cluster, model, plan)
    if specs is not None:
        written.append(write_specs(paths.run_dir, specs, request.facts))
    return written


def run_metadata(cluster: ClusterSpec, model: ModelSpec, plan: Plan, run_id: str,
                 replica: dict[str, Any] | None = None) -> dict[str, Any]:
    """What served a run: specs, plan, image (with what `image build` recorded for it), versions."""
    # startup: the image code (~5 ms) only when a run's record is written, not for --dry-run
    from ftcluster.service.image import image_metadata, image_tag, recipe_of

    # The name `image build` gives the engine's image by default (the default engine's where this one has no build).
    tag = image_tag(cluster, recipe=recipe_of(engine_for(model)))
    built = image_metadata(cluster, tag) if cluster.container.runtime != "none" or cluster.image.tag else None
    return {
        "run_id": run_id, "created": time.time(), "ftcluster_version": __version__,
        "cluster": {"name": cluster.name, "source": cluster.source, "scheduler": cluster.scheduler,
                    "runtime": cluster.container.runtime},
        "model": {"name": model.name, "backend": model.backend, **plan.details, "source": model.source},
        "plan": plan.to_dict(),
        "image": {"container_image": cluster.container.image, "tag": tag,
                  # image id and TRITON_VERSION as `ftcluster image build` recorded them
                  "built": built.to_dict() if built else None},
        "tritonserver": cluster.server.binary,
        **({"replica": replica} if replica else {}),
    }


def write_run_metadata(paths: RunPaths, cluster: ClusterSpec, model: ModelSpec, plan: Plan,
                       replica: dict[str, Any] | None = None) -> Path:
    path = paths.run_dir / "run.json"
    path.write_text(json.dumps(run_metadata(cluster, model, plan, paths.run_id, replica), indent=2,
                               default=str) + "\n")
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


# The ranks' load progress is shown at most this often while they load.
LOAD_SHOWN_S = 5.0
# Seconds the launch goes on without an answer from the scheduler before giving up.
SCHEDULER_UNREACHABLE_LIMIT = 300.0

# Rank 0's log lines shown while waiting: the model status table and errors.
_WORTH_SHOWING = re.compile(r"^\| \S+ +\| \d+ +\| (READY|UNAVAILABLE)|^E\d{4} |failed to")
_ERROR_LINE = re.compile(r"^E\d{4} |error|failed|traceback|exception|unable to", re.IGNORECASE)


def _detail(ev: Event) -> str:
    """A milestone's arguments in words where bare words would puzzle ("vm 27594")."""
    if ev.kind == EV.job_started and len(ev.args) >= 2:
        return f"on {ev.args[0]}, job {ev.args[1]}"
    return " ".join(ev.args)


def rank_log_tail(paths: RunPaths, rank: str, n: int = 12) -> list[str]:
    """The lines of a rank's logs that explain a failure: errors first, else the last lines."""
    lines: list[str] = []
    for name in (FILES.server_log(rank), FILES.rank(rank, "stdout")):
        path = paths.logs / name
        if path.is_file():
            text = path.read_text(errors="replace").splitlines()[-400:]
            picked = [line for line in text if _ERROR_LINE.search(line)] or text
            lines += [f"{name}: {line.strip()}" for line in picked[-n:] if line.strip()]
    return lines
