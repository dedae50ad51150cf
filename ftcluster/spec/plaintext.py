"""What no value a person gives ftcluster holds (a spec's strings, the config file's paths, the
options that reach a job): a character that is not visible text.

That is Unicode's controls (C0, DEL and C1, NEL among them), its line and paragraph separators
(U+2028, U+2029), its format characters (bidirectional overrides, zero-width characters: text
that shows other than it is) and a lone surrogate (no file system or file takes it). Python's
str.splitlines breaks at NEL and U+2028/2029 as at a newline, a terminal obeys escapes and
overrides, and the OS refuses a NUL or a surrogate in a path (as ValueError, not OSError). A
multi-line value (the spec's env: a certificate) may hold newlines, carriage returns and tabs.
Light (unicodedata only): the CLI's option types use it too.
"""

from __future__ import annotations

import unicodedata

# Unicode's general categories of what is not visible text.
_NOT_TEXT = {"Cc": "a control character", "Cf": "a format character", "Cs": "a lone surrogate",
             "Zl": "a line separator", "Zp": "a paragraph separator"}
# The controls people know by name (unicodedata has no names for controls).
_CONTROL_NAMES = {"\0": "NUL", "\t": "tab", "\n": "newline", "\r": "carriage return", "\x1b": "escape",
                  "\x7f": "DEL", "\x85": "NEL"}
# What a multi-line value may hold of them.
MULTI_LINE = frozenset("\n\r\t")


def not_text(text: str, allowed: frozenset[str] = frozenset()) -> str | None:
    """The first character of `text` that is not visible text, in words (`U+0085 (NEL), a
    control character`), without the text around it (it may be a secret); None when there is none."""
    if text.isascii():   # the common case, without a lookup per character
        bad = next((c for c in text if (ord(c) < 32 or c == "\x7f") and c not in allowed), None)
    else:
        bad = next((c for c in text if unicodedata.category(c) in _NOT_TEXT and c not in allowed), None)
    return None if bad is None else describe(bad)


def describe(char: str) -> str:
    """A character that is not visible text, in words: its code point, name where it has a known
    one, and kind. A byte that is no UTF-8 comes from argv or the OS as a surrogate of
    U+DC80-U+DCFF (Python's surrogateescape): said as that byte."""
    if 0xDC80 <= ord(char) <= 0xDCFF:
        return f"the byte 0x{ord(char) - 0xDC00:02X}, which is no UTF-8"
    kind = unicodedata.category(char)
    name = _CONTROL_NAMES.get(char) or (unicodedata.name(char, "").lower() if kind == "Cf" else "")
    return f"U+{ord(char):04X}{f' ({name})' if name else ''}, {_NOT_TEXT.get(kind, 'a character')}"
