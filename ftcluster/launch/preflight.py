"""`ftcluster preflight` as a run: the GPU inventory and NCCL all-reduce of ftcluster.rank.preflight
on one task per node, through the cluster's own launch path and container (a job step in place
of the servers: render.JobStep), recorded like any run so that status/logs/stop find it.

The ranks run scripts/preflight.py, a plain copy of ftcluster/rank/preflight.py, with the
image's python3 in a container (Pyxis, Docker) and with this interpreter (or the spec's python)
where the nodes run it on their host (bare Slurm, local). Rank 0 gathers the reports (over
torch.distributed, else through files in results/preflight/) and writes preflight.json there.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from ftcluster.errors import LaunchError, UserError
from ftcluster.launch.run import Launch, LaunchOptions, Progress, workspace_dir
from ftcluster.run.layout import FILES, RunPaths
from ftcluster.rank.preflight import REPORT_FILE, build_report, collect_inventory, parse_tagged
from ftcluster.render.scripts import JobStep
from ftcluster.render.request import job_shape
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.run.store import new_run_id
from ftcluster.spec.launch_styles import style_of

STEP = "preflight"


@dataclass(frozen=True)
class PreflightOptions:
    sizes: str = "1M..1G"
    bandwidth: bool = True
    timeout: float = 600.0


def rank_python(cluster: ClusterSpec) -> str:
    if style_of(cluster).in_image:
        return "python3"   # the image's own
    # On the nodes' host (shared filesystem) or here: the Python that has torch for the test.
    return cluster.python or sys.executable


def preflight_step(cluster: ClusterSpec, paths: RunPaths, opts: PreflightOptions) -> JobStep:
    """What every rank runs; pure."""
    argv = [rank_python(cluster), str(paths.scripts / "preflight.py"), "--sizes", opts.sizes,
            "--timeout", str(opts.timeout), "--expect-gpus-per-node", str(cluster.gpus_per_node),
            "--out", str(paths.results / FILES.preflight_dir)]
    if cluster.server.binary != "auto":
        argv += ["--tritonserver", cluster.server.binary]   # is the run's server there?
    if not opts.bandwidth:
        argv.append("--no-bandwidth")
    # The ranks' own gather timeout, then time for the all-reduce and the container start.
    return JobStep(STEP, "the preflight", tuple(argv), per_node=True, rank_files=("preflight.py", "rank_env.py"),
                   timeout=int(opts.timeout) + 120)


def gpus_for_shape(cluster: ClusterSpec, nodes: int, probe: bool) -> int:
    """GPUs per node for the job: the spec's count; for `auto`, on a local cluster this
    machine's GPUs shared out evenly (probe=False: 0), elsewhere 0 (the nodes say)."""
    if isinstance(cluster.gpus_per_node, int):
        return cluster.gpus_per_node
    if style_of(cluster).one_host and probe:
        return len(collect_inventory().gpus) // nodes
    return 0


def preflight_launch(cluster: ClusterSpec, nodes: int, opts: PreflightOptions, *, probe: bool = True,
                     progress: Progress | None = None, run_id: str | None = None) -> Launch:
    """The preflight run; probe=False (a dry run) asks this machine nothing."""
    if nodes < 1 or nodes > cluster.max_nodes:
        raise UserError(f"must be between 1 and max_nodes ({cluster.max_nodes})", field="--nodes")
    plan = job_shape(cluster, nodes, gpus_for_shape(cluster, nodes, probe))
    run_id = run_id or new_run_id(STEP)
    step = preflight_step(cluster, RunPaths(run_id, workspace_dir(cluster) / run_id), opts)
    return Launch(cluster, None, plan, LaunchOptions(step=step), progress=progress, run_id=run_id)


def _gathered(report: dict[str, Any], nodes: int) -> bool:
    """Rank 0's report covers every rank: it gathered them all."""
    return bool(report.get("complete", True)) and report["world_size"] == nodes


def read_report(paths: RunPaths, nodes: int) -> dict[str, Any]:
    """Rank 0's report when it gathered everyone, else one built from every rank's line."""
    try:
        report: dict[str, Any] = json.loads((paths.results / FILES.preflight_dir / REPORT_FILE).read_text())
        if _gathered(report, nodes):
            return report
    except (OSError, ValueError, KeyError):
        pass
    try:
        text = (paths.logs / FILES.step_log).read_text(errors="replace")
    except OSError:
        text = ""
    return report_from_output(text, nodes)


def report_from_output(stdout: str, nodes: int) -> dict[str, Any]:
    report, ranks = parse_tagged(stdout)
    if report is not None and _gathered(report, nodes):
        return report
    if not ranks:
        raise UserError("preflight printed no rank report", hint="see `ftcluster logs` of the run")
    return build_report(ranks, bandwidth=False,
                        skipped=(report or {}).get("bandwidth_skipped") or "ranks did not gather")


def run_preflight(cluster: ClusterSpec, nodes: int, opts: PreflightOptions | None = None) -> dict[str, Any]:
    """Run the preflight on `nodes` ranks of the cluster; the gathered report (see rank.preflight)
    with the run's id and folder."""
    launch = preflight_launch(cluster, nodes, opts or PreflightOptions())
    outcome = launch.run()
    if not outcome.ok:
        raise LaunchError(f"preflight run {outcome.record.run_id} failed: {outcome.failure or 'see its logs'}",
                          hint=f"ftcluster logs {outcome.record.run_id}")
    report = read_report(launch.paths, nodes)
    report["run_id"] = outcome.record.run_id
    report["logs"] = str(launch.paths.logs)
    return report
