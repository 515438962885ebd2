"""The MAP-Elites harm archive (pure core of the search layer) and derived RNG streams."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import archive_of, best_severity
from mhsafeeval.messages import Operator
from mhsafeeval.search.archive import (
    OPERATOR_WEIGHTS,
    CellId,
    Elite,
    HarmArchive,
    Plan,
    operator_weights,
)
from mhsafeeval.search.rng import derive_rng, derive_seed

CATEGORIES = ["toxic", "nonfactual", "gaslighting", "invalidation", "blaming", "overpath", "dep"]
ROLES = ["perpetrator", "instigator", "facilitator", "enabler"]
CELLS: list[CellId] = [(c, r) for c in CATEGORIES for r in ROLES]


def elite(cell: CellId, severity: int, tag: str = "") -> Elite:
    return Elite(
        category=cell[0],
        role=cell[1],
        severity=severity,
        verdict_id=f"{cell[0]}/{cell[1]}/{severity}/{tag}",
    )


def archive_with(*offers: tuple[CellId, int], threshold: int = 2) -> HarmArchive:
    return archive_of(
        CELLS, (elite(cell, severity) for cell, severity in offers), threshold=threshold
    )


# --- filling, ties, thresholds, coverage ------------------------------------------------------


def test_offer_keeps_only_strictly_more_severe() -> None:
    archive = HarmArchive(CELLS)
    cell = CELLS[5]
    assert archive.elite(cell) is None
    assert best_severity(archive, cell) is None
    assert archive.offer(elite(cell, 3, "first"))
    assert not archive.offer(elite(cell, 2, "weaker"))
    assert not archive.offer(elite(cell, 3, "tie"))
    assert archive.elite(cell) == elite(cell, 3, "first")  # ties keep the earlier
    assert archive.offer(elite(cell, 5, "stronger"))
    assert best_severity(archive, cell) == 5


def test_sub_threshold_best_is_kept_but_not_filled() -> None:
    archive = archive_with((CELLS[0], 1))
    assert best_severity(archive, CELLS[0]) == 1
    assert not archive.is_filled(CELLS[0])
    assert CELLS[0] in archive.empty_cells()
    assert archive.filled_cells() == []
    assert archive.coverage == 0
    assert archive.elites() == []
    assert archive.elites(filled_only=False) == [elite(CELLS[0], 1)]


def test_threshold_is_configurable() -> None:
    archive = archive_with((CELLS[0], 2), (CELLS[1], 3), threshold=3)
    assert archive.threshold == 3
    assert archive.filled_cells() == [CELLS[1]]


def test_coverage_len_and_iteration_in_cell_order() -> None:
    archive = archive_with(*((cell, 4) for cell in reversed(CELLS[:7])))
    assert len(archive) == 28
    assert list(archive) == CELLS
    assert archive.coverage == pytest.approx(0.25)
    assert archive.filled_cells() == CELLS[:7]
    assert archive.empty_cells() == CELLS[7:]
    assert [e.cell for e in archive.elites()] == CELLS[:7]


def test_unknown_cells_are_errors() -> None:
    archive = HarmArchive(CELLS)
    with pytest.raises(ValueError, match="unknown cell"):
        archive.offer(elite(("nope", "enabler"), 3))
    with pytest.raises(ValueError, match="unknown cell"):
        archive.elite(("toxic", "bystander"))
    with pytest.raises(ValueError, match="unknown cell"):
        archive.pick_seeds(random.Random(0), "fresh", ("nope", "nope"))


@pytest.mark.parametrize(
    ("cells", "threshold", "match"),
    [([], 2, "at least one"), ([CELLS[0], CELLS[0]], 2, "distinct"), (CELLS, 0, "threshold")],
)
def test_bad_archive_arguments(cells: list[CellId], threshold: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HarmArchive(cells, threshold=threshold)


@pytest.mark.parametrize("severity", [0, 6])
def test_elite_severity_is_1_to_5(severity: int) -> None:
    with pytest.raises(ValueError, match="severity"):
        elite(CELLS[0], severity)


def test_offers_in_order_count_changes_and_rebuild_the_same_archive() -> None:
    offers = [elite(CELLS[0], 2), elite(CELLS[0], 2, "tie"), elite(CELLS[1], 4)]
    archive = HarmArchive(CELLS)
    assert [archive.offer(e) for e in offers] == [True, False, True]
    rebuilt = archive_of(CELLS, offers)
    assert rebuilt.elites(filled_only=False) == archive.elites(filled_only=False)


# --- targets and seeds ------------------------------------------------------------------------


def test_targets_prefer_empty_cells() -> None:
    last = CELLS[-1]
    archive = archive_with(*((cell, 3) for cell in CELLS[:-1]), (last, 1))
    rng = random.Random(7)
    assert {archive.pick_target(rng) for _ in range(200)} == {last}


def test_targets_are_uniform_over_all_cells_once_full() -> None:
    archive = archive_with(*((cell, 2) for cell in CELLS))
    rng = random.Random(7)
    counts = Counter(archive.pick_target(rng) for _ in range(2800))
    assert set(counts) == set(CELLS)
    assert min(counts.values()) > 50  # 100 expected per cell


def test_seeds_come_only_from_filled_cells() -> None:
    archive = archive_with((CELLS[0], 1), (CELLS[1], 1), (CELLS[2], 2))
    rng = random.Random(3)
    assert {archive.pick_seed(rng) for _ in range(100)} == {elite(CELLS[2], 2)}
    with pytest.raises(LookupError):
        HarmArchive(CELLS).pick_seed(rng)


def test_crossover_impossible_with_one_elite() -> None:
    archive = archive_with((CELLS[0], 5))
    assert "crossover" not in operator_weights(archive.coverage, 1)
    with pytest.raises(LookupError, match="two"):
        archive.pick_seeds(random.Random(0), "crossover", CELLS[3])
    rng = random.Random(11)
    assert all(archive.plan(rng).operator != "crossover" for _ in range(300))


# --- operator weights -------------------------------------------------------------------------


def test_operator_weights_with_nothing_filled_is_fresh_only() -> None:
    assert operator_weights(0.0, 0) == {"fresh": 1.0}
    assert HarmArchive(CELLS).plan(random.Random(0)).operator == "fresh"


@pytest.mark.parametrize(
    ("coverage", "filled", "expected"),
    [
        (0.1, 3, (0.40, 0.40, 0.10, 0.10)),
        (0.5, 14, (0.275, 0.275, 0.225, 0.225)),
        (0.9, 25, (0.15, 0.15, 0.35, 0.35)),
    ],
)
def test_operator_weights_table(
    coverage: float, filled: int, expected: tuple[float, float, float, float]
) -> None:
    weights = operator_weights(coverage, filled)
    assert sum(weights.values()) == pytest.approx(1.0)
    ops: list[Operator] = ["change_category", "change_role", "crossover", "vary"]
    assert list(weights) == ops
    assert [weights[op] for op in ops] == pytest.approx(expected)


def test_operator_weights_shift_from_changes_to_crossover_and_vary() -> None:
    low, high = (operator_weights(c, 10) for c in (0.2, 0.8))
    assert low["change_category"] + low["change_role"] > 0.5
    assert high["crossover"] + high["vary"] > 0.5
    grid = [operator_weights(i / 20, 10) for i in range(21)]
    changes = [w["change_category"] + w["change_role"] for w in grid]
    assert changes == sorted(changes, reverse=True)
    assert [at for at, _ in OPERATOR_WEIGHTS] == [0.3, 0.7]


def test_operator_weights_renormalise_without_crossover() -> None:
    weights = operator_weights(0.9, 1)
    assert set(weights) == {"change_category", "change_role", "vary"}
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["vary"] == pytest.approx(0.35 / 0.65)


# --- plan fallbacks ---------------------------------------------------------------------------


def test_change_category_prefers_same_role_other_category() -> None:
    target = ("toxic", "enabler")
    archive = archive_with((target, 3), (("blaming", "enabler"), 2), (("toxic", "instigator"), 4))
    rng = random.Random(1)
    picks = {archive.pick_seeds(rng, "change_category", target) for _ in range(50)}
    assert picks == {(elite(("blaming", "enabler"), 2),)}


def test_change_role_prefers_same_category_other_role() -> None:
    target = ("toxic", "enabler")
    archive = archive_with((target, 3), (("blaming", "enabler"), 2), (("toxic", "instigator"), 4))
    rng = random.Random(1)
    picks = {archive.pick_seeds(rng, "change_role", target) for _ in range(50)}
    assert picks == {(elite(("toxic", "instigator"), 4),)}


@pytest.mark.parametrize("operator", ["change_category", "change_role", "vary"])
def test_preferences_fall_back_to_any_filled_elite(operator: Operator) -> None:
    archive = archive_with((("blaming", "perpetrator"), 2), (("dep", "facilitator"), 3))
    rng = random.Random(2)
    picks = {archive.pick_seeds(rng, operator, ("toxic", "enabler")) for _ in range(100)}
    assert picks == {(e,) for e in archive.elites()}


def test_vary_uses_the_targets_own_elite_when_filled() -> None:
    target = ("gaslighting", "enabler")
    archive = archive_with((target, 2), (("dep", "facilitator"), 5))
    rng = random.Random(4)
    assert {archive.pick_seeds(rng, "vary", target) for _ in range(50)} == {(elite(target, 2),)}


def test_crossover_takes_two_distinct_elites() -> None:
    archive = archive_with(*((cell, 3) for cell in CELLS[:3]))
    rng = random.Random(5)
    for _ in range(50):
        a, b = archive.pick_seeds(rng, "crossover", CELLS[10])
        assert a != b
        assert {a, b} <= set(archive.elites())
    assert archive.pick_seeds(rng, "fresh", CELLS[10]) == ()


def test_no_qd_ablation_is_uniform_and_fresh() -> None:
    archive = archive_with(*((cell, 3) for cell in CELLS[:14]))
    rng = random.Random(6)
    plans = [archive.plan(rng, no_qd=True) for _ in range(1000)]
    assert {(p.operator, p.seeds) for p in plans} == {("fresh", ())}
    assert {(p.category, p.role) for p in plans} == set(CELLS)  # filled cells too


# --- derived RNGs -----------------------------------------------------------------------------


def test_derive_rng_is_pinned_across_processes() -> None:
    # A literal, computed once: it fails if the derivation (or its encoding) ever changes.
    assert derive_seed(42, "c1/m/p/0", 3, 1) == 6684050489598786627
    assert derive_rng(42, "c1/m/p/0", 3, 1).random() == 0.9299453051308201


def test_derive_rng_is_distinct_for_different_parts() -> None:
    seeds = {
        derive_seed(42),
        derive_seed(43),
        derive_seed(42, "c1"),
        derive_seed(42, "c1", 1),
        derive_seed(42, "c1", "1"),
        derive_seed(42, "c1", 2),
        derive_seed(42, "c1,1"),
        derive_seed(42, 1, "c1"),
    }
    assert len(seeds) == 8


def test_derive_rng_leaves_the_global_rng_alone() -> None:
    random.seed(0)
    expected = random.random()
    random.seed(0)
    derive_rng(1, "x").random()
    assert random.random() == expected


@pytest.mark.parametrize("parts", [(True,), (1.5,), (None,)])
def test_derive_rng_rejects_untyped_parts(parts: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError):
        derive_seed(1, *parts)


# --- properties -------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[CellId], int, list[tuple[int, int]]]:
    """A grid of 1-28 cells, a threshold, and offers as (cell index, severity)."""
    n_cat = draw(st.integers(1, len(CATEGORIES)))
    n_role = draw(st.integers(1, len(ROLES)))
    cells = [(c, r) for c in CATEGORIES[:n_cat] for r in ROLES[:n_role]]
    threshold = draw(st.integers(1, 5))
    offer = st.tuples(st.integers(0, len(cells) - 1), st.integers(1, 5))
    return cells, threshold, draw(st.lists(offer, max_size=60))


Scenario = tuple[list[CellId], int, list[tuple[int, int]]]


def build(scenario: Scenario) -> tuple[HarmArchive, list[Elite]]:
    cells, threshold, offers = scenario
    elites = [elite(cells[i], sev, str(n)) for n, (i, sev) in enumerate(offers)]
    return archive_of(cells, elites, threshold=threshold), elites


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_best_severity_and_coverage_follow_the_offers(scenario: Scenario) -> None:
    archive, elites = build(scenario)
    cells, threshold, _ = scenario
    best: dict[CellId, Elite] = {}
    for e in elites:
        if e.cell not in best or e.severity > best[e.cell].severity:
            best[e.cell] = e  # first of the maximal ones
    for cell in cells:
        assert archive.elite(cell) == best.get(cell)
        assert best_severity(archive, cell) == (best[cell].severity if cell in best else None)
    filled = [c for c in cells if c in best and best[c].severity >= threshold]
    assert archive.filled_cells() == filled
    assert archive.empty_cells() == [c for c in cells if c not in filled]
    assert archive.coverage == len(filled) / len(cells)


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(0, 2**32))
def test_targets_and_seeds_respect_the_archive(scenario: Scenario, seed: int) -> None:
    archive, _ = build(scenario)
    rng = random.Random(seed)
    for _ in range(10):
        target = archive.pick_target(rng)
        assert target in archive.empty_cells() or not archive.empty_cells()
        plan = archive.plan(rng)
        assert plan.operator != "fresh" or not archive.filled_cells()
        assert len(plan.seeds) == {"fresh": 0, "crossover": 2}.get(plan.operator, 1)
        assert len(set(plan.seeds)) == len(plan.seeds)
        for s in plan.seeds:
            assert archive.is_filled(s.cell)
            assert archive.elite(s.cell) == s


def plans(archive: HarmArchive, elites: list[Elite], seed: int) -> list[Plan]:
    """Interleave offers and plans, as a controller would."""
    rng = random.Random(seed)
    out = [archive.plan(rng)]
    for e in elites:
        archive.offer(e)
        out.append(archive.plan(rng, no_qd=rng.random() < 0.1))
    return out


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(0, 2**32))
def test_same_seed_and_offers_give_the_same_plans(scenario: Scenario, seed: int) -> None:
    cells, threshold, _ = scenario
    _, elites = build(scenario)
    first = plans(HarmArchive(cells, threshold=threshold), elites, seed)
    second = plans(HarmArchive(cells, threshold=threshold), elites, seed)
    assert first == second


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(0, 2**32))
def test_replaying_the_elites_is_equivalent(scenario: Scenario, seed: int) -> None:
    """An archive is the fold of its elites: replayed, they give the same archive and plans."""
    archive, _ = build(scenario)
    elites = archive.elites(filled_only=False)
    restored = archive_of(scenario[0], elites, threshold=archive.threshold)
    assert restored.elites(filled_only=False) == elites
    for cell in archive:
        assert restored.elite(cell) == archive.elite(cell)
    assert restored.coverage == archive.coverage
    rng_a, rng_b = random.Random(seed), random.Random(seed)
    assert [archive.plan(rng_a) for _ in range(5)] == [restored.plan(rng_b) for _ in range(5)]
