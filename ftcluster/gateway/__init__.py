"""An async HTTP API in front of Triton for an FT model: JSON prompts in, token ids / text out.

`ftcluster gateway --triton HOST:PORT --model NAME` serves `create_app(GatewayConfig(...))` with
uvicorn; FastAPI writes the OpenAPI docs (/docs, /openapi.json).
"""

from ftcluster.gateway.app import GatewayConfig, create_app

__all__ = ["GatewayConfig", "create_app"]
