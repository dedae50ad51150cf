"""Every model the FT backend serves: what users call it, what the backend accepts, what the
converters write.

The backend (fastertransformer_backend src/libfastertransformer.cc, ModelFactory) knows only
the model_type strings GPT, GPT-J, GPT-NeoX, T5, T5-Encoder and bert (default GPT) and refuses
any other with `Unknown model "..."`. BLOOM and OPT are GPT variants: their converters
(FasterTransformer examples/pytorch/gpt/utils/huggingface_{bloom,opt}_convert.py) write a
[gpt] section with model_variant/layernorm fields and the backend serves them as `GPT`.
Megatron GPT (megatron_ckpt_convert.py) and the interactive GPT (all_models/
gpt-interactive-text-generation: sequence batching) are plain GPT too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stack:
    """One transformer stack of a config.ini (decoder-only models have one, T5 two)."""

    section: str
    head_key: str
    layer_key: str


@dataclass(frozen=True)
class ModelKind:
    name: str                                    # the spec's model_type
    backend_type: str                            # parameters.model_type in config.pbtxt
    stacks: tuple[Stack, ...]
    required: tuple[tuple[str, tuple[str, ...]], ...]   # config.ini (section, keys) FT reads
    style: str                                   # decoder | encoder-decoder | encoder | bert


_GPT_KEYS = ("head_num", "size_per_head", "inter_size", "num_layer", "vocab_size", "start_id",
             "end_id", "weight_data_type")
_GPT_STACK = (Stack("gpt", "head_num", "num_layer"),)
_T5_KEYS = ("num_heads", "num_layers", "d_model", "d_kv", "d_ff", "vocab_size", "weight_data_type")
_T5_ENCODER = Stack("encoder", "num_heads", "num_layers")
# huggingface_t5_ckpt_convert.py copies HF's config into both sections: the decoder's depth
# is num_decoder_layers there (num_layers being the encoder's).
_T5_DECODER = Stack("decoder", "num_heads", "num_decoder_layers")

KINDS: dict[str, ModelKind] = {k.name: k for k in (
    ModelKind("GPT", "GPT", _GPT_STACK, (("gpt", (*_GPT_KEYS, "max_pos_seq_len")),), "decoder"),
    ModelKind("OPT", "GPT", _GPT_STACK, (("gpt", (*_GPT_KEYS, "max_pos_seq_len")),), "decoder"),
    # ALiBi: no max_pos_seq_len and no position table; a layernorm after the embedding.
    ModelKind("BLOOM", "GPT", _GPT_STACK, (("gpt", _GPT_KEYS),), "decoder"),
    ModelKind("GPT-J", "GPT-J", (Stack("gptj", "head_num", "num_layer"),),
              (("gptj", (*_GPT_KEYS, "rotary_embedding")),), "decoder"),
    ModelKind("GPT-NeoX", "GPT-NeoX", (Stack("gptneox", "head_num", "num_layer"),),
              (("gptneox", (*_GPT_KEYS, "rotary_embedding")),), "decoder"),
    ModelKind("T5", "T5", (_T5_ENCODER, _T5_DECODER),
              (("encoder", _T5_KEYS), ("decoder", _T5_KEYS)), "encoder-decoder"),
    # --encoder_only: the converter leaves [decoder] empty and writes no decoder weights.
    ModelKind("T5-Encoder", "T5-Encoder", (_T5_ENCODER,), (("encoder", _T5_KEYS),), "encoder"),
    # huggingface_bert_convert.py writes only the encoder layers (model.encoder.layer.N.*).
    ModelKind("bert", "bert", (Stack("bert", "head_num", "num_layer"),),
              (("bert", ("head_num", "size_per_head", "inter_size", "num_layer", "weight_data_type")),), "bert"),
)}

MODEL_TYPES = tuple(KINDS)
BACKEND_TYPES = ("GPT", "GPT-J", "GPT-NeoX", "T5", "T5-Encoder", "bert")


def kind(model_type: str) -> ModelKind:
    return KINDS[model_type]


def backend_type(model_type: str) -> str:
    """What config.pbtxt's model_type must say for the spec's model_type."""
    return KINDS[model_type].backend_type
