"""Tokenizers for the client and the gateway: `bytes` (the demo's byte-level TEST tokenizer) or
transformers (an AutoTokenizer name or a local folder).

transformers is optional (`pip install 'ftcluster[text]'`) and imported only when a name other
than `bytes` is given, so the CLI and the gateway stay light.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from ftcluster.errors import UserError


class Tokenizer(Protocol):
    name: str
    pad_id: int          # fills input_ids rows shorter than the longest prompt of a batch

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """One token per UTF-8 byte, ids >= 256 (padding, end ids) dropped: the demo ensemble's scheme."""

    name = "bytes"
    pad_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, name_or_path: str):
        # Without torch, transformers warns on import that models are unavailable; we only tokenize.
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            # optional extra: text (transformers)
            from transformers import AutoTokenizer
        except ImportError:
            raise UserError(f"--tokenizer {name_or_path!r} needs transformers", field="--tokenizer",
                            hint="pip install 'ftcluster[text]', or use --tokenizer bytes for the demo") from None
        try:
            self._tok: Any = AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load tokenizer {name_or_path!r}: {exc}", field="--tokenizer") from None
        self.name = name_or_path
        pad = next((t for t in (self._tok.pad_token_id, self._tok.eos_token_id) if t is not None), 0)
        self.pad_id = int(pad)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))


def load_tokenizer(name_or_path: str | None) -> Tokenizer | None:
    if not name_or_path:
        return None
    if name_or_path == "bytes":
        return ByteTokenizer()
    return HFTokenizer(name_or_path)
