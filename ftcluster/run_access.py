"""How a client reaches a recorded run: its endpoint and, for a private run, its token.

`ftcluster client ... --run RUN` and `ftcluster token RUN` read them from the run folder: the
endpoint rank 0 (or its proxy) serves at, the gRPC port from the run's values, the token from
scripts/token (0600; a successor keeps its predecessor's token).
"""

from __future__ import annotations

from pathlib import Path

from ftcluster.errors import UserError
from ftcluster.job.config import JobConfig
from ftcluster.job.names import FILES
from ftcluster.store import RunRecord


def token_of(rec: RunRecord) -> str | None:
    """The run's token; None for a run without one (access: cluster)."""
    path = Path(rec.run_dir) / "scripts" / FILES.token
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot read the run's token {path}: {exc.strerror or exc}", field="RUN",
                        hint="only the user who launched the run may read it") from None
    return text or None


def endpoint_of(rec: RunRecord, protocol: str) -> str:
    """HOST:PORT of the run's endpoint for `protocol` (http or grpc)."""
    from ftcluster.status import run_status

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
