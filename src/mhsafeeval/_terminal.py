"""Text shown in a terminal: model output and user-supplied names made safe to print.

Model text (a counselor's reply quoted in an error line, an event's payload) and names taken
from a config file may hold control characters and escape sequences. Printed raw, an
``ESC [ ... m`` sequence recolours or clears the user's terminal, and a carriage return can
overwrite what came before it on the line. Everything the CLI prints from such a source goes
through :func:`visible` first; JSON printed for machines goes through :func:`visible_json`,
which makes the same characters harmless without changing the value the JSON decodes to.
"""

from __future__ import annotations

from mhsafeeval.framework._text import visible

__all__ = ["visible", "visible_json"]

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
