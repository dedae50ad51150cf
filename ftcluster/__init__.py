"""ftcluster: serve a model with Triton and its engine (ftcluster/engines/) across Slurm GPU
nodes, and keep it served."""

__version__ = "0.1.0"
