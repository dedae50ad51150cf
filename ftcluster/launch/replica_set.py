"""A replica set's life on the launching side: launch (the front, then the members), follow
until every member is in rotation, stop (the members drain first, then the front), stop or
add one member, scale, a rolling restart.

The set's run id is its front's run (style `front`); its run folder holds replicas.json, the
members the front balances over. Each member is an ordinary serving run (`<set>-r<K>`), whose
record names its set (`replica_of`). Pure parts live in ftcluster.plan.replicas.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ftcluster.access.run_access import read_token
from ftcluster.errors import Interrupted, LaunchError, UserError
from ftcluster.run.events import EV, events_in
from ftcluster.job.poll import CLOCK, Clock
from ftcluster.launch.run import Launch, LaunchOptions, Progress, run_paths, workspace_dir
from ftcluster.launch.successor import run_specs
from ftcluster.render.launched import LaunchedSpecs, read_specs, write_specs
from ftcluster.schedulers import scheduler_class, scheduler_for
from ftcluster.run.layout import FILES, RunPaths
from ftcluster.engines import make_plan
from ftcluster.plan.parallel import Plan
from ftcluster.plan.endpoint import new_token, proxy_binary
from ftcluster.plan.facts import resolve
from ftcluster.render.scripts import JobStep, handover_lead, write_private
from ftcluster.run.replica_files import (FRONT_CADDY, FRONT_SETTINGS, MEMBERS_FILE, front_endpoint, read_members,
                                     rotation_now)
from ftcluster.plan.replicas import (FrontSettings, front_config_text, member_cluster, member_id,
                                replica_problems)
from ftcluster.render.request import job_shape
from ftcluster.spec.cluster import ClusterSpec, Container
from ftcluster.spec.load import load_model, with_image
from ftcluster.spec.model import ModelSpec
from ftcluster.observe.status import member_records, stop_run
from ftcluster.run.store import RunRecord, RunStore, new_run_id
from ftcluster.spec.launch_styles import style_of

FRONT_STEP = "front"


def front_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The front's spec: on the node itself (no container), no GPUs, sharing its node (it is
    small), one of it."""
    return cluster.model_copy(update={"container": Container(), "request_gpus": False, "exclusive": False,
                                      "replicas": 1})


def front_step(cluster: ClusterSpec, paths: RunPaths, build: bool) -> JobStep:
    """The balancer's step; `cluster` is the front's spec (front_cluster)."""
    # The set's access (the front's own job serves no Triton: it holds the set's token where private).
    private = resolve(cluster, serves=False).access == "private"
    python = cluster.python or sys.executable
    # On Slurm the front hands over to a job of its own before its time limit (ftcluster.job.front).
    lead = handover_lead(cluster) if scheduler_class(cluster.scheduler).time_limit_notice else 0
    settings = FrontSettings(
        caddy=proxy_binary(cluster.proxy) if build else cluster.proxy.binary,
        config=str(paths.scripts / FRONT_CADDY), members=str(paths.run_dir / MEMBERS_FILE),
        token_file=str(paths.scripts / FILES.token) if private else "",
        state=str(paths.state), logs=str(paths.logs), tls_cert=cluster.proxy.tls_cert or "",
        handover_lead=lead, script=str(paths.job_script(style_of(cluster).name)) if lead else "",
        run_dir=str(paths.run_dir) if lead else "",
        record=(python, "-m", "ftcluster", "successor", str(paths.run_dir), "--took-over") if lead else (),
        log_max_bytes=int(cluster.server.log_max_mb * (1 << 20)))
    listen = "127.0.0.1" if style_of(cluster).one_host else ""
    return JobStep(FRONT_STEP, "the balancer",
                   (python, str(paths.scripts / FILES.supervisor), "front", str(paths.scripts / FRONT_SETTINGS)),
                   per_node=False,
                   files=((FRONT_SETTINGS, settings.to_json()), (FRONT_CADDY, front_config_text(cluster, listen))),
                   token=private, notice=bool(lead), serves=True)


# --- the members file ----------------------------------------------------------------------


def write_members(set_dir: Path, members: list[dict[str, Any]]) -> None:
    write_private(set_dir / MEMBERS_FILE, json.dumps({"members": members}, indent=1, sort_keys=True) + "\n", 0o600)


@dataclass
class SetOutcome:
    set_id: str
    ok: bool
    run_dir: str
    endpoint: str | None = None
    members: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    detached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.set_id, "ok": self.ok, "run_dir": self.run_dir, "endpoint": self.endpoint,
                "members": self.members, "failure": self.failure, "detached": self.detached}


class ReplicaSet:
    """R members of one plan behind one front: launched, followed until each is in rotation."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, plan: Plan, opts: LaunchOptions, replicas: int,
                 progress: Progress | None = None, store: RunStore | None = None, run_id: str | None = None,
                 clock: Clock = CLOCK):
        self.cluster, self.model, self.plan, self.opts, self.replicas = cluster, model, plan, opts, replicas
        self.progress = progress or (lambda phase, t, detail: None)
        self._store = store
        self.clock = clock
        self.set_id = run_id or new_run_id(model.name)
        self.front_spec = front_cluster(cluster)
        self.paths = run_paths(cluster, self.set_id)

    @property
    def store(self) -> RunStore:
        if self._store is None:   # opened on first use, as Launch does
            self._store = RunStore()
        return self._store

    @property
    def specs(self) -> LaunchedSpecs:
        """What each of its runs is made from (a member's spec is derived from it: member_cluster)."""
        return LaunchedSpecs(self.cluster, self.model, self.plan)

    def problems(self, replicas: int, nodes_known: int | None) -> list[str]:
        one_host = style_of(self.cluster).one_host
        return replica_problems(self.cluster, self.plan, replicas, one_host, resolve(self.cluster).port_stride,
                                nodes_known)

    def front(self, build: bool = True, token: str | None = None) -> Launch:
        step = front_step(self.front_spec, self.paths, build)
        # The set's specs in its folder: members started later (scale, a rolling restart) come from them.
        opts = LaunchOptions(detach=True, client=False, mpi_check=False, step=step, token=token, specs=self.specs)
        return Launch(self.front_spec, None, job_shape(self.front_spec, 1, 0), opts, store=self._store,
                      run_id=self.set_id, record_plan=self.plan.to_dict(), clock=self.clock)

    def member(self, k: int, generation: int = 0, token: str | None = None) -> Launch:
        opts = replace(self.opts, detach=True, client=False, token=token, member_of=self.set_id, member=k,
                       specs=self.specs)
        return Launch(member_cluster(self.cluster, k), self.model, self.plan, opts, store=self._store,
                      run_id=member_id(self.set_id, k, generation), clock=self.clock)

    def dry_run(self) -> str:
        """The front's request, then each member's: what would run, nothing written, once
        what a launch of the set refuses was checked."""
        self.problems_for(self.replicas)
        parts = [str(self.front(build=False).dry_run())]
        parts += [str(self.member(k).dry_run()) for k in range(self.replicas)]
        return "\n".join(parts)

    def problems_for(self, replicas: int) -> None:
        """Refuse `replicas` members of this plan (UserError naming every problem)."""
        nodes_known = None
        slurm = getattr(scheduler_for(self.cluster), "slurm", None)
        if slurm is not None:
            nodes_known = slurm.partition_nodes(self.cluster.partition)
        problems = self.problems(replicas, nodes_known)
        if problems:
            raise UserError("; ".join(problems))

    def run(self) -> SetOutcome:
        self.problems_for(self.replicas)
        private = resolve(self.cluster).access == "private"
        # One token for the set: the front checks it, and so does each member's own proxy.
        token = new_token() if private else None
        front = self.front(token=token)
        front_out = front.run()
        launched: list[RunRecord] = [front_out.record]
        t0 = time.time()
        members: list[dict[str, Any]] = []
        try:
            for k in range(self.replicas):
                members.append({"replica": k, "run_id": member_id(self.set_id, k),
                                "run_dir": str(workspace_dir(self.cluster) / member_id(self.set_id, k))})
            write_members(self.paths.run_dir, members)
            for k in range(self.replicas):
                out = self.member(k, token=token).run()
                launched.append(out.record)
                self.progress("submitted", time.time() - t0, f"replica {k}: run {out.record.run_id}, job {out.record.job_id}")
        except BaseException:
            stop_records(launched, self.store)
            raise
        outcome = SetOutcome(self.set_id, True, str(self.paths.run_dir), members=members,
                             detached=self.opts.detach)
        if self.opts.detach:
            return outcome
        try:
            self._follow(outcome, launched, t0)
        except KeyboardInterrupt:
            stop_records(launched, self.store)
            raise Interrupted(f"interrupted; replica set {self.set_id} was stopped") from None
        if not outcome.ok:
            stop_records(launched, self.store)
            return outcome
        for rec in launched:
            self.store.update(rec, status="SERVING" if self.opts.keep_serving else "COMPLETED")
        if not self.opts.keep_serving:
            stop_records(launched, self.store)
        return outcome

    def _follow(self, outcome: SetOutcome, launched: list[RunRecord], t0: float) -> None:
        """Until every member is in rotation; a member's or the front's end fails the set."""
        deadline = time.monotonic() + self.cluster.server.ready_timeout + 120
        shown: set[tuple[str, str]] = set()
        while True:
            rotation = rotation_now(self.paths.run_dir)
            for rec in launched:
                events = events_in(Path(rec.run_dir))
                label = "balancer" if rec.replica is None else f"replica {rec.replica}"
                for e in events:
                    if e.kind in (EV.job_started, EV.ready, EV.serving, EV.step_started) and (rec.run_id, e.kind) not in shown:
                        shown.add((rec.run_id, e.kind))
                        self.progress(e.kind, time.time() - t0, f"{label}: {' '.join(e.args)}")
                ended = [e for e in events if e.kind in (EV.failed, EV.done)]
                if ended:
                    failed = [e for e in events if e.kind == EV.failed]
                    outcome.ok = False
                    outcome.failure = f"{label} (run {rec.run_id}) ended: " + (
                        " ".join(failed[0].args) if failed else "its job ended")
                    return
            up = rotation.get("in_rotation", [])
            if len(up) >= self.replicas:
                outcome.endpoint = front_endpoint(self.paths.run_dir)
                self.progress("serving", time.time() - t0, f"{len(up)} replicas in rotation behind {outcome.endpoint}")
                return
            if time.monotonic() > deadline:
                outcome.ok = False
                outcome.failure = (f"only {len(up)} of {self.replicas} replicas in rotation after "
                                   f"{self.cluster.server.ready_timeout + 120:.0f} s")
                return
            self.clock.sleep(0.5)


def stop_records(records: list[RunRecord], store: RunStore) -> None:
    """Stop runs at once (each waits for its own teardown): the members drain through the front
    meanwhile; a front among them goes last."""
    fronts = [r for r in records if r.style == FRONT_STEP]
    members = [r for r in records if r.style != FRONT_STEP and r.job_id]
    errors: list[str] = []

    def stop(rec: RunRecord) -> None:
        try:
            stop_run(rec, store)
        except Exception as exc:  # noqa: BLE001  (every other one still stops)
            errors.append(f"{rec.run_id}: {exc}")

    threads = [threading.Thread(target=stop, args=(r,)) for r in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in fronts:
        if r.job_id:
            stop(r)
    if errors:
        raise LaunchError("some runs could not be stopped: " + "; ".join(errors))


def stop_set(set_rec: RunRecord, store: RunStore, replica: int | None = None) -> list[RunRecord]:
    """Stop a whole set (members, then the front) or one member; the runs stopped."""
    members = member_records(set_rec, store, replica)
    if replica is not None and not members:
        raise UserError(f"replica set {set_rec.run_id} has no replica {replica}", field="--replica",
                        hint="see `ftcluster status RUN` for its members")
    live = [r for r in members if r.job_id and r.status in ("SUBMITTED", "SERVING")]
    if replica is None:
        stop_records([*live, set_rec], store)
        return [*live, set_rec]
    stop_records(live, store)
    write_members(Path(set_rec.run_dir), [m for m in read_members(Path(set_rec.run_dir))
                                          if m.get("replica") != replica])
    return live


def wait_in_rotation(set_dir: Path, run_dir: str, limit: float, clock: Clock = CLOCK,
                     check: Callable[[], str | None] | None = None) -> str | None:
    """Wait until the member in `run_dir` is in the front's rotation; the failure, else None."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for m in rotation_now(set_dir).get("members", []):
            if m.get("run_dir") == run_dir and m.get("in"):
                return None
        failed = [e for e in events_in(Path(run_dir)) if e.kind in (EV.failed, EV.done)]
        if failed:
            return f"run {Path(run_dir).name} ended before it was in rotation: {' '.join(failed[0].args)}"
        if check is not None:
            why = check()
            if why:
                return why
        clock.sleep(0.5)
    return f"run {Path(run_dir).name} was not in rotation within {limit:.0f} s"


# --- changing a serving set: scale, rolling restart --------------------------------------------

def recorded_set(set_rec: RunRecord, model_path: str | None = None, image: str | None = None,
                 progress: Progress | None = None) -> ReplicaSet:
    """The ReplicaSet a recorded set was launched as (the specs its folder keeps, never the
    files again), with a new model spec or container image where given."""
    members = [r for r in member_records(set_rec, RunStore()) if Path(r.run_dir, "run.json").is_file()]
    if not members:
        raise UserError(f"replica set {set_rec.run_id} has no member left to take its specs from", field="RUN")
    member = run_specs(Path(members[-1].run_dir))
    # A set an earlier ftcluster launched keeps its specs in its members' folders only.
    specs = read_specs(Path(set_rec.run_dir)) or member.launched
    cluster, model, plan = specs.cluster, specs.model, specs.plan
    if image:
        cluster = with_image(cluster, image, "--image")
    if model_path:
        model = load_model(model_path)
        plan = make_plan(cluster, model, specs.plan.nodes, gpus_per_node=specs.plan.gpus_per_node)
    opts = LaunchOptions(keep_serving=True, detach=True, client=False, mpi_check=member.job.mpi_check)
    return ReplicaSet(cluster, model, plan, opts, len(read_members(Path(set_rec.run_dir))), progress=progress,
                      run_id=set_rec.run_id)


def _next_generation(store: RunStore, set_id: str, k: int) -> int:
    """The generation of member k's next run: one above any recorded."""
    base = member_id(set_id, k)
    gens = [0 if r.run_id == base else int(r.run_id[len(base) + 1:]) for r in store.all()
            if r.run_id == base or (r.run_id.startswith(base + ".") and r.run_id[len(base) + 1:].isdigit())]
    return max(gens) + 1 if gens else 0


def free_indices(have: set[int], count: int) -> list[int]:
    """The `count` lowest member indices that no member has."""
    return [k for k in range(len(have) + count) if k not in have][:count]


def start_member(rs: ReplicaSet, set_rec: RunRecord, k: int, store: RunStore) -> RunRecord:
    """Launch member k of a serving set (its next generation), add it to the front's members
    and wait until it is in rotation; a member that does not get there is stopped."""
    set_dir = Path(set_rec.run_dir)
    launch = rs.member(k, _next_generation(store, rs.set_id, k), token=read_token(set_dir))
    out = launch.run()
    members = [m for m in read_members(set_dir) if m.get("replica") != k]
    members.append({"replica": k, "run_id": out.record.run_id, "run_dir": out.record.run_dir})
    write_members(set_dir, sorted(members, key=lambda m: int(m["replica"])))
    rs.progress("submitted", 0.0, f"replica {k}: run {out.record.run_id}, job {out.record.job_id}")
    why = wait_in_rotation(set_dir, out.record.run_dir, rs.cluster.server.ready_timeout + 120, rs.clock)
    if why:
        stop_records([out.record], store)
        raise LaunchError(f"replica {k}: {why}")
    rs.progress("serving", 0.0, f"replica {k}: run {out.record.run_id} in rotation")
    return store.update(out.record, status="SERVING")


def scale(set_rec: RunRecord, replicas: int, progress: Progress | None = None) -> list[str]:
    """Add members (each in rotation before the next starts) or stop the highest ones (each
    drained first); what was done, in words."""
    store = RunStore()
    have = sorted(int(m["replica"]) for m in read_members(Path(set_rec.run_dir)))
    done: list[str] = []
    if replicas > len(have):
        rs = recorded_set(set_rec, progress=progress)
        rs.problems_for(replicas)
        for k in free_indices(set(have), replicas - len(have)):
            rec = start_member(rs, set_rec, k, store)
            done.append(f"replica {k} started: run {rec.run_id} (job {rec.job_id})")
    for k in reversed(have[replicas:]):
        for r in stop_set(set_rec, store, k):
            done.append(f"replica {k} stopped: run {r.run_id} (job {r.job_id})")
    return done


def rolling_restart(set_rec: RunRecord, model_path: str | None = None, image: str | None = None,
                    progress: Progress | None = None, surge: bool | None = None) -> list[str]:
    """One member at a time: out of rotation and stopped (its requests in flight finish), then
    started again (a new run of the same index, with the new model or image where given) and
    back in rotation before the next. With two or more members the endpoint never lacks one.
    `surge` (the default for a set of one, which would otherwise have none in rotation
    meanwhile): each member's replacement starts first, at a free index, and the member drains
    and stops once the replacement is in rotation -- the nodes of one more member for a while."""
    store = RunStore()
    set_dir = Path(set_rec.run_dir)
    rs = recorded_set(set_rec, model_path, image, progress)
    members = sorted(read_members(set_dir), key=lambda m: int(m["replica"]))
    if surge is None:
        surge = len(members) == 1
    if surge:
        rs.problems_for(len(members) + 1)
    done: list[str] = []
    for m in members:
        k = int(m["replica"])
        if surge:
            (new,) = free_indices({int(x["replica"]) for x in read_members(set_dir)}, 1)
            rec = start_member(rs, set_rec, new, store)
            done.append(f"replica {new}: run {rec.run_id} (job {rec.job_id}) in rotation in place of replica {k}")
        for r in stop_set(set_rec, store, k):
            done.append(f"replica {k}: run {r.run_id} stopped")
        if not surge:
            rec = start_member(rs, set_rec, k, store)
            done.append(f"replica {k}: run {rec.run_id} (job {rec.job_id}) in rotation")
    # Every member runs the new specs now: so do members started later.
    write_specs(set_dir, rs.specs)
    return done
