"""The harm taxonomy: categories x counselor roles, each cell with a five-level severity ladder.

A taxonomy is a TOML file that a person can write by hand. The built-in one is R-MHSafe
(7 harm categories x 4 counselor roles = 28 cells); users can bring their own for another
domain, with any number of categories and roles::

    name = "R-MHSafe"
    version = "1"
    description = "..."
    severity_scale = { 1 = "safe", 2 = "...", 3 = "...", 4 = "...", 5 = "..." }

    [categories.toxic_language]
    name = "Toxic language"
    definition = "..."

    [roles.perpetrator]
    name = "Perpetrator"
    definition = "..."
    initiator = "counselor"     # counselor | client
    involvement = "direct"      # direct | indirect

    [cells.toxic_language.perpetrator]
    definition = "..."
    example = { client = "...", counselor = "..." }
    levels = { 1 = "...", 2 = "...", 3 = "...", 4 = "...", 5 = "..." }

Every (category, role) pair needs a cell and every cell needs all five levels; anything
missing or unknown is an :class:`~mhsafeeval.errors.InputError` naming the file and the key.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec

from mhsafeeval.errors import InputError, convert, decode_toml, read_input

__all__ = [
    "INITIATORS",
    "INVOLVEMENTS",
    "SEVERITY_LEVELS",
    "Category",
    "Cell",
    "Example",
    "Ladder",
    "Role",
    "Taxonomy",
    "builtin_taxonomy",
    "cell_to_text",
    "load_taxonomy",
    "parse_taxonomy",
    "taxonomy_to_text",
]

SEVERITY_LEVELS = (1, 2, 3, 4, 5)
"""The severity scale: 1 safe ... 5 severe."""
INITIATORS = ("counselor", "client")
INVOLVEMENTS = ("direct", "indirect")

Ladder = tuple[str, str, str, str, str]
"""Five descriptors, for severity 1 to 5 (index 0 is severity 1)."""

_ID = re.compile(r"[a-z][a-z0-9_]*\Z")
_BUILTIN = "r_mhsafe.toml"
_T = TypeVar("_T")


class Category(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A kind of harm (what went wrong), e.g. ``gaslighting``."""

    id: str
    name: str
    definition: str


class Role(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The counselor's part in a harm: who started it and how directly the counselor took part."""

    id: str
    name: str
    definition: str
    initiator: str
    """``counselor`` or ``client``: who introduces the harmful idea."""
    involvement: str
    """``direct`` or ``indirect``: whether the counselor acts or lets the client act/believe."""


class Example(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One short exchange: what the client said and the harmful counselor reply."""

    client: str
    counselor: str


class Cell(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One (category, role) failure mode with its own severity ladder."""

    category: str
    role: str
    definition: str
    example: Example
    levels: Ladder

    def level(self, severity: int) -> str:
        """Return the descriptor of one severity level.

        Args:
            severity: 1 to 5.

        Raises:
            ValueError: ``severity`` is not in 1..5.
        """
        if severity not in SEVERITY_LEVELS:
            raise ValueError(f"severity must be 1 to 5, got {severity!r}")
        return self.levels[severity - 1]


class Taxonomy(msgspec.Struct, frozen=True):
    """A complete taxonomy: every category x role pair has a :class:`Cell`.

    ``cells`` is a read-only mapping keyed by ``(category_id, role_id)``; ``source`` is the
    file it came from (for error messages that point back at it).
    """

    name: str
    version: str
    description: str
    severity_scale: Ladder
    categories: tuple[Category, ...]
    roles: tuple[Role, ...]
    cells: Mapping[tuple[str, str], Cell]
    source: str = ""

    def category_ids(self) -> list[str]:
        """Category ids in file order."""
        return [c.id for c in self.categories]

    def role_ids(self) -> list[str]:
        """Role ids in file order."""
        return [r.id for r in self.roles]

    def cell_ids(self) -> list[tuple[str, str]]:
        """All ``(category, role)`` pairs: categories in file order, then roles in file order."""
        return [(c.id, r.id) for c in self.categories for r in self.roles]

    def category(self, category_id: str) -> Category:
        """Return a category by id; ``KeyError`` (listing the known ids) if there is none."""
        for c in self.categories:
            if c.id == category_id:
                return c
        raise KeyError(f"no category {category_id!r} in {self.name}; known: {self.category_ids()}")

    def role(self, role_id: str) -> Role:
        """Return a role by id; ``KeyError`` (listing the known ids) if there is none."""
        for r in self.roles:
            if r.id == role_id:
                return r
        raise KeyError(f"no role {role_id!r} in {self.name}; known: {self.role_ids()}")

    def cell(self, category: str, role: str) -> Cell:
        """Return the cell for ``(category, role)``; ``KeyError`` naming the pair if unknown."""
        try:
            return self.cells[(category, role)]
        except KeyError:
            raise KeyError(
                f"no cell ({category!r}, {role!r}) in {self.name}; categories: "
                f"{self.category_ids()}, roles: {self.role_ids()}"
            ) from None


# ---------------------------------------------------------------------------------------------
# Loading


class _RawTaxonomy(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    version: str | int
    severity_scale: Any
    categories: dict[str, Any]
    roles: dict[str, Any]
    cells: dict[str, Any]
    description: str = ""


class _RawCategory(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    definition: str


class _RawRole(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    definition: str
    initiator: str
    involvement: str


class _RawCell(msgspec.Struct, forbid_unknown_fields=True):
    definition: str
    example: Example
    levels: Any


def load_taxonomy(path: str | Path) -> Taxonomy:
    """Read and check a taxonomy TOML file.

    Args:
        path: the file.

    Returns:
        The complete taxonomy.

    Raises:
        InputError: the file cannot be read, is not valid TOML, or is incomplete; the message
            names the file and the key (e.g. ``cells.blaming.enabler.levels.3``).
    """
    try:
        text = read_input(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read taxonomy file: {exc}") from exc
    return parse_taxonomy(text, str(path))


@functools.cache
def builtin_taxonomy() -> Taxonomy:
    """The R-MHSafe taxonomy shipped with the package (read once, then cached).

    Returns:
        The built-in 7 x 4 taxonomy.
    """
    data = resources.files("mhsafeeval") / "data" / _BUILTIN
    return parse_taxonomy(data.read_text(encoding="utf-8"), f"<builtin>/{_BUILTIN}")


def parse_taxonomy(text: str, source: str) -> Taxonomy:
    """Parse and check taxonomy TOML text.

    Args:
        text: the TOML document.
        source: where it came from, used in error messages (usually the file path).

    Returns:
        The complete taxonomy.

    Raises:
        InputError: invalid TOML, a wrong type, an unknown or missing key, an empty text,
            or a (category, role) pair without a complete cell.
    """
    try:
        doc = decode_toml(text, source)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, None, f"invalid TOML: {exc}") from exc
    raw = convert(doc, _RawTaxonomy, source, "")
    categories = tuple(
        Category(
            cid, _text(c.name, source, f"{p}.name"), _text(c.definition, source, f"{p}.definition")
        )
        for cid, c, p in _entries(raw.categories, _RawCategory, source, "categories")
    )
    roles = tuple(
        _role(rid, r, source, p) for rid, r, p in _entries(raw.roles, _RawRole, source, "roles")
    )
    return Taxonomy(
        name=_text(raw.name, source, "name"),
        version=_text(str(raw.version), source, "version"),
        description=raw.description.strip(),
        severity_scale=_ladder(raw.severity_scale, source, "severity_scale"),
        categories=categories,
        roles=roles,
        cells=MappingProxyType(_cells(raw.cells, categories, roles, source)),
        source=source,
    )


def _entries(
    table: dict[str, Any], kind: type[_T], source: str, section: str
) -> list[tuple[str, _T, str]]:
    if not table:
        raise InputError(source, section, f"at least one entry is required under [{section}]")
    out = []
    for key, value in table.items():
        path = f"{section}.{key}"
        _check_id(key, source, path)
        out.append((key, convert(value, kind, source, path), path))
    return out


def _role(rid: str, r: _RawRole, source: str, path: str) -> Role:
    if r.initiator not in INITIATORS:
        raise InputError(
            source, f"{path}.initiator", f"must be 'counselor' or 'client', got {r.initiator!r}"
        )
    if r.involvement not in INVOLVEMENTS:
        raise InputError(
            source, f"{path}.involvement", f"must be 'direct' or 'indirect', got {r.involvement!r}"
        )
    name = _text(r.name, source, f"{path}.name")
    return Role(
        rid, name, _text(r.definition, source, f"{path}.definition"), r.initiator, r.involvement
    )


def _cells(
    table: dict[str, Any],
    categories: tuple[Category, ...],
    roles: tuple[Role, ...],
    source: str,
) -> dict[tuple[str, str], Cell]:
    cat_ids = [c.id for c in categories]
    role_ids = [r.id for r in roles]
    # Unknown keys first: a misspelt role would otherwise be reported as a missing cell.
    for cat, row in table.items():
        if cat not in cat_ids:
            raise InputError(
                source, f"cells.{cat}", f"unknown category (known: {', '.join(cat_ids)})"
            )
        if not isinstance(row, dict):
            raise InputError(source, f"cells.{cat}", "expected a table of roles")
        for role in row:
            if role not in role_ids:
                raise InputError(
                    source, f"cells.{cat}.{role}", f"unknown role (known: {', '.join(role_ids)})"
                )
    cells: dict[tuple[str, str], Cell] = {}
    for cat in cat_ids:
        for role in role_ids:
            path = f"cells.{cat}.{role}"
            value = table.get(cat, {}).get(role)
            if value is None:
                raise InputError(source, path, "missing (every category x role needs a cell)")
            raw = convert(value, _RawCell, source, path)
            example = Example(
                _text(raw.example.client, source, f"{path}.example.client"),
                _text(raw.example.counselor, source, f"{path}.example.counselor"),
            )
            definition = _text(raw.definition, source, f"{path}.definition")
            levels = _ladder(raw.levels, source, f"{path}.levels")
            cells[(cat, role)] = Cell(cat, role, definition, example, levels)
    return cells


def _ladder(value: Any, source: str, path: str) -> Ladder:
    """Five texts from a ``{1 = "...", ..., 5 = "..."}`` table or a list of five strings."""
    if isinstance(value, list):
        if len(value) != len(SEVERITY_LEVELS):
            raise InputError(source, path, f"expected 5 levels (1 to 5), got {len(value)}")
        value = {str(n): v for n, v in zip(SEVERITY_LEVELS, value, strict=True)}
    if not isinstance(value, dict):
        raise InputError(source, path, "expected a table with keys 1 to 5")
    wanted = [str(n) for n in SEVERITY_LEVELS]
    for key in value:
        if key not in wanted:
            raise InputError(source, f"{path}.{key}", "unknown level (levels are 1 to 5)")
    texts: list[str] = []
    for key in wanted:
        if key not in value:
            raise InputError(source, f"{path}.{key}", "missing (levels 1 to 5 are all required)")
        text = value[key]
        if not isinstance(text, str):
            raise InputError(
                source, f"{path}.{key}", f"expected a string, got {type(text).__name__}"
            )
        text = _text(text, source, f"{path}.{key}")
        if text in texts:
            raise InputError(source, f"{path}.{key}", f"same text as level {texts.index(text) + 1}")
        texts.append(text)
    return (texts[0], texts[1], texts[2], texts[3], texts[4])


def _text(value: str, source: str, path: str) -> str:
    text = value.strip()
    if not text:
        raise InputError(source, path, "must not be empty")
    return text


def _check_id(key: str, source: str, path: str) -> None:
    if not _ID.match(key):
        raise InputError(
            source, path, "ids must be lowercase snake_case (a-z, 0-9, _; starting with a letter)"
        )


# ---------------------------------------------------------------------------------------------
# Text views (for the `taxonomy` CLI command and the judge's rubric prompt)


def cell_to_text(taxonomy: Taxonomy, category: str, role: str) -> str:
    """Render one cell as rubric text: category, role, cell definition, example and ladder.

    Args:
        taxonomy: the taxonomy.
        category: category id.
        role: role id.

    Returns:
        Plain text, one item per line.
    """
    cell = taxonomy.cell(category, role)
    cat, rol = taxonomy.category(category), taxonomy.role(role)
    lines = [
        f"Harm category: {cat.name} ({cat.id}): {cat.definition}",
        f"Counselor role: {rol.name} ({rol.id}; started by the {rol.initiator}, "
        f"{rol.involvement} involvement): {rol.definition}",
        f"This cell: {cell.definition}",
        f'Example: client: "{cell.example.client}" / harmful counselor reply: '
        f'"{cell.example.counselor}"',
        "Severity levels:",
    ]
    lines += [f"  {n}: {text}" for n, text in zip(SEVERITY_LEVELS, cell.levels, strict=True)]
    return "\n".join(lines)


def taxonomy_to_text(taxonomy: Taxonomy, *, detail: bool = False) -> str:
    """Summarise a taxonomy for people.

    Args:
        taxonomy: the taxonomy.
        detail: also print every cell's definition, example and five levels.

    Returns:
        Plain text.
    """
    t = taxonomy
    lines = [
        f"{t.name} (version {t.version}): {len(t.categories)} categories x "
        f"{len(t.roles)} roles = {len(t.cells)} cells"
    ]
    if t.description:
        lines.append(t.description)
    lines.append("Severity scale:")
    lines += [f"  {n}: {text}" for n, text in zip(SEVERITY_LEVELS, t.severity_scale, strict=True)]
    lines.append("Categories:")
    lines += [f"  {c.id}: {c.name}: {c.definition}" for c in t.categories]
    lines.append("Roles:")
    lines += [
        f"  {r.id}: {r.name} (started by the {r.initiator}, {r.involvement}): {r.definition}"
        for r in t.roles
    ]
    if detail:
        for cat, role in t.cell_ids():
            lines += ["", f"[{cat} x {role}]", cell_to_text(t, cat, role)]
    return "\n".join(lines)
