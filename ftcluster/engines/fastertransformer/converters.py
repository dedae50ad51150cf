"""The FasterTransformer checkpoint converters: one table, looked up by model_type.

Script paths and argument names as in NVIDIA/FasterTransformer (examples/pytorch/...), read from
each script's argparse block:
  gpt/utils/huggingface_gpt_convert.py    -saved_dir/-o -in_file/-i -infer_gpu_num/-i_g -weight_data_type
  gptj/utils/gptj_ckpt_convert.py         --output-dir --ckpt-dir --n-inference-gpus (writes fp32, no option)
  gptneox/utils/huggingface_gptneox_convert.py  -saved_dir/-o -in_file/-i -infer_gpu_num/-i_g
                                          -weight_data_type -model_name/-m_n (required; the one
                                          FT's docs/gptneox_guide.md runs)
  t5/utils/huggingface_t5_ckpt_convert.py -saved_dir/-o -in_file/-i -inference_tensor_para_size/-i_g
                                          -weight_data_type
  gpt/utils/huggingface_bloom_convert.py  -i/--input-dir -o/--output-dir -tp/--tensor-para-size
                                          -dt/--data-type
  gpt/utils/huggingface_opt_convert.py    -saved_dir/-o -in_file/-i -infer_gpu_num/-i_g -weight_data_type
  t5/utils/huggingface_t5_ckpt_convert.py --encoder_only/-e (T5-Encoder: an empty [decoder], no
                                          decoder weights)
  bert/utils/huggingface_bert_convert.py  -saved_dir/-o -in_file/-i -infer_tensor_para_size/-i_g
                                          -weight_data_type
  gpt/utils/megatron_ckpt_convert.py      --saved-dir/-o --in-file/-i --infer-gpu-num/-i_g
                                          --weight-data-type (GPT with `converter: megatron`)
Every one of them writes into <output>/<N>-gpu/, which is what checkpoint_root holds. Their
weight types are fp32 or fp16 only; FT casts fp32 weights to bf16 when it loads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftcluster.errors import UserError


@dataclass(frozen=True)
class Converter:
    script: str                     # relative to the FasterTransformer checkout
    input_flag: str
    output_flag: str
    gpus_flag: str
    dtype_flag: str | None          # None: the script has no weight type option
    extra: tuple[str, ...] = ()     # fixed flags; "{name}" becomes the model's name


CONVERTERS: dict[str, Converter] = {
    "GPT": Converter("examples/pytorch/gpt/utils/huggingface_gpt_convert.py",
                     "-i", "-o", "-i_g", "-weight_data_type"),
    "GPT-J": Converter("examples/pytorch/gptj/utils/gptj_ckpt_convert.py",
                       "--ckpt-dir", "--output-dir", "--n-inference-gpus", None),
    "GPT-NeoX": Converter("examples/pytorch/gptneox/utils/huggingface_gptneox_convert.py",
                          "-i", "-o", "-i_g", "-weight_data_type", ("-model_name", "{name}")),
    "T5": Converter("examples/pytorch/t5/utils/huggingface_t5_ckpt_convert.py",
                    "-in_file", "-saved_dir", "-inference_tensor_para_size", "-weight_data_type"),
    "BLOOM": Converter("examples/pytorch/gpt/utils/huggingface_bloom_convert.py",
                       "-i", "-o", "-tp", "-dt"),
    "OPT": Converter("examples/pytorch/gpt/utils/huggingface_opt_convert.py",
                     "-i", "-o", "-i_g", "-weight_data_type"),
    "T5-Encoder": Converter("examples/pytorch/t5/utils/huggingface_t5_ckpt_convert.py",
                            "-in_file", "-saved_dir", "-inference_tensor_para_size", "-weight_data_type",
                            ("--encoder_only",)),
    "bert": Converter("examples/pytorch/bert/utils/huggingface_bert_convert.py",
                      "-in_file", "-saved_dir", "-infer_tensor_para_size", "-weight_data_type"),
}


# Other converters for a type, chosen by the model spec's `converter`.
VARIANTS: dict[tuple[str, str], Converter] = {
    ("GPT", "megatron"): Converter("examples/pytorch/gpt/utils/megatron_ckpt_convert.py",
                                   "-i", "-o", "-i_g", "--weight-data-type"),
}


def converter_for(model_type: str, variant: str | None = None) -> Converter:
    if variant is not None:
        try:
            return VARIANTS[(model_type, variant)]
        except KeyError:
            raise UserError(f"no {variant} converter is known for model_type {model_type}",
                            field="converter", hint="leave converter out") from None
    try:
        return CONVERTERS[model_type]
    except KeyError:
        raise UserError(f"no FT converter is known for model_type {model_type}",
                        field="model_type", hint=f"known: {', '.join(CONVERTERS)}") from None


def weight_type(data_type: str) -> str:
    # The converters write fp32 or fp16; bf16 serving loads fp32 weights.
    return "fp16" if data_type == "fp16" else "fp32"


def converter_argv(model_type: str, converter_root: Path, input_dir: str, output_root: str,
                   gpus: int, data_type: str, name: str, python: str = "python3",
                   variant: str | None = None) -> list[str]:
    """The converter's command line: writes <output_root>/<gpus>-gpu/."""
    conv = converter_for(model_type, variant)
    argv = [python, str(converter_root / conv.script), conv.input_flag, input_dir,
            conv.output_flag, output_root, conv.gpus_flag, str(gpus)]
    if conv.dtype_flag:
        argv += [conv.dtype_flag, weight_type(data_type)]
    return argv + [a.replace("{name}", name) for a in conv.extra]
