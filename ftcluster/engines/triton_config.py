"""Triton's model config, for every engine Triton serves: config.pbtxt goes through Triton's own
protobuf schema (`ModelConfig` + text_format), never through regexes; a model repository is
scanned for its models. Comments in config.pbtxt are lost on rewrite, which is why a run's
preparation writes a copy, never the original.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import importlib.util
import sys
from types import ModuleType
from typing import Any

from google.protobuf import text_format

from ftcluster.errors import SpecError


def _model_config_module() -> ModuleType:
    """Triton's ModelConfig schema, without importing tritonclient.grpc's client (grpc, numpy).

    The schema module needs only protobuf; loading it alone keeps every CLI call ~0.5 s faster.
    It is registered under its real name, so a later `import tritonclient.grpc` reuses it.
    """
    name = "tritonclient.grpc.model_config_pb2"
    if name in sys.modules:
        return sys.modules[name]
    # startup: only tritonclient's package, to find the schema file (see the docstring)
    import tritonclient

    path = Path(next(iter(tritonclient.__path__))) / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a broken install
        from tritonclient.grpc import model_config_pb2  # startup: as above (grpc, numpy only here)

        return model_config_pb2
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


model_config_pb2: Any = _model_config_module()
ModelConfig = model_config_pb2.ModelConfig


def one_line(text: str) -> str:
    return " ".join(text.split())


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None


def read_model_config(path: Path) -> model_config_pb2.ModelConfig:
    cfg = ModelConfig()
    try:
        text_format.Parse(read_text(path), cfg)
    except text_format.ParseError as exc:
        raise SpecError(f"{path}: not a valid Triton model config: {one_line(str(exc))}") from None
    return cfg


def dump_model_config(cfg: model_config_pb2.ModelConfig) -> str:
    return text_format.MessageToString(cfg)


def get_param(cfg: model_config_pb2.ModelConfig, key: str) -> str | None:
    if key in cfg.parameters:
        return str(cfg.parameters[key].string_value)
    return None


def set_param(cfg: model_config_pb2.ModelConfig, key: str, value: str) -> None:
    cfg.parameters[key].string_value = value


@dataclass(frozen=True)
class RepoModel:
    """One model folder of a Triton model repository."""

    name: str
    path: Path
    config: model_config_pb2.ModelConfig

    @property
    def backend(self) -> str:
        return str(self.config.backend or self.config.platform)


def scan_repository(repo: Path) -> dict[str, RepoModel]:
    """All models (folders with a config.pbtxt) of a repository, by folder name."""
    models: dict[str, RepoModel] = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        folder = cfg_path.parent
        models[folder.name] = RepoModel(folder.name, folder, read_model_config(cfg_path))
    if not models:
        raise SpecError(f"repository: no */config.pbtxt under {repo}",
                        hint="point repository at the folder that holds one folder per model")
    return models
