"""`gateway`: the HTTP API in front of a Triton endpoint (needs the `gateway` extra)."""

from __future__ import annotations

import importlib.util

import click

from ftcluster.cli import cli
from ftcluster.cli.numbers import DAY, count, seconds, tcp_port
from ftcluster.cli.options_access import token_options
from ftcluster.errors import UserError


@cli.command("gateway")
@click.option("--triton", "triton_url", default=None, help="Triton's HTTP endpoint, HOST:PORT.")
@token_options("--triton")
@click.option("--model", default=None,
              help="The model to query (an FT model or FT-style ensemble) [default: the run's model with --run].")
@click.option("--tokenizer", default=None,
              help="'bytes' (the demo's byte-level TEST tokenizer) or a transformers name/path; "
                   "enables 'prompt' for token-id models and text in responses.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=tcp_port(), default=9000, show_default=True)
@click.option("--timeout", type=seconds(DAY), default=60.0, show_default=True,
              help="Seconds per request before answering 504.")
@click.option("--max-input-tokens", type=count(), default=4096, show_default=True)
@click.option("--max-tokens", type=count(), default=4096, show_default=True,
              help="Largest max_tokens a request may ask for.")
@click.option("--max-batch", type=count(), default=64, show_default=True)
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def gateway_cmd(triton_url: str | None, run_ref: str | None, token_file: str | None, token: str | None,
                ca: str | None, model: str | None,
                tokenizer: str | None, host: str, port: int, timeout: float,
                max_input_tokens: int, max_tokens: int, max_batch: int, log_level: str) -> None:
    """Serve a JSON generation API (OpenAPI docs at /docs) in front of Triton.

    \b
    Example:
      ftcluster gateway --triton localhost:8000 --model ensemble --port 9000
      curl -s localhost:9000/v1/generate -H 'content-type: application/json' \\
          -d '{"prompt": "Hello", "max_tokens": 8}'
    """
    try:
        # optional extra: gateway (fastapi, uvicorn)
        import uvicorn

        from ftcluster.gateway.app import GatewayConfig, create_app
        from ftcluster.gateway.request import Limits
    except ImportError as exc:
        raise UserError(f"the gateway needs {exc.name}", hint="pip install 'ftcluster[gateway]'") from None
    # startup: only once the gateway's extra is found
    from ftcluster.access.run_access import model_to_query, resolve_endpoint

    # A bad --triton, run or token file fails here, naming its option.
    endpoint = resolve_endpoint(triton_url, run_ref, "http", timeout, token, token_file, url_option="--triton", ca=ca)
    model = model_to_query(model, run_ref)
    triton_url = endpoint.url
    cfg = GatewayConfig(triton_url, model, tokenizer, timeout,
                        Limits(max_input_tokens=max_input_tokens, max_tokens=max_tokens, max_batch=max_batch),
                        token=endpoint.token, ssl_context=endpoint.ssl_context() if endpoint.tls else None)
    click.echo(f"gateway for {model!r} at {triton_url}: http://{host}:{port}/v1/generate (docs: /docs)", err=True)
    # uvicorn takes uvloop and httptools when they are installed (the gateway extra).
    if not all(importlib.util.find_spec(m) is not None for m in ("uvloop", "httptools")):
        click.echo("uvloop/httptools not installed, slower: pip install 'ftcluster[gateway]'", err=True)
    uvicorn.run(create_app(cfg), host=host, port=port, log_level=log_level, access_log=False)
