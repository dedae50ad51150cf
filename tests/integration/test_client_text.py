"""`ftcluster client text` end to end against a real CPU tritonserver (no mocks, no network).

The server holds the demo TEST ensemble (byte-level tokenizer models inside Triton) with its
GPT-style `fastertransformer` TEST model, plus two copies of that model over a tiny vocabulary:
`gpt_small` (decoder-only) and `t5_small` (T5-style inputs, generated tokens only). The
transformers tokenizer is trained here with the `tokenizers` library (WordLevel on a few
sentences) and saved with save_pretrained, so `--tokenizer PATH` is a real AutoTokenizer.

Expected texts follow the TEST model's rule (model.py): it generates the tokens
(last prompt token + i) % vocab_size, i = 1..output_len, after the prompt (GPT) or alone (T5).
"""

from __future__ import annotations

import configparser
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftcluster.client import Endpoint
from ftcluster.client.text import run_text
from tests.helpers_specs import assert_one_line_error, run_cli
from tests.triton_server import copy_test_model_code, TritonServer, require_tritonserver, running_tritonserver, t5_config

pytestmark = pytest.mark.triton

DEMO = Path(__file__).resolve().parents[2] / "ftcluster" / "demo"
MODEL_PY = DEMO / "model_repository" / "fastertransformer" / "1" / "model.py"
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "birds sing in green trees",
             "the old river runs under a blue sky"]
SPECIALS = ["[PAD]", "[UNK]", "[EOS]"]                       # ids 0, 1, 2
VOCAB = len(SPECIALS) + len({w for s in SENTENCES for w in s.split()})



@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    require_tritonserver()
    tmp = tmp_path_factory.mktemp("text")
    repo = tmp / "repo"
    for name, ini in (("gpt", f"[gpt]\nvocab_size={VOCAB}\nend_id=2\n"),
                      ("t5", f"[encoder]\nvocab_size={VOCAB}\n[decoder]\nvocab_size={VOCAB}\nend_id=2\n")):
        (tmp / "ckpt" / name).mkdir(parents=True)
        (tmp / "ckpt" / name / "config.ini").write_text(ini)
        (repo / f"{name}_small" / "1").mkdir(parents=True)
        copy_test_model_code(repo / f"{name}_small" / "1")
    gpt_cfg = (MODEL_PY.parents[1] / "config.pbtxt").read_text()
    gpt_cfg = gpt_cfg.replace('name: "fastertransformer"', 'name: "gpt_small"').replace(
        "../../checkpoint/1-gpu/", f"{tmp / 'ckpt' / 'gpt'}/")
    (repo / "gpt_small" / "config.pbtxt").write_text(gpt_cfg)
    (repo / "t5_small" / "config.pbtxt").write_text(t5_config("t5_small", 4, f"{tmp / 'ckpt' / 't5'}/"))
    with running_tritonserver([DEMO / "ensemble_repository", repo], log_dir=tmp / "logs") as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real transformers tokenizer, trained and saved offline."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, tokenizers.trainers.WordLevelTrainer(special_tokens=SPECIALS))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                eos_token="[EOS]")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(str(path))
    assert len(fast) == VOCAB and [fast.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2]
    return path


@pytest.fixture(scope="module")
def vocab(tokenizer_dir: Path) -> dict[str, int]:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    return dict(data["model"]["vocab"])


def _ep(server: TritonServer, protocol: str) -> Endpoint:
    return Endpoint.parse(server.http_url if protocol == "http" else server.grpc_url, protocol, 30)


def generated_ids(prompt_ids: list[int], n: int, vocab_size: int) -> list[int]:
    """The TEST model's rule (model.py)."""
    return [(prompt_ids[-1] + i) % vocab_size for i in range(1, n + 1)]


def words(ids: list[int], vocab: dict[str, int]) -> str:
    """WordLevel decoding written out: words joined by spaces, special tokens skipped."""
    inv = {i: w for w, i in vocab.items()}
    return " ".join(inv[i] for i in ids if inv[i] not in SPECIALS)


def expected(prompt: str, n: int, vocab: dict[str, int]) -> str:
    return words(generated_ids([vocab[w] for w in prompt.split()], n, VOCAB), vocab)


def test_gpt_with_a_transformers_tokenizer(server: TritonServer, tokenizer_dir: Path,
                                           vocab: dict[str, int]) -> None:
    prompts = ["the cat sat", "birds sing", "a dog ran in the park"]   # padded within a batch
    result = run_text(_ep(server, "http"), "gpt_small", prompts, tokenizer=str(tokenizer_dir),
                      output_len=4, batch_size=2)
    assert result.ok, result.to_dict()
    assert result.style == "decoder" and result.tokenizer == str(tokenizer_dir)
    assert result.inputs_sent == ["input_ids", "input_lengths", "request_output_len"]
    assert len(result.latencies_ms) == 2 and all(ms > 0 for ms in result.latencies_ms)
    for row, prompt in zip(result.rows, prompts, strict=True):
        assert row.prompt == prompt
        assert row.text == expected(prompt, 4, vocab)
        assert row.text, "the rule's tokens must not all be special ones"
        assert row.output == f"{prompt} {row.text}"          # GPT returns the prompt first
        assert row.input_tokens == len(prompt.split()) and row.output_tokens == 4


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_t5_translation_with_bleu(server: TritonServer, tokenizer_dir: Path, vocab: dict[str, int],
                                  protocol: str) -> None:
    pytest.importorskip("sacrebleu")
    prompts = ["the cat sat on the mat", "a dog", "birds sing in green trees", "the old river",
               "runs under a blue sky"]
    want = [expected(p, 8, vocab) for p in prompts]
    assert all(len(w.split()) >= 4 for w in want)  # BLEU's 4-grams exist in every line
    result = run_text(_ep(server, protocol), "t5_small", prompts, tokenizer=str(tokenizer_dir),
                      output_len=8, references=want)
    assert result.ok, result.to_dict()
    assert result.style == "encoder-decoder"
    assert result.inputs_sent == ["input_ids", "sequence_length", "max_output_len"]
    assert result.batch_size == 4 and len(result.latencies_ms) == 2     # max_batch_size 4: 4 + 1
    assert result.texts == want
    assert [r.output for r in result.rows] == want                      # T5: generated tokens only
    assert result.bleu == pytest.approx(100.0)
    assert result.bleu_signature and "nrefs:1" in result.bleu_signature

    perturbed = list(want)
    perturbed[0] = " ".join(["zebra", *want[0].split()[1:]])
    worse = run_text(_ep(server, protocol), "t5_small", prompts, tokenizer=str(tokenizer_dir),
                     output_len=8, references=perturbed)
    assert worse.texts == want
    assert worse.bleu is not None and 0 < worse.bleu < 100


def ensemble_expected(prompt: str, n: int) -> str:
    """The demo ensemble: UTF-8 bytes in, the GPT TEST model's rule, ids < 256 back to bytes."""
    ini = configparser.ConfigParser(inline_comment_prefixes=(";",))
    ini.read(DEMO / "checkpoint" / "1-gpu" / "config.ini")
    ids = generated_ids(list(prompt.encode()), n, ini.getint("gpt", "vocab_size"))
    return bytes(i for i in ids if i < 256).decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_text_in_text_out(server: TritonServer, protocol: str) -> None:
    prompts = ["hello", "Triton and FT", "abc"]
    result = run_text(_ep(server, protocol), "ensemble", prompts, output_len=5,
                      tokenizer="bytes")  # unused: the ensemble tokenizes inside Triton
    assert result.ok, result.to_dict()
    assert result.style == "text" and result.tokenizer is None
    assert result.inputs_sent == ["INPUT_0", "INPUT_1", "INPUT_2", "INPUT_3"]
    assert result.texts == [ensemble_expected(p, 5) for p in prompts]
    assert result.texts[0] == "pqrst"
    assert [r.output for r in result.rows] == [p + ensemble_expected(p, 5) for p in prompts]


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(f"{ln}\n" for ln in lines))
    return str(path)


def test_cli_bytes_tokenizer_on_the_demo_model(server: TritonServer, tmp_path: Path) -> None:
    prompts = _write(tmp_path / "prompts.txt", ["hello", "Triton"])
    res = run_cli("client", "text", "--url", server.http_url, "--model", "fastertransformer",
                  "--prompts", prompts, "--tokenizer", "bytes", "--output-len", "4")
    assert res.rc == 0, res.stderr
    assert "1. 'hello' -> 'pqrs'" in res.stdout and "2. 'Triton' -> 'opqr'" in res.stdout
    assert "latency ms" in res.stdout and res.stdout.rstrip().endswith("OK")


def test_cli_json_bleu_over_grpc(server: TritonServer, tokenizer_dir: Path, vocab: dict[str, int],
                                 tmp_path: Path) -> None:
    pytest.importorskip("sacrebleu")
    prompts = ["the cat sat on the mat", "a dog ran in the park"]
    want = [expected(p, 6, vocab) for p in prompts]
    res = run_cli("client", "text", "--url", server.grpc_url, "--protocol", "grpc", "--model", "t5_small",
                  "--prompts", _write(tmp_path / "p.txt", prompts), "--tokenizer", str(tokenizer_dir),
                  "--reference", _write(tmp_path / "ref.txt", want), "--output-len", "6", "--json",
                  "--result-file", str(tmp_path / "out" / "text.json"))
    assert res.rc == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    assert data == json.loads((tmp_path / "out" / "text.json").read_text())
    assert data["ok"] is True and data["protocol"] == "grpc"
    assert [r["text"] for r in data["rows"]] == want
    assert data["bleu"] == pytest.approx(100.0)
    assert set(data["latency_ms"]) == {"min", "median", "max"}

    text = run_cli("client", "text", "--url", server.http_url, "--model", "t5_small",
                   "--prompts", str(tmp_path / "p.txt"), "--tokenizer", str(tokenizer_dir),
                   "--reference", _write(tmp_path / "ref2.txt", [want[0], "zebra " + want[1]]),
                   "--output-len", "6")
    assert text.rc == 0, text.stderr
    assert f"1. 'the cat sat on the mat' -> '{want[0]}'" in text.stdout
    bleu = next(ln for ln in text.stdout.splitlines() if ln.strip().startswith("BLEU"))
    assert 0 < float(bleu.split()[1]) < 100


def test_cli_user_errors_against_the_server(server: TritonServer, tmp_path: Path) -> None:
    prompts = _write(tmp_path / "p.txt", ["hello"])
    assert_one_line_error(run_cli("client", "text", "--url", server.http_url, "--model", "fastertransformer",
                                  "--prompts", prompts), "--tokenizer", "takes token ids")
    assert_one_line_error(run_cli("client", "text", "--url", server.http_url, "--model", "t5_small",
                                  "--prompts", prompts, "--tokenizer", "bytes", "--batch-size", "5"),
                          "--batch-size", "max_batch_size 4")
    assert_one_line_error(run_cli("client", "text", "--url", server.http_url, "--model", "gpt_small",
                                  "--prompts", prompts, "--tokenizer", str(tmp_path / "no-such-tokenizer")),
                          "--tokenizer", "cannot load tokenizer")
    assert_one_line_error(run_cli("client", "text", "--url", server.http_url, "--model", "nope",
                                  "--prompts", prompts), "--model", "not ready")
