"""FasterTransformer behind the engine seam: its model spec and model types, config.pbtxt and
config.ini, the plan's rule (tensor_para_size = GPUs per node, pipeline_para_size = nodes) and
its checks, the checkpoint and its converters, the per-run model repository, what the ranks
must see in their containers. `ENGINE` is what ftcluster.spec.engines loads by name."""

from ftcluster.engines.fastertransformer.engine import ENGINE

__all__ = ["ENGINE"]
