"""MkDocs hook: the reference pages' generated parts, built from the code at every build.

* ``<!-- generated: config -->``: every config key, from the msgspec Structs in
  ``mhsafeeval.config`` (and the built-in plugins' option Structs): its type, default and
  bounds (``msgspec.Meta``) as msgspec sees them, and its description, the string literal
  written right after the field in the source (read with :mod:`ast`, so nothing is written
  twice).
* ``<!-- generated: cli -->``: ``mhsafeeval --help`` and each command's help, from the
  argparse parser, formatted at 80 columns.
* ``<!-- generated: compare-schema -->``: the JSON Schema of ``compare --json``.

``tests/test_docs.py`` imports this file: :func:`undocumented` lists the keys without a
description (the test fails on any), and the strict build runs the hook.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import inspect
import json
import logging
import os
import re
import textwrap
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec
import msgspec.inspect as mi

_log = logging.getLogger("mkdocs.hooks.reference")


class Key(NamedTuple):
    """One config key: where it lives, what it takes, and what it means."""

    table: str
    name: str
    type: str
    default: str
    bounds: str
    description: str


class Table(NamedTuple):
    """One TOML table of the config reference."""

    path: str
    doc: str
    keys: list[Key]


def _markdown(text: str) -> str:
    """A docstring's reST as Markdown: ``x`` and :role:`x` become `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """The string literal after each annotated field of ``cls`` (and of its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, msgspec.Struct) or not klass.__module__.startswith("mhsafeeval"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for field, after in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[field.target.id] = _markdown(inspect.cleandoc(after.value.value))
    return docs


def _type(t: mi.Type) -> str:
    """A msgspec type as the TOML a user writes."""
    match t:
        case mi.IntType():
            return "integer"
        case mi.FloatType():
            return "number"
        case mi.StrType():
            return "string"
        case mi.BoolType():
            return "boolean"
        case mi.NoneType():
            return "unset"
        case mi.AnyType():
            return "any"
        case mi.LiteralType():
            return " \\| ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v}`" for v in t.values)
        case mi.UnionType():
            return " or ".join(_type(x) for x in t.types if not isinstance(x, mi.NoneType))
        case mi.ListType() | mi.VarTupleType() | mi.SetType() | mi.FrozenSetType():
            return f"array of {_type(t.item_type)}"
        case mi.DictType():
            return f"table of {_type(t.value_type)}"
        case mi.StructType():
            return "table"
    return type(t).__name__


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) or float(value).is_integer() else str(value)


def _bounds(t: mi.Type, extra: tuple[float, float | None] | None = None) -> str:
    """The range msgspec checks (``Meta``), or ``extra``: one ``check`` applies itself."""
    if isinstance(t, mi.UnionType):
        return "; ".join(filter(None, (_bounds(x, extra) for x in t.types)))
    parts = []
    for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        value = getattr(t, attr, None)
        if value is not None:
            parts.append(f"{sign} {_number(value)}")
    if extra is not None and not parts and isinstance(t, mi.IntType | mi.FloatType):
        low, high = extra
        parts.append(f">= {_number(low)}" if high is None else f"{_number(low)} to {_number(high)}")
    if getattr(t, "pattern", None):
        parts.append(f"pattern `{t.pattern}`")  # type: ignore[attr-defined]
    return ", ".join(parts)


def _default(f: mi.Field) -> str:
    if f.required:
        return "required"
    value = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
    if value is None:
        return "unset"
    return f"`{json.dumps(msgspec.to_builtins(value))}`"


def _opens(t: mi.Type) -> tuple[str, type] | None:
    """Whether ``t`` is a table of its own: (how its path continues, its Struct)."""
    if isinstance(t, mi.UnionType):
        structs = [x for x in t.types if isinstance(x, mi.StructType)]
        return ("", structs[0].cls) if len(structs) == 1 else None
    if isinstance(t, mi.StructType):
        return "", t.cls
    if isinstance(t, mi.DictType) and isinstance(t.value_type, mi.StructType):
        return ".NAME", t.value_type.cls
    if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
        return "[]", t.item_type.cls
    return None


def _first_paragraph(cls: type) -> str:
    return _markdown(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0])


def _tables(path: str, cls: type, doc: str, shown: dict[type, str]) -> Iterator[Table]:
    """``cls``'s table at ``path`` and the tables inside it; a Struct already ``shown``
    elsewhere (a model table) refers there and lists only the keys it adds."""
    from mhsafeeval.config import _MODEL_LIMITS
    from mhsafeeval.providers import ModelSettings

    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    docs = _field_docs(cls)
    base = next((b for b in cls.__mro__ if b in shown), None)
    base_info = mi.type_info(base) if base is not None else None
    skip = {f.name for f in base_info.fields} if isinstance(base_info, mi.StructType) else set()
    if base is not None:
        kind = "A model table: the keys of" if issubclass(base, ModelSettings) else "The keys of"
        doc = f"{doc} {kind} `[{shown[base].split('|')[0]}]`" + (
            ", and these:" if len(skip) < len(info.fields) else "."
        )
    else:
        own = _first_paragraph(cls)
        doc = own if own.startswith("`[") else " ".join(filter(None, (doc, own)))
        shown[cls] = path
    keys, nested = [], []
    for f in info.fields:
        if f.name in skip:
            continue
        opened = _opens(f.type)
        if opened is not None:
            how, inner = opened
            child = f"{path}.{f.encode_name}".lstrip(".")
            nested.append((child + how, inner, docs.get(f.name, "")))
            continue
        limits = _MODEL_LIMITS.get(f.name) if issubclass(cls, ModelSettings) else None
        keys.append(
            Key(
                path,
                f.encode_name,
                _type(f.type),
                _default(f),
                _bounds(f.type, limits),
                docs.get(f.name, ""),
            )
        )
    if path and info.fields:
        yield Table(path, doc, keys)
    for child, inner, child_doc in nested:
        yield from _tables(child, inner, child_doc, shown)


def config_tables() -> list[Table]:
    """Every table of a campaign config, with the built-in plugins' option tables."""
    from mhsafeeval.config import Config
    from mhsafeeval.judges._registry import JUDGES
    from mhsafeeval.providers._registry import provider_info
    from mhsafeeval.search._registry import CONTROLLERS

    shown: dict[type, str] = {}
    tables = list(_tables("", Config, "", shown))
    options: type[msgspec.Struct] | None
    for name in CONTROLLERS.available():
        options = CONTROLLERS.get(name).options
        if options is not None and options not in shown:
            users = [n for n in CONTROLLERS.available() if CONTROLLERS.get(n).options is options]
            label = "controller " + ", ".join(users)
            tables += _tables(f"search|{label}", options, "", shown)
    for name in JUDGES.available():
        options = JUDGES.get(name).options
        if options is not None and options not in shown:
            tables += _tables(f"judge|judge {name}", options, "", shown)
    for prefix in ("scripted", "local", "openai", "litellm", "http", "vllm"):
        options = provider_info(prefix).options
        if options is not None:
            tables += _tables(f"models.NAME.options|{prefix}/", options, "", shown)
    return [t for t in tables if t.keys or t.doc]


def undocumented() -> list[str]:
    """Every config key that has no description (``table.key``)."""
    return [
        f"{t.path.split('|')[0]}.{k.name}"
        for t in config_tables()
        for k in t.keys
        if not k.description
    ]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_markdown() -> str:
    """The config reference: one table per TOML table."""
    out = []
    for t in config_tables():
        path, _, label = t.path.partition("|")
        heading = f"[[{path[:-2]}]]" if path.endswith("[]") else f"[{path}]"
        out += [f"### `{heading}`" + (f" ({label})" if label else ""), ""]
        out += [" ".join(t.doc.split()), ""] if t.doc else []
        if not t.keys:
            continue
        out += ["| key | type | default | bounds | description |", "|---|---|---|---|---|"]
        out += [
            f"| `{k.name}` | {k.type} | {k.default} | {_cell(k.bounds)} | {_cell(k.description)} |"
            for k in t.keys
        ]
        out.append("")
    return "\n".join(out)


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def commands() -> dict[str, argparse.ArgumentParser]:
    """``mhsafeeval`` (as ``""``) and each command's parser, in the order ``--help`` lists."""
    from mhsafeeval.cli._arguments import _parser

    parser = _parser()
    found = {"": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def cli_markdown() -> str:
    """Every command's ``--help``, as printed at 80 columns."""
    out = []
    with _columns(80):
        for name, parser in commands().items():
            title = f"mhsafeeval {name}".strip()
            out += [f"### `{title}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def compare_schema_markdown() -> str:
    """The JSON Schema of ``compare --json``, from its Structs."""
    from mhsafeeval.reports.compare import comparison_schema

    return "```json\n" + json.dumps(comparison_schema(), indent=2) + "\n```\n"


GENERATED = {
    "<!-- generated: config -->": config_markdown,
    "<!-- generated: cli -->": cli_markdown,
    "<!-- generated: compare-schema -->": compare_schema_markdown,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: put the generated parts into the pages that ask for them (a config key
    without a description is a warning, so ``--strict`` fails)."""
    if "<!-- generated: config -->" in markdown:
        for key in undocumented():
            _log.warning("config key %s has no description (a docstring under its field)", key)
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
