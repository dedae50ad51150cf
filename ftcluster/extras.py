"""Optional parts of ftcluster, each behind a pip extra: a command that needs one that is not
installed says which extra to install, in one line, instead of an ImportError."""

from __future__ import annotations

import importlib
from types import ModuleType

from ftcluster.errors import UserError

# The package a module comes from, and the extra that installs it (pyproject.toml).
EXTRAS = {"fabric": "ssh", "paramiko": "ssh", "docker": "docker", "tritonclient.http": "client",
          "tritonclient.grpc": "client", "fastapi": "gateway", "matplotlib": "plot"}


def need(module: str, what: str) -> ModuleType:
    """Import `module` for `what`, or fail naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except (ImportError, RuntimeError) as exc:
        # tritonclient.http and .grpc wrap a missing dependency of theirs (gevent, grpcio) in a
        # RuntimeError ("The installation does not include http support"): the plain
        # `tritonclient` that ftcluster's base install brings lacks them.
        if isinstance(exc, RuntimeError) and not isinstance(exc.__cause__, ImportError):
            raise
        extra = EXTRAS.get(module) or EXTRAS.get(module.split(".")[0], "")
        raise UserError(f"{what} needs {module.split('.')[0]} ({exc})", field=None,
                        hint=f"pip install 'ftcluster[{extra}]'" if extra else "install it") from None
