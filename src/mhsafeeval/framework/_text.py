"""Making text safe to show in a terminal (see :mod:`mhsafeeval._terminal`); here, at the
bottom layer, so that log lines can use it too."""

from __future__ import annotations

import unicodedata

__all__ = ["visible"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def visible(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with every control or format character shown as an escape, never emitted.

    Printable characters (any script, emoji included) are kept as they are; C0/C1 controls,
    DEL, and invisible format characters (bidirectional overrides, zero-width joiners) become
    ``\\xNN`` / ``\\uNNNN`` escapes, and a backslash is kept as it is.

    Args:
        text: what to show (``str()`` is taken of anything else).
        keep_newlines: keep ``\\n`` as a line break (for multi-line text such as a report).

    Example:
        >>> visible("ok\\x1b[2Jgone\\r")
        'ok\\\\x1b[2Jgone\\\\r'
        >>> visible("two\\nlines", keep_newlines=True)
        'two\\nlines'
        >>> visible("café 🙂")
        'café 🙂'
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    out = []
    for ch in s:
        if ch.isprintable() or ch == " " or (keep_newlines and ch == "\n"):
            out.append(ch)
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) == "Zs":  # other spaces: printable in effect
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return "".join(out)
