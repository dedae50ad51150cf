"""Planning + rendering for 1024 nodes must take well under a second (issue 3).

Times `plan_for` + `render` for every launch style at 1024 nodes (median of repeats) and
prints the ratio against the same work for 1 node, measured in the same run:

    python bench/render_1024.py [--repeats 15] [--budget 1.0]

Exits non-zero when a 1024-node median exceeds --budget seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftcluster.engines.fastertransformer.checkpoint import CheckpointFacts, Split  # noqa: E402
from ftcluster.engines.fastertransformer.plan import ModelFacts, plan_for  # noqa: E402
from ftcluster.render.scripts import STYLE_TEMPLATE, RenderOptions, RunPaths, render, templates_dir  # noqa: E402
from ftcluster.spec.cluster import ClusterSpec  # noqa: E402
from ftcluster.engines.fastertransformer.spec import FTModelSpec as ModelSpec  # noqa: E402

CLUSTERS = {
    "local": {"scheduler": "local"},
    "none": {"scheduler": "slurm", "partition": "gpu", "container": {"runtime": "none"}},
    "pyxis": {"scheduler": "slurm", "partition": "gpu",
              "container": {"runtime": "pyxis", "image": "/i.sqsh", "mounts": ["/m:/m:ro"]}},
    "docker": {"scheduler": "slurm", "container": {"runtime": "docker", "image": "triton:ft"}},
    "ssh_docker": {"scheduler": "ssh", "hosts": [f"gpu{i:04d}" for i in range(4096)],
                   "container": {"runtime": "docker", "image": "triton:ft"}},
}


def once(style: str, nodes: int) -> float:
    cluster = ClusterSpec.model_validate({"name": "b", "gpus_per_node": 8, "max_nodes": 4096, **CLUSTERS[style]})
    model = ModelSpec.model_validate({"name": "ensemble", "model_type": "GPT", "repository": "/r",
                                      "checkpoint_root": "/c"})
    facts = ModelFacts("fastertransformer", ((1, "KIND_CPU"),), True, False, 8)
    ckpt = CheckpointFacts(Path("/c"), (8,), Path("/c/8-gpu"), Path("/c/8-gpu/config.ini"),
                           (Split("gpt", 96, 1024 * 2),), None, "fp16")
    t0 = time.perf_counter()
    plan = plan_for(cluster, model, facts, ckpt, nodes, 8)
    render(cluster, model, plan, RunPaths("bench", Path("/shared/runs/bench")),
           RenderOptions(python="/py"))
    return time.perf_counter() - t0


def median(style: str, nodes: int, repeats: int) -> float:
    once(style, nodes)  # warm the template cache
    return statistics.median(once(style, nodes) for _ in range(repeats))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds allowed for 1024 nodes")
    args = ap.parse_args()
    worst = 0.0
    print(f"{'style':10} {'1 node':>10} {'1024 nodes':>12} {'ratio':>7}")
    for style in CLUSTERS:
        if not (templates_dir() / STYLE_TEMPLATE[style]).is_file():
            print(f"{style:10} (no template)")
            continue
        base = median(style, 1, args.repeats)
        big = median(style, 1024, args.repeats)
        worst = max(worst, big)
        print(f"{style:10} {base * 1e3:8.2f}ms {big * 1e3:10.2f}ms {big / base:6.2f}x")
    ok = worst < args.budget
    print(f"slowest 1024-node plan+render: {worst * 1e3:.2f} ms ({'OK' if ok else 'OVER'} budget {args.budget}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
