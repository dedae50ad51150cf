"""FasterTransformer's serving image: Triton with the FT backend, built by the Dockerfile of the
user's fastertransformer_backend checkout (triton-inference-server/fastertransformer_backend), its
tritonserver base chosen by TRITON_VERSION."""

from ftcluster.engines.base import ImageRecipe

IMAGE = ImageRecipe(
    source="a fastertransformer_backend checkout, which has docker/Dockerfile",
    dockerfile="docker/Dockerfile",
    version_arg="TRITON_VERSION",
    repository="ftcluster/triton_with_ft",
)
