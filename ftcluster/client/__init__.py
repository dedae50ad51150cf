"""Client of a model served by Triton: identity test, load test and text test over HTTP or gRPC.

    from ftcluster.client import Endpoint, run_identity, run_bench, parse_steps, run_text
    result = run_identity(Endpoint.parse("localhost:8000"), "gpt")
    texts = run_text(Endpoint.parse("localhost:8000"), "ensemble", ["Hello"]).texts

The names below are imported on first use (PEP 562): `launch` renders its liveness probe with
ftcluster.client.modelio and .rawtriton alone, and importing a submodule runs this file first;
eager imports here would add asyncio, multiprocessing and the three test modules to every launch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftcluster.client.bench import BenchResult, Step, StepResult, parse_steps, run_bench
    from ftcluster.client.endpoint import Endpoint
    from ftcluster.client.identity import Check, IdentityResult, run_identity, run_identity_async
    from ftcluster.client.text import TextResult, TextRow, run_text, run_text_async

# public name -> the submodule that defines it
_WHERE = {
    "BenchResult": "bench", "Step": "bench", "StepResult": "bench", "parse_steps": "bench", "run_bench": "bench",
    "Endpoint": "endpoint",
    "Check": "identity", "IdentityResult": "identity", "run_identity": "identity", "run_identity_async": "identity",
    "TextResult": "text", "TextRow": "text", "run_text": "text", "run_text_async": "text",
}

__all__ = ["BenchResult", "Check", "Endpoint", "IdentityResult", "Step", "StepResult", "TextResult",
           "TextRow", "parse_steps", "run_bench", "run_identity", "run_identity_async", "run_text",
           "run_text_async"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value   # once: later lookups skip this function
    return value
