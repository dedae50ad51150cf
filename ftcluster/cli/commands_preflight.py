"""`preflight`: GPU inventory and an NCCL all-reduce check on every rank, before a launch.

The ranks run ftcluster.rank.preflight through the cluster's own launch path: process groups
here for scheduler `local`, `srun` (one task per node) for `slurm`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

import ftcluster
from ftcluster.cli import cli
from ftcluster.cli.options import echo_json
from ftcluster.errors import UserError
from ftcluster.launchers.local_ranks import RankResult, run_local_ranks
from ftcluster.rank.env import child_env
from ftcluster.rank.preflight import (
    REPORT_FILE,
    RankReport,
    build_report,
    check_inventory,
    collect_inventory,
    human_size,
    parse_tagged,
)
from ftcluster.spec import ClusterSpec, default_cluster_path, load_cluster


def rank_argv(cluster: ClusterSpec, sizes: str, bandwidth: bool, timeout: float,
              out: Path | None = None) -> list[str]:
    argv = [cluster.python or sys.executable, "-m", "ftcluster.rank.preflight",
            "--sizes", sizes, "--timeout", str(timeout),
            "--expect-gpus-per-node", str(cluster.gpus_per_node)]
    if out is not None:
        argv += ["--out", str(out)]
    if not bandwidth:
        argv.append("--no-bandwidth")
    return argv


def srun_argv(cluster: ClusterSpec, nodes: int, rank_cmd: list[str]) -> list[str]:
    """One preflight task per node, through the MPI plugin the servers use."""
    argv = ["srun", f"--mpi={cluster.mpi}", "-N", str(nodes), "--ntasks-per-node=1"]
    for opt in ("partition", "account", "qos"):
        val = getattr(cluster, opt)
        if val:
            argv.append(f"--{opt}={val}")
    if cluster.request_gpus and isinstance(cluster.gpus_per_node, int):
        argv.append(f"--gpus-per-node={cluster.gpus_per_node}")
    return argv + rank_cmd


def _rank_failure(results: list[RankResult], log_dir: Path) -> UserError | None:
    failed = [r for r in results if not r.ok and not r.killed]
    if not failed and not any(r.timed_out for r in results):
        return None
    if not failed:
        return UserError("preflight timed out; every rank was stopped", hint=f"logs in {log_dir}")
    r = failed[0]
    tail = [ln for ln in r.stderr().splitlines() if ln.strip()][-1:] or ["(no stderr)"]
    return UserError(f"preflight rank {r.rank} exited {r.returncode}: {tail[0]}",
                     hint=f"logs in {log_dir}")


def _local(cluster: ClusterSpec, nodes: int, sizes: str, bandwidth: bool,
           timeout: float) -> dict[str, Any]:
    gpus_per_rank: int | None
    if isinstance(cluster.gpus_per_node, int):
        gpus_per_rank = cluster.gpus_per_node
    else:  # auto: share this machine's GPUs out evenly
        gpus_per_rank = len(collect_inventory().gpus) // nodes or None
    work = Path(tempfile.mkdtemp(prefix="ftc-preflight-"))
    pkg_parent = str(Path(ftcluster.__file__).resolve().parents[1])
    env = dict(cluster.env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p)
    try:
        results = run_local_ranks(rank_argv(cluster, sizes, bandwidth, timeout, work / "out"),
                                  nodes, gpus_per_rank, env=env, timeout=timeout + 60,
                                  log_dir=work / "logs")
    except ValueError as exc:  # not enough GPUs for the slices
        raise UserError(str(exc), field="gpus_per_node") from None
    err = _rank_failure(results, work / "logs")
    if err is not None:
        raise err
    report_path = work / "out" / REPORT_FILE
    if report_path.exists():
        report: dict[str, Any] = json.loads(report_path.read_text())
    else:
        report = _from_output("".join(r.stdout() for r in results), nodes)
    report["logs"] = str(work / "logs")
    return report


def _from_output(stdout: str, nodes: int) -> dict[str, Any]:
    """Rank 0's report when it gathered everyone, else one built from every rank's line."""
    report, ranks = parse_tagged(stdout)
    if report is not None and report.get("complete", True) and report["world_size"] == nodes:
        return report
    if not ranks:
        raise UserError("preflight printed no rank report", hint="see the output above")
    return build_report(ranks, bandwidth=False,
                        skipped=(report or {}).get("bandwidth_skipped") or "ranks did not gather")


def _slurm(cluster: ClusterSpec, nodes: int, sizes: str, bandwidth: bool, timeout: float,
           quiet: bool) -> dict[str, Any]:
    argv = srun_argv(cluster, nodes, rank_argv(cluster, sizes, bandwidth, timeout))
    if not quiet:
        click.echo(f"running: {shlex.join(argv)}", err=True)
    try:
        proc = subprocess.run(argv, check=False, env=child_env(cluster.env), capture_output=True,
                              text=True, timeout=timeout + 120, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError("srun not found", hint="run preflight on a Slurm login node") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"preflight did not finish in {timeout + 120:.0f}s") from None
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
        raise UserError(f"`{shlex.join(argv)}` exited {proc.returncode}: " + " | ".join(tail))
    return _from_output(proc.stdout, nodes)


def run_preflight(cluster: ClusterSpec, nodes: int, *, sizes: str = "1M..1G",
                  bandwidth: bool = True, timeout: float = 600.0,
                  quiet: bool = False) -> dict[str, Any]:
    """Run the preflight on `nodes` ranks of the cluster; the gathered report (see rank.preflight)."""
    if nodes < 1 or nodes > cluster.max_nodes:
        raise UserError(f"must be between 1 and max_nodes ({cluster.max_nodes})", field="--nodes")
    if cluster.scheduler == "local":
        return _local(cluster, nodes, sizes, bandwidth, timeout)
    if cluster.scheduler == "slurm":
        return _slurm(cluster, nodes, sizes, bandwidth, timeout, quiet)
    raise UserError(f"preflight with scheduler {cluster.scheduler!r} is not supported yet",
                    field="scheduler", hint="use 'slurm' or 'local'")


def report_errors(cluster: ClusterSpec, report: dict[str, Any], require_gpus: bool) -> list[str]:
    reports = [RankReport.from_dict(d) for d in report["ranks"]]
    errors = check_inventory(reports, cluster.gpus_per_node, require_gpus=require_gpus)
    if report.get("world_size") and len(reports) != report["world_size"]:
        errors.append(f"{len(reports)} of {report['world_size']} ranks reported")
    return errors


def _tables(report: dict[str, Any], cluster: ClusterSpec) -> list[Table]:
    ranks = Table(title=f"preflight: {cluster.name} ({len(report['ranks'])} ranks)")
    for col in ("rank", "host", "GPUs", "model", "memory", "driver", "CUDA_VISIBLE_DEVICES"):
        ranks.add_column(col)
    for r in report["ranks"]:
        gpus = r["gpus"]
        if gpus:
            models = ", ".join(sorted({g["name"] for g in gpus}))
            ranks.add_row(str(r["rank"]), r["host"], str(len(gpus)), models,
                          f"{gpus[0]['memory_mib']} MiB", str(r["driver"]),
                          str(r["cuda_visible_devices"]))
        else:
            ranks.add_row(str(r["rank"]), r["host"], "[red]no GPU[/red]", r.get("note") or "", "",
                          str(r["driver"] or ""), str(r["cuda_visible_devices"]))
    tables = [ranks]
    if report["bandwidth"]:
        bw = Table(title=f"all-reduce (busbw = algbw x {report['busbw_factor']:.2f})")
        for col in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "slowest rank"):
            bw.add_column(col, justify="right")
        for row in report["bandwidth"]:
            bw.add_row(human_size(row["size"]), f"{row['time_us']:.1f}", f"{row['algbw_gbs']:.2f}",
                       f"{row['busbw_gbs']:.2f}", f"{row['slowest_rank']} ({row['slowest_host']})")
        tables.append(bw)
    return tables


@cli.command("preflight")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
              help="Cluster spec YAML (default: the embedded local cluster).")
@click.option("--nodes", "-N", type=int, default=1, show_default=True, help="Nodes (one rank each).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--sizes", default="1M..1G", show_default=True,
              help="All-reduce sizes: FIRST..LAST (doubling) or a list such as 1M,64M,1G.")
@click.option("--no-bandwidth", is_flag=True, help="GPU inventory only, no all-reduce.")
@click.option("--allow-no-gpu", is_flag=True, help="Report ranks without GPUs instead of failing.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds.")
def preflight_cmd(cluster_path: str | None, nodes: int, as_json: bool, sizes: str,
                  no_bandwidth: bool, allow_no_gpu: bool, timeout: float) -> None:
    """Check every node's GPUs and the NCCL all-reduce bandwidth between them.

    \b
    Example:
      ftcluster preflight --cluster configs/clusters/pyxis.yaml --nodes 2
    """
    cluster = load_cluster(cluster_path or default_cluster_path())
    report = run_preflight(cluster, nodes, sizes=sizes, bandwidth=not no_bandwidth,
                           timeout=timeout, quiet=as_json)
    errors = report_errors(cluster, report, require_gpus=not allow_no_gpu)
    report["errors"] = errors
    if as_json:
        echo_json(report)
    else:
        console = Console()
        for table in _tables(report, cluster):
            console.print(table)
        if report.get("largest"):
            big = report["largest"]
            console.print(f"busbw at {human_size(big['size'])}: {big['busbw_gbs']:.1f} GB/s; "
                          f"slowest rank {big['slowest_rank']} ({big['slowest_host']})")
        elif report.get("bandwidth_skipped"):
            console.print(f"bandwidth test skipped: {report['bandwidth_skipped']}")
        if report.get("transports"):
            console.print("NCCL transports: " + ", ".join(report["transports"]))
        if cluster.gpus_per_node == "auto" and report.get("gpus_per_node"):
            console.print(f"gpus_per_node: auto -> {report['gpus_per_node']}")
    if errors:
        raise UserError("preflight failed: " + "; ".join(errors))
