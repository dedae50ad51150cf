"""The CUDA test model's decoder math (gpt_cuda.py): every tp x pp split gives the tokens of the
whole model. Runs on torch's CPU tensors, so it needs torch but no GPU (skipped without torch)."""

from __future__ import annotations

import configparser
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the CUDA test model's math needs it)")

MODEL_DIR = Path(__file__).resolve().parents[2] / "ftcluster/demo/model_repository/fastertransformer/1"


def _gpt_cuda() -> Any:
    spec = importlib.util.spec_from_file_location("gpt_cuda", MODEL_DIR / "gpt_cuda.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpt_cuda"] = mod
    spec.loader.exec_module(mod)
    return mod


def _dims(mod: Any, layers: int = 4) -> Any:
    ini = configparser.ConfigParser()
    ini.read_string(f"[gpt]\nhead_num=4\nsize_per_head=8\ninter_size=64\nnum_layer={layers}\n"
                    "vocab_size=97\nmax_pos_seq_len=64\n")
    return mod.Dims(ini, "gpt")


def _run(mod: Any, dims: Any, tp: int, pp: int, ids: np.ndarray, in_lens: np.ndarray,
         out_lens: np.ndarray, seed: int = 0) -> np.ndarray:
    """All stages in this process on CPU; the all-reduce is a plain sum, send/recv a copy."""
    stages = [mod.Stage(dims, seed, tp, pp, s, [torch.device("cpu")] * tp, torch.float64) for s in range(pp)]

    def allreduce(parts: list[Any]) -> None:
        total = sum(p.clone() for p in parts)
        for p in parts:
            p.copy_(total)

    def step(batch_ids: Any, positions: Any) -> Any:
        hs = stages[0].embed(batch_ids)
        for st in stages:
            hs = st.forward([h.clone() for h in hs], allreduce)
        return stages[-1].next_tokens(hs[0], positions)

    with torch.no_grad():
        return mod.generate(step, ids, in_lens, out_lens)


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2), (2, 2), (4, 4)])
def test_every_split_gives_the_whole_models_tokens(tp: int, pp: int) -> None:
    mod = _gpt_cuda()
    dims = _dims(mod)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, dims.vocab, size=(3, 7))
    in_lens, out_lens = np.array([7, 3, 5]), np.array([6, 6, 2])
    whole = _run(mod, dims, 1, 1, ids, in_lens, out_lens)
    assert np.array_equal(_run(mod, dims, tp, pp, ids, in_lens, out_lens), whole)
    assert (whole[2, 2:] == 0).all()          # nothing past a row's output length


def test_tokens_depend_on_the_prompt_the_seed_and_the_layers() -> None:
    mod = _gpt_cuda()
    dims = _dims(mod)
    ids = np.arange(8).reshape(2, 4) + 5
    lens, out = np.array([4, 4]), np.array([8, 8])
    base = _run(mod, dims, 1, 1, ids, lens, out)
    assert not np.array_equal(base[0], base[1])
    assert not np.array_equal(_run(mod, dims, 1, 1, ids, lens, out, seed=1), base)
    assert not np.array_equal(_run(mod, _dims(mod, layers=2), 1, 1, ids, lens, out), base)


def test_generated_tokens_are_not_the_prompt_repeated() -> None:
    """A model that only echoes its input would make every identity test across plans pass."""
    mod = _gpt_cuda()
    dims = _dims(mod)
    ids = np.arange(8).reshape(2, 4) + 5
    out = _run(mod, dims, 1, 1, ids, np.array([4, 4]), np.array([8, 8]))
    for row, prompt in zip(out, ids):
        assert len(set(row.tolist())) > 2, row
        assert not (row == prompt[-1]).all(), row


def test_a_layer_count_pp_does_not_divide_is_refused_in_fts_words() -> None:
    mod = _gpt_cuda()
    with pytest.raises(RuntimeError, match=r"\[FT\]\[ERROR\] num_layer 4 must be divisible"):
        mod.Stage(_dims(mod), 0, 1, 3, 0, [torch.device("cpu")], torch.float64)
