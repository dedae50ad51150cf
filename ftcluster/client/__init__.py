"""Client of a served FT model: identity test, load test and text test over HTTP or gRPC.

    from ftcluster.client import Endpoint, run_identity, run_bench, parse_steps, run_text
    result = run_identity(Endpoint.parse("localhost:8000"), "fastertransformer")
    texts = run_text(Endpoint.parse("localhost:8000"), "ensemble", ["Hello"]).texts
"""

from ftcluster.client.bench import BenchResult, Step, StepResult, parse_steps, run_bench
from ftcluster.client.endpoint import Endpoint
from ftcluster.client.identity import Check, IdentityResult, run_identity, run_identity_async
from ftcluster.client.text import TextResult, TextRow, run_text, run_text_async

__all__ = ["BenchResult", "Check", "Endpoint", "IdentityResult", "Step", "StepResult", "TextResult",
           "TextRow", "parse_steps", "run_bench", "run_identity", "run_identity_async", "run_text",
           "run_text_async"]
