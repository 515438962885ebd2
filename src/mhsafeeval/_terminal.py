"""Text shown in a terminal: model output and user-supplied names made safe to print.

Model text (a counselor's reply quoted in an error line, an event's payload) and names taken
from a config file may hold control characters and escape sequences. Printed raw, an
``ESC [ ... m`` sequence recolours or clears the user's terminal, and a carriage return can
overwrite what came before it on the line. Everything the CLI prints from such a source goes
through :func:`visible` first; JSON printed for machines goes through :func:`visible_json`,
which makes the same characters harmless without changing the value the JSON decodes to.
"""

from __future__ import annotations

import unicodedata

__all__ = ["visible", "visible_json"]

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


_JSON_SPACE = str.maketrans("\t\n\r", "   ")


def visible_json(document: str) -> str:
    """A JSON ``document`` that decodes to the same value, with nothing a terminal acts on.

    JSON encoders escape C0 controls inside strings but pass C1 controls, bidirectional
    overrides and other invisible characters through as they are. Here every character that
    :func:`visible` would escape becomes a ``\\uXXXX`` escape (a surrogate pair above
    U+FFFF), and a tab or line break between tokens (the only place valid JSON can hold one
    raw) becomes a space, so one document stays one line.

    Args:
        document: valid JSON text (other text gets the same escapes, but may not decode).

    Example:
        >>> visible_json('{"text": "a\u202eb"}')
        '{"text": "a\\\\u202eb"}'
    """
    if document.isprintable():
        return document
    out = []
    for ch in document.translate(_JSON_SPACE):
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            high, low = divmod(ord(ch) - 0x10000, 0x400)
            out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}")
    return "".join(out)
