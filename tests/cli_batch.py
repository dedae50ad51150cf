"""Many `python -m ftcluster ARGS` runs at the cost of one interpreter's start.

Reads a JSON list of cases ({"args", "cwd", "out", "err"}) on stdin; runs each as `python -m
ftcluster` runs it (runpy, `__main__`, the CLI's own exit), in a child forked from a process that
has imported ftcluster once, its stdout and stderr into the case's files, stdin /dev/null; writes
the exit codes as a JSON list. A child is a process of its own, as the subprocess would be: its
working folder, its exit, its traceback on stderr when something escapes.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import runpy
import sys
import traceback
from typing import Any

import ftcluster


def _preload() -> None:
    # What the commands import, once here (forked children share it) rather than once per case.
    for mod in pkgutil.walk_packages(ftcluster.__path__, "ftcluster."):
        if mod.name.endswith("__main__") or ".demo" in mod.name:
            continue
        try:
            importlib.import_module(mod.name)
        except Exception:   # an optional extra not installed: the case imports it (and says so) itself
            pass


def _child(case: dict[str, Any]) -> None:
    code = 1
    try:
        os.chdir(case["cwd"])
        for fd, path in ((1, case["out"]), (2, case["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.argv = [os.path.join(ftcluster.__path__[0], "__main__.py"), *case["args"]]
        try:
            runpy.run_module("ftcluster", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:   # the CLI ends with os._exit; a SystemExit is Python's own ending
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def main() -> None:
    cases = json.load(sys.stdin)
    jobs = os.cpu_count() or 1
    _preload()
    codes: list[int | None] = [None] * len(cases)
    running: dict[int, int] = {}

    def reap() -> None:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)

    for i, case in enumerate(cases):
        while len(running) >= jobs:
            reap()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(case)
        running[pid] = i
    while running:
        reap()
    json.dump(codes, sys.stdout)


if __name__ == "__main__":
    main()
