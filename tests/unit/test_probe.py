"""The liveness probe's request, rendered per model type: the smallest valid inference."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from ftcluster.errors import UserError
from ftcluster.engines import make_plan
from ftcluster.render.liveness_request import PROBE_SEQUENCE_ID, liveness_config
from ftcluster.spec.cluster import Liveness
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_model
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec
from ftcluster.spec.model import ClientDefaults
from tests.helpers_specs import cluster
from tests.unit.test_zoo import IDS, REPOS, make_checkpoint, spec_for



def _header(model: ModelSpec, client: ClientDefaults | None = None) -> dict[str, Any]:
    plan = make_plan(cluster(gpus_per_node=1), model, 1)
    cfg = liveness_config(model, plan, client or model.client, Liveness(interval=5, deadline=2, failures=3), 8002)
    assert cfg is not None and (cfg.interval, cfg.deadline, cfg.failures, cfg.metrics_port) == (5, 2, 3, 8002)
    body = base64.b64decode(cfg.body)
    header: dict[str, Any] = json.loads(body[:cfg.json_size])
    # The binary tensors follow the header, exactly as long as it says.
    assert len(body) - cfg.json_size == sum(i["parameters"]["binary_data_size"] for i in header["inputs"])
    header["what"] = cfg.what
    return header


@pytest.mark.parametrize(("repo", "model_type"), REPOS.items(), ids=IDS)
def test_one_token_in_one_token_out_for_every_type(repo: Path, model_type: str, tmp_path: Path) -> None:
    client = ClientDefaults(hidden_size=8) if model_type == "bert" else None
    make_checkpoint(tmp_path, repo, model_type, 1)
    header = _header(spec_for(repo, model_type, tmp_path), client)
    dims = {i["name"]: i["shape"] for i in header["inputs"]}
    ids = next(v for k, v in dims.items() if k == "input_ids" or k == "input_hidden_state")
    # [batch 1, 1 token] (interactive GPT: [1, 1, 1]; bert: [1, 1, hidden])
    assert ids[-2 if model_type == "bert" else -1] == 1 and all(d == 1 for d in ids[:-1 if model_type != "bert" else -2])
    for name in ("request_output_len", "max_output_len"):
        if name in dims:
            assert all(d == 1 for d in dims[name])
    sequence = "parameters" in header
    assert sequence == (repo.name == "gpt-interactive")
    if sequence:   # its own correlation id, START and END in one request
        assert header["parameters"] == {"sequence_id": PROBE_SEQUENCE_ID, "sequence_start": True,
                                        "sequence_end": True}


def test_an_ensemble_is_probed_through_the_ensemble() -> None:
    demo = load_model(embedded_model_path())
    ensemble = demo.model_copy(update={"name": "ensemble", "repository": demo.repository.parent / "ensemble_repository"})
    header = _header(ensemble)
    assert header["what"].endswith("through ensemble")
    assert [i["datatype"] for i in header["inputs"]].count("BYTES") >= 1   # the text prompt


def test_no_probe_when_turned_off_and_a_clear_refusal_when_none_can_be_made(tmp_path: Path) -> None:
    demo = load_model(embedded_model_path())
    plan = make_plan(cluster(gpus_per_node=1), demo, 1)
    assert liveness_config(demo, plan, demo.client, Liveness(interval=0), 8002) is None
    broken = tmp_path / "repo" / demo.name
    broken.mkdir(parents=True)
    (broken / "config.pbtxt").write_text("this is not a model config")
    with pytest.raises(UserError) as exc:
        liveness_config(demo.model_copy(update={"repository": tmp_path / "repo"}), plan, demo.client, Liveness(), 8002)
    assert exc.value.field == "server.liveness" and "interval: 0" in (exc.value.hint or "")


_IN_A_FRESH_PROCESS = """
import json, sys
from ftcluster.engines import make_plan
from ftcluster.render.liveness_request import liveness_config
from ftcluster.spec.cluster import Liveness
from ftcluster.spec.defaults import embedded_model_path
from ftcluster.spec.load import load_model
from tests.helpers_specs import cluster
demo = load_model(embedded_model_path())
cfg = liveness_config(demo, make_plan(cluster(gpus_per_node=1), demo, 1), demo.client, Liveness(), 8002)
print(json.dumps([cfg.body, cfg.json_size, cfg.what, "numpy" in sys.modules]))
"""


def test_a_model_probed_before_is_probed_from_the_cache_without_numpy(tmp_path: Path) -> None:
    """The request is made once per model config (numpy and the client's request builder cost a
    launch 0.1-0.2 s before any server starts); later launches read it from the cache, and a
    damaged cache entry is made again."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "FTCLUSTER_CACHE": str(tmp_path / "cache")}

    def probe() -> list[Any]:
        r = subprocess.run([sys.executable, "-c", _IN_A_FRESH_PROCESS], env=env, capture_output=True, text=True,
                           timeout=120, cwd=Path(__file__).resolve().parents[2], check=True)
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    first = probe()
    assert first[3] is True                      # made: the client's builder, numpy with it
    kept = list((tmp_path / "cache" / "probes").glob("*.json"))
    assert len(kept) == 1
    again = probe()
    assert again == [*first[:3], False]          # the same request, no numpy
    kept[0].write_text("{not json")
    assert probe() == first                      # made again, and kept again
    assert json.loads(kept[0].read_text())["body"] == first[0]
