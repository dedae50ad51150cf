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

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Stack:
    """One transformer stack of a config.ini (decoder-only models have one, T5 two)."""

    section: str
    head_key: str
    layer_key: str
    layer_file: str     # regex of a per-layer weight file name; group 1 is the layer index


@dataclass(frozen=True)
class ModelKind:
    name: str                                    # the spec's model_type
    backend_type: str                            # parameters.model_type in config.pbtxt
    stacks: tuple[Stack, ...]
    required: tuple[tuple[str, tuple[str, ...]], ...]   # config.ini (section, keys) FT reads
    whole_files: tuple[str, ...]                 # files written once, not per rank
    style: str                                   # decoder | encoder-decoder | encoder | bert

    def layer_res(self) -> list[tuple[Stack, re.Pattern[str]]]:
        return [(s, re.compile(s.layer_file)) for s in self.stacks]


_GPT_LAYER = r"^model\.layers\.(\d+)\."
_GPT_KEYS = ("head_num", "size_per_head", "inter_size", "num_layer", "vocab_size", "start_id",
             "end_id", "weight_data_type")
_GPT_STACK = (Stack("gpt", "head_num", "num_layer", _GPT_LAYER),)
_GPT_FILES = ("model.wte.bin", "model.final_layernorm.weight.bin", "model.final_layernorm.bias.bin")
_T5_KEYS = ("num_heads", "num_layers", "d_model", "d_kv", "d_ff", "vocab_size", "weight_data_type")
_T5_ENCODER = Stack("encoder", "num_heads", "num_layers", r"^encoder\.block\.(\d+)\.")
# huggingface_t5_ckpt_convert.py copies HF's config into both sections: the decoder's depth
# is num_decoder_layers there (num_layers being the encoder's).
_T5_DECODER = Stack("decoder", "num_heads", "num_decoder_layers", r"^decoder\.block\.(\d+)\.")

KINDS: dict[str, ModelKind] = {k.name: k for k in (
    ModelKind("GPT", "GPT", _GPT_STACK, (("gpt", (*_GPT_KEYS, "max_pos_seq_len")),),
              (*_GPT_FILES, "model.wpe.bin"), "decoder"),
    ModelKind("OPT", "GPT", _GPT_STACK, (("gpt", (*_GPT_KEYS, "max_pos_seq_len")),),
              (*_GPT_FILES, "model.wpe.bin", "model.lm_head.weight.bin"), "decoder"),
    # ALiBi: no max_pos_seq_len and no position table; a layernorm after the embedding.
    ModelKind("BLOOM", "GPT", _GPT_STACK, (("gpt", _GPT_KEYS),),
              (*_GPT_FILES, "model.pre_decoder_layernorm.weight.bin",
               "model.pre_decoder_layernorm.bias.bin"), "decoder"),
    ModelKind("GPT-J", "GPT-J", (Stack("gptj", "head_num", "num_layer", _GPT_LAYER),),
              (("gptj", (*_GPT_KEYS, "rotary_embedding")),),
              (*_GPT_FILES, "model.lm_head.weight.bin", "model.lm_head.bias.bin"), "decoder"),
    ModelKind("GPT-NeoX", "GPT-NeoX", (Stack("gptneox", "head_num", "num_layer", _GPT_LAYER),),
              (("gptneox", (*_GPT_KEYS, "rotary_embedding")),),
              (*_GPT_FILES, "model.lm_head.weight.bin"), "decoder"),
    ModelKind("T5", "T5", (_T5_ENCODER, _T5_DECODER),
              (("encoder", _T5_KEYS), ("decoder", _T5_KEYS)),
              ("shared.weight_T.bin", "encoder.final_layer_norm.weight.bin",
               "decoder.final_layer_norm.weight.bin"), "encoder-decoder"),
    # --encoder_only: the converter leaves [decoder] empty and writes no decoder weights.
    ModelKind("T5-Encoder", "T5-Encoder", (_T5_ENCODER,), (("encoder", _T5_KEYS),),
              ("shared.weight_T.bin", "encoder.final_layer_norm.weight.bin"), "encoder"),
    # huggingface_bert_convert.py writes only the encoder layers (model.encoder.layer.N.*).
    ModelKind("bert", "bert", (Stack("bert", "head_num", "num_layer", r"^model\.encoder\.layer\.(\d+)\."),),
              (("bert", ("head_num", "size_per_head", "inter_size", "num_layer", "weight_data_type")),),
              (), "bert"),
)}

MODEL_TYPES = tuple(KINDS)
BACKEND_TYPES = ("GPT", "GPT-J", "GPT-NeoX", "T5", "T5-Encoder", "bert")


def kind(model_type: str) -> ModelKind:
    return KINDS[model_type]


def backend_type(model_type: str) -> str:
    """What config.pbtxt's model_type must say for the spec's model_type."""
    return KINDS[model_type].backend_type
