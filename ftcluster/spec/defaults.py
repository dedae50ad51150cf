"""Which cluster and model spec a command uses when none is named: `--cluster`/`--model` first,
then $FTCLUSTER_CLUSTER / $FTCLUSTER_MODEL, then the user's config file
($XDG_CONFIG_HOME/ftcluster/config.yaml, default ~/.config/ftcluster/config.yaml, keys `cluster`
and `model`, set by `ftcluster config`), then the embedded local cluster and test model."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from ftcluster.spec import yaml_text
from ftcluster.errors import UserError
from ftcluster.spec.plaintext import not_text
from ftcluster.resources import package_path

KEYS = ("cluster", "model")
ENV = {"cluster": "FTCLUSTER_CLUSTER", "model": "FTCLUSTER_MODEL"}


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "ftcluster" / "config.yaml"


def embedded(key: str) -> Path:
    return package_path("demo", "local-cluster.yaml" if key == "cluster" else "model.yaml")


def embedded_cluster_path() -> Path:
    """The embedded local cluster: ranks as local processes on this machine."""
    return embedded("cluster")


def embedded_model_path() -> Path:
    """The embedded test model shipped with the package (the default engine's shape)."""
    return embedded("model")


def embedded_model_name() -> str:
    """The embedded test model's name on the server: the model a client asks for when nothing
    names one."""
    return str(yaml.safe_load(embedded_model_path().read_text())["name"])


def read_config() -> dict[str, str]:
    path = config_path()
    try:
        data = yaml_text.load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        raise UserError(f"cannot read {path}: not a text file", field="config", hint="fix it, or remove it") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}", field="config",
                        hint="fix it, or remove it") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: {yaml_text.problem(exc)}", field="config", hint="fix it, or remove it") from None
    if not isinstance(data, dict) or set(data) - set(KEYS) or not all(isinstance(v, str) for v in data.values()):
        raise UserError(f"{path} holds other than `cluster: PATH` and `model: PATH`", field="config",
                        hint="ftcluster config --unset KEY, or edit the file")
    # A path the OS cannot take (a NUL) would be a ValueError at the first stat.
    bad = [f"{k}: {v!r} holds {why} (no path may hold one)" for k, v in data.items() if (why := not_text(v))]
    if bad:
        raise UserError(f"{path}: " + "; ".join(bad), field="config", hint="edit the file, or remove it")
    return {k: str(v) for k, v in data.items()}


def default_with_source(key: str) -> tuple[Path, str]:
    """The spec a command uses for `key` when none is named, and where that came from."""
    env = os.environ.get(ENV[key])
    if env:
        return Path(env).expanduser(), f"${ENV[key]}"
    found = read_config().get(key)
    if found:
        return Path(found).expanduser(), str(config_path())
    return embedded(key), "embedded"


def default_path(key: str) -> Path:
    return default_with_source(key)[0]


def default_cluster_path() -> Path:
    """The cluster spec used when none is named: $FTCLUSTER_CLUSTER, the user's config file, else
    the embedded local cluster."""
    return default_path("cluster")


def default_model_path() -> Path:
    """The model spec used when none is named: $FTCLUSTER_MODEL, the user's config file, else the
    embedded test model."""
    return default_path("model")


def user_default(key: str) -> Path | None:
    """The user's own default (variable or config file), None when it is the embedded one."""
    path, source = default_with_source(key)
    return None if source == "embedded" else path


def write_config(values: dict[str, str | None]) -> Path:
    """Set (a path) or unset (None) keys of the config file; the file is the user's alone."""
    data: dict[str, str] = read_config()
    for key, value in values.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=True) if data else "")
    return path
