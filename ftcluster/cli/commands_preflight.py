"""`preflight`: GPU inventory and an NCCL all-reduce check on every rank, before a launch.

A run like any other (ftcluster.launch.preflight): the job request's step goes through the cluster's
own launch path and container, and `status`, `logs` and `stop` find the run.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ftcluster.cli import cli
from ftcluster.cli.numbers import count, seconds
from ftcluster.cli.options import echo_json
from ftcluster.errors import UserError
from ftcluster.launch.preflight import PreflightOptions, preflight_launch, run_preflight
from ftcluster.rank.preflight import RankReport, check_inventory, human_size, parse_sizes
from ftcluster.spec.cluster import ClusterSpec
from ftcluster.spec.defaults import default_cluster_path
from ftcluster.spec.load import load_cluster


def report_errors(cluster: ClusterSpec, report: dict[str, Any], require_gpus: bool) -> list[str]:
    reports = [RankReport.from_dict(d) for d in report["ranks"]]
    errors = check_inventory(reports, cluster.gpus_per_node, require_gpus=require_gpus)
    if report.get("world_size") and len(reports) != report["world_size"]:
        errors.append(f"{len(reports)} of {report['world_size']} ranks reported")
    return errors


def _tables(report: dict[str, Any], cluster: ClusterSpec) -> list[Table]:
    ranks = Table(title=f"preflight: {cluster.name} ({len(report['ranks'])} ranks)")
    for col in ("rank", "host", "GPUs", "model", "memory", "driver", "CUDA_VISIBLE_DEVICES", "system"):
        ranks.add_column(col)
    for r in report["ranks"]:
        gpus = r["gpus"]
        # What the rank ran on: the image's OS and Python in a container.
        system = " / ".join(v for v in (r.get("os_release"), r.get("python") and f"Python {r['python']}") if v)
        if gpus:
            models = ", ".join(sorted({g["name"] for g in gpus}))
            ranks.add_row(str(r["rank"]), r["host"], str(len(gpus)), models,
                          f"{gpus[0]['memory_mib']} MiB", str(r["driver"]),
                          str(r["cuda_visible_devices"]), system)
        else:
            ranks.add_row(str(r["rank"]), r["host"], "[red]no GPU[/red]", r.get("note") or "", "",
                          str(r["driver"] or ""), str(r["cuda_visible_devices"]), system)
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


def _sizes(text: str) -> str:
    """--sizes checked here as the ranks will read it, before anything is submitted."""
    try:
        sizes = parse_sizes(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{text!r}: give sizes above 0, such as 1M..1G or 1M,64M")
    return text


@cli.command("preflight")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
              help="Cluster spec YAML (default: the embedded local cluster).")
@click.option("--nodes", "-N", type=count(), default=1, show_default=True, help="Nodes (one rank each).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--sizes", default="1M..1G", show_default=True, callback=lambda ctx, param, v: _sizes(v),
              help="All-reduce sizes: FIRST..LAST (doubling) or a list such as 1M,64M,1G.")
@click.option("--no-bandwidth", is_flag=True, help="GPU inventory only, no all-reduce.")
@click.option("--allow-no-gpu", is_flag=True, help="Report ranks without GPUs instead of failing.")
@click.option("--timeout", type=seconds(), default=600.0, show_default=True, help="Seconds.")
@click.option("--dry-run", is_flag=True, help="Print the job request (scripts and command); run nothing.")
def preflight_cmd(cluster_path: str | None, nodes: int, as_json: bool, sizes: str,
                  no_bandwidth: bool, allow_no_gpu: bool, timeout: float, dry_run: bool) -> None:
    """Check every node's GPUs and the NCCL all-reduce bandwidth between them.

    Runs as a job through the cluster's launch path, inside its container (Pyxis, Docker) with
    the image's own python3, nvidia-smi/NVML and torch/NCCL; `ftcluster logs RUN` shows it.

    \b
    Example:
      ftcluster preflight --cluster configs/clusters/pyxis.yaml --nodes 2
    """
    cluster = load_cluster(cluster_path or default_cluster_path())
    opts = PreflightOptions(sizes=sizes, bandwidth=not no_bandwidth, timeout=timeout)
    if dry_run:
        click.echo(str(preflight_launch(cluster, nodes, opts, probe=False).dry_run()), nl=False)
        return
    report = run_preflight(cluster, nodes, opts)
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
