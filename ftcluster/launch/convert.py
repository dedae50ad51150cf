"""`ftcluster convert`: the model's engine's weight converter, as a run like any other.

The converter is the run's one job step (render.JobStep): one task on one node, through the
cluster's own launch path -- sbatch + srun, inside the Pyxis, Charliecloud or Docker container
where there is one (Docker: the run's container on its node), or a process group here for a
local cluster -- recorded with its launcher, so `status`, `logs`
and `stop` work for it as for a launch. It writes `<checkpoint_root>/<tp>-gpu/` with tp =
tensor_para_size of the plan for the requested node count; its output is the run's
logs/step.log. After the job the checkpoint check runs on the result.

(It ran through submitit before: a second way onto the nodes, with its own job ids, polling
and logs, that `status`/`stop` could not follow for a local cluster.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ftcluster.engines import engine_for
from ftcluster.engines.base import Conversion, Converter
from ftcluster.errors import LaunchError, PlanError, UserError, every_problem
from ftcluster.launch.run import Launch, LaunchOptions, LaunchOutcome, Progress
from ftcluster.plan.parallel import resolve_gpus
from ftcluster.render.scripts import JobStep
from ftcluster.render.request import job_shape
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.engines import default_engine, engine_named
from ftcluster.spec.model import ModelSpec
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.spec.launch_styles import style_of

STYLE = "convert"


def converter_of(model: ModelSpec) -> Converter:
    """The model's engine's converter (UserError: the engine has none)."""
    found = engine_for(model).converter
    if found is None:
        raise UserError(f"the {model.backend} engine has no weight converter", field="backend",
                        hint="convert its weights with the engine's own tools")
    return found


@dataclass(frozen=True)
class ConvertRequest:
    cluster: ClusterSpec
    model: ModelSpec
    tp: int
    converter_root: Path
    input_dir: str
    python: str

    @cached_property
    def conversion(self) -> Conversion:
        """The engine's converter run, made once (it looks for the converter's script)."""
        return converter_of(self.model).conversion(self.model, self.tp, self.converter_root, self.input_dir,
                                                   self.python)

    @property
    def output_root(self) -> Path:
        return self.conversion.output

    def argv(self) -> list[str]:
        return list(self.conversion.argv)


def convert_step(req: ConvertRequest) -> JobStep:
    """The converter as the run's step; the paths it reads and writes are mounted at their own
    path in the container (Pyxis). Pure."""
    conversion = req.conversion
    return JobStep(STYLE, "the converter", conversion.argv, per_node=False, paths=conversion.paths)


def plan_tp(cluster: ClusterSpec, nodes: int, gpus_per_node: int | None, tp: int | None,
            pp: int | None) -> int:
    """tensor_para_size as `plan` would choose it, before any checkpoint exists."""
    gpn = resolve_gpus(cluster, gpus_per_node)
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
    req.conversion   # the converter is there for the model (UserError)


def check_scheduler(cluster: ClusterSpec) -> None:
    if not style_of(cluster).converts:
        raise UserError(f"convert runs through Slurm (bare, Pyxis, Charliecloud or Docker) or locally, not scheduler "
                        f"{cluster.scheduler!r} with container runtime {cluster.container.runtime!r}",
                        field="scheduler", hint="use a slurm (runtime none, pyxis, charliecloud or docker) or local "
                                                "cluster spec")


def record_plan(req: ConvertRequest) -> dict[str, object]:
    """What the run record keeps of a conversion: enough to check its result later."""
    return {"backend": req.model.backend, **req.conversion.record}


def convert_launch(req: ConvertRequest, *, detach: bool = False, progress: Progress | None = None,
                   store: RunStore | None = None) -> Launch:
    """The conversion run: one node, one GPU where the cluster asks for GPUs. Its run() first
    needs the output folder (a container mounts it): see run()."""
    check_request(req)
    return Launch(req.cluster, req.model, job_shape(req.cluster, 1, 1),
                  LaunchOptions(step=convert_step(req), detach=detach), progress=progress, store=store,
                  record_plan=record_plan(req))


def run(launch: Launch, req: ConvertRequest) -> LaunchOutcome:
    """Submit the conversion (and follow it unless detached); the output folder first."""
    req.output_root.mkdir(parents=True, exist_ok=True)
    return launch.run()


def finish(launch: Launch, outcome: LaunchOutcome) -> RunRecord:
    """COMPLETED only when the converter succeeded and the checkpoint checks out."""
    rec = outcome.record
    if not outcome.ok:
        launch.store.update(rec, status="FAILED")
        raise LaunchError(f"conversion failed: {outcome.failure or 'the job ended before the converter did'}",
                          hint=f"see `ftcluster logs {rec.run_id}`")
    converter = engine_named(str(rec.plan.get("backend", default_engine()))).converter
    problems = converter.result_problems(rec.plan) if converter else []
    if problems:
        launch.store.update(rec, status="FAILED")
        raise LaunchError(f"the converted checkpoint is incomplete: {every_problem(problems)}",
                          hint=f"see `ftcluster logs {rec.run_id}`")
    return launch.store.update(rec, status="COMPLETED")
