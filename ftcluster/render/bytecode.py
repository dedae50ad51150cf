"""Bytecode for the package's modules that a run folder carries as copies (the job supervisor,
scripts/ftcluster_job/). Without it the job's Python compiles every one of them at each job's
start, some 15-20 ms on the way to the servers. The installed package's own cache (pip compiles
a wheel's modules at install) is given a checked-hash header (PEP 552): valid for the copy
whatever its mtime, checked against the copy's source at import, and named for this Python
(its cache tag), so that another Python ignores it and compiles as before."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_CHECKED_HASH = (0b11).to_bytes(4, "little")   # hash-based, check the source


def _installed_code(source: Path, text: bytes) -> bytes | None:
    """The marshalled code of this Python's cache entry for `source` (whose bytes are `text`),
    when the entry is current; else None."""
    try:
        data = Path(importlib.util.cache_from_source(str(source))).read_bytes()
        st = source.stat()
    except (OSError, NotImplementedError, ValueError):
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags == 0:   # timestamp-based, as pip and a plain import write it
        current = (int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                   and int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF)
    else:
        current = bool(flags & 1) and data[8:16] == importlib.util.source_hash(text)
    return data[16:] if current else None


def ship_bytecode(copy: Path, source: Path) -> bool:
    """Write the bytecode of `copy` (a copy of the package's `source`, byte for byte) into its
    folder's __pycache__; False where there is none to ship (no current cache entry, another
    text, a package or folder that cannot be written, PYTHONDONTWRITEBYTECODE): the job's
    Python then compiles the copy itself."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return False
    try:
        text = copy.read_bytes()
        if text != source.read_bytes():
            return False
    except OSError:
        return False
    code = _installed_code(source, text)
    if code is None and not sys.dont_write_bytecode:
        # None yet (an editable install imports only part of the supervisor itself): made once,
        # where importing the module would have put it.
        import py_compile

        try:
            py_compile.compile(str(source), quiet=2)
        except OSError:   # a package folder this user cannot write
            return False
        code = _installed_code(source, text)
    if code is None:
        return False
    # Beside the copy whatever this Python's pycache_prefix: the job's Python looks there.
    target = copy.parent / "__pycache__" / f"{copy.stem}.{tag}.pyc"
    try:
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(importlib.util.MAGIC_NUMBER + _CHECKED_HASH + importlib.util.source_hash(text) + code)
    except OSError:
        return False
    return True
