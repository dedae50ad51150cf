"""`ftcluster convert`: the FT converter for the model type, as a Slurm job through submitit.

The job writes `<checkpoint_root>/<tp>-gpu/` with tp = tensor_para_size of the plan for the
requested node count. Its stdout/stderr (submitit's `<job>_0_log.out/.err`) land in the run
folder's logs/, and the run is recorded in the run store, so `ftcluster logs RUN` shows them.
After the job the checkpoint check runs on the result.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftcluster.checkpoint_check import checkpoint_problems
from ftcluster.converters import converter_argv, converter_for
from ftcluster.errors import LaunchError, PlanError, UserError
from ftcluster.plan import _resolve_gpus
from ftcluster.render import RunPaths
from ftcluster.spec import ClusterSpec, ModelSpec
from ftcluster.store import RunRecord, RunStore, new_run_id

STYLE = "convert"


class ConverterFailed(RuntimeError):
    pass


def run_converter(argv: list[str], cwd: str) -> str:
    """The job itself (runs on the node): the converter, its output into the job's log."""
    print(f"ftcluster convert: {shlex.join(argv)}", flush=True)
    rc = subprocess.run(argv, cwd=cwd, check=False).returncode
    if rc != 0:
        raise ConverterFailed(f"the converter exited {rc}")
    return "converted"


@dataclass(frozen=True)
class ConvertRequest:
    cluster: ClusterSpec
    model: ModelSpec
    tp: int
    converter_root: Path
    input_dir: str
    python: str

    @property
    def output_root(self) -> Path:
        return self.model.checkpoint_root

    def argv(self) -> list[str]:
        return converter_argv(self.model.model_type, self.converter_root, self.input_dir,
                              str(self.output_root), self.tp, self.model.data_type or "fp16", self.model.name,
                              python=self.python, variant=self.model.converter)


def minutes(slurm_time: str) -> int:
    """A Slurm time (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in whole minutes, for submitit."""
    if slurm_time.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    days, _, rest = slurm_time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        h, (m, s) = 0, (parts + [0])[:2]
    total = (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)
    return max(total, 1)


def srun_args(req: ConvertRequest, run_dir: Path) -> list[str]:
    """Container flags for Pyxis: the image, the spec's mounts and the paths the job touches."""
    c = req.cluster.container
    if c.runtime != "pyxis":
        return []
    paths = {str(run_dir), str(req.converter_root), str(req.output_root)}
    if Path(req.input_dir).is_absolute():
        paths.add(req.input_dir)
    mounts = [f"{m.src}:{m.dst}" + (f":{'+'.join(m.flags)}" if m.flags else "") for m in c.mounts]
    mounts += [f"{p}:{p}" for p in sorted(paths)]
    bad = [p for p in paths if "," in p or ":" in p]
    if bad:
        raise UserError(f"{bad[0]} holds ',' or ':', which --container-mounts cannot express")
    args = [f"--container-image={c.image}", f"--container-mounts={','.join(mounts)}"]
    return args + ([f"--container-workdir={c.workdir}"] if c.workdir else [])


def plan_tp(cluster: ClusterSpec, nodes: int, gpus_per_node: int | None, tp: int | None,
            pp: int | None) -> int:
    """tensor_para_size as `plan` would choose it, before any checkpoint exists."""
    gpn = _resolve_gpus(cluster, gpus_per_node)
    tp = gpn if tp is None else tp
    pp = nodes if pp is None else pp
    if nodes < 1 or tp < 1 or pp < 1:
        raise PlanError("nodes, tp and pp must be >= 1", field="--nodes/--tp/--pp")
    if tp * pp != nodes * gpn:
        raise PlanError(f"tensor_para_size {tp} x pipeline_para_size {pp} != {nodes} node(s) x {gpn} GPU(s)",
                        field="plan", hint="make tp*pp equal nodes*gpus_per_node")
    return tp


def check_request(req: ConvertRequest) -> None:
    check_scheduler(req.cluster)
    script = req.converter_root / converter_for(req.model.model_type, req.model.converter).script
    if not script.is_file():
        raise UserError(f"{script} does not exist", field="--converter-root",
                        hint="point it at a FasterTransformer checkout (the converter is looked up by model_type)")


def slurm_parameters(req: ConvertRequest, run_dir: Path, job_name: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters: one task on one node, partition/account/time from the spec."""
    cluster = req.cluster
    params: dict[str, Any] = {
        "job_name": job_name, "partition": cluster.partition, "time": minutes(cluster.time_limit),
        "nodes": 1, "ntasks_per_node": 1, "srun_args": srun_args(req, run_dir),
        "account": cluster.account, "qos": cluster.qos,
        # GPT/T5 converters use a GPU when there is one; one is enough.
        "gpus_per_node": 1 if cluster.request_gpus else None,
    }
    return {k: v for k, v in params.items() if v is not None}


def job_python(cluster: ClusterSpec) -> str:
    # In a Pyxis container the job's python is the image's (it needs submitit installed).
    return cluster.python or ("python3" if cluster.container.runtime == "pyxis" else sys.executable)


def make_executor(req: ConvertRequest, run_dir: Path, job_name: str) -> Any:
    import submitit

    cluster = req.cluster
    folder = str(run_dir / "logs")
    if cluster.scheduler == "local":
        ex: Any = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=minutes(cluster.time_limit) or 60 * 24)
        return ex
    check_scheduler(cluster)
    ex = submitit.SlurmExecutor(folder=folder, python=job_python(cluster))
    ex.update_parameters(**slurm_parameters(req, run_dir, job_name))
    return ex


def check_scheduler(cluster: ClusterSpec) -> None:
    if cluster.scheduler not in ("slurm", "local"):
        raise UserError(f"convert runs through Slurm or locally, not scheduler {cluster.scheduler!r}",
                        field="scheduler", hint="use a slurm or local cluster spec")


@dataclass(frozen=True)
class Submitted:
    record: RunRecord
    job: Any
    paths: RunPaths
    argv: list[str]


def submit(req: ConvertRequest, store: RunStore | None = None) -> Submitted:
    check_request(req)
    store = store or RunStore()
    run_id = new_run_id(f"convert-{req.model.name}")
    workspace = Path(req.cluster.workspace)   # expanded once, by the spec
    paths = RunPaths(run_id, (workspace / run_id).resolve())
    paths.logs.mkdir(parents=True, exist_ok=True)
    req.output_root.mkdir(parents=True, exist_ok=True)
    executor = make_executor(req, paths.run_dir, f"ftc-{run_id}")
    argv = req.argv()
    job = executor.submit(run_converter, argv, str(paths.run_dir))
    rec = RunRecord(run_id=run_id, created=time.time(), cluster_name=req.cluster.name,
                    cluster_source=req.cluster.source or "", scheduler=req.cluster.scheduler,
                    style=STYLE, run_dir=str(paths.run_dir), nodes=1, model=req.model.name,
                    job_id=str(job.job_id), status="SUBMITTED",
                    plan={"tensor_para_size": req.tp, "converter": argv, "model_type": req.model.model_type,
                          "checkpoint_dir": str(req.output_root / f"{req.tp}-gpu")})
    store.add(rec)
    return Submitted(rec, job, paths, argv)


def _slurm_gone(job_id: str) -> bool:
    from ftcluster.runner import LocalRunner
    from ftcluster.slurm import Slurm

    return Slurm(LocalRunner()).info(job_id).state.terminal


def wait(sub: Submitted, store: RunStore, timeout: float | None = None, poll: float = 0.5) -> RunRecord:
    """Wait for the job; COMPLETED only when the converter succeeded and the checkpoint checks out.

    Not job.result(): submitit asks sacct, which clusters without accounting (like the test
    cluster) lack; the result file or squeue/scontrol tell us the same.
    """
    job, rec = sub.job, sub.record
    deadline = None if timeout is None else time.monotonic() + timeout
    gone_since: float | None = None
    while not job.paths.result_pickle.exists():
        if rec.scheduler == "slurm" and _slurm_gone(str(job.job_id)):
            # The job ended without a result (killed, time limit, no python): give NFS a moment.
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > 5:
                store.update(rec, status="FAILED")
                raise LaunchError(f"conversion job {job.job_id} ended without a result",
                                  hint=f"see `ftcluster logs {rec.run_id}`")
        elif rec.scheduler == "local" and job.done():
            break
        if deadline is not None and time.monotonic() > deadline:
            raise LaunchError(f"conversion job {job.job_id} still running after {timeout:.0f}s",
                              hint=f"follow it with `ftcluster logs {rec.run_id}`")
        time.sleep(poll)
    try:
        job.result()
    except Exception as exc:  # noqa: BLE001  (submitit re-raises the job's exception, any type)
        store.update(rec, status="FAILED")
        # submitit's message holds the job's traceback; the converter's exit is its last word.
        found = re.findall(r"ConverterFailed: (.*)", str(exc))
        why = found[-1].strip() if found else f"the job raised {type(exc).__name__}"
        raise LaunchError(f"conversion failed: {why}",
                          hint=f"see `ftcluster logs {rec.run_id}`") from None
    problems = checkpoint_problems(Path(rec.plan["checkpoint_dir"]).parent, rec.plan["model_type"],
                                   int(rec.plan["tensor_para_size"]))
    if problems:
        store.update(rec, status="FAILED")
        raise LaunchError(f"the converted checkpoint is incomplete: {problems[0]}"
                          + (f" [+{len(problems) - 1} more]" if len(problems) > 1 else ""),
                          hint=f"see `ftcluster logs {rec.run_id}`")
    return store.update(rec, status="COMPLETED")
