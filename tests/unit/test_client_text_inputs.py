"""`ftcluster client text` without a server: prompt/reference files, request arrays from real FT
and demo configs, decoding rules, BLEU, and the CLI's one-line user errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ftcluster.client.modelio import parse_config
from ftcluster.client.text import (
    build_arrays,
    corpus_bleu,
    decode_outputs,
    read_prompts,
    read_references,
)
from ftcluster.client.tokenizer import ByteTokenizer
from ftcluster.errors import UserError
from tests.helpers_specs import assert_one_line_error, run_cli
from tests.unit.test_client_modelio import DEMO, fixture, load

GPT = DEMO / "model_repository" / "fastertransformer" / "config.pbtxt"
ENSEMBLE = DEMO / "ensemble_repository" / "ensemble" / "config.pbtxt"


def test_prompt_file_lines(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("héllo wörld\r\nsecond line\n\n\n", encoding="utf-8")
    assert read_prompts(f) == ["héllo wörld", "second line"]   # trailing empty lines dropped


@pytest.mark.parametrize("content, match", [
    ("", "holds no prompts"),
    ("\n \n", "holds no prompts"),
    ("one\n\nthree\n", "line 2 is empty"),
])
def test_bad_prompt_files(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "p.txt"
    f.write_text(content)
    with pytest.raises(UserError, match=match) as exc:
        read_prompts(f)
    assert exc.value.field == "--prompts"


def test_unreadable_prompt_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_prompts(tmp_path / "missing.txt")
    with pytest.raises(UserError, match="is a folder"):
        read_prompts(tmp_path)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_prompts(tmp_path / "latin1.txt")


def test_reference_lines_must_match_prompts(tmp_path: Path) -> None:
    f = tmp_path / "ref.txt"
    f.write_text("a\n\nc\n")    # an empty reference line in the middle counts
    assert read_references(f, 3) == ["a", "", "c"]
    with pytest.raises(UserError, match="has 3 lines for 2 prompts") as exc:
        read_references(f, 2)
    assert exc.value.field == "--reference"


def test_bleu() -> None:
    pytest.importorskip("sacrebleu")
    hyps = ["the cat sat on the mat today", "a dog ran in the green park"]
    score, signature = corpus_bleu(hyps, list(hyps))
    assert score == pytest.approx(100.0)
    assert "nrefs:1" in signature
    worse, _ = corpus_bleu(hyps, ["the cat sat on the mat today", "a dog ran in the blue park"])
    assert 0 < worse < 100


def test_bleu_without_sacrebleu_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    with pytest.raises(UserError, match=r"pip install 'ftcluster\[text\]'"):
        corpus_bleu(["a"], ["a"])


def test_transformers_tokenizer_without_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from ftcluster.client.tokenizer import load_tokenizer

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(UserError, match=r"pip install 'ftcluster\[text\]'"):
        load_tokenizer("some/tokenizer")


def test_gpt_arrays_pad_and_declare_lengths() -> None:
    io = parse_config(load(GPT))
    arrays, lengths = build_arrays(io, ["hi", "hello"], 5, ByteTokenizer())
    assert list(arrays) == ["input_ids", "input_lengths", "request_output_len"]
    assert lengths == [2, 5]
    assert arrays["input_ids"].dtype == np.uint32
    assert arrays["input_ids"].tolist() == [[104, 105, 0, 0, 0], list(b"hello")]
    assert arrays["input_lengths"].tolist() == [[2], [5]]
    assert arrays["request_output_len"].tolist() == [[5], [5]]


def test_real_ft_t5_arrays() -> None:
    io = parse_config(load(fixture("t5/fastertransformer/config.pbtxt")))
    arrays, _ = build_arrays(io, ["abc"], 7, ByteTokenizer())
    assert list(arrays) == ["input_ids", "sequence_length", "max_output_len"]
    assert arrays["sequence_length"].tolist() == [[3]] and arrays["max_output_len"].tolist() == [[7]]


@pytest.mark.parametrize("path", [ENSEMBLE, "gpt/ensemble/config.pbtxt"])
def test_ensemble_arrays_are_strings(path: Path | str) -> None:
    io = parse_config(load(path if isinstance(path, Path) else fixture(path)))
    arrays, lengths = build_arrays(io, ["hello there", "x"], 4, None)   # no tokenizer needed
    assert lengths is None
    assert arrays["INPUT_0"].tolist() == [[b"hello there"], [b"x"]]
    assert arrays["INPUT_1"].tolist() == [[4], [4]]
    # The bad/stop word lists the ensemble requires go as empty strings.
    assert {k: v.tolist() for k, v in arrays.items() if k in ("INPUT_2", "INPUT_3")} == {
        "INPUT_2": [[b""], [b""]], "INPUT_3": [[b""], [b""]]}


def test_token_id_model_needs_a_tokenizer() -> None:
    with pytest.raises(UserError, match="takes token ids") as exc:
        build_arrays(parse_config(load(GPT)), ["hi"], 5, None)
    assert exc.value.field == "--tokenizer"


def test_decode_cuts_the_prompt_of_decoder_models_at_sequence_length() -> None:
    io = parse_config(load(GPT))
    ids = np.array([[[104, 105, 106, 107, 999]], [[97, 98, 99, 100, 101]]], dtype=np.uint32)
    out = {"output_ids": ids, "sequence_length": np.array([[4], [5]], dtype=np.uint32)}
    rows = decode_outputs(io, ["hi", "abc"], [2, 3], out, ByteTokenizer(), echoes_prompt=True)
    assert rows == [("jk", "hijk", 2), ("de", "abcde", 2)]
    # encoder-decoder: all of output_ids is generated text
    rows = decode_outputs(io, ["hi", "abc"], [2, 3], out, ByteTokenizer(), echoes_prompt=False)
    assert rows == [("hijk", "hijk", 4), ("abcde", "abcde", 5)]


def test_decode_text_model_output() -> None:
    io = parse_config(load(ENSEMBLE))
    out = {"OUTPUT_0": np.array([[b"hello world"], [b"other"]], dtype=np.object_)}
    assert decode_outputs(io, ["hello", "x"], None, out, None, echoes_prompt=True) == [
        (" world", "hello world", None), ("other", "other", None)]
    assert decode_outputs(io, ["hello"], None, {"OUTPUT_0": out["OUTPUT_0"][:1]}, None,
                          echoes_prompt=False) == [("hello world", "hello world", None)]


def test_cli_user_errors_are_one_line(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\n")
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "ref.txt").write_text("just one\n")
    url = ["--url", "127.0.0.1:1"]   # files are checked before the server is contacted
    assert_one_line_error(run_cli("client", "text", *url, "--prompts", str(tmp_path / "nope.txt")),
                          "--prompts", "no such file")
    assert_one_line_error(run_cli("client", "text", *url, "--prompts", str(tmp_path / "empty.txt")),
                          "--prompts", "holds no prompts")
    assert_one_line_error(run_cli("client", "text", *url, "--prompts", str(prompts),
                                  "--reference", str(tmp_path / "ref.txt")),
                          "--reference", "has 1 line for 2 prompts")
    assert_one_line_error(run_cli("client", "text", "--url", "nohost", "--prompts", str(prompts)),
                          "--url")
    res = run_cli("client", "--help")
    assert res.rc == 0 and "client text" in res.stdout and "text " in res.stdout


def test_text_refuses_encoders_in_one_line() -> None:
    zoo = Path(__file__).resolve().parents[1] / "data" / "zoo" / "t5-encoder" / "fastertransformer" / "config.pbtxt"
    io = parse_config(load(zoo))
    with pytest.raises(UserError, match="is an encoder .T5-Encoder.: it returns hidden states, not text") as exc:
        build_arrays(io, ["abc"], 4, ByteTokenizer())
    assert exc.value.field == "--model" and "identity" in (exc.value.hint or "")
