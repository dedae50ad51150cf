"""Client of a served FT model: identity test and load test over HTTP or gRPC.

    from ftcluster.client import Endpoint, run_identity, run_bench, parse_steps
    result = run_identity(Endpoint.parse("localhost:8000"), "fastertransformer")
"""

from ftcluster.client.bench import BenchResult, Step, StepResult, parse_steps, run_bench
from ftcluster.client.endpoint import Endpoint
from ftcluster.client.identity import Check, IdentityResult, run_identity, run_identity_async

__all__ = ["BenchResult", "Check", "Endpoint", "IdentityResult", "Step", "StepResult", "parse_steps",
           "run_bench", "run_identity", "run_identity_async"]
