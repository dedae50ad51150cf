"""FasterTransformer's weight converter behind the engine (ftcluster.engines.base.Converter): the
converter script of FT's examples/pytorch for the model type, writing <checkpoint_root>/<tp>-gpu/,
and the checkpoint check of what it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftcluster.engines.base import Conversion
from ftcluster.engines.fastertransformer.checkpoint_check import checkpoint_problems
from ftcluster.engines.fastertransformer.converters import converter_argv, converter_for
from ftcluster.engines.fastertransformer.spec import ft_spec
from ftcluster.errors import UserError
from ftcluster.spec.model import ModelSpec


class FTConverter:
    output_field = "checkpoint_root"
    root = "a FasterTransformer checkout, which holds examples/pytorch/..."

    def conversion(self, model: ModelSpec, tp: int, converter_root: Path, input_dir: str, python: str) -> Conversion:
        ft = ft_spec(model, "convert")
        script = converter_root / converter_for(ft.model_type, ft.converter).script
        if not script.is_file():
            raise UserError(f"{script} does not exist", field="--converter-root",
                            hint="point it at a FasterTransformer checkout (the converter is looked up by model_type)")
        argv = converter_argv(ft.model_type, converter_root, input_dir, str(ft.checkpoint_root), tp,
                              ft.data_type or "fp16", ft.name, python=python, variant=ft.converter)
        paths = {str(converter_root), str(ft.checkpoint_root)}
        if Path(input_dir).is_absolute():
            paths.add(input_dir)
        return Conversion(tuple(argv), ft.checkpoint_root, tuple(sorted(paths)),
                          {"tensor_para_size": tp, "converter": argv, "model_type": ft.model_type,
                           "checkpoint_dir": str(ft.checkpoint_root / f"{tp}-gpu")})

    def problems(self, model: ModelSpec, tp: int) -> tuple[Path, list[str]]:
        ft = ft_spec(model, "check-checkpoint")
        return ft.checkpoint_root / f"{tp}-gpu", checkpoint_problems(ft.checkpoint_root, ft.model_type, tp)

    def result_problems(self, record: dict[str, Any]) -> list[str]:
        return checkpoint_problems(Path(record["checkpoint_dir"]).parent, record["model_type"],
                                   int(record["tensor_para_size"]))
