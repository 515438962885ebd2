"""Errors that users see.

Every problem with something the user handed us (a config file, a profile, a taxonomy,
a database) is an :class:`InputError` naming *where* (file and field) and *why*. The CLI
turns it into one line on stderr and exit code 2, before anything is written.

Every reader of a user file (config TOML and ``--set`` values, taxonomies, profiles, labels)
reads and decodes it through :func:`read_input`, :func:`decode_toml` and :func:`decode_json`,
which bound inputs of any shape: :data:`MAX_INPUT_BYTES` a file, :data:`MAX_NESTING` levels of
nesting. Past them, an :class:`InputError` names the file, never a ``RecursionError`` or a parser
that runs out of memory.
"""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import msgspec

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_NESTING",
    "InputError",
    "MhSafeEvalError",
    "convert",
    "decode_json",
    "decode_toml",
    "join_path",
    "read_input",
    "read_input_bytes",
    "validation_error",
]

MAX_INPUT_BYTES = 16 * 1024 * 1024
"""The largest input a reader accepts (16 MiB: a config, taxonomy or profile file is a few KiB,
a labelled set of ten thousand exchanges a few MiB)."""
MAX_NESTING = 64
"""The deepest nesting an input may have: arrays, tables and objects inside each other, and the
parts of a dotted TOML key (``a.b.c``: 3). Every shipped input stays under 8."""

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


def read_input(path: str | Path, encoding: str = "utf-8") -> str:
    """A user file's text, as ``Path.read_text(encoding)`` reads it (newlines as ``\\n``), of
    at most :data:`MAX_INPUT_BYTES` bytes.

    Raises:
        InputError: the file is larger (or a device or pipe that goes on).
        OSError, UnicodeDecodeError: as ``read_text``; each reader words them.
    """
    data = read_input_bytes(path)
    return io.TextIOWrapper(io.BytesIO(data), encoding=encoding).read()


def read_input_bytes(path: str | Path) -> bytes:
    """A user file's bytes, at most :data:`MAX_INPUT_BYTES` of them (see :func:`read_input`)."""
    with open(path, "rb") as file:
        data = file.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise _too_large(path, None)
    return data


def decode_toml(text: str, source: str | Path | None, field: str | None = None) -> dict[str, Any]:
    """``tomllib.loads(text)``, bounded by :data:`MAX_NESTING` and :data:`MAX_INPUT_BYTES`.

    Raises:
        InputError: nested too deep (naming ``field``, else the line), or too long.
        tomllib.TOMLDecodeError: not TOML; each reader words it.

    Example:
        >>> decode_toml("a.b = [[1]]", "ok.toml")
        {'a': {'b': [[1]]}}
        >>> decode_toml("a = 1\\nb = " + "[" * 100 + "]" * 100, "deep.toml")
        Traceback (most recent call last):
        mhsafeeval.errors.InputError: deep.toml: line 2: nested more than 64 levels deep
    """
    _check_size(text, source, field)
    _scan(text, _TOML_TOKEN, source, field)
    try:
        data = tomllib.loads(text)
    except RecursionError:  # a last resort: the scan keeps the parser from recursing this deep
        raise _too_deep(source, field, text, None) from None
    if _depth(data) > MAX_NESTING:  # tables, dotted keys and arrays, each within the bound
        raise _too_deep(source, field, text, None)
    return data


def decode_json(data: bytes | str, source: str | Path | None, field: str | None = None) -> Any:
    """``msgspec.json.decode(data)``, bounded by :data:`MAX_NESTING` and
    :data:`MAX_INPUT_BYTES`.

    Raises:
        InputError: nested too deep (naming ``field``, else the line), or too long.
        msgspec.DecodeError: not JSON; each reader words it.

    Example:
        >>> decode_json(b'{"a": ["[[["]}', "ok.json")
        {'a': ['[[[']}
        >>> decode_json("[" * 100_000, "deep.jsonl", "line 3")
        Traceback (most recent call last):
        mhsafeeval.errors.InputError: deep.jsonl: line 3: nested more than 64 levels deep
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    _check_size(text, source, field)
    _scan(text, _JSON_TOKEN, source, field)
    try:
        return msgspec.json.decode(data)
    except RecursionError:  # a last resort: the scan keeps the parser from recursing this deep
        raise _too_deep(source, field, text, None) from None


# The scans are lexers only, so that no decoder recurses past the bound (nor, for TOML's dotted
# keys, grows quadratically); the decoders still judge what is valid. They skip strings (a
# bracket in a string is text), comments and blanks.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?P<open>[\[{])|(?P<close>[\]}])')
_TOML_TOKEN = re.compile(
    r"""(?P<key>'''.*?'''|'[^'\n]*'|\"\"\"(?:[^\\]|\\.)*?\"\"\"|"(?:[^"\\\n]|\\.)*"
        |[A-Za-z0-9_+:-]+)
    |(?P<open>[\[{])|(?P<close>[\]}])|(?P<dot>\.)|(?P<blank>[ \t]+)|\#[^\n]*|.""",
    re.DOTALL | re.VERBOSE,
)


def _scan(text: str, token: re.Pattern[str], source: str | Path | None, field: str | None) -> None:
    """Refuse brackets nested deeper, or dotted keys of more parts, than :data:`MAX_NESTING`."""
    depth = parts = 0
    dotted = False
    for found in token.finditer(text):
        kind = found.lastgroup
        if kind == "open":
            depth += 1
            if depth > MAX_NESTING:
                raise _too_deep(source, field, text, found.start())
        elif kind == "close":
            depth = max(0, depth - 1)
        elif kind == "key":  # a key, or a part of a dotted one (numbers and dates look alike)
            parts = parts + 1 if dotted else 1
            if parts > MAX_NESTING:
                raise _too_deep(source, field, text, found.start())
        if kind != "blank":
            dotted = kind == "dot"
        if kind not in ("key", "dot", "blank"):
            parts = 0


def _depth(value: Any) -> int:
    """How deep dicts and lists nest in ``value`` (a scalar: 0), without recursing; counted
    no further than one level past :data:`MAX_NESTING`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_NESTING:
                items = node.values() if isinstance(node, dict) else node
                stack.extend((item, level + 1) for item in items)
    return deepest


def _check_size(text: str, source: str | Path | None, field: str | None) -> None:
    if len(text) > MAX_INPUT_BYTES:
        raise _too_large(source, field)


def _too_large(source: str | Path | None, field: str | None) -> InputError:
    return InputError(source, field, f"larger than {MAX_INPUT_BYTES // 2**20} MiB")


def _too_deep(
    source: str | Path | None, field: str | None, text: str, at: int | None
) -> InputError:
    if field is None and at is not None and "\n" in text:
        line = text.count("\n", 0, at) + 1
        field = f"line {line}"
    return InputError(source, field, f"nested more than {MAX_NESTING} levels deep")
