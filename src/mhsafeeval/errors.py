"""Errors that users see.

Every problem with something the user handed us (a config file, a profile, a taxonomy,
a database) is an :class:`InputError` naming *where* (file and field) and *why*. The CLI
turns it into one line on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec

__all__ = ["InputError", "MhSafeEvalError", "convert", "join_path", "validation_error"]

T = TypeVar("T")


class MhSafeEvalError(Exception):
    """Base class of every error this package raises on purpose.

    Example:
        >>> from mhsafeeval.config import parse_config
        >>> try:
        ...     parse_config("campaign = 3", "bad.toml")
        ... except MhSafeEvalError as exc:  # an InputError, say
        ...     print(type(exc).__name__)
        InputError
    """


class InputError(MhSafeEvalError):
    """Bad user input: names the file, the field (a key path such as ``models.judge.timeout``)
    and the reason.

    Example:
        >>> str(InputError("campaign.toml", "models.judge.timeout", "expected a number"))
        'campaign.toml: models.judge.timeout: expected a number'
    """

    def __init__(self, source: str | Path | None, field: str | None, reason: str) -> None:
        self.source = str(source) if source is not None else None
        self.field = field or None
        self.reason = reason
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        return ": ".join([*parts, self.reason])


def validation_error(source: str | Path | None, exc: Exception, prefix: str = "") -> InputError:
    """Turn a msgspec ``ValidationError`` (or a ``ValueError`` raised while validating) into an
    :class:`InputError` whose field is a readable key path.

    msgspec reports ``"Expected `int`, got `str` - at `$.models[0].timeout`"`` (innermost
    location first when a ``__post_init__`` raised); ``prefix`` is put before the path so that
    callers who validate one entry of a table at a time can name its key.

    Example:
        >>> err = validation_error("c.toml", ValueError("Expected `int`, got `str` - at `$.seed`"))
        >>> str(err)
        'c.toml: seed: expected int, got str'
    """
    reason, *where = str(exc).split(" - at `")
    path = prefix
    for segment in reversed(where):
        path = join_path(path, segment.rstrip("`").removeprefix("$").lstrip("."))
    field = _FIELD.match(reason)
    if field:
        what = "missing required field" if field["what"] == "missing required" else "unknown field"
        return InputError(source, join_path(path, field["name"]), what)
    reason = reason.replace("`", "")
    return InputError(source, path or None, reason[:1].lower() + reason[1:])


def convert(value: Any, kind: type[T], source: str | Path | None, prefix: str = "") -> T:
    """``msgspec.convert(value, kind)`` whose errors are :class:`InputError` naming the key path."""
    try:
        return msgspec.convert(value, kind)
    except (msgspec.ValidationError, ValueError) as exc:
        raise validation_error(source, exc, prefix) from None


_FIELD = re.compile(r"Object (?P<what>missing required|contains unknown) field `(?P<name>[^`]*)`")


def join_path(prefix: str, rest: str) -> str:
    """Join key paths: ``join_path("a", "b") == "a.b"``, ``join_path("a", "[0]") == "a[0]"``."""
    if not prefix or not rest:
        return prefix or rest
    return prefix + rest if rest.startswith("[") else f"{prefix}.{rest}"
