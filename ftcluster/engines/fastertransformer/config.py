"""The FT backend's own config facts: which model of a repository is the FT model, and
config.ini (written by FT's converters) through configparser. config.pbtxt is Triton's
(ftcluster.engines.triton_config)."""

from __future__ import annotations

import configparser
from pathlib import Path

from ftcluster.engines.triton_config import RepoModel, one_line, read_text
from ftcluster.errors import SpecError


def find_ft_model(models: dict[str, RepoModel], wanted: str | None, served: str) -> RepoModel:
    """The FT model of a repository: named by the spec, else the one with the FT backend."""
    if wanted:
        if wanted not in models:
            raise SpecError(f"ft_model: no model folder {wanted!r} in the repository",
                            hint=f"choose one of {sorted(models)}")
        return models[wanted]
    ft = [m for m in models.values() if m.backend == "fastertransformer"]
    if len(ft) == 1:
        return ft[0]
    if served in models and not ft:
        return models[served]
    raise SpecError(
        f"ft_model: cannot tell which model is the FT model ({len(ft)} use the fastertransformer backend)",
        hint="set ft_model: <folder name> in the model spec",
    )


def read_ini(path: Path) -> configparser.ConfigParser:
    # FT converters write inline comments with ';' and '#' (e.g. "max_pos_seq_len=2048 ;for ...").
    parser = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), interpolation=None, strict=False)
    text = read_text(path)
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        # configparser's messages span lines (file, line number, the offending text).
        raise SpecError(f"{path}: not a valid config.ini: {one_line(exc.message)}") from None
    return parser
