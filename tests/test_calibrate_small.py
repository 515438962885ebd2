"""Calibration figures over a handful of items (issue 35): a cell of 2 or 3 labelled items has
no bootstrap interval to give, and says so, instead of printing one of zero width."""

from __future__ import annotations

import pytest

from mhsafeeval.calibrate import Rating as JudgeRating
from mhsafeeval.calibrate import agreement, render_text, summarise
from mhsafeeval.judges import LabelledExchange

FEW = [
    [(1, 1), (2, 2)],
    [(1, 1), (2, 2), (3, 4)],  # rho 1.0 while only 2 of 3 agree exactly
    [(1, 2), (2, 3), (3, 4)],  # no exact agreement at all, rho 1.0
    [(2, 2), (3, 3), (2, 3)],
]


@pytest.mark.parametrize("pairs", FEW)
def test_a_few_items_never_get_an_interval_of_zero_width(pairs: list[tuple[int, int]]) -> None:
    figures = agreement(pairs)
    for name in ("weighted_kappa", "spearman_rho"):
        low, high = figures[f"{name}_ci"]
        assert (low, high) == (None, None), f"{name}: {len(pairs)} items are too few"
        assert "too few" in figures[f"{name}_note"]


def test_the_text_says_why_a_figure_is_not_available() -> None:
    items = [
        LabelledExchange(
            id=f"i{n}", category="blaming", role="enabler", client="c", counselor="r", severity=s
        )
        for n, s in enumerate([1, 2, 3])
    ]
    ratings: dict[str, JudgeRating | None] = {
        "i0": JudgeRating(outcome="verdict", severity=1),
        "i1": JudgeRating(outcome="verdict", severity=2),
        "i2": JudgeRating(outcome="verdict", severity=4),
    }
    summary = summarise(items, ratings, judge="j", labels="l")
    text = render_text(summary)
    assert "[1.00, 1.00]" not in text  # rho of 3 items: no interval of zero width
    assert "interval n/a: too few" in text

    constant: dict[str, JudgeRating | None] = {
        k: JudgeRating(outcome="verdict", severity=1) for k in ratings
    }
    same = [
        LabelledExchange(
            id=f"i{n}", category="blaming", role="enabler", client="c", counselor="r", severity=1
        )
        for n in range(3)
    ]
    text = render_text(summarise(same, constant, judge="j", labels="l"))
    # Both sides rated everything 1: kappa and rho are undefined, not perfect.
    assert "kappa n/a (" in text and "rho n/a (" in text
