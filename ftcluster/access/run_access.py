"""How a client reaches a recorded run: its endpoint and, for a private run, its token.

`ftcluster client ... --run RUN` and `ftcluster token RUN` read them from the run folder: the
endpoint rank 0 (or its proxy) serves at, the gRPC port from the run's values, the token from
scripts/token (0600; a successor keeps its predecessor's token).
"""

from __future__ import annotations

import json
from pathlib import Path

from typing import TYPE_CHECKING

from ftcluster.errors import UserError
from ftcluster.job.config import JobConfig
from ftcluster.job.names import FILES
from ftcluster.run.replica_files import FRONT_SETTINGS
from ftcluster.run.store import RunRecord, RunStore

if TYPE_CHECKING:   # the client's module loads numpy and tritonclient: only when a client runs
    from ftcluster.client.endpoint import Endpoint


def token_of(rec: RunRecord) -> str | None:
    """The run's token; None for a run without one (access: cluster)."""
    return read_token(Path(rec.run_dir))


def read_token(run_dir: Path) -> str | None:
    """The token in a run folder (a successor's launch keeps its predecessor's); None: none."""
    path = run_dir / "scripts" / FILES.token
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot read the run's token {path}: {exc.strerror or exc}", field="RUN",
                        hint="only the user who launched the run may read it") from None
    return text or None


def resolve_endpoint(url: str | None, run_ref: str | None, protocol: str, timeout: float, token: str | None,
                     token_file: str | None, url_option: str = "--url", ca: str | None = None) -> Endpoint:
    """Where a client sends its requests: `url`, or a recorded run's endpoint; a private run's
    token from `token_file`, else `token` ($FTCLUSTER_TOKEN or --token), else the run's own.
    TLS where the URL asks for it, `ca` is given, or the run's proxy serves it."""
    if (url is None) == (run_ref is None):
        raise UserError("give the endpoint as HOST:PORT or as --run RUN (one of them)", field=url_option)
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {token_file}: {getattr(exc, 'strerror', None) or exc}",
                            field="--token-file") from None
    if run_ref is not None:
        rec = RunStore().get(run_ref)
        url = endpoint_of(rec, protocol)
        token = token or token_of(rec)
        ca = ca or tls_cert_of(Path(rec.run_dir))
    assert url is not None
    # optional extra: client (tritonclient's HTTP/gRPC clients, numpy) only when a client is made
    from ftcluster.client.endpoint import Endpoint

    return Endpoint.parse(url, protocol, timeout, token, tls=ca is not None, ca=ca, option=url_option)


def model_to_query(model: str | None, run_ref: str | None, default: str | None = None) -> str:
    """The model a client asks for: --model, else the recorded run's own (a run serves its model
    under its spec's name), else `default` (the demo model's)."""
    if model:
        return model
    if run_ref is not None:
        name = RunStore().get(run_ref).model
        if name:
            return name
    if default is None:
        raise UserError("which model? none is recorded for this run" if run_ref else "which model?",
                        field="--model", hint="give --model NAME, or --run RUN of a recorded run")
    return default


def tls_cert_of(run_dir: Path) -> str | None:
    """The certificate a run's endpoint serves TLS with (proxy.tls_cert): a run's proxy, or a
    replica set's front; None for plain HTTP."""
    scripts = run_dir / "scripts"
    try:
        front = json.loads((scripts / FRONT_SETTINGS).read_text())
        return str(front.get("tls_cert") or "") or None
    except (OSError, ValueError, AttributeError):
        pass
    try:
        cfg = JobConfig.from_json((scripts / FILES.job_config).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return cfg.proxy.tls_cert if cfg.proxy is not None else None


def endpoint_of(rec: RunRecord, protocol: str) -> str:
    """HOST:PORT of the run's endpoint for `protocol` (http or grpc)."""
    # startup: the run's status (the schedulers and their queries) only when a run's endpoint is looked up
    from ftcluster.observe.status import run_status

    st = run_status(rec)
    endpoint = st.get("endpoint")
    if not endpoint:
        raise UserError(f"run {rec.run_id} has no endpoint ({st.get('phase_label') or 'not ready'})", field="--run",
                        hint="wait until it serves (`ftcluster status`)")
    host, _, port = str(endpoint).rpartition(":")
    if protocol == "grpc":
        try:
            cfg = JobConfig.from_json((Path(rec.run_dir) / "scripts" / FILES.job_config).read_text())
        except (OSError, ValueError, TypeError) as exc:
            raise UserError(f"cannot read the run's values: {exc}", field="--run") from None
        if not cfg.grpc_port:
            raise UserError(f"run {rec.run_id} does not record its gRPC port", field="--protocol",
                            hint="give --url HOST:GRPC_PORT")
        port = str(cfg.grpc_port)
    return f"{host}:{port}"
