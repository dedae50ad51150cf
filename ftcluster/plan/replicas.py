"""Replicas behind one endpoint, as pure functions: member ids and ports, the plan's checks and
the front balancer's Caddy config.

A replica set is R identical FT worlds (members) behind one balancer (the front). Each member is
an ordinary serving run with its own Slurm job: it restarts, hands over and is lost on its own,
and Slurm places it on its own; one job of R components would tie every member to one
allocation and one time limit. The front is a run of its own too (one node, no GPUs), whose
run id names the set: it outlives any member, and depends on no login node.

Rotation follows each member's own liveness verdict (the POST judged in the member's job, not
the balancer's GET checks): the member's job writes state/rotation; the front's controller
reads it (the shared run folders) and sets Caddy's upstreams through Caddy's admin API on a 0600
unix socket in the front's 0700 run folder. Caddy retries a request that failed on one member
on another (its body buffered), balances by least outstanding requests, and waits
`balancer.retry_for` seconds for a member when none is in rotation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ftcluster.job.config import PROXY_TOKEN_ENV
from ftcluster.plan.parallel import Plan
from ftcluster.plan.endpoint import PRIVATE_GRPC_METHODS, PRIVATE_HTTP_PATHS, guarded_routes, tls_policy
from ftcluster.plan.facts import member_cluster, member_ports, ports_of, resolve
from ftcluster.spec.cluster import ClusterSpec

# A member's run id: the set's, then -r<K>; a member started again (restart, scale) adds .<N>.
MEMBER_MARK = "-r"
# Triton's unary inference over gRPC: buffered and retried. Streams (ModelStreamInfer) are
# neither: buffering a stream's body would wait for its end.
GRPC_UNARY_RETRIED = "/inference.GRPCInferenceService/ModelInfer"


def member_id(set_id: str, k: int, generation: int = 0) -> str:
    return f"{set_id}{MEMBER_MARK}{k}" + (f".{generation}" if generation else "")


def replica_problems(cluster: ClusterSpec, plan: Plan, replicas: int, one_host: bool, rank_stride: int,
                     nodes_known: int | None) -> list[str]:
    """Why R members of this plan cannot run behind one balancer, each naming the field."""
    problems = []
    if cluster.scheduler == "ssh":
        problems.append("replicas: the ssh + Docker style runs one world on its fixed hosts; "
                        "use a Slurm or the local style for replicas")
    if plan.mpi_ranks != plan.nodes:
        problems.append("replicas: one rank per node is needed (a member's world is its own nodes)")
    if not one_host and cluster.exclusive:
        # Whole nodes each (exclusive): no member shares one, nor the balancer's small job.
        need = replicas * plan.nodes + 1
        if nodes_known is not None and need > nodes_known:
            problems.append(f"replicas: {replicas} x {plan.nodes} node(s) + 1 for the balancer = {need} nodes, "
                            f"but the cluster has {nodes_known}: fewer replicas or --nodes")
        if need > cluster.max_nodes:
            problems.append(f"replicas: {need} nodes in all is above max_nodes ({cluster.max_nodes})")
    seen: dict[int, str] = {}
    for what, port in ports_of(cluster, replicas, plan.mpi_ranks if one_host else 1, rank_stride if one_host else 0):
        if port > 65535:
            problems.append(f"balancer.port_step: {what} port would be {port} (at most 65535): "
                            "lower ports.*, balancer.port_step or replicas")
            break
        if port in seen:
            problems.append(f"balancer.port_step: {what} port {port} is {seen[port]}'s too: "
                            "choose a port_step above the ports' spread (and proxy.loopback_offset)")
            break
        seen[port] = what
    return problems


@dataclass(frozen=True)
class FrontSettings:
    """What the front's controller needs beside Caddy's config (scripts/front.json)."""

    caddy: str                  # the binary
    config: str                 # Caddy's config without upstreams (scripts/front_caddy.json)
    members: str                # the set's members (replicas.json in the front's run folder)
    token_file: str             # "" unless private
    state: str                  # the front's state folder: rotation.json, the socket
    logs: str
    poll: float = 0.5           # seconds between readings of the members' rotation files
    tls_cert: str = ""          # the front serves TLS with this certificate (proxy.tls_cert)
    # Its time limit (Slurm): the notice comes this long before it (0: none); the front then
    # submits `script` again from `run_dir` on its node and, once that job serves, runs
    # `record` + the new job's id (the run's record names it).
    handover_lead: int = 0
    script: str = ""
    run_dir: str = ""
    record: tuple[str, ...] = ()
    # Caddy's log (logs/front_caddy.log: a line for each request it could not pass on) is cut
    # beyond this (server.log_max_mb), as the servers' logs are.
    log_max_bytes: int = 256 << 20

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True) + "\n"


def front_config(cluster: ClusterSpec, listen_host: str) -> dict[str, Any]:
    """Caddy's config for the front: HTTP and gRPC on the spec's ports, upstreams empty (the
    controller fills them: every `reverse_proxy` handler of server "http" gets the members'
    HTTP addresses, of "grpc" their gRPC ones). The admin API is off here: the controller gives
    each job's Caddy its own 0600 unix socket (two jobs share the state folder in a hand-over);
    with no admin setting at all Caddy would listen on localhost:2019, open to the node."""
    private = resolve(cluster, serves=False).access == "private"
    b = cluster.balancer
    # A short try_interval: a request whose member refused it (a closed door) is sent on within
    # 50 ms, and few requests wait in a retry at any moment (a config load would end them).
    lb = {"selection_policy": {"policy": "least_conn"}, "try_duration": f"{b.retry_for:g}s",
          "try_interval": "50ms",
          # A request whose member failed mid-way (a killed world) is sent again to another.
          "retry_match": [{"method": ["GET", "HEAD", "POST"]}]}
    # A member that refused a connection is passed over for a while (its job takes it out of
    # rotation too, on its own verdict).
    passive = {"passive": {"fail_duration": "5s", "max_fails": 1}}

    def proxy(transport: dict[str, Any], buffered: bool) -> dict[str, Any]:
        h: dict[str, Any] = {"handler": "reverse_proxy", "upstreams": [], "load_balancing": lb,
                             "health_checks": passive, "transport": transport}
        if buffered and b.buffer_mb:
            h["request_buffers"] = b.buffer_mb << 20   # a retry needs the body again
        else:
            h["flush_interval"] = -1
        return h

    http_up = proxy({"protocol": "http", "compression": False}, True)
    h2c = {"protocol": "http", "versions": ["h2c", "2"]}
    grpc_routes = [{"match": [{"path": [GRPC_UNARY_RETRIED]}], "terminal": True, "handle": [proxy(h2c, True)]}]

    tls = cluster.proxy.tls_cert is not None

    def server(port: int, routes: list[dict[str, Any]]) -> dict[str, Any]:
        s: dict[str, Any] = {"listen": [f"{listen_host}:{port}"], "routes": routes,
                             "protocols": ["h1", "h2"] if tls else ["h1", "h2c"],
                             "automatic_https": {"disable": True}}
        if tls:
            s["tls_connection_policies"] = [tls_policy(cluster.proxy)]
        return s

    if private:
        http_routes = guarded_routes([], PRIVATE_HTTP_PATHS, "the repository API", http_up)
        grpc_all = guarded_routes(grpc_routes, PRIVATE_GRPC_METHODS, "the repository API", proxy(h2c, False))
    else:
        http_routes = [{"handle": [http_up]}]
        grpc_all = [*grpc_routes, {"handle": [proxy(h2c, False)]}]
    config: dict[str, Any] = {
        "admin": {"disabled": True, "config": {"persist": False}},
        "logging": {"logs": {"default": {"level": "WARN"}}},
        "apps": {"http": {"servers": {"http": server(cluster.ports.http, http_routes),
                                      "grpc": server(cluster.ports.grpc, grpc_all)}}},
    }
    if tls:
        config["apps"]["tls"] = {"certificates": {"load_files": [
            {"certificate": cluster.proxy.tls_cert, "key": cluster.proxy.tls_key}]}}
    return config


def front_config_text(cluster: ClusterSpec, listen_host: str) -> str:
    return json.dumps(front_config(cluster, listen_host), indent=1, sort_keys=True) + "\n"


__all__ = ["PROXY_TOKEN_ENV", "FrontSettings", "front_config", "member_cluster", "member_id", "member_ports", "ports_of",
           "replica_problems"]
