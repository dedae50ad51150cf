"""A serving run's successor: the same plan from the same specs (those it was launched from,
kept in its folder), as a new run on other nodes.

The job of a serving run submits it before its time limit (ftcluster.job.handover runs
`python -m ftcluster successor RUN_DIR --exclude NODES` on the batch host, with the launching
Python) and hands over when it serves. The successor is an ordinary detached `launch
--keep-serving --no-client` run whose record names its predecessor; `status` follows the chain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.job.config import JobConfig
from ftcluster.job.names import FILES
from ftcluster.launch.run import Launch, LaunchOptions, LaunchOutcome
from ftcluster.render.launched import LaunchedSpecs, read_facts, read_specs
from ftcluster.engines import make_plan
from ftcluster.plan.replicas import member_cluster
from ftcluster.schedulers import scheduler_for
from ftcluster.access.run_access import read_token
from ftcluster.spec.load import load_cluster, load_model
from ftcluster.run.store import RunRecord, RunStore


def hostlist_items(text: str) -> list[str]:
    """A Slurm hostlist's comma-separated items, a bracket's own commas kept: "a[1,3-4],b" ->
    ["a[1,3-4]", "b"]."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [i for i in [*items, cur] if i]


def with_excluded(sbatch_args: tuple[str, ...], nodes: list[str]) -> tuple[str, ...]:
    """The spec's sbatch_args with `nodes` added to its --exclude (one option, merged)."""
    kept, excluded = [], list(nodes)
    for arg in sbatch_args:
        # --exclude=NODES, -x NODES or -xNODES (a hostlist such as node[01-03] stays one entry)
        for prefix in ("--exclude=", "-x ", "-x"):
            if arg.startswith(prefix) and len(arg) > len(prefix):
                excluded = hostlist_items(arg[len(prefix):].strip()) + excluded
                break
        else:
            kept.append(arg)
    return (*kept, "--exclude=" + ",".join(dict.fromkeys(excluded))) if excluded else tuple(kept)


@dataclass(frozen=True)
class RunSpecs:
    """What a serving run was launched from, read back from its folder."""

    launched: LaunchedSpecs
    job: JobConfig
    meta: dict[str, Any]

    @property
    def replica(self) -> dict[str, Any] | None:
        """A replica set member's {"set", "index"} (run.json), else None."""
        found = self.meta.get("replica")
        return found if isinstance(found, dict) else None


def run_specs(run_dir: Path) -> RunSpecs:
    """The specs and plan (as launched: ftcluster.render.launched) and job values of the serving run in
    `run_dir`."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
        cfg = JobConfig.from_json((run_dir / "scripts" / FILES.job_config).read_text())
        if not isinstance(meta, dict):
            raise ValueError("run.json holds no mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{run_dir} is not a serving run's folder: {exc}", field="RUN_DIR") from None
    launched = read_specs(run_dir) or _specs_from_files(meta, cfg)
    return RunSpecs(launched, cfg, meta)


def _specs_from_files(meta: dict[str, Any], cfg: JobConfig) -> LaunchedSpecs:
    """A run folder that an earlier ftcluster wrote keeps no specs: its spec files, read again
    (a serving run launched before an upgrade still hands over)."""
    try:
        cluster_source, model_source = meta["cluster"]["source"], meta["model"]["source"]
        planned = meta["plan"]
    except (KeyError, TypeError) as exc:
        raise UserError(f"the run folder's run.json lacks {exc}", field="RUN_DIR") from None
    if not cluster_source or not model_source:
        raise UserError("the run's specs were not files; a successor needs them", field="RUN_DIR")
    cluster = load_cluster(cluster_source)
    model = load_model(model_source)
    plan = make_plan(cluster, model, cfg.nodes, gpus_per_node=cfg.gpus_per_node,
                     tp=planned.get("tensor_para_size"), pp=planned.get("pipeline_para_size"))
    return LaunchedSpecs(cluster, model, plan)


def successor_launch(run_dir: Path, exclude: list[str], faults: tuple[str, ...] = ()) -> Launch:
    """The successor of the serving run in `run_dir`, excluding `exclude` (its nodes, or a lost
    one), with the run's own server.restarts, counting on from `faults` (those of the run still
    counted): made from the specs the run was launched from (its folder's, not the files')."""
    specs = run_specs(run_dir)
    launched, cfg = specs.launched, specs.job
    cluster = launched.cluster
    server = cluster.server.model_copy(update={"restarts": cfg.restarts})
    cluster = cluster.model_copy(update={"server": server,
                                         "sbatch_args": with_excluded(cluster.sbatch_args, exclude)})
    replica = specs.replica
    if replica:   # a replica set's member: its ports, and in its balancer's rotation

        cluster = member_cluster(cluster, int(replica["index"]))
    # The same token as the predecessor's: clients of a private run keep theirs across the hand-over.
    token = read_token(run_dir)
    opts = LaunchOptions(keep_serving=True, detach=True, client=False, mpi_check=cfg.mpi_check, token=token,
                         member_of=replica["set"] if replica else None,
                         member=int(replica["index"]) if replica else None, carried_faults=tuple(faults),
                         service=cfg.service or cfg.run_id, specs=launched,
                         # The same run, continued: its facts (ports, access, restarts) as its launch saved them.
                         facts=read_facts(run_dir))
    # The cluster's scheduler (holding its runtime) submits it, as it submitted the predecessor.
    return Launch(cluster, launched.model, launched.plan, opts, predecessor=cfg.run_id,
                  launcher=scheduler_for(cluster))


def submit_successor(run_dir: Path, exclude: list[str], faults: tuple[str, ...] = ()) -> LaunchOutcome:
    """Submit the successor of the serving run in `run_dir` (successor_launch)."""
    return successor_launch(run_dir, exclude, faults).run()


def record_job(run_dir: Path, job_id: str) -> RunRecord:
    """The run in `run_dir` is served by job `job_id` now (a replica set's balancer that handed
    over to a job of its own on its node): its record names that job, so that `status`, `stop`
    and `logs` follow it."""
    if not job_id.isdigit():
        raise UserError(f"not a Slurm job id: {job_id!r}", field="--took-over", hint="give the job's number")
    store = RunStore()
    found = [r for r in store.all() if Path(r.run_dir).resolve() == run_dir.resolve()]
    if not found:
        raise UserError(f"no run is recorded for {run_dir}", field="RUN_DIR")
    return store.update(found[-1], job_id=job_id)
