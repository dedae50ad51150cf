"""Is the Triton answering on HOST:PORT ours, and is it (and a model) ready? Blocking probes.

A 200 from /v2/health/ready is not enough: a second server started on a busy port logs
"Started HTTPService", exits about 2 s later, and meanwhile the OTHER server answers (see
TESTBED.md section 3). So "ours" means `GET /v2` names the `--id` we started it with. The
job scripts make the same check in bash (`_lib.sh.j2`), where no Python of ours may be
assumed; every Python caller uses this module. The client and gateway ask through their own
(async) transport and do not care whose server it is.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import quote

SERVER_PATH = "/v2"
READY_PATH = "/v2/health/ready"


def model_path(model: str, what: str = "ready") -> str:
    """/v2/models/NAME/<what>, the name quoted as Triton's HTTP server expects."""
    return f"/v2/models/{quote(model, safe='')}/{what}"


def http_get(host: str, port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """Status and body of one GET; OSError / http.client.HTTPException when it cannot be had."""
    # http.client, not urllib: proxy variables must not reroute a probe of a node's port.
    conn = http.client.HTTPConnection(host.strip("[]"), port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def server_id(host: str, port: int, timeout: float = 2.0) -> str | None:
    """The `--id` of the server answering there; None when nothing (or no Triton) answers."""
    try:
        status, body = http_get(host, port, SERVER_PATH, timeout)
        name = json.loads(body).get("name") if status == 200 else None
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return None
    return name if isinstance(name, str) else None


def ours_ready(host: str, port: int, server: str, model: str | None = None, timeout: float = 2.0) -> bool:
    """The server there has the id `server`, is ready, and so is `model` (when given)."""
    if server_id(host, port, timeout) != server:
        return False
    paths = [READY_PATH] + ([model_path(model)] if model is not None else [])
    try:
        return all(http_get(host, port, p, timeout)[0] == 200 for p in paths)
    except (OSError, http.client.HTTPException):
        return False
