"""run.json: a run records what served it, including the image `ftcluster image build` made."""

from __future__ import annotations

from pathlib import Path

from ftcluster.service.image import record_build
from ftcluster.launch.run import run_metadata
from ftcluster.engines.fastertransformer.plan import plan_for
from tests.helpers_specs import ckpt, cluster, facts, model


def test_run_metadata_carries_the_built_image_and_plan(tmp_path: Path) -> None:
    c = cluster(scheduler="slurm", partition="gpu", workspace=str(tmp_path / "ws"), gpus_per_node=2,
                container={"runtime": "docker", "image": "team/triton_ft:22.12"})
    m = model()
    plan = plan_for(c, m, facts(), ckpt(tp=2, heads=16, layers=24), 2, 2)
    assert run_metadata(c, m, plan, "r1")["image"]["built"] is None  # not built here
    (tmp_path / "ft").mkdir()
    record_build(c, "team/triton_ft:22.12", "sha256:abc", "22.12", tmp_path / "ft", None)
    meta = run_metadata(c, m, plan, "r1")
    assert meta["image"]["tag"] == "team/triton_ft:22.12"
    assert meta["image"]["built"]["image_id"] == "sha256:abc"
    assert meta["image"]["built"]["triton_version"] == "22.12"
    assert meta["plan"]["tensor_para_size"] == 2 and meta["plan"]["pipeline_para_size"] == 2
