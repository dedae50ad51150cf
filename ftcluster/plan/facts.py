"""A run's facts, resolved once from its specs: the one place that applies the rules (its launch
style, which runs are private, where Triton listens behind a proxy, a replica set's member's
ports and every port the set takes, the port stride of ranks that share one host, how often a
serving world restarts, which runs probe their liveness and with what request).

render, the schedulers, status, replica sets and successors read a `RunFacts`; none works a fact
out again. A launch saves its run's facts beside its specs (scripts/specs.json, `facts`), so
that what the run was launched as can be read back without the rules: `status` reads the access
from there. Pure: `resolve` touches nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ftcluster.job.config import LivenessConfig
from ftcluster.spec.launch_styles import STYLES, style_name, style_of

if TYPE_CHECKING:
    from ftcluster.spec.cluster import ClusterSpec, Ports, Proxy, Server

ACCESS = ("private", "cluster")
# The port offset between ranks: distinct ports only when ranks share one host.
LOCAL_PORT_STRIDE = 10


# --- the rules ---------------------------------------------------------------------------------

def access_of(cluster: ClusterSpec) -> str:
    """private or cluster: the spec's, else private where a proxy can run beside rank 0, except
    on the local style, which binds the loopback already."""
    if cluster.access is not None:
        return cluster.access
    style = style_of(cluster)
    return "private" if style.proxy and not style.one_host else "cluster"


def loopback_shift(proxy: Proxy) -> int:
    """How far above the endpoint's ports Triton listens on rank 0's loopback, behind a proxy."""
    return proxy.loopback_offset


def loopback_ports(ports: Ports, proxy: Proxy) -> Ports:
    """Triton's own ports on rank 0's loopback, behind the proxy."""
    return ports.shifted(loopback_shift(proxy))


def member_shift(cluster: ClusterSpec, k: int) -> int:
    """How far above the spec's ports member k of a replica set serves: `balancer.port_step` x
    (k+1) (the front takes the spec's own). Members on one machine (the local style) or sharing
    a node with the front must not meet; on separate nodes the step costs nothing."""
    return cluster.balancer.port_step * (k + 1)


def member_ports(cluster: ClusterSpec, k: int) -> Ports:
    """Member k's endpoint ports (member_shift)."""
    return cluster.ports.shifted(member_shift(cluster, k))


def member_cluster(cluster: ClusterSpec, k: int) -> ClusterSpec:
    """The spec member k runs with: its ports, one member. TLS (proxy.tls_cert) ends at the
    front: the members' doors speak plain HTTP to it, with the set's token where private."""
    proxy = cluster.proxy.model_copy(update={"tls_cert": None, "tls_key": None})
    return cluster.model_copy(update={"ports": member_ports(cluster, k), "replicas": 1, "proxy": proxy})


def ports_of(cluster: ClusterSpec, replicas: int, ranks_per_host: int, rank_stride: int) -> list[tuple[str, int]]:
    """Every port the set takes, named: the front's, each member's (and Triton's loopback ones
    behind a member's proxy; on one machine, every rank's)."""
    names = ("http", "grpc", "metrics")
    taken = [(f"the balancer's {n}", getattr(cluster.ports, n)) for n in names[:2]]
    # Plain numbers: one past 65535 is a problem to name, not a Ports to build.
    for k in range(replicas):
        off = member_shift(cluster, k)
        # A member's Triton listens on the loopback, proxy.loopback_offset above, behind its proxy.
        for what, extra in (("", 0), (" (loopback)", loopback_shift(cluster.proxy))):
            for r in range(ranks_per_host):
                for n in names:
                    who = f"replica {k}" + (f" rank {r}" if ranks_per_host > 1 else "")
                    taken.append((f"{who}'s {n}{what}", getattr(cluster.ports, n) + off + extra + r * rank_stride))
            if cluster.ports.gpus is not None:   # one GPU exporter a member: its job's
                taken.append((f"replica {k}'s gpus{what}", cluster.ports.gpus + off + extra))
    return taken


def port_stride(cluster: ClusterSpec) -> int:
    """Between ranks' ports: only where ranks share one host."""
    return LOCAL_PORT_STRIDE if style_of(cluster).one_host else 0


def serving_restarts(server: Server, keep_serving: bool) -> int:
    """How often the job restarts its world on a fault while serving."""
    # startup: the spec models (pydantic) are loaded by whoever has a Server to give
    from ftcluster.spec.cluster import DEFAULT_SERVING_RESTARTS

    if not keep_serving:
        return 0
    return DEFAULT_SERVING_RESTARTS if server.restarts is None else server.restarts


# Makes the liveness probe's request from the served model, given Triton's metrics port
# (ftcluster.render.liveness_request: it reads the model's config); None: the spec turns it off.
Probe = Callable[[int], LivenessConfig | None]


def liveness_of(probe: Probe | None, triton: Ports, serves: bool, keep_serving: bool) -> LivenessConfig | None:
    """The probe's request: a run that serves until stopped probes rank 0 through Triton's own
    metrics port; a run without a model to probe (probe None), or one that ends, has none."""
    if probe is None or not (serves and keep_serving):
        return None
    return probe(triton.metrics)


# --- the value ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunFacts:
    """What a run is, as its specs and launch make it."""

    style: str          # the launch style's name (ftcluster.spec.launch_styles)
    access: str         # "private" or "cluster": the spec's, or its style's default (access_of)
    private: bool       # the run's Triton serves behind the proxy with the run's token (private and serving)
    proxied: bool       # Triton listens on rank 0's loopback behind a proxy (private, or a replica set's member)
    loopback: bool      # every Triton port on the loopback: proxied, or one machine (the local style)
    public: Ports       # what clients reach: the proxy's (a member's door), or Triton's own when not proxied
    triton: Ports       # Triton's own ports: the loopback's behind a proxy, else `public`
    port_stride: int    # between ranks' ports on one host (0: each rank has its host)
    restarts: int       # restarts of the world while serving (0: a run that does not serve)
    liveness: LivenessConfig | None   # the job's probe while serving (liveness_of); None: none

    def rank_port(self, name: str, rank: int) -> int:
        """Rank `rank`'s Triton port `name` (ranks sharing a host are the stride apart)."""
        return int(getattr(self.triton, name)) + rank * self.port_stride

    def to_dict(self) -> dict[str, Any]:
        return {"style": self.style, "access": self.access, "private": self.private, "proxied": self.proxied,
                "loopback": self.loopback,
                "public": self.public.model_dump(mode="json"), "triton": self.triton.model_dump(mode="json"),
                "port_stride": self.port_stride, "restarts": self.restarts,
                "liveness": None if self.liveness is None else self.liveness._asdict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunFacts:
        """The facts back as saved (ValueError, KeyError, TypeError: not such a mapping)."""
        # startup: the spec models (pydantic) only where saved facts are read whole, not for status
        from ftcluster.spec.cluster import Ports

        if data["access"] not in ACCESS:
            raise ValueError(f"access: {data['access']!r} is not one of {', '.join(ACCESS)}")
        return cls(style=str(data["style"]), access=data["access"], private=bool(data["private"]),
                   proxied=bool(data["proxied"]), loopback=bool(data["loopback"]), public=Ports.model_validate(data["public"]),
                   triton=Ports.model_validate(data["triton"]), port_stride=int(data["port_stride"]),
                   restarts=int(data["restarts"]),
                   liveness=None if data["liveness"] is None else LivenessConfig(**data["liveness"]))


def resolve(cluster: ClusterSpec, *, serves: bool = True, member: bool = False,
            keep_serving: bool = False, probe: Probe | None = None) -> RunFacts:
    """The facts of a run of `cluster` (its ports already a member's where it is one: see
    member_ports). `serves`: the run starts the servers (not a job step or the MPI check alone);
    `member`: a replica set's member, in and out of its balancer's rotation behind its own proxy;
    `keep_serving`: it serves until stopped (restarts on a fault); `probe`: makes its liveness
    request (the one thing resolved from more than the specs: the model's config)."""
    access = access_of(cluster)
    private = access == "private" and serves
    proxied = private or (member and serves)
    style = style_of(cluster).name
    triton = loopback_ports(cluster.ports, cluster.proxy) if proxied else cluster.ports
    return RunFacts(
        style=style, access=access, private=private,
        proxied=proxied, loopback=proxied or STYLES[style].one_host, public=cluster.ports, triton=triton,
        port_stride=port_stride(cluster), restarts=serving_restarts(cluster.server, keep_serving),
        liveness=liveness_of(probe, triton, serves, keep_serving))


# --- read back, light --------------------------------------------------------------------------

FACTS_KEY = "facts"   # in scripts/specs.json (ftcluster.render.launched)


def saved_access(specs_file: Path) -> str | None:
    """The access a run was launched with, as its specs file saved it; None where it saved none
    (a folder an earlier ftcluster wrote, or none at all). JSON alone: `status` reads it."""
    try:
        data = json.loads(specs_file.read_text())
        access = data[FACTS_KEY]["access"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return access if access in ACCESS else None


def saved_style(specs_file: Path, scheduler: str, runtime: str) -> str:
    """The launch style a run was launched with, as its specs file saved it; for a folder that
    saved none, the rule applied to the scheduler and runtime its run.json recorded."""
    try:
        style = json.loads(specs_file.read_text())[FACTS_KEY]["style"]
    except (OSError, ValueError, KeyError, TypeError):
        style = None
    return style if isinstance(style, str) and style in STYLES else style_name(scheduler, runtime)
