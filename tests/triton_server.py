"""Start and stop a real CPU tritonserver for tests (see ../shared/TESTBED.md section 3).

Guards against the traps seen on the test bed:
- a server on a busy port logs "Started HTTPService" and dies 2 s later while another server
  answers /v2/health/ready: we also require our process alive and `GET /v2` naming our --id;
- SIGTERM can hang: stop() always SIGKILLs the process group after a grace period;
- killed servers leave /dev/shm/triton_python_backend_shm_region_*: ours get a unique prefix
  (python backend's shm-region-prefix-name) so we remove exactly ours, never another run's;
- the test model's MPI (a singleton here, Open MPI 5) leaves its shared-memory segment in
  /dev/shm and its session folder in $TMPDIR: both go to the server's own folders, removed with
  it; the python backend's /tmp/python_env_* folders that appeared while it started are its own.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ftcluster.client.ready import ours_ready

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


def free_ports(n: int) -> list[int]:
    """n distinct ports the kernel says are free now (a race remains; start() retries)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class TritonServer:
    proc: subprocess.Popen[bytes]
    server_id: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    shm_prefix: str
    # Its own: Open MPI's segment and session folders, and the python backend's /tmp folders.
    own_dirs: list[str] = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ours_ready(self) -> bool:
        """Ready, and it is really this process answering on the port."""
        return self.alive() and ours_ready("127.0.0.1", self.http_port, self.server_id, timeout=1.0)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the process group, then SIGKILL it after `grace` s; clean our shm regions."""
        if self._stopped:
            return self.proc.returncode
        self._stopped = True
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:  # always: stubs may outlive the server, and the server may hang
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for region in SHM_DIR.glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)
        for d in self.own_dirs:
            shutil.rmtree(d, ignore_errors=True)
        return self.proc.returncode


def start_tritonserver(
    model_repositories: Sequence[Path],
    *,
    log_dir: Path,
    binary: Path | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout: float = 90.0,
    attempts: int = 3,
) -> TritonServer:
    """Start tritonserver on free ports and wait until it is ready; RuntimeError with the log tail."""
    if binary is None:
        from ftcluster.service.triton_local import find_tritonserver

        binary = find_tritonserver()
    last_log = ""
    for attempt in range(attempts):
        http_port, grpc_port, metrics_port = free_ports(3)
        server_id = f"ftc-test-{uuid.uuid4().hex[:10]}"
        shm_prefix = f"{SHM_PREFIX}{server_id}"
        log_path = log_dir / f"{server_id}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(binary), f"--id={server_id}", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
               f"--metrics-port={metrics_port}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               f"--backend-config=python,shm-region-prefix-name={shm_prefix}", "--exit-timeout-secs=5",
               *(f"--model-repository={p}" for p in model_repositories), *extra_args]
        mpi_shm = SHM_DIR / f"ftc-test-mpi-{server_id}"
        mpi_shm.mkdir()
        mpi_tmp = tempfile.mkdtemp(prefix="ftc-ts-")   # short: Open MPI's sockets live in it
        mpi_env = {"OMPI_MCA_btl_sm_backing_directory": str(mpi_shm),
                   "OMPI_MCA_btl_vader_backing_directory": str(mpi_shm), "TMPDIR": mpi_tmp}
        envs_before = set(glob.glob("/tmp/python_env_*"))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **mpi_env, **(env or {})}, start_new_session=True)
        server = TritonServer(proc, server_id, http_port, grpc_port, metrics_port, log_path, shm_prefix,
                              [str(mpi_shm), mpi_tmp])
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and server.alive():
            if server.ours_ready():
                server.own_dirs += sorted(set(glob.glob("/tmp/python_env_*")) - envs_before)
                return server
            time.sleep(0.1)
        timed_out = server.alive()
        server.stop(grace=2.0)
        text = server.log()
        # The tail alone is mostly Triton's wide option table; keep its error lines too.
        errors = [ln for ln in text.splitlines() if (ln[:1] == "E" and ln[1:5].isdigit()) or "rror" in ln]
        last_log = "\n".join(errors[-20:]) + "\n--- tail ---\n" + text[-1500:]
        if timed_out or "address already in use" not in text.lower():
            break  # not a port race: retrying will not help
    raise RuntimeError(f"tritonserver did not become ready (attempt {attempt + 1}):\n{last_log}")


@contextmanager
def running_tritonserver(model_repositories: Sequence[Path], *, log_dir: Path,
                         **kwargs: object) -> Iterator[TritonServer]:
    server = start_tritonserver(model_repositories, log_dir=log_dir, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


# A T5-style config for the demo test model (its model.py serves either layout): FT T5's
# required inputs and INT32 outputs. Fill with t5_config(name, max_batch_size, checkpoint_dir).
_T5_CONFIG = """
name: "%(name)s"
backend: "python"
max_batch_size: %(max_batch_size)d
input [
  { name: "input_ids" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "sequence_length" data_type: TYPE_UINT32 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "max_output_len" data_type: TYPE_UINT32 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "runtime_top_k" data_type: TYPE_UINT32 dims: [ 1 ] reshape: { shape: [ ] } optional: true }
]
output [
  { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
  { name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "model_type" value: { string_value: "T5" } }
parameters { key: "model_checkpoint_path" value: { string_value: "%(checkpoint)s" } }
parameters { key: "tensor_para_size" value: { string_value: "1" } }
parameters { key: "pipeline_para_size" value: { string_value: "1" } }
"""


def t5_config(name: str, max_batch_size: int, checkpoint: str) -> str:
    return _T5_CONFIG % {"name": name, "max_batch_size": max_batch_size, "checkpoint": checkpoint}


def require_tritonserver() -> None:
    """Skip the calling test when no tritonserver can be found here."""
    import pytest

    from ftcluster.errors import UserError
    from ftcluster.service.triton_local import find_tritonserver

    try:
        find_tritonserver()
    except UserError as exc:
        pytest.skip(str(exc))


# The demo model, sleeping `sleep_ms` (a config parameter) per execute, i.e. per batch: a
# stand-in for an FT forward pass. The demo model itself stays as shipped.
_SLOW_PY = '''
import importlib.util, json, time
_spec = importlib.util.spec_from_file_location("ftc_demo_model", {path!r})
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)

class TritonPythonModel(_mod.TritonPythonModel):
    def initialize(self, args):
        super().initialize(args)
        params = json.loads(args["model_config"]).get("parameters", {{}})
        self.sleep_s = float(params["sleep_ms"]["string_value"]) / 1000

    def execute(self, requests):
        time.sleep(self.sleep_s)
        return super().execute(requests)
'''
_SLEEP_PARAM = 'parameters {{\n  key: "sleep_ms"\n  value: {{\n    string_value: "{ms}"\n  }}\n}}\n'


def slow_demo_model(repository: Path, name: str, sleep_ms: float) -> Path:
    """Add model `name` to `repository`: the demo model's config and code, plus the sleep."""
    demo = Path(__file__).resolve().parents[1] / "ftcluster" / "demo"
    src = demo / "model_repository" / "fastertransformer"
    (repository / name / "1").mkdir(parents=True)
    cfg = (src / "config.pbtxt").read_text().replace('name: "fastertransformer"', f'name: "{name}"')
    cfg = cfg.replace("../../checkpoint/1-gpu/", str(demo / "checkpoint" / "1-gpu") + "/")
    (repository / name / "config.pbtxt").write_text(cfg + _SLEEP_PARAM.format(ms=sleep_ms))
    (repository / name / "1" / "model.py").write_text(_SLOW_PY.format(path=str(src / "1" / "model.py")))
    return repository



def copy_test_model_code(version_dir: Path) -> None:
    """The demo test model's code (model.py, the ctmpi.py it imports, and gpt_cuda.py, which it
    imports where torch sees a GPU) into a model version folder."""
    src = Path(__file__).resolve().parents[1] / "ftcluster" / "demo" / "model_repository" / "fastertransformer" / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    for name in ("model.py", "ctmpi.py", "gpt_cuda.py"):
        (version_dir / name).write_text((src / name).read_text())
