"""Facts about a converted FT checkpoint (`<root>/<N>-gpu/config.ini`).

The planner needs the head and layer counts to check tensor/pipeline splits, and the GPU
count the checkpoint was converted for. Each FT model type keeps them under other names.
"""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from pathlib import Path

from ftcluster.errors import PlanError
from ftcluster.engines.fastertransformer.config import read_ini
from ftcluster.engines.fastertransformer.modeltypes import kind
from ftcluster.spec.model import INT32_MAX

GPU_DIR = re.compile(r"([0-9]+)-gpu", re.ASCII)   # <root>/<N>-gpu/

# The sizes config.ini gives, which FT's INIReader reads as C ints (strtol: ASCII digits).
# Checked before anything is computed from them: a layer count of 10^11 would have the
# layout check build names until memory ran out, a head count of 0 divides by anything.
_LAYER_KEYS = frozenset({"num_layer", "num_layers", "num_decoder_layers"})
SIZE_KEYS = _LAYER_KEYS | frozenset({
    "head_num", "size_per_head", "inter_size", "vocab_size", "hidden_size", "max_pos_seq_len",
    "d_model", "d_ff", "num_heads", "d_kv", "relative_attention_num_buckets_or_max_pos_seq_len",
    "tensor_para_size", "pipeline_para_size",
})
MAX_LAYERS = 10_000
_INI_INT = re.compile(r"[0-9]{1,12}", re.ASCII)


def size_problem(key: str, raw: str) -> str | None:
    """Why `raw` is not a usable value of the size `key` (None: it is)."""
    if not _INI_INT.fullmatch(raw.strip()):
        return "is not a positive integer"
    top = MAX_LAYERS if key in _LAYER_KEYS else INT32_MAX
    value = int(raw)
    return None if 1 <= value <= top else f"is out of range (1 to {top})"


def size_problems(parser: configparser.ConfigParser, ini: Path) -> list[str]:
    """Every size in config.ini that FT could not use, each named with its section."""
    found = []
    for section in parser.sections():
        for key in parser.options(section):
            why = size_problem(key, parser.get(section, key)) if key in SIZE_KEYS else None
            if why:
                found.append(f"{ini}: [{section}] {key}={parser.get(section, key)[:40]} {why}")
    return found


@dataclass(frozen=True)
class Split:
    """Heads and layers of one stack (decoder-only models have one, T5 two)."""

    section: str
    head_num: int
    num_layer: int


@dataclass(frozen=True)
class CheckpointFacts:
    root: Path
    available_gpus: tuple[int, ...]      # N of every N-gpu folder present
    gpu_dir: Path | None                 # <root>/<tp>-gpu when present
    ini_path: Path | None
    splits: tuple[Split, ...]            # empty when no config.ini was read
    ini_tensor_para_size: int | None     # what config.ini says it was converted for
    weight_data_type: str | None
    # bert: the hidden size of input_hidden_state, which the client must send
    input_hidden_size: int | None = None


def available_gpu_counts(root: Path) -> tuple[int, ...]:
    found = []
    for child in root.iterdir() if root.is_dir() else ():
        m = GPU_DIR.fullmatch(child.name)
        if m and child.is_dir():
            found.append(int(m.group(1)))
    return tuple(sorted(found))


def _int(parser: configparser.ConfigParser, section: str, key: str, ini: Path) -> int:
    try:
        raw = parser.get(section, key)
    except (configparser.NoSectionError, configparser.NoOptionError):
        raise PlanError(f"{ini}: [{section}] {key} is missing",
                        hint="re-run the FT converter; the backend needs it") from None
    why = size_problem(key, raw)
    if why:
        raise PlanError(f"{ini}: [{section}] {key}={raw[:40]} {why}",
                        hint="fix config.ini or re-run the FT converter")
    return int(raw)


def detect_model_type(parser: configparser.ConfigParser) -> str | None:
    """The model_type a converter's config.ini belongs to, from its sections and variant fields."""
    filled = {s for s in parser.sections() if parser.options(s)}
    if "gpt" in filled:
        bloom = (parser.get("gpt", "model_variant", fallback="").startswith("bloom")
                 or parser.get("gpt", "use_attention_linear_bias", fallback="").lower() in ("true", "1"))
        return "BLOOM" if bloom else "GPT"
    for section, name in (("gptj", "GPT-J"), ("gptneox", "GPT-NeoX"), ("bert", "bert")):
        if section in filled:
            return name
    if "encoder" in filled:
        return "T5" if "decoder" in filled else "T5-Encoder"
    return None


def type_hint(parser: configparser.ConfigParser, model_type: str) -> str:
    found = detect_model_type(parser)
    if found is not None and found != model_type and not {found, model_type} <= {"GPT", "OPT"}:
        return f"this config.ini was written by the {found} converter: set model_type: {found}"
    return "check model_type in the model spec, or re-run the converter for it"


def read_checkpoint(root: Path, model_type: str, tp: int) -> CheckpointFacts:
    """Read what the planner needs from `<root>/<tp>-gpu/config.ini` (pure reading, no checks)."""
    available = available_gpu_counts(root)
    gpu_dir = root / f"{tp}-gpu"
    if not gpu_dir.is_dir():
        return CheckpointFacts(root, available, None, None, (), None, None)
    ini = gpu_dir / "config.ini"
    if not ini.is_file():
        return CheckpointFacts(root, available, gpu_dir, None, (), None, None)
    parser = read_ini(ini)
    splits = []
    ini_tp: int | None = None
    wdt: str | None = None
    for stack in kind(model_type).stacks:
        section = stack.section
        if not parser.has_section(section) or not parser.options(section):
            raise PlanError(f"{ini}: no [{section}] section (or an empty one), expected for model_type "
                            f"{model_type}", field="model_type",
                            hint=type_hint(parser, model_type))
        layer_key = stack.layer_key
        if not parser.has_option(section, layer_key) and layer_key == "num_decoder_layers":
            layer_key = "num_layers"
        splits.append(Split(section, _int(parser, section, stack.head_key, ini),
                            _int(parser, section, layer_key, ini)))
        if parser.has_option(section, "tensor_para_size"):
            ini_tp = _int(parser, section, "tensor_para_size", ini)
        if parser.has_option(section, "weight_data_type"):
            wdt = parser.get(section, "weight_data_type")
    hidden: int | None = None
    if model_type == "bert":  # huggingface_bert_convert.py writes hidden_size
        hidden = (_int(parser, "bert", "hidden_size", ini) if parser.has_option("bert", "hidden_size")
                  else splits[0].head_num * _int(parser, "bert", "size_per_head", ini))
    return CheckpointFacts(root, available, gpu_dir, ini, tuple(splits), ini_tp, wdt, hidden)
