"""Does the hand-written keep-alive HTTP client pay against tritonclient on a realistic request?

    python bench/http_transport.py [--concurrency 1,8] [--seconds 3] [--repeats 5]
                                   [--batch 8] [--input-len 512] [--output-len 128] [--model-ms 0]

One real CPU tritonserver serving the faithful FT test model (ftcluster/demo/model_repository;
with --model-ms > 0 a copy that sleeps that long per batch), requests of realistic size
(batch 8 x 512 input tokens, 128 output tokens: output_ids and sequence_length back, about
20 KB each way). Per repeat and concurrency, closed loops in alternating order, same server,
same process:
- per request (the gateway's pattern: build the inputs, send, decode the outputs to arrays):
  `tritonclient`  tritonclient.http.aio InferenceServerClient.infer + as_numpy
  `raw`           ftcluster.client.rawtriton.TritonHttp.infer (ftcluster's keep-alive pool)
- fixed request (the load test's pattern: the same encoded request again and again):
  `tritonclient fixed`  tritonclient.http.aio infer with InferInput objects built once
  `raw fixed`           TritonHttp.infer_payload once, then its pool (what `client bench` does)
Prints the medians of req/s, p50 latency and this process's CPU per request, and the ratios
raw / tritonclient (req/s; above 1: the hand-written client is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import load
import report

from tests.triton_server import running_tritonserver, slow_demo_model

DEMO_REPO = ROOT / "ftcluster" / "demo" / "model_repository"
OUTPUTS = ["output_ids", "sequence_length"]
Send = Callable[[], Awaitable[None]]


async def closed_loop(send: Send, concurrency: int, seconds: float) -> dict[str, float]:
    r = await load.closed_loop(send, concurrency, seconds)
    return {"req_s": r.rate, "p50_ms": r.p50_ms, "cpu_ms": r.client_ms}


def arrays_of(args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(1, 50000, (args.batch, args.input_len), dtype=np.uint32),
            "input_lengths": np.full((args.batch, 1), args.input_len, np.uint32),
            "request_output_len": np.full((args.batch, 1), args.output_len, np.uint32)}


async def measure(url: str, model: str, concurrency: int, args: argparse.Namespace,
                  runs: dict[str, list[dict[str, float]]]) -> None:
    import tritonclient.http as th
    from tritonclient.http import aio

    from ftcluster.client.rawtriton import TritonHttp

    arrays = arrays_of(args)
    width = args.input_len + args.output_len

    def inputs() -> list[th.InferInput]:
        out = []
        for name, arr in arrays.items():
            inp = th.InferInput(name, list(arr.shape), "UINT32")
            inp.set_data_from_numpy(arr, binary_data=True)
            out.append(inp)
        return out

    def outputs() -> list[th.InferRequestedOutput]:
        return [th.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS]

    tc = aio.InferenceServerClient(url, conn_limit=concurrency)
    raw = TritonHttp(url, 60.0, concurrency)
    body, json_size = th.InferenceServerClient.generate_request_body(inputs(), outputs=outputs())
    fixed = TritonHttp(url, 60.0, concurrency)
    payload = fixed.infer_payload(model, body, json_size)
    fixed_in, fixed_out = inputs(), outputs()

    async def tc_send() -> None:
        res = await tc.infer(model, inputs(), outputs=outputs())
        assert res.as_numpy("output_ids").shape[-1] == width and res.as_numpy("sequence_length") is not None

    async def raw_send() -> None:
        got = await raw.infer(model, arrays, OUTPUTS)
        assert got["output_ids"].shape[-1] == width and "sequence_length" in got

    async def tc_fixed() -> None:
        res = await tc.infer(model, fixed_in, outputs=fixed_out)
        assert res.get_response() is not None

    async def raw_fixed() -> None:
        reply = await fixed.pool.request(payload)
        assert reply.status == 200

    phases = {"tritonclient": tc_send, "raw": raw_send,
              "tritonclient fixed": tc_fixed, "raw fixed": raw_fixed}
    try:
        for send in phases.values():  # warm-up: connections, the model's first batches
            await closed_loop(send, concurrency, 0.5)
        for i in range(args.repeats):
            order = list(phases.items()) if i % 2 == 0 else list(reversed(phases.items()))
            for name, send in order:
                res = await closed_loop(send, concurrency, args.seconds)
                runs[f"c={concurrency} {name}"].append(res)
                print(f"c={concurrency} repeat {i + 1} {name:18} {res['req_s']:7.1f} req/s "
                      f"p50 {res['p50_ms']:6.2f} ms cpu {res['cpu_ms']:.3f} ms/req", file=sys.stderr, flush=True)
    finally:
        await tc.close()
        await raw.close()
        await fixed.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--model-ms", type=float, default=0.0, help="sleep per batch (0: the test model as shipped)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    names = ("tritonclient", "raw", "tritonclient fixed", "raw fixed")
    runs: dict[str, list[dict[str, float]]] = {f"c={c} {n}": [] for c in levels for n in names}
    with tempfile.TemporaryDirectory(prefix="ftc-bench-http-") as tmp:
        repos, model = [DEMO_REPO], "fastertransformer"
        if args.model_ms > 0:
            model = "fastertransformer_slow"
            repos = [slow_demo_model(Path(tmp) / "repo", model, args.model_ms)]
        with running_tritonserver(repos, log_dir=Path(tmp) / "logs",
                                  extra_args=["--model-control-mode=explicit", f"--load-model={model}"]) as server:
            for c in levels:
                asyncio.run(measure(server.http_url, model, c, args, runs))
    med = report.medians(runs)
    print(f"batch {args.batch} x {args.input_len} tokens in, {args.output_len} out, model sleep "
          f"{args.model_ms:g} ms/batch; {args.seconds:g} s x {args.repeats} repeats, medians:")
    report.table(med, [("req_s", "req/s", ".1f"), ("p50_ms", "p50 ms", ".2f"), ("cpu_ms", "client CPU ms/req", ".3f")])
    report.print_ratios(med, "req_s", [(f"c={c} raw{s}", f"c={c} tritonclient{s}") for c in levels
                                       for s in ("", " fixed")], what="req/s")
    report.print_ratios(med, "cpu_ms", [(f"c={c} tritonclient{s}", f"c={c} raw{s}") for c in levels
                                        for s in ("", " fixed")], what="client CPU")
    report.print_json(med, repeats=args.repeats, seconds=args.seconds, batch=args.batch,
                      input_len=args.input_len, output_len=args.output_len, model_ms=args.model_ms)


if __name__ == "__main__":
    main()
