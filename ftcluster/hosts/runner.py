"""Run commands and touch files where the cluster is: here, or on a login node over SSH.

Slurm commands, log reading and run-folder writes all go through a `Runner`, so remote use
is the same code with another runner, not a second code path.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def brief(self) -> str:
        """The command and its first error line, for messages."""
        err = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"`{shlex.join(self.argv)}` exited {self.returncode}" + (f": {err[-1]}" if err else "")


class Runner(Protocol):
    """Where commands run and run folders live."""

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult: ...
    def read_text(self, path: str) -> str: ...
    def write_text(self, path: str, text: str, mode: int = 0o644) -> None: ...
    def exists(self, path: str) -> bool: ...
    def open_binary(self, path: str) -> IO[bytes]: ...
    def which(self, name: str) -> str | None: ...


class LocalRunner:
    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float | None = 60.0) -> CommandResult:
        try:
            proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(tuple(argv), 124, "", f"timed out after {timeout}s")
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def read_text(self, path: str) -> str:
        return Path(path).read_text(errors="replace")

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        os.chmod(p, mode)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def open_binary(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def which(self, name: str) -> str | None:
        return shutil.which(name)
