"""ftcluster: serve a model with Triton + FasterTransformer across Slurm GPU nodes."""

__version__ = "0.1.0"
