"""Launch scripts rendered from job_templates/ — pure functions of the plan and the specs.

Every value reaches the shell through the `q` filter (shlex.quote) and is assigned once to a
shell variable at the top of the script; the template bodies then only use "$VARS". Slurm's
`#SBATCH` lines carry only validated names and paths relative to the run folder, because
sbatch does not parse shell quoting there.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from ftcluster.engines import engine_for
from ftcluster.errors import UserError

# The run folder's layout lives in ftcluster.run.layout (light, for status/logs); re-exported here.
from ftcluster.run.events import EV, Kinds
from ftcluster.hosts.fanout import FanoutConfig
from ftcluster.run.layout import (  # noqa: F401
    EVENTS,
    FILES,
    HERE_STYLES,
    LOGS,
    REPO,
    RESULTS,
    SCRIPTS,
    STATE,
    RunFiles,
    RunPaths,
)
from ftcluster.plan.parallel import Plan
from ftcluster.plan.endpoint import caddy_config_text, same_host_note
from ftcluster.plan.facts import RunFacts, resolve
from ftcluster.resources import package_path, tree_path
from ftcluster.spec.cluster import (
    ClusterSpec,
    Container,
    Ports,
    Server,
    pyxis_mount_path_problem,
    slurm_time_seconds,
)
from ftcluster.spec.model import ClientDefaults, ModelSpec
from ftcluster.job.config import (
    CONTAINER_PROXY_DIR,
    PROXY_BINARY,
    PROXY_STAGE,
    PROXY_TLS_FILES,
    JobConfig,
    LivenessConfig,
    ProxyConfig,
    StepConfig,
)
from ftcluster.render.liveness_request import liveness_config
from ftcluster.spec.launch_styles import STYLES, Style
from ftcluster.schedulers import scheduler_class

STYLE_TEMPLATE = {name: style.template for name, style in STYLES.items()}
# Files copied into scripts/ under another name than their module's in ftcluster/rank/: a
# plain `env.py` there could shadow a module of the image's Python.
RANK_FILE_SOURCES = {"rank_env.py": "env.py"}
# The job supervisor's modules, shipped into scripts/ftcluster_job/: every module of
# ftcluster/job/ and its subpackages (schedulers/, runtimes/), as paths relative to it, read from
# the folder (a module added there travels without a list to keep).
SUPERVISOR_MODULES = tuple(sorted(p.relative_to(package_path("job")).as_posix()
                                  for p in package_path("job").rglob("*.py")))


def backend_directory(server_args: tuple[str, ...]) -> str:
    """The --backend-directory that server.extra_args give tritonserver (the last one wins, as
    in its own parsing); "": none, the server's default."""
    found = ""
    for i, arg in enumerate(server_args):
        if arg.startswith("--backend-directory="):
            found = arg.split("=", 1)[1]
        elif arg == "--backend-directory" and i + 1 < len(server_args):
            found = server_args[i + 1]
    return found


def templates_dir() -> Path:
    # The source tree's job_templates/, which a wheel carries inside the package.
    return tree_path("job_templates")


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept in the user's cache (jinja2 keys them by the template's source):
    a launch compiles none again, some 30 ms of its start-up. A cache that cannot be written
    only costs the compiling."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:   # noqa: BLE001  (a damaged entry: compile, as with none)
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    # startup: the run store (sqlite3) only when templates are rendered
    from ftcluster.run.store import cache_root

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        bytecode_cache=_TemplateCache(str(cache_root() / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["qjoin"] = lambda vs: " ".join(shlex.quote(str(v)) for v in vs)
    return env


def job_name(name: str, run_id: str) -> str:
    # Slurm job names are shown in squeue and used by scancel --name: keep them plain.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"ftc-{name}-{run_id}")[:100]


def container_name(run_id: str) -> str:
    # Pyxis names may not contain '/'; docker names allow [a-zA-Z0-9_.-].
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"ftc-{run_id}")


def pyxis_mount_problems(cluster: ClusterSpec, paths: RunPaths, step: JobStep | None) -> list[str]:
    """Every path that reaches --container-mounts, wherever it came from (the spec's mounts, the
    run folder from the workspace or `render --out`, what a job step touches), through the one
    check (spec.pyxis_mount_path_problem): Pyxis splits the list on ',' and ':' and Enroot's bash
    evaluates each mount line. One "FIELD: problem (hint)" per bad path."""
    found: list[tuple[str, str, str]] = []
    for i, m in enumerate(cluster.container.mounts):
        found += [(p, f"container.mounts.{i}", "use a plain path; a symlink to it will do") for p in (m.src, m.dst)]
    found.append((str(paths.run_dir), paths.origin, "choose a folder path without them"))
    if step is not None:
        found += [(p, step.what, "use a plain path; a symlink to it will do") for p in step.paths]
    problems = []
    for path, field_name, hint in found:
        problem = pyxis_mount_path_problem(path)
        if problem:
            problems.append(f"{field_name}: {problem} ({hint})")
    return problems


def pyxis_mounts(cluster: ClusterSpec, run_dir: Path, extra: tuple[str, ...] = ()) -> str:
    """--container-mounts value: SRC:DST[:FLAGS] joined by ',', flags joined by '+'. Its paths
    passed pyxis_mount_problems first (render)."""
    parts = []
    for m in cluster.container.mounts:
        parts.append(f"{m.src}:{m.dst}" + (f":{'+'.join(m.flags)}" if m.flags else ""))
    # The run folder (and what a job step touches) must be visible at the same path inside.
    parts += [f"{p}:{p}" for p in (str(run_dir), *extra)]
    return ",".join(parts)


# Every container of a run carries this label (value: the run id); teardown removes by it.
DOCKER_LABEL = "org.ftcluster.run"


def docker_run_args(cluster: ClusterSpec, run_dir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """`docker run` options of the Docker path, without name, label, image and command."""
    c = cluster.container
    # Host network: ranks, sshd and the client see the node's interfaces and ports.
    args = ["--network", "host", "--ipc", "host", "--cap-add", "IPC_LOCK", "--shm-size", c.shm_size]
    for m in c.mounts:
        # -v binds anyway; other flags docker does not know fail loudly at `docker run`.
        flags = [f for f in m.flags if f not in ("bind", "rbind")]
        args += ["-v", f"{m.src}:{m.dst}" + (f":{','.join(flags)}" if flags else "")]
    # The run folder at the same path inside: scripts, logs, state and keys; then what a job
    # step touches.
    for p in (str(run_dir), *extra):
        args += ["-v", f"{p}:{p}"]
    for dev in c.devices:
        args += ["--device", dev]
    # No -e: `docker inspect` would show the env's values to whoever may ask the daemon. What
    # runs in the container reads them from scripts/env.sh itself (docker_node.sh `run`).
    return args


@dataclass(frozen=True)
class JobStep:
    """A run's one step in place of the servers, through the same path and container as they:
    `preflight` (one task per node, one world) or `convert` (one task)."""

    what: str                        # "preflight" or "convert": names the step in events and logs
    label: str                       # in messages: "the preflight", "the converter"
    argv: tuple[str, ...]            # what each task runs (inside the container, where there is one)
    per_node: bool                   # one task on every node; else one task on one node
    paths: tuple[str, ...] = ()      # host paths the step needs inside the container, at their own path
    rank_files: tuple[str, ...] = () # files of ftcluster/rank/ copied into scripts/ (stdlib only)
    timeout: int | None = None       # seconds the step may take (None: the job's time limit)
    files: tuple[tuple[str, str], ...] = ()   # more files of scripts/: (name, text)
    token: bool = False              # the run has a token (scripts/token): a private replica set's front
    notice: bool = False             # on Slurm, the step takes the time-limit notice (USR1) itself: a front
    serves: bool = False             # the step serves for as long as its job lives (a front): requeued as a serving run is


@dataclass(frozen=True)
class RenderOptions:
    keep_serving: bool = False
    client: bool = True
    mpi_check: bool = True
    servers: bool = True                 # False: only the MPI check (`ftcluster check`)
    mpi_check_timeout: float = 120.0
    tritonserver: str | None = None      # resolved binary; default: cluster.server.binary
    python: str | None = None            # default: this interpreter where the job script runs
                                         # here, else cluster.python or this interpreter
    mpirun: str = "mpirun"               # local style: the resolved Open MPI launcher
    extra_env: dict[str, str] = field(default_factory=dict)
    step: JobStep | None = None          # a preflight or convert run (servers and client off)
    rotation: bool = False               # a replica set's member: in and out of its balancer's rotation
    front_rotation: str = ""             # ... and its front's state/rotation.json
    carried_faults: tuple[str, ...] = ()  # a successor's: its predecessor's faults still counted
    service: str = ""                    # the service's name in metrics labels ("": the run id)
    # The run's facts: as its launch resolved them (run_facts), or as the run it continues saved
    # them (a successor's: its predecessor's); None: resolved here (run_facts).
    facts: RunFacts | None = None

    @property
    def runs_servers(self) -> bool:
        """The run starts the servers: not the MPI check alone, nor a job step."""
        return self.servers and self.step is None


@dataclass(frozen=True)
class RenderedScripts:
    """The files of a run's scripts/ folder, by name."""

    style: str
    files: dict[str, str]
    # The files that are copies of the package's own (the supervisor, the rank-side files): name -> source.
    sources: dict[str, str] = field(default_factory=dict)
    # What a dry run shows instead of a file's text (the env's values hidden): name -> text.
    shown: dict[str, str] = field(default_factory=dict)
    facts: RunFacts | None = None   # the run's facts, as its scripts were rendered from them

    def materialize(self, scripts_dir: Path) -> list[Path]:
        scripts_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files.items():
            path = scripts_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, text, 0o600 if name in PRIVATE_FILES else 0o755)
            written.append(path)
        return written

    def __str__(self) -> str:
        return "\n".join(f"# ===== {name} =====\n{text}" for name, text in self.files.items())


@dataclass(frozen=True)
class RenderContext:
    """Everything the templates see, by name and type (jinja2 gets its fields as variables).
    StrictUndefined makes a template that needs a name not here fail at render, in the tests."""

    facts: RunFacts                # the run's resolved facts (ftcluster.plan.facts): the fields below read them
    style: str
    summary: str                   # the style's one line: how the ranks start
    run_id: str
    run_dir: str
    job_name: str
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    # sbatch header (Slurm styles)
    partition: str | None
    account: str | None
    qos: str | None
    time_limit: str
    sbatch_args: list[str]
    srun_args: list[str]
    setup: list[str]
    gpus_per_node_gres: bool
    exclusive: bool
    mpi: str
    # servers
    ports: Ports                   # the endpoint's: Triton's, or the proxy's when private
    triton_ports: Ports            # what rank 0's tritonserver listens on (the loopback's when private)
    private: bool                  # access: private (Triton on the loopback, the proxy in front)
    same_host_note: str            # a private run's Triton reachable by others on its node ("": not)
    rotation: bool                 # a replica set's member (state/rotation for the balancer)
    proxied: bool                  # Triton on rank 0's loopback, the proxy beside it (private, or a member)
    loopback: bool                 # every Triton port on the loopback: proxied, or one machine (the local style)
    front_rotation: str            # a member's front's state/rotation.json ("": no set)
    expose_metrics: bool           # proxy.expose_metrics
    proxy_binary: str
    proxy_tls_cert: str | None        # the proxy serves TLS with this certificate
    proxy_tls_key: str | None
    # The proxy in rank 0's container (the job runs on another machine): its folder there, where
    # the job stages its files, its binary's name there ({} where the proxy runs beside the job).
    container_proxy: dict[str, str]
    port_stride: int               # between ranks' ports: only where ranks share one host
    ssh_port: int
    env: dict[str, str]
    container: Container
    container_name: str
    pyxis_mounts: str
    # What a job step touches (besides the run folder), at the same path inside any container.
    step_paths: list[str]
    tritonserver: str
    server: Server
    python: str                    # runs the client (and the ssh fan-out) on the job's host
    served_model: str
    client: ClientDefaults
    run_client: bool
    keep_serving: bool
    # Restarts of the world while serving (server.restarts, or its serving default); the entry
    # script starts a supervisor that died by a signal again at most this often too.
    restarts: int
    # A serving run on Slurm: Slurm requeues it when a node fails (the batch host: nothing of the
    # job is left to act); the job itself moves to a successor first when it finds another node
    # lost; it hands over before its limit.
    serving_on_slurm: bool
    # Slurm requeues the job when its batch host is lost (a serving run, or a step that serves:
    # a replica set's balancer), whatever the site's JobRequeue.
    requeue: bool
    handover_lead: int             # seconds before the time limit; 0: no hand-over
    carried_faults: list[str]      # a successor's: the faults of its predecessor still counted
    service: str                   # the service's name in metrics labels ("": the run id)
    notice_to_steps: bool          # the notice goes to the job's steps (a front), not the batch shell
    stop_lead: int                 # seconds before the time limit Slurm asks the job to stop (TERM)
    sbatch_dir: str                # the run folder as #SBATCH --chdir takes it; "": it cannot
    mpi_check: bool
    mpi_check_timeout: float
    # The backend libraries the servers load, which the MPI check looks for in the image, and
    # the server's --backend-directory where server.extra_args sets one ("": beside its bin/).
    backends: list[str]
    backend_directory: str
    servers: bool
    runs_servers: bool             # the servers start: not the MPI check alone, nor a job step
    step: JobStep | None           # a preflight or convert run: _step.sh.j2 instead of the servers
    # the run folder
    repo: str
    logs: str
    state: str
    results: str
    scripts: str
    id_prefix: str
    # docker styles
    docker_run_args: list[str]
    docker_label: str
    ssh_dir: str
    # ssh scheduler: the plan's hosts, rank 0 first
    run_hosts: list[str]
    mpirun: str
    # The engine's line for a rank's model loaded (a bash regular expression; "": no model).
    loaded_marker: str
    # The event kinds and the run folder's file names, defined once in Python.
    ev: Kinds
    files: RunFiles

    def variables(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _client(model: ModelSpec | None, plan: Plan) -> ClientDefaults:
    """The model's client settings; bert's hidden size from the checkpoint unless set."""
    if model is None:
        return ClientDefaults()
    if model.client.hidden_size or not plan.client_hidden_size:
        return model.client
    return model.client.model_copy(update={"hidden_size": plan.client_hidden_size})


def run_facts(cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, opts: RenderOptions) -> RunFacts:
    """The run's facts (ftcluster.plan.facts) as these options launch it: those it continues
    with, else resolved from its specs (the liveness request from its model's config)."""
    if opts.facts is not None:
        return opts.facts

    def probe(metrics_port: int) -> LivenessConfig | None:
        assert model is not None
        return liveness_config(model, plan, _client(model, plan), cluster.server.liveness, metrics_port)

    return resolve(cluster, serves=opts.runs_servers, member=opts.rotation and opts.runs_servers,
                   keep_serving=opts.keep_serving, probe=probe if model is not None else None)


def context(
    cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, paths: RunPaths, opts: RenderOptions
) -> RenderContext:
    """Everything the templates see; pure. `model` is None for a run without one (preflight)."""
    facts = run_facts(cluster, model, plan, opts)
    style = STYLES[facts.style]
    env = {**cluster.env, **opts.extra_env}
    # Only Slurm gives notice of a time limit (and requeues): its scheduler says so.
    notice = scheduler_class(cluster.scheduler).time_limit_notice
    serving_on_slurm = opts.keep_serving and opts.runs_servers and notice
    extra = opts.step.paths if opts.step else ()
    step_notice = opts.step is not None and opts.step.notice and notice
    private = facts.private
    rotation = opts.rotation and opts.runs_servers
    return RenderContext(
        facts=facts,
        style=style.name,
        summary=style.summary,
        run_id=paths.run_id,
        run_dir=str(paths.run_dir),
        job_name=job_name(model.name if model else (opts.step.what if opts.step else "run"), paths.run_id),
        nodes=plan.nodes,
        gpus_per_node=plan.gpus_per_node,
        tp=plan.tensor_para_size,
        pp=plan.pipeline_para_size,
        partition=cluster.partition,
        account=cluster.account,
        qos=cluster.qos,
        time_limit=cluster.time_limit,
        sbatch_args=list(cluster.sbatch_args),
        srun_args=list(cluster.srun_args),
        setup=list(cluster.setup),
        # A GPU count not known yet (gpus_per_node: auto before the preflight) asks for none.
        gpus_per_node_gres=cluster.request_gpus and plan.gpus_per_node > 0,
        exclusive=cluster.exclusive,
        mpi=cluster.mpi,
        ports=facts.public,
        triton_ports=facts.triton,
        private=private,
        same_host_note=same_host_note(cluster) if private else "",
        rotation=rotation,
        proxied=facts.proxied,
        loopback=facts.loopback,
        front_rotation=opts.front_rotation if rotation else "",
        expose_metrics=cluster.proxy.expose_metrics,
        proxy_binary=cluster.proxy.binary,
        proxy_tls_cert=cluster.proxy.tls_cert,
        proxy_tls_key=cluster.proxy.tls_key,
        container_proxy={"dir": CONTAINER_PROXY_DIR, "stage": str(paths.state / PROXY_STAGE), "binary": PROXY_BINARY}
        if private and style.proxy_in_container else {},
        port_stride=facts.port_stride,
        ssh_port=cluster.ssh_port,
        env=env,
        container=cluster.container,
        container_name=container_name(paths.run_id),
        pyxis_mounts=pyxis_mounts(cluster, paths.run_dir, extra) if style.srun_mounts else "",
        step_paths=list(extra),
        tritonserver=opts.tritonserver or cluster.server.binary,
        server=cluster.server,
        # Never inside a container: this interpreter where the job script runs here.
        python=opts.python or (sys.executable if style.runs_here else cluster.python or sys.executable),
        served_model=model.name if model else "",
        client=_client(model, plan),
        run_client=opts.client,
        keep_serving=opts.keep_serving, restarts=facts.restarts,
        serving_on_slurm=serving_on_slurm,
        requeue=serving_on_slurm or (opts.step is not None and opts.step.serves and notice),
        # Only Slurm gives notice of a time limit; a run that does not serve has nothing to hand over.
        handover_lead=handover_lead(cluster) if serving_on_slurm or step_notice else 0,
        carried_faults=list(opts.carried_faults) if opts.keep_serving else [],
        service=opts.service,
        notice_to_steps=step_notice,
        stop_lead=stop_lead(cluster),
        sbatch_dir=str(paths.run_dir) if _SBATCH_SAFE.fullmatch(str(paths.run_dir)) else "",
        # A world on this machine alone is its own mpirun's; there is nothing to check.
        mpi_check=opts.mpi_check and not style.one_host,
        mpi_check_timeout=opts.mpi_check_timeout,
        backends=list(plan.backends) if opts.servers else [],
        backend_directory=backend_directory(cluster.server.extra_args),
        servers=opts.servers,
        runs_servers=opts.runs_servers,
        step=opts.step,
        repo=str(paths.repo),
        logs=str(paths.logs),
        state=str(paths.state),
        results=str(paths.results),
        scripts=str(paths.scripts),
        id_prefix=f"ftc-{paths.run_id}",
        docker_run_args=docker_run_args(cluster, paths.run_dir, extra) if style.docker_run else [],
        docker_label=DOCKER_LABEL,
        ssh_dir=str(paths.state / "ssh"),
        run_hosts=list(cluster.hosts[: plan.nodes]),
        mpirun=opts.mpirun,
        loaded_marker=engine_for(model).loaded_marker if model else "",
        ev=EV,
        files=FILES,
    )


# A path an #SBATCH line carries as it is: no blank or quote (sbatch splits and unquotes those),
# no % (a filename pattern) and no #.
_SBATCH_SAFE = re.compile(r"/[^\s'\"`\\%#]*")


def stop_lead(cluster: ClusterSpec) -> int:
    """Seconds before the time limit Slurm sends the job TERM: its teardown (rank 0's graceful
    stop within server.exit_grace, the containers) ends before Slurm kills it; at most half the
    limit; 0 without a limit."""
    limit = slurm_time_seconds(cluster.time_limit)
    if limit is None:
        return 0
    return min(int(cluster.server.exit_grace) + 60, limit // 2)


def handover_lead(cluster: ClusterSpec) -> int:
    """Seconds before the time limit the job hands over: server.handover_lead, at most half the
    limit (a notice at the start would hand over at once, and again, for ever); 0 without a limit."""
    limit = slurm_time_seconds(cluster.time_limit)
    if limit is None:
        return 0
    return min(cluster.server.handover_lead, limit // 2)


def job_config(ctx: RenderContext) -> JobConfig:
    """The supervisor's values (scripts/job.json): the context's job-side half."""
    step = ctx.step
    container_flags: list[str] = []
    if STYLES[ctx.style].srun_mounts:
        c = ctx.container
        # The commas are Pyxis syntax; each flag is one argv word, never parsed by a shell.
        container_flags = [f"--container-image={c.image}", f"--container-mounts={ctx.pyxis_mounts}",
                           f"--container-name={ctx.container_name}"]
        if c.workdir:
            container_flags.append(f"--container-workdir={c.workdir}")
    client_args = ["--protocol", ctx.client.protocol, "--batch-size", str(ctx.client.batch_size),
                   "--input-len", str(ctx.client.input_len), "--output-len", str(ctx.client.output_len)]
    if ctx.client.hidden_size:
        client_args += ["--hidden-size", str(ctx.client.hidden_size)]
    return JobConfig(
        style=STYLES[ctx.style].job_style, run_id=ctx.run_id, run_dir=ctx.run_dir, logs=ctx.logs, state=ctx.state,
        results=ctx.results, scripts=ctx.scripts, nodes=ctx.nodes, gpus_per_node=ctx.gpus_per_node,
        http_port=ctx.ports.http, served_model=ctx.served_model, id_prefix=ctx.id_prefix, python=ctx.python,
        tritonserver=ctx.tritonserver, ready_timeout=int(ctx.server.ready_timeout),
        exit_grace=int(ctx.server.exit_grace), keep_serving=ctx.keep_serving, run_client=ctx.run_client,
        client_args=client_args, servers=ctx.servers, mpi_check=ctx.mpi_check,
        mpi_check_timeout=int(ctx.mpi_check_timeout), env=dict(ctx.env),
        backends=ctx.backends, backend_directory=ctx.backend_directory,
        step=None if step is None else StepConfig(what=step.what, label=step.label, argv=list(step.argv),
                                                  per_node=step.per_node,
                                                  timeout=None if step.timeout is None else int(step.timeout)),
        mpi=ctx.mpi, srun_args=[w for arg in ctx.srun_args for w in arg.split(" ", 1)], container_flags=container_flags, container_name=ctx.container_name,
        docker_label=ctx.docker_label, ssh_dir=ctx.ssh_dir, ssh_port=ctx.ssh_port, run_hosts=list(ctx.run_hosts),
        mpirun=ctx.mpirun, liveness=ctx.facts.liveness, restarts=ctx.restarts,
        restart_backoff=ctx.server.restart_backoff, restart_reset=ctx.server.restart_reset,
        carried_faults=ctx.carried_faults, service=ctx.service, on_failure=list(ctx.server.on_failure),
        log_max_bytes=int(ctx.server.log_max_mb * (1 << 20)),
        successor=[ctx.python, "-m", "ftcluster", "successor", ctx.run_dir] if ctx.serving_on_slurm else [],
        handover_lead=ctx.handover_lead, grpc_port=ctx.ports.grpc, rotation=ctx.rotation,
        front_rotation=ctx.front_rotation,
        metrics_interval=ctx.server.metrics_interval if ctx.keep_serving else 0.0,
        stall_timeout=ctx.server.stall_timeout,
        metrics_port=ctx.triton_ports.metrics, metrics_max_bytes=int(ctx.server.metrics_max_mb * (1 << 20)),
        targets_file=targets_file(ctx), public_metrics_port=ctx.ports.metrics,
        # The GPU exporter listens where Triton does: the loopback behind a proxy.
        gpu_exporter_address="127.0.0.1" if ctx.proxied else "",
        gpu_exporter_port=(ctx.triton_ports.gpus or 0) if ctx.keep_serving else 0,
        public_gpu_exporter_port=(ctx.ports.gpus or 0) if ctx.keep_serving else 0,
        proxy=ProxyConfig(binary=ctx.proxy_binary, config=os.path.join(ctx.scripts, FILES.proxy_config),
                          token_file=os.path.join(ctx.scripts, FILES.token) if ctx.private else "",
                          triton_http_port=ctx.triton_ports.http, triton_grpc_port=ctx.triton_ports.grpc,
                          tls_cert=ctx.proxy_tls_cert, tls_key=ctx.proxy_tls_key,
                          same_host_note=ctx.same_host_note) if ctx.proxied else None,
    )


# Prometheus file_sd files of serving runs: <workspace>/prometheus/<run id>.json, beside the run
# folders, readable by others (host, port and run id only; no secret).
TARGETS_DIR = "prometheus"


def targets_file(ctx: RenderContext) -> str:
    """Where a serving run publishes its metrics target; "" where nobody may scrape it: a private
    run's metrics stay behind its proxy unless proxy.expose_metrics (then with the token)."""
    if not ctx.keep_serving or not ctx.runs_servers:
        return ""
    if ctx.private and not ctx.expose_metrics:
        return ""
    return os.path.join(os.path.dirname(ctx.run_dir), TARGETS_DIR, f"{ctx.run_id}.json")


def write_private(path: Path, text: str, mode: int) -> None:
    """Write a file created with `mode` (no moment with the umask's wider one); an existing
    file gets `mode` first."""
    if path.exists():
        path.chmod(mode)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _package_file(*parts: str) -> str:
    return package_path(*parts).read_text()


def _ship(files: dict[str, str], sources: dict[str, str], name: str, *source: str) -> None:
    files[name] = _package_file(*source)
    sources[name] = "/".join(("ftcluster", *source))


def render(
    cluster: ClusterSpec, model: ModelSpec | None, plan: Plan, paths: RunPaths, opts: RenderOptions | None = None
) -> RenderedScripts:
    """The run's scripts/ folder: the entry script, the supervisor and its values, the rank
    wrapper, the style's node script and the rank-side files."""
    opts = opts or RenderOptions()
    ctx = context(cluster, model, plan, paths, opts)
    style = STYLES[ctx.style]
    if style.srun_mounts:
        problems = pyxis_mount_problems(cluster, paths, opts.step)
        if problems:
            raise UserError("; ".join(problems))
    env = _env()
    variables = ctx.variables()
    cfg = job_config(ctx)
    files = {paths.job_script(style.name).name: env.get_template(style.template).render(variables),
             FILES.job_config: cfg.to_json(), FILES.env_file: env_file(ctx.env)}
    # What a dry run shows of the files that hold the env's values: the names only.
    hidden = {k: "<hidden>" for k in ctx.env}
    shown = {FILES.job_config: cfg._replace(env=hidden).to_json(), FILES.env_file: env_file(hidden)}
    if ctx.proxied:
        # A proxy in rank 0's container serves the metrics to the job, which runs elsewhere, and
        # finds the copies of proxy.tls_cert's files there.
        away = ctx.container_proxy
        cert, key = PROXY_TLS_FILES
        files[FILES.proxy_config] = caddy_config_text(
            cluster.ports, ctx.triton_ports, cluster.proxy, token=ctx.private, member=ctx.rotation,
            metrics=bool(away), tls_files=(f"{away['dir']}/{cert}", f"{away['dir']}/{key}") if away else None)
    sources: dict[str, str] = {}
    for module in SUPERVISOR_MODULES:
        _ship(files, sources, f"{FILES.supervisor}/{module}", "job", *module.split("/"))
    if opts.step is not None:
        files.update(opts.step.files)
    if opts.step is None:
        files["rank_server.sh"] = env.get_template("rank_server.sh.j2").render(variables)
    # Run inside the user's image with its python3 (and its MPI): plain files, stdlib only.
    # signal_rank.sh is the one way the job signals a rank it recorded (only while the pid is
    # still that rank's); local_rank.sh gives a rank on this machine its slice of the GPUs.
    rank_files = ((("signal_rank.sh",) if opts.step is None else ())
                  + (("local_rank.sh",) if style.one_host else ())
                  + (("mpicheck.py", "ctmpi.py", "rank_env.py") if ctx.mpi_check else ())
                  + (opts.step.rank_files if opts.step else ()))
    for name in rank_files:
        _ship(files, sources, name, "rank", RANK_FILE_SOURCES.get(name, name))
    if style.node_script:
        files[style.node_script.removesuffix(".j2")] = env.get_template(style.node_script).render(variables)
    for name in job_node_scripts(style):
        files[name] = env.get_template(f"{name}.j2").render(variables)
    if style.host_list:
        files["nodes.json"] = fanout_config(cluster, plan).to_json()
    return RenderedScripts(style.name, files, sources, shown, ctx.facts)


def job_node_scripts(style: Style) -> tuple[str, ...]:
    """The bash the job itself runs as `bash SCRIPT ARGS` (job_templates/, sharing _marked.sh.j2's
    definitions with rank_server.sh), for what its style's job does: the guard of a job beside
    its launcher; Pyxis's proof that a step ran in the image; where no container of the run's
    holds what killed ranks leave (bare metal, Charliecloud, one host), their removal."""
    keeps_containers = style.docker_run or style.srun_mounts   # its node script reaps and removes
    return (("session_guard.sh",) if style.runs_here else ()) + (
        ("prove_in_image.sh",) if style.srun_mounts else ()) + (
        () if keeps_containers else ("kill_marked.sh", "free_python_envs.sh" if style.one_host else "node_teardown.sh"))


def env_file(env: dict[str, str]) -> str:
    """scripts/env.sh: the spec's env, sourced by every node-side script (values quoted once)."""
    return ("# The spec's env (generated by ftcluster; 0600: its values may be secrets).\n"
            "# shellcheck disable=SC2016  # values are data, quoted once\n") + "".join(
        f"export {key}={shlex.quote(value)}\n" for key, value in env.items())


# Files of scripts/ that hold the env's values: readable by their owner alone.
PRIVATE_FILES = (FILES.job_config, FILES.env_file)


def fanout_config(cluster: ClusterSpec, plan: Plan) -> FanoutConfig:
    s = cluster.node_ssh
    return FanoutConfig(hosts=tuple(cluster.hosts[: plan.nodes]), user=s.user, port=s.port,
                        identity_file=s.identity_file, known_hosts=s.known_hosts, parallel=s.parallel,
                        connect_timeout=s.connect_timeout)
