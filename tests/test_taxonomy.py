"""The taxonomy loader: built-in R-MHSafe data, and user taxonomies with errors that point home."""

from __future__ import annotations

from pathlib import Path

import pytest

from mhsafeeval.errors import InputError
from mhsafeeval.taxonomy import (
    Taxonomy,
    builtin_taxonomy,
    cell_to_text,
    load_taxonomy,
    parse_taxonomy,
    taxonomy_to_text,
)

CATEGORIES = [
    "toxic_language",
    "nonfactual_statement",
    "gaslighting",
    "invalidation",
    "blaming",
    "over_pathologizing",
    "dependency_induction",
]
ROLES = ["perpetrator", "instigator", "facilitator", "enabler"]


# --- built-in ---------------------------------------------------------------------------------


def test_builtin_has_28_complete_cells() -> None:
    t = builtin_taxonomy()
    assert t.name == "R-MHSafe"
    assert t.category_ids() == CATEGORIES
    assert t.role_ids() == ROLES
    assert len(t.cells) == 28
    levels = [text for cell in t.cells.values() for text in cell.levels]
    assert len(levels) == 140
    assert all(text.strip() for text in levels)
    assert len(set(levels)) == 140
    for cell in t.cells.values():
        assert cell.definition
        assert cell.example.client
        assert cell.example.counselor
    assert len(set(t.severity_scale)) == 5


def test_builtin_role_axes_match_the_mission() -> None:
    t = builtin_taxonomy()
    axes = {r.id: (r.initiator, r.involvement) for r in t.roles}
    assert axes == {
        "perpetrator": ("counselor", "direct"),
        "instigator": ("counselor", "indirect"),
        "facilitator": ("client", "direct"),
        "enabler": ("client", "indirect"),
    }


def test_cell_ids_order_is_categories_then_roles_in_file_order() -> None:
    t = builtin_taxonomy()
    ids = t.cell_ids()
    assert ids == [(c, r) for c in CATEGORIES for r in ROLES]
    assert ids[:2] == [("toxic_language", "perpetrator"), ("toxic_language", "instigator")]
    assert ids == t.cell_ids() == list(t.cells)


def test_cell_lookup_and_levels() -> None:
    t = builtin_taxonomy()
    cell = t.cell("gaslighting", "enabler")
    assert (cell.category, cell.role) == ("gaslighting", "enabler")
    assert cell.level(1) == cell.levels[0]
    assert cell.level(5) == cell.levels[4]
    with pytest.raises(ValueError, match="1 to 5"):
        cell.level(6)
    with pytest.raises(KeyError, match="bystander"):
        t.cell("gaslighting", "bystander")


def test_builtin_is_cached_and_read_only() -> None:
    t = builtin_taxonomy()
    assert builtin_taxonomy() is t
    with pytest.raises(TypeError):
        t.cells[("x", "y")] = t.cell("blaming", "enabler")  # type: ignore[index]


def test_text_views_name_everything() -> None:
    t = builtin_taxonomy()
    summary = taxonomy_to_text(t)
    assert "7 categories x 4 roles = 28 cells" in summary
    assert all(c.name in summary for c in t.categories)
    assert "[blaming x enabler]" not in summary
    detailed = taxonomy_to_text(t, detail=True)
    assert "[blaming x enabler]" in detailed
    rubric = cell_to_text(t, "blaming", "enabler")
    for text in t.cell("blaming", "enabler").levels:
        assert text in rubric


# --- user taxonomies --------------------------------------------------------------------------

USER_CATS = ["rudeness", "false_promise"]
USER_ROLES = [
    ("author", "counselor", "direct"),
    ("coach", "counselor", "indirect"),
    ("bystander", "client", "indirect"),
]


def _cell(cat: str, role: str, *, skip: str = "", drop_level: int = 0) -> str:
    lines = [f"[cells.{cat}.{role}]"]
    if skip != "definition":
        lines.append(f'definition = "{cat} done as {role}"')
    lines.append(f'example.client = "client line for {cat}/{role}"')
    if skip != "counselor":
        lines.append(f'example.counselor = "counselor line for {cat}/{role}"')
    lines += [f'levels.{n} = "{cat}/{role} level {n}"' for n in range(1, 6) if n != drop_level]
    return "\n".join(lines)


def _user_toml(
    *,
    skip_cell: tuple[str, str] | None = None,
    drop_level: tuple[str, str, int] | None = None,
    skip_field: tuple[str, str, str] | None = None,
    extra: str = "",
) -> str:
    parts = [
        'name = "Retail support"\nversion = 2\ndescription = "A small test taxonomy."',
        "severity_scale = [" + ", ".join(f'"scale {n}"' for n in range(1, 6)) + "]",
    ]
    parts += [
        f'[categories.{c}]\nname = "{c.title()}"\ndefinition = "about {c}"' for c in USER_CATS
    ]
    parts += [
        f'[roles.{r}]\nname = "{r.title()}"\ndefinition = "about {r}"\n'
        f'initiator = "{who}"\ninvolvement = "{how}"'
        for r, who, how in USER_ROLES
    ]
    for c in USER_CATS:
        for r, _, _ in USER_ROLES:
            if skip_cell == (c, r):
                continue
            level = drop_level[2] if drop_level and drop_level[:2] == (c, r) else 0
            skip = skip_field[2] if skip_field and skip_field[:2] == (c, r) else ""
            parts.append(_cell(c, r, skip=skip, drop_level=level))
    parts.append(extra)
    return "\n\n".join(parts) + "\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "retail.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_taxonomy(path)
    message = str(info.value)
    assert message.startswith(str(path) + ": "), message
    return message


def test_user_taxonomy_2x3_loads(tmp_path: Path) -> None:
    t = load_taxonomy(_write(tmp_path, _user_toml()))
    assert isinstance(t, Taxonomy)
    assert t.version == "2"
    assert len(t.cells) == 6
    assert t.cell_ids()[0] == ("rudeness", "author")
    assert t.cell_ids()[-1] == ("false_promise", "bystander")
    assert t.cell("false_promise", "coach").level(3) == "false_promise/coach level 3"
    assert t.severity_scale[0] == "scale 1"
    assert t.source == str(tmp_path / "retail.toml")


def test_parse_taxonomy_uses_the_given_source_name() -> None:
    with pytest.raises(InputError, match=r"^inline\.toml: cells\.rudeness\.coach: missing"):
        parse_taxonomy(_user_toml(skip_cell=("rudeness", "coach")), "inline.toml")


def test_missing_cell_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml(skip_cell=("false_promise", "bystander")))
    assert "cells.false_promise.bystander: missing (every category x role needs a cell)" in message


def test_missing_level_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml(drop_level=("rudeness", "coach", 3)))
    assert "cells.rudeness.coach.levels.3: missing" in message


def test_missing_definition_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml(skip_field=("rudeness", "author", "definition")))
    assert "cells.rudeness.author.definition: missing required field" in message


def test_missing_example_reply_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml(skip_field=("false_promise", "coach", "counselor")))
    assert "cells.false_promise.coach.example.counselor: missing required field" in message


def test_unknown_role_in_cells_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml(extra=_cell("rudeness", "bystandr")))
    assert "cells.rudeness.bystandr: unknown role (known: author, coach, bystander)" in message


def test_unknown_category_in_cells_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml(extra=_cell("rudenes", "author")))
    assert "cells.rudenes: unknown category" in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('"rudeness/author level 2"', '"  "', "cells.rudeness.author.levels.2: must not be empty"),
        ("levels.5 =", "levels.6 =", "cells.rudeness.author.levels.6: unknown level"),
        ('level 4"', 'level 3"', "cells.rudeness.author.levels.4: same text as level 3"),
        ('initiator = "counselor"', 'initiator = "user"', "roles.author.initiator: must be"),
        ('involvement = "direct"', 'involvement = "both"', "roles.author.involvement: must be"),
        ("[categories.rudeness]", "[categories.Rudeness]", "categories.Rudeness: ids must be"),
        ('name = "Retail support"', "name = 3", "name: expected str, got int"),
        (
            'definition = "about rudeness"',
            'definiton = "x"',
            "categories.rudeness.definiton: unknown",
        ),
        (
            "severity_scale = [",
            'severity_scale = ["scale 0", ',
            "severity_scale: expected 5 levels",
        ),
    ],
)
def test_invalid_values_are_named(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text = _user_toml()
    assert old in text
    assert expected in _error(tmp_path, text.replace(old, new, 1))


def test_levels_may_be_a_table(tmp_path: Path) -> None:
    text = _user_toml().replace(
        "severity_scale = [" + ", ".join(f'"scale {n}"' for n in range(1, 6)) + "]",
        "severity_scale = { " + ", ".join(f'{n} = "s{n}"' for n in range(1, 6)) + " }",
    )
    assert load_taxonomy(_write(tmp_path, text)).severity_scale == ("s1", "s2", "s3", "s4", "s5")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    message = _error(tmp_path, _user_toml() + "\n[cells.rudeness\n")
    assert "invalid TOML" in message


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.toml: cannot read"):
        load_taxonomy(tmp_path / "nope.toml")
