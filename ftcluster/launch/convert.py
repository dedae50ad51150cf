"""`ftcluster convert`: the FT converter for the model type, as a run like any other.

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
from pathlib import Path

from ftcluster.engines.fastertransformer.checkpoint_check import checkpoint_problems
from ftcluster.engines.fastertransformer.converters import converter_argv, converter_for
from ftcluster.errors import LaunchError, PlanError, UserError, every_problem
from ftcluster.launch.run import Launch, LaunchOptions, LaunchOutcome, Progress
from ftcluster.plan.parallel import resolve_gpus
from ftcluster.render.scripts import JobStep
from ftcluster.render.request import job_shape
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.engines.fastertransformer.spec import FTModelSpec
from ftcluster.run.store import RunRecord, RunStore
from ftcluster.spec.launch_styles import style_of

STYLE = "convert"


@dataclass(frozen=True)
class ConvertRequest:
    cluster: ClusterSpec
    model: FTModelSpec
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


def convert_step(req: ConvertRequest) -> JobStep:
    """The converter as the run's step; the paths it reads and writes are mounted at their own
    path in the container (Pyxis). Pure."""
    paths = {str(req.converter_root), str(req.output_root)}
    if Path(req.input_dir).is_absolute():
        paths.add(req.input_dir)
    return JobStep(STYLE, "the converter", tuple(req.argv()), per_node=False, paths=tuple(sorted(paths)))


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
    script = req.converter_root / converter_for(req.model.model_type, req.model.converter).script
    if not script.is_file():
        raise UserError(f"{script} does not exist", field="--converter-root",
                        hint="point it at a FasterTransformer checkout (the converter is looked up by model_type)")


def check_scheduler(cluster: ClusterSpec) -> None:
    if not style_of(cluster).converts:
        raise UserError(f"convert runs through Slurm (bare, Pyxis, Charliecloud or Docker) or locally, not scheduler "
                        f"{cluster.scheduler!r} with container runtime {cluster.container.runtime!r}",
                        field="scheduler", hint="use a slurm (runtime none, pyxis, charliecloud or docker) or local "
                                                "cluster spec")


def record_plan(req: ConvertRequest) -> dict[str, object]:
    """What the run record keeps of a conversion: enough to check its result later."""
    return {"tensor_para_size": req.tp, "converter": req.argv(), "model_type": req.model.model_type,
            "checkpoint_dir": str(req.output_root / f"{req.tp}-gpu")}


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
    problems = checkpoint_problems(Path(rec.plan["checkpoint_dir"]).parent, rec.plan["model_type"],
                                   int(rec.plan["tensor_para_size"]))
    if problems:
        launch.store.update(rec, status="FAILED")
        raise LaunchError(f"the converted checkpoint is incomplete: {every_problem(problems)}",
                          hint=f"see `ftcluster logs {rec.run_id}`")
    return launch.store.update(rec, status="COMPLETED")
