"""The documented JSON objects of the CLI (`--json`): run, plan, status, launch.

Every object carries `schema_version` and `kind`; `nodes` is always a list of host names (as far
as known) and `num_nodes` the count. docs/reference.md ("JSON output") documents each key.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftcluster.plan.parallel import Plan
    from ftcluster.run.store import RunRecord

# Bumped when a documented key changes meaning or goes away (adding keys keeps it).
SCHEMA_VERSION = 2


def document(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """One JSON object of the documented shape `kind` (run, plan, status, launch)."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, **body}


def run_hosts(run_dir: str, num_nodes: int, plan: dict[str, Any] | None = None) -> list[str]:
    """Host names by rank, as far as known: the ranks' own state/rank<R>.host files (written
    when each rank started), else the plan's fixed nodes (local and ssh clusters)."""
    hosts: list[str] = []
    listed = (plan or {}).get("ranks")
    # A plan as launch records it; anything else in a (hand-edited) run.json names no host.
    ranks = {r["rank"]: r["node"] for r in listed if isinstance(r, dict) and isinstance(r.get("rank"), int)
             and isinstance(r.get("node"), str)} if isinstance(listed, list) else {}
    for r in range(num_nodes):
        host_file = Path(run_dir) / "state" / f"rank{r}.host" if run_dir else None
        try:
            host = host_file.read_text(errors="replace").strip() if host_file else ""
        except OSError:
            host = ""
        host = host or ranks.get(r) or ""
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def run_json(rec: RunRecord, state: str | None = None) -> dict[str, Any]:
    """The `run` object: a run as the store records it, and its job's state now where asked
    (`list`)."""
    return document("run", {
        "run_id": rec.run_id, "created": rec.created, "cluster": rec.cluster_name,
        "cluster_source": rec.cluster_source, "scheduler": rec.scheduler, "style": rec.style,
        "run_dir": rec.run_dir, "model": rec.model, "job_id": rec.job_id, "status": rec.status,
        "endpoint": rec.endpoint, "num_nodes": rec.nodes, "nodes": run_hosts(rec.run_dir, rec.nodes, rec.plan),
        "state": state, "predecessor": rec.predecessor, "replica_of": rec.replica_of, "replica": rec.replica,
    })


def plan_json(plan: Plan) -> dict[str, Any]:
    """The `plan` object: Plan.to_dict() with `nodes` as host names and `num_nodes` the count."""
    body = plan.to_dict()
    body["num_nodes"] = plan.nodes
    # Hosts are known up front on local and ssh clusters; Slurm picks them at allocation.
    body["nodes"] = list(dict.fromkeys(r.node for r in plan.ranks if r.node))
    return document("plan", body)


