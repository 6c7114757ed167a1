"""Make text from a sandbox safe to print on a terminal.

Anything the sandbox provides (job labels and commands, ids, states, file names, messages that
embed them) may hold terminal controls: ``ESC ] 52`` writes the user's clipboard, ``ESC [ 2 J``
clears the screen, ``\\r`` and U+202E (right-to-left override) make a line read differently
from what it holds, a newline forges table rows. :func:`terminal_safe` replaces each such
character with a visible escape (``\\x1b``, ``\\u202e``, ``\\n``) and keeps ordinary Unicode.

A leaf module (it imports nothing from the package), so every layer that prints can use it:
the CLI, the notebook's text fallbacks. A job's *output* is not passed through it: ``run`` and
``attach`` print the program's bytes as they are, as ``ssh`` and ``docker logs`` do.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["terminal_safe"]

# Categories a terminal may act on or that change how the text around them reads: Cc (C0
# controls, DEL, C1 controls such as the one-byte CSI U+009B), Cf (format: bidi overrides and
# isolates, zero-width characters), Zl/Zp (line and paragraph separators), Cs (lone surrogates:
# bytes that were not UTF-8, which would also make ``print`` raise UnicodeEncodeError).
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Printable ASCII is safe as it is; anything else is looked up (one regex scan, so plain
# text costs no per-character Python call).
_SUSPECT = re.compile(r"[^\x20-\x7e]")


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, decoded with surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _fix(match: re.Match[str]) -> str:
    ch = match.group()
    return _escape(ch) if unicodedata.category(ch) in _UNSAFE else ch


def terminal_safe(value: object) -> str:
    """``str(value)`` with every control, format and separator character shown as an escape.

    ``"a\\x1b[2J\\u202e\\n"`` becomes ``a\\x1b[2J\\u202e\\n`` as printed (backslashes and all).
    The result is one line, holds no byte a terminal acts on, and encodes to UTF-8.
    """
    text = value if isinstance(value, str) else str(value)
    return _SUSPECT.sub(_fix, text)
