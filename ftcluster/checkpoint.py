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
from ftcluster.ftconfig import read_ini

# model_type -> (section, head key, layer key); T5 has an encoder and a decoder.
_LAYOUT: dict[str, list[tuple[str, str, str]]] = {
    "GPT": [("gpt", "head_num", "num_layer")],
    "GPT-J": [("gptj", "head_num", "num_layer")],
    "GPT-NeoX": [("gptneox", "head_num", "num_layer")],
    "BLOOM": [("gpt", "head_num", "num_layer")],
    "bert": [("bert", "head_num", "num_layer")],
    "T5": [("encoder", "num_heads", "num_layers"), ("decoder", "num_heads", "num_layers")],
}
_GPU_DIR = re.compile(r"^(\d+)-gpu$")


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


def available_gpu_counts(root: Path) -> tuple[int, ...]:
    found = []
    for child in root.iterdir() if root.is_dir() else ():
        m = _GPU_DIR.match(child.name)
        if m and child.is_dir():
            found.append(int(m.group(1)))
    return tuple(sorted(found))


def _int(parser: configparser.ConfigParser, section: str, key: str, ini: Path) -> int:
    try:
        return parser.getint(section, key)
    except (configparser.NoSectionError, configparser.NoOptionError):
        raise PlanError(f"{ini}: [{section}] {key} is missing",
                        hint="re-run the FT converter; the backend needs it") from None
    except ValueError:
        raise PlanError(f"{ini}: [{section}] {key} is not an integer") from None


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
    for section, head_key, layer_key in _LAYOUT[model_type]:
        if not parser.has_section(section):
            raise PlanError(f"{ini}: no [{section}] section, expected for model_type {model_type}",
                            hint="check model_type in the model spec")
        splits.append(Split(section, _int(parser, section, head_key, ini), _int(parser, section, layer_key, ini)))
        if parser.has_option(section, "tensor_para_size"):
            ini_tp = _int(parser, section, "tensor_para_size", ini)
        if parser.has_option(section, "weight_data_type"):
            wdt = parser.get(section, "weight_data_type")
    if model_type == "T5" and parser.has_option("decoder", "num_decoder_layers"):
        # T5 converters copy the HF config into both sections; the decoder's depth is
        # num_decoder_layers there, num_layers being the encoder's.
        splits[1] = Split("decoder", splits[1].head_num, _int(parser, "decoder", "num_decoder_layers", ini))
    return CheckpointFacts(root, available, gpu_dir, ini, tuple(splits), ini_tp, wdt)
