"""The liveness probe's request, made at render time from the served model's config.pbtxt: its
smallest valid inference (one prompt token and one output token; an encoder's one-token input;
through the ensemble when the served model is one; a sequence-batching model with a correlation
id of its own and START/END together). The job sends it as rendered: the supervisor has the
standard library only.

Made once per model config: the request is kept in the user's cache, keyed by the config as
the server sees it and by the sources that make it, so a relaunch imports no numpy (0.1-0.2 s of
every launch's start-up, before any server starts).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from ftcluster.errors import UserError
from ftcluster.job.config import LivenessConfig
from ftcluster.plan.parallel import Plan
from ftcluster.engines import engine_for
from ftcluster.spec.cluster import Liveness
from ftcluster.spec.model import ClientDefaults, ModelSpec

# The probe's own sequence (sequence-batching models): far from the ids clients count up from 1.
PROBE_SEQUENCE_ID = 7_340_000_000_000_000_001


def liveness_config(model: ModelSpec, plan: Plan, client: ClientDefaults, liveness: Liveness,
                    metrics_port: int) -> LivenessConfig | None:
    """The job's probe for a serving run; None when the spec turns it off (interval 0)."""
    if not liveness.interval:
        return None
    try:
        cfg = engine_for(model).served_config(model, plan)
    except (OSError, ValueError, UserError) as exc:
        raise UserError(f"cannot read the config of {model.name} to make the liveness probe: {exc}",
                        field="server.liveness",
                        hint="fix the config, or set server.liveness.interval: 0 for no probe") from None
    made = _cached(cfg, client.hidden_size)
    return LivenessConfig(interval=liveness.interval, deadline=liveness.deadline, failures=liveness.failures,
                          model=model.name, body=made["body"], json_size=made["json_size"],
                          what=f"{made['kind']} through {model.name}", metrics_port=metrics_port)


def _made(cfg: dict[str, Any], hidden_size: int | None) -> dict[str, Any]:
    """The probe's body (base64), JSON header length and the request in words."""
    # startup: numpy and the client's encoders only when a probe request is made (it is cached)
    from ftcluster.client.modelio import build_request, output_names, parse_config
    from ftcluster.client.rawtriton import encode_infer

    io = parse_config(cfg)
    try:
        # vocab_size 3: the one prompt token is id 1, valid in every vocabulary.
        request = build_request(io, 1, 1, 1, vocab_size=3, hidden_size=hidden_size)
    except UserError as exc:
        raise UserError(f"the liveness probe cannot be made: {exc.message}", field="server.liveness",
                        hint="set server.liveness.interval: 0 for no probe (rank deaths are still seen)") from None
    params = ({"sequence_id": PROBE_SEQUENCE_ID, "sequence_start": True, "sequence_end": True}
              if io.sequence_batching else None)
    body, json_size = encode_infer(request.arrays, output_names(io), params)
    kind = {"encoder": "an encoder input of 1 token", "text": "a 1-word prompt for 1 output token"}.get(
        io.style, "1 prompt token for 1 output token")
    return {"body": base64.b64encode(body).decode(), "json_size": json_size, "kind": kind}


# What makes the request, beside the config: a change to any of them is another key.
_SOURCES = ("render/liveness_request.py", "client/modelio.py", "client/rawtriton.py")


def _cached(cfg: dict[str, Any], hidden_size: int | None) -> dict[str, Any]:
    """_made's answer, from the cache when this config was probed before (a damaged or
    unwritable cache only costs the making)."""
    # startup: the run store (sqlite3) only when the cache is used
    from ftcluster.run.store import cache_root, keep_in_cache

    key = hashlib.sha256(json.dumps([cfg, hidden_size], sort_keys=True).encode())
    here = Path(__file__).parents[1]   # the package
    for name in _SOURCES:
        key.update((here / name).read_bytes())
    path = cache_root() / "probes" / f"{key.hexdigest()}.json"
    try:
        kept = json.loads(path.read_text())
        if isinstance(kept, dict) and {"body", "json_size", "kind"} <= kept.keys():
            return kept
    except (OSError, ValueError):
        pass
    made = _made(cfg, hidden_size)
    keep_in_cache(path, json.dumps(made))
    return made
