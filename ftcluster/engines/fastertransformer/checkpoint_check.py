"""Is a converted `<root>/<N>-gpu/` folder complete for N GPUs? Checked before anything is submitted.

FT loads weights with a fixed size per file and no header, so a missing or truncated shard
surfaces only as garbage output or a crash minutes into a multi-node start. Here:
  - config.ini has the fields the backend reads for the model type;
  - every rank-split file `<name>.<rank>.bin` exists for ranks 0..N-1 and for no other rank
    (shards for another rank count mean the folder was converted for another GPU count);
  - every file the type's converter writes is there with the size config.ini implies. Names
    and splits follow NVIDIA/FasterTransformer examples/pytorch/gpt/utils/huggingface_gpt_convert.py
    (split_and_convert_process), huggingface_bloom_convert.py (parameter_to_split),
    huggingface_opt_convert.py, gptj/utils/huggingface_gptj_ckpt_convert.py and gptj_ckpt_convert.py
    (the same layout), gptneox/utils/huggingface_gptneox_convert.py and eleutherai_gpt_neox_convert.py
    (the same layout), bert/utils/huggingface_bert_convert.py and
    t5/utils/huggingface_t5_ckpt_convert.py (t5_layout):
    qkv, attention.dense.weight, mlp.dense_h_to_4h.{weight,bias} and mlp.dense_4h_to_h.weight
    are split per rank; layernorms and the other biases are written once.
A folder without any weight file is never complete.
"""

from __future__ import annotations

import configparser
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ftcluster.engines.fastertransformer.checkpoint import available_gpu_counts, size_problems, type_hint
from ftcluster.errors import PlanError, every_problem
from ftcluster.engines.fastertransformer.config import read_ini
from ftcluster.engines.fastertransformer.modeltypes import kind

_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_SHARD = re.compile(r"(?P<stem>.+)\.(?P<rank>[0-9]+)\.bin", re.ASCII | re.DOTALL)


@dataclass(frozen=True)
class Expected:
    name: str       # file name inside the N-gpu folder
    nbytes: int


def has_weights(gpu_dir: Path) -> bool:
    """Config-only checkpoints (test models, the demo) have no .bin files and are not checked."""
    return gpu_dir.is_dir() and any(gpu_dir.glob("*.bin"))


@dataclass(frozen=True)
class _Decoder:
    """The sizes a decoder-only config.ini section gives."""
    hidden: int
    inter: int
    vocab: int
    b: int          # bytes per weight element

    @classmethod
    def of(cls, s: configparser.SectionProxy) -> _Decoder:
        hidden = int(s["head_num"]) * int(s["size_per_head"])
        return cls(hidden, int(s.get("inter_size", str(4 * hidden))), int(s["vocab_size"]),
                   _BYTES.get(s.get("weight_data_type", "fp32"), 4))

    def ends(self, lm_head: bool) -> list[Expected]:
        """The embedding, the final layernorm and (where the model has one) the output embedding."""
        h, b = self.hidden, self.b
        files = [Expected("model.wte.bin", self.vocab * h * b),
                 Expected("model.final_layernorm.weight.bin", h * b),
                 Expected("model.final_layernorm.bias.bin", h * b)]
        return files + ([Expected("model.lm_head.weight.bin", self.vocab * h * b)] if lm_head else [])


def _decoder_shards(prefix: str, d: _Decoder, tp: int, qkv_bias: bool) -> list[Expected]:
    """One decoder layer's rank-split files: attention split by heads, the MLP by its inner size."""
    hidden, inter, b = d.hidden, d.inter, d.b
    split = {"attention.query_key_value.weight": hidden * 3 * hidden // tp}
    if qkv_bias:
        split["attention.query_key_value.bias"] = 3 * hidden // tp
    split.update({
        "attention.dense.weight": hidden // tp * hidden,
        "mlp.dense_h_to_4h.weight": hidden * inter // tp,
        "mlp.dense_h_to_4h.bias": inter // tp,
        "mlp.dense_4h_to_h.weight": inter // tp * hidden,
    })
    return [Expected(f"{prefix}{name}.{rank}.bin", n * b) for rank in range(tp) for name, n in split.items()]


def _gpt_layer(prefix: str, d: _Decoder, tp: int) -> list[Expected]:
    """A GPT-style layer (GPT, BLOOM, OPT, GPT-NeoX): layernorms and output biases written once."""
    once = ("input_layernorm.weight", "input_layernorm.bias", "attention.dense.bias",
            "post_attention_layernorm.weight", "post_attention_layernorm.bias", "mlp.dense_4h_to_h.bias")
    return ([Expected(f"{prefix}{name}.bin", d.hidden * d.b) for name in once]
            + _decoder_shards(prefix, d, tp, qkv_bias=True))


def gpt_layout(parser: configparser.ConfigParser, model_type: str, tp: int) -> list[Expected]:
    """Every file the GPT / BLOOM converter writes for `tp` ranks, with its size in bytes."""
    s = parser["gpt"]
    d = _Decoder.of(s)
    hidden, b = d.hidden, d.b
    # huggingface_opt_convert.py: an output embedding of its own
    files = d.ends(lm_head=model_type == "OPT")
    if model_type == "BLOOM":  # Megatron GPT writes GPT's layout
        # ALiBi instead of position embeddings; an extra layernorm after the embedding.
        files += [Expected("model.pre_decoder_layernorm.weight.bin", hidden * b),
                  Expected("model.pre_decoder_layernorm.bias.bin", hidden * b)]
    else:
        files.append(Expected("model.wpe.bin", int(s["max_pos_seq_len"]) * hidden * b))
    if model_type == "OPT" and s.get("has_post_decoder_layernorm", "1") == "0":
        # and the final layernorm only where the model has one (OPT-350m has none)
        files = [f for f in files if not f.name.startswith("model.final_layernorm.")]
    for layer in range(int(s["num_layer"])):
        files += _gpt_layer(f"model.layers.{layer}.", d, tp)
    return files


def gptneox_layout(parser: configparser.ConfigParser, tp: int) -> list[Expected]:
    """Every file huggingface_gptneox_convert.py (FT's docs/gptneox_guide.md) and
    eleutherai_gpt_neox_convert.py (GPT-NeoX-20B) write for `tp` ranks: GPT's layers, no position
    table (rotary), an unbiased lm_head, and with use_gptj_residual (FT's default 1) both output
    biases summed into mlp.attention.bias.sum, the one FT then loads."""
    s = parser["gptneox"]
    d = _Decoder.of(s)
    files = d.ends(lm_head=True)
    summed = s.get("use_gptj_residual", "1").strip() != "0"
    for layer in range(int(s["num_layer"])):
        p = f"model.layers.{layer}."
        files += _gpt_layer(p, d, tp)
        if summed:
            files.append(Expected(f"{p}mlp.attention.bias.sum.bin", d.hidden * d.b))
    return files


def gptj_layout(parser: configparser.ConfigParser, tp: int) -> list[Expected]:
    """Every file the GPT-J converters write for `tp` ranks. Unlike GPT: no position embedding
    (rotary), a biased lm_head of its own, no attention.dense bias and no post-attention
    layernorm (attention and MLP read the same input_layernorm output)."""
    d = _Decoder.of(parser["gptj"])
    files = d.ends(lm_head=True) + [Expected("model.lm_head.bias.bin", d.vocab * d.b)]
    for layer in range(parser.getint("gptj", "num_layer")):
        p = f"model.layers.{layer}."
        files += [Expected(f"{p}{once}.bin", d.hidden * d.b)
                  for once in ("input_layernorm.weight", "input_layernorm.bias", "mlp.dense_4h_to_h.bias")]
        files += _decoder_shards(p, d, tp, qkv_bias=False)
    return files


def bert_layout(parser: configparser.ConfigParser, tp: int) -> list[Expected]:
    """Every file huggingface_bert_convert.py writes for `tp` ranks: the encoder layers only
    (split_and_convert_process: output biases and layernorms once; attention.output.dense and
    output.dense weights split by rows, query/key/value and intermediate.dense by columns)."""
    s = parser["bert"]
    hidden = int(s.get("hidden_size", str(int(s["head_num"]) * int(s["size_per_head"]))))
    inter = int(s.get("inter_size", str(4 * hidden)))
    b = _BYTES.get(s.get("weight_data_type", "fp32"), 4)
    files = []
    for layer in range(int(s["num_layer"])):
        p = f"model.encoder.layer.{layer}."
        for once in ("attention.output.dense.bias", "attention.output.LayerNorm.weight",
                     "attention.output.LayerNorm.bias", "output.dense.bias", "output.LayerNorm.weight",
                     "output.LayerNorm.bias"):
            files.append(Expected(f"{p}{once}.bin", hidden * b))
        split = {"attention.output.dense.weight": hidden // tp * hidden,
                 "output.dense.weight": inter // tp * hidden,
                 "intermediate.dense.weight": hidden * inter // tp,
                 "intermediate.dense.bias": inter // tp}
        for qkv in ("query", "key", "value"):
            split[f"attention.self.{qkv}.weight"] = hidden * hidden // tp
            split[f"attention.self.{qkv}.bias"] = hidden // tp
        for rank in range(tp):
            files += [Expected(f"{p}{name}.{rank}.bin", n * b) for name, n in split.items()]
    return files


def t5_layout(parser: configparser.ConfigParser, encoder_only: bool, tp: int) -> list[Expected]:
    """Every file huggingface_t5_ckpt_convert.py writes for `tp` ranks (split_and_convert_process
    and fuse_decoder_qkv; HF T5 has no biases): q/k/v and wi (wi2 when gated) split by columns,
    o and wo by rows, relative_attention_bias (block 0) by heads, layer norms once; the decoder's
    self-attention q/k/v fused into one qkv; shared.weight twice (as is and transposed) and
    lm_head.weight for the full model."""
    enc = parser["encoder"]
    d_model, d_ff = int(enc["d_model"]), int(enc["d_ff"])
    heads = int(enc["num_heads"])
    inner = heads * int(enc["d_kv"])
    buckets = int(enc.get("relative_attention_num_buckets_or_max_pos_seq_len", "32"))
    b = _BYTES.get(enc.get("weight_data_type", "fp32"), 4)
    gated = parser.get("structure", "use_gated_activation", fallback="0").lower() in ("1", "true")
    vocab = int(enc["vocab_size"])
    files = [Expected(n, vocab * d_model * b) for n in ("shared.weight.bin", "shared.weight_T.bin")]
    if not encoder_only:
        files.append(Expected("lm_head.weight.bin", vocab * d_model * b))

    def stack(name: str, layers: int, attentions: tuple[str, ...]) -> None:
        files.append(Expected(f"{name}.final_layer_norm.weight.bin", d_model * b))
        bias = f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        split = {bias: heads // tp * buckets}
        for i in range(layers):
            p = f"{name}.block.{i}.layer."
            for n, att in enumerate(attentions):
                files.append(Expected(f"{p}{n}.layer_norm.weight.bin", d_model * b))
                if name == "decoder" and att == "SelfAttention":
                    split[f"{p}{n}.{att}.qkv.weight"] = d_model * 3 * inner // tp
                else:
                    split.update({f"{p}{n}.{att}.{x}.weight": d_model * inner // tp for x in "qkv"})
                split[f"{p}{n}.{att}.o.weight"] = inner // tp * d_model
            ff = f"{p}{len(attentions)}."
            files.append(Expected(f"{ff}layer_norm.weight.bin", d_model * b))
            for wi in ("wi", "wi2") if gated else ("wi",):
                split[f"{ff}DenseReluDense.{wi}.weight"] = d_model * d_ff // tp
            split[f"{ff}DenseReluDense.wo.weight"] = d_ff // tp * d_model
        for rank in range(tp):
            files.extend(Expected(f"{key}.{rank}.bin", n * b) for key, n in split.items())

    stack("encoder", int(enc["num_layers"]), ("SelfAttention",))
    if not encoder_only:
        dec = parser["decoder"]
        layers = dec.get("num_decoder_layers", dec.get("num_layers", "0"))
        stack("decoder", int(layers or "0"), ("SelfAttention", "EncDecAttention"))
    return files


def expected_files(parser: configparser.ConfigParser, model_type: str, tp: int) -> list[Expected]:
    """Every file the model type's converter writes for `tp` ranks, with its size."""
    if model_type == "GPT-J":
        return gptj_layout(parser, tp)
    if model_type == "GPT-NeoX":
        return gptneox_layout(parser, tp)
    if model_type == "bert":
        return bert_layout(parser, tp)
    if model_type in ("T5", "T5-Encoder"):
        return t5_layout(parser, model_type == "T5-Encoder", tp)
    return gpt_layout(parser, model_type, tp)   # GPT (Megatron too), BLOOM, OPT


def _config_problems(parser: configparser.ConfigParser, ini: Path, model_type: str, tp: int) -> list[str]:
    problems = size_problems(parser, ini)
    for section, keys in kind(model_type).required:
        if not parser.has_section(section) or not parser.options(section):
            problems.append(f"{ini}: no [{section}] section or an empty one (needed for model_type "
                            f"{model_type}; {type_hint(parser, model_type)})")
            continue
        missing = [k for k in keys if not parser.has_option(section, k)]
        if missing:
            problems.append(f"{ini}: [{section}] lacks {', '.join(missing)} "
                            f"({type_hint(parser, model_type)})")
        if parser.has_option(section, "tensor_para_size"):
            ini_tp = parser.get(section, "tensor_para_size")
            if ini_tp != str(tp):
                problems.append(f"{ini}: tensor_para_size={ini_tp}: converted for {ini_tp} GPU(s), "
                                f"not {tp}")
    return problems


def _shard_problems(gpu_dir: Path, tp: int) -> list[str]:
    ranks: dict[str, dict[int, int]] = defaultdict(dict)
    for f in gpu_dir.glob("*.bin"):
        m = _SHARD.fullmatch(f.name)
        if m:
            ranks[m["stem"]][int(m["rank"])] = f.stat().st_size
    if not ranks:
        return []
    counts = {max(r) + 1 for r in ranks.values()}
    complete = all(len(r) == max(r) + 1 for r in ranks.values())
    other = max(counts) if max(counts) > tp else (counts.pop() if len(counts) == 1 and complete else tp)
    if other != tp:
        # Every tensor split for another rank count: the folder holds another conversion.
        return [(f"the weight shards are for {other} GPU(s) (rank files .0.bin to "
                 f".{other - 1}.bin): converted for {other} GPU(s), not {tp}")]
    problems = []
    for stem, by_rank in sorted(ranks.items()):
        missing = [r for r in range(tp) if r not in by_rank]
        if missing:
            problems.append(f"missing shard {stem}.{missing[0]}.bin"
                            + (f" (+{len(missing) - 1} more ranks)" if len(missing) > 1 else ""))
        elif len(set(by_rank.values())) > 1:
            small = min(by_rank, key=lambda r: by_rank[r])
            problems.append(f"{stem}.{small}.bin is {by_rank[small]} bytes but the other shards are "
                            f"{max(by_rank.values())} (truncated?)")
    return problems


def _layout_problems(gpu_dir: Path, expected: list[Expected]) -> list[str]:
    problems = []
    for e in expected:
        path = gpu_dir / e.name
        if not path.is_file():
            problems.append(f"missing {'shard' if _SHARD.fullmatch(e.name) else 'file'} {e.name}")
            continue
        size = path.stat().st_size
        if size != e.nbytes:
            what = "truncated" if size < e.nbytes else "too large"
            problems.append(f"{e.name} is {size} bytes, config.ini implies {e.nbytes} ({what})")
    return problems


def checkpoint_problems(root: Path, model_type: str, tp: int) -> list[str]:
    """Everything wrong with `<root>/<tp>-gpu/` for `tp` ranks (empty: it is complete)."""
    gpu_dir = root / f"{tp}-gpu"
    if not gpu_dir.is_dir():
        have = available_gpu_counts(root)
        found = ", ".join(f"{n}-gpu" for n in have)
        return [f"no {tp}-gpu folder under {root}"
                + (f"; it was converted for {found} GPU(s)" if have else "")]
    ini = gpu_dir / "config.ini"
    if not ini.is_file():
        return [f"{ini} is missing"]
    parser = read_ini(ini)
    problems = _config_problems(parser, ini, model_type, tp)
    if not any(gpu_dir.glob("*.bin")):
        return problems + [f"no weight files (*.bin) in {gpu_dir}: not converted, or converted elsewhere"]
    shard = _shard_problems(gpu_dir, tp)
    if shard and "converted for" in shard[0]:
        return problems + shard[:1]
    if problems:
        return problems + shard
    return _layout_problems(gpu_dir, expected_files(parser, model_type, tp))


def verify_checkpoint(root: Path, model_type: str, tp: int) -> None:
    """Raise PlanError naming every problem (the first PROBLEMS_SHOWN of them, and how many more)
    when weights are present."""
    gpu_dir = root / f"{tp}-gpu"
    if not has_weights(gpu_dir):
        return
    problems = checkpoint_problems(root, model_type, tp)
    if problems:
        raise PlanError(f"{gpu_dir}: {every_problem(problems)}", field="checkpoint_root",
                        hint=f"re-run `ftcluster convert` for {tp} GPU(s) "
                             "or `ftcluster check-checkpoint` for the full list")
