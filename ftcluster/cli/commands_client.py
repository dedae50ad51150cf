"""`ftcluster client identity|bench|text`: correctness test, load test and end-to-end text test
against a Triton endpoint.

Also what the launcher runs on rank 0's node (`python -m ftcluster.client identity ...`).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ftcluster.cli import cli
from ftcluster.cli.numbers import DAY, count, fraction, seconds
from ftcluster.cli.options_access import token_options
from ftcluster.client.endpoint import PROTOCOLS, Endpoint
from ftcluster.errors import UserError, os_error_words
from ftcluster.access.run_access import model_to_query, resolve_endpoint

# The model a client asks for when neither --model nor --run names one: the embedded demo
# model's (ftcluster/demo/model.yaml, what `ftcluster launch` serves without --model).
MODEL_HELP = "Model name on the server [default: the run's model with --run, else the demo model's]."


def _model(model: str | None, run_ref: str | None) -> str:
    if model:
        return model
    # startup: the demo spec is read (YAML) only where no --model names the model
    from ftcluster.spec.defaults import embedded_model_name

    return model_to_query(None, run_ref, embedded_model_name())


def _with_endpoint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Where the client sends its requests, as one `endpoint` argument: --url, or --run for a
    recorded run's endpoint, with a private run's token (token_options); and which `model` it
    asks for (model_to_query)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, url: str | None, run_ref: str | None, protocol: str, timeout: float,
                token: str | None, token_file: str | None, ca: str | None, **kwargs: Any) -> Any:
        endpoint = resolve_endpoint(url, run_ref, protocol, timeout, token, token_file, ca=ca)
        return fn(*args, endpoint=endpoint, **{**kwargs, "model": _model(kwargs["model"], run_ref)})

    opts = [
        click.option("--url", default=None, help="Triton HOST:PORT (HTTP or gRPC port, per --protocol)."),
        click.option("--protocol", type=click.Choice(PROTOCOLS), default="http", show_default=True),
        click.option("--timeout", type=seconds(DAY), default=60.0, show_default=True, help="Per-request timeout (s)."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return token_options("--url")(wrapper)


def _endpoint_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--model", default=None, help=MODEL_HELP),
        click.option("--batch-size", type=count(), default=None,
                     help="Sequences per request (default: identity 2, bench 1)."),
        click.option("--input-len", type=count(), default=8, show_default=True,
                     help="Prompt tokens (words, for a text ensemble)."),
        click.option("--output-len", type=count(), default=8, show_default=True, help="Tokens to generate."),
        click.option("--seed", type=count(0, 2**32 - 1), default=0, show_default=True, help="Seed of the random prompt."),
        click.option("--hidden-size", type=count(), default=None,
                     help="bert: the hidden size of input_hidden_state (config.ini [bert] hidden_size)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return _with_endpoint(fn)


def _writable(**outputs: str | None) -> None:
    """Refuse, before any request is sent, an output file that could not be written at the end:
    a long bench's result is not to be lost to a mistyped folder. Each given path's nearest
    existing folder must take a new file (a probe made and removed there; no folder is made)."""
    for option, path in outputs.items():
        if not path:
            continue
        flag = "--" + option.replace("_", "-")
        folder = Path(path).expanduser().absolute().parent
        try:
            while not folder.exists():
                folder = folder.parent
            fd, probe = tempfile.mkstemp(prefix=".ftcluster-probe-", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror or exc}; nothing was sent", field=flag,
                            hint="choose a folder you can write to") from None


def _write_result(path: str | None, data: dict[str, Any], option: str = "--result-file") -> None:
    if path:
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
            tmp.replace(target)  # readers (the launcher) never see half a file
        except OSError as exc:
            raise UserError(f"cannot write {path}: {os_error_words(exc)}", field=option,
                            hint="choose a folder you can write to") from None


@cli.group("client")
def client_group() -> None:
    """Test, benchmark and run prompts through a model served by Triton.

    \b
    Examples:
      ftcluster client identity --url node1:8000 --model gpt
      ftcluster client bench --url node1:8001 --protocol grpc --concurrency 1,4,16 --csv out.csv
      ftcluster client text --url node1:8000 --model t5 --prompts en.txt --tokenizer t5-small \\
          --reference de.txt
    """


@client_group.command("identity")
@_endpoint_options
@click.option("--repeats", type=count(), default=3, show_default=True, help="Requests to send (each is checked).")
@click.option("--vocab-size", type=count(1, 2**31 - 1), default=50257, show_default=True, help="Random ids stay below this.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--result-file", type=click.Path(dir_okay=False), help="Also write the JSON result here.")
@click.option("--save", "save_path", type=click.Path(dir_okay=False),
              help="Write this run's request and tokens as a reference for --against.")
@click.option("--against", "against_path", type=click.Path(dir_okay=False),
              help="Also check that the tokens equal those of a reference written by --save.")
def identity_cmd(endpoint: Endpoint, model: str, batch_size: int | None,
                 input_len: int, output_len: int, seed: int, hidden_size: int | None, repeats: int,
                 vocab_size: int,
                 as_json: bool, result_file: str | None, save_path: str | None,
                 against_path: str | None) -> int:
    """Send random token ids (or text, for an ensemble) with the inputs the model's config
    declares and check output_ids/sequence_length. Exits 1 when a check fails.

    \b
    Example:
      ftcluster client identity --url localhost:8000 --batch-size 4 --json   # the demo model
      ftcluster client identity --url localhost:8000 --save tp1.json      # one plan...
      ftcluster client identity --url localhost:8000 --against tp1.json   # ...then another
    """
    # startup: each subcommand's code only when it runs, not for `client --help`
    from ftcluster.client.identity import (
        check_against,
        format_identity,
        load_reference,
        reference_of,
        run_identity,
    )

    _writable(result_file=result_file, save=save_path)
    reference = load_reference(against_path) if against_path else None
    result = run_identity(endpoint, model, batch_size=batch_size or 2, input_len=input_len,
                          output_len=output_len, repeats=repeats, seed=seed, vocab_size=vocab_size,
                          hidden_size=hidden_size)
    if reference is not None and result.ok:
        result.checks.append(check_against(result, reference, Path(against_path or "").name))
    if save_path:
        _write_result(save_path, reference_of(result), "--save")
    _write_result(result_file, result.to_dict())
    click.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json else format_identity(result))
    return 0 if result.ok else 1


@client_group.command("bench")
@_endpoint_options
@click.option("--concurrency", default=None, help="Closed-loop steps, e.g. 1,2,4,8,16 (default when no --rate).")
@click.option("--rate", default=None, help="Open-loop Poisson request rates (req/s), e.g. 100,200.")
@click.option("--duration", type=seconds(DAY), default=5.0, show_default=True, help="Measurement window per step (s).")
@click.option("--warmup", type=seconds(DAY, zero_ok=True), default=1.0, show_default=True, help="Warm-up before each window (s).")
@click.option("--windows", type=count(1, 1000), default=3, show_default=True, help="Sub-windows for the stability check.")
@click.option("--stability", type=fraction(), default=0.1, show_default=True,
              help="Stable when every sub-window is within this fraction of their mean.")
@click.option("--processes", type=count(1, 4096), default=1, show_default=True, help="Load processes (for many-core clients).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Write one CSV row per step.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write latency vs throughput PNG.")
@click.option("--result-file", type=click.Path(dir_okay=False), help="Also write the JSON result here.")
def bench_cmd(endpoint: Endpoint, model: str, batch_size: int | None, input_len: int,
              output_len: int, seed: int, hidden_size: int | None, concurrency: str | None, rate: str | None, duration: float,
              warmup: float, windows: int, stability: float, processes: int, as_json: bool,
              csv_path: str | None, plot_path: str | None, result_file: str | None) -> int:
    """Closed-loop concurrency sweep and/or open-loop Poisson rates: req/s, tokens/s and
    latency p50/p90/p99/max per step. Exits 1 when a step had errors or no completed request.

    \b
    Example:
      ftcluster client bench --url localhost:8000 --concurrency 1,4,16 --rate 200 --csv bench.csv
    """
    # startup: each subcommand's code only when it runs, not for `client --help`
    from ftcluster.client.bench import format_table, parse_steps, run_bench, write_csv, write_plot

    steps = parse_steps(concurrency if concurrency or rate else "1,2,4,8,16", rate)
    _writable(result_file=result_file, csv=csv_path, plot=plot_path)
    result = run_bench(endpoint, model, steps, batch_size=batch_size or 1, input_len=input_len,
                       output_len=output_len, warmup_s=warmup, duration_s=duration, windows=windows,
                       stability=stability, processes=processes, seed=seed, hidden_size=hidden_size)
    _write_result(result_file, result.to_dict())
    for option, path, write in (("--csv", csv_path, write_csv), ("--plot", plot_path, write_plot)):
        if path:
            try:
                write(result, path)
            except OSError as exc:
                raise UserError(f"cannot write {path}: {os_error_words(exc)}", field=option) from None
    click.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json else format_table(result))
    return 0 if result.ok else 1


@client_group.command("text")
@_with_endpoint
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--prompts", "prompts_path", required=True, metavar="FILE", help="Text file, one prompt per line.")
@click.option("--tokenizer", default=None, metavar="bytes|NAME",
              help="'bytes' (the demo's byte-level TEST tokenizer) or a transformers name/path; needed "
                   "for token-id models, unused by text models (ensembles tokenize inside Triton).")
@click.option("--reference", "reference_path", default=None, metavar="FILE",
              help="One reference per prompt: print corpus BLEU of the outputs (sacrebleu).")
@click.option("--output-len", type=count(), default=16, show_default=True, help="Tokens to generate.")
@click.option("--batch-size", type=count(), default=None,
              help="Prompts per request (default: 8, or the model's max_batch_size if smaller).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--result-file", type=click.Path(dir_okay=False), help="Also write the JSON result here.")
def text_cmd(endpoint: Endpoint, model: str, prompts_path: str, tokenizer: str | None, reference_path: str | None,
             output_len: int, batch_size: int | None, as_json: bool,
             result_file: str | None) -> int:
    """Prompts in, text out: tokenize, send batched requests with the inputs the model's config
    declares, decode output_ids up to sequence_length (a decoder-only model's prompt is cut
    off), and print each prompt -> text with the latency. With --reference, also corpus BLEU
    (for translation models such as T5). A transformers tokenizer and BLEU need
    `pip install 'ftcluster[text]'`. Exits 1 when a request fails.

    \b
    Examples:
      ftcluster client text --url localhost:8000 --prompts prompts.txt --tokenizer bytes
      ftcluster client text --url localhost:8001 --protocol grpc --model ensemble --prompts prompts.txt
      ftcluster client text --url node1:8000 --model t5 --tokenizer t5-small --prompts en.txt \\
          --reference de.txt --output-len 64
    """
    # startup: each subcommand's code only when it runs, not for `client --help`
    from ftcluster.client.text import format_text, read_prompts, read_references, run_text

    _writable(result_file=result_file)
    prompts = read_prompts(prompts_path)
    references = read_references(reference_path, len(prompts)) if reference_path else None
    result = run_text(endpoint, model, prompts, tokenizer=tokenizer, output_len=output_len,
                      batch_size=batch_size, references=references)
    _write_result(result_file, result.to_dict())
    click.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json else format_text(result))
    return 0 if result.ok else 1
