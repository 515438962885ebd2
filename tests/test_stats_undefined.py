"""Undefined statistics are undefined (issue 35): a table without variation has no chance
agreement to correct for, so kappa and alpha are nan there (as the reference implementations
say), and a bootstrap skips such resamples instead of counting them as perfect agreement."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mhsafeeval.stats import (
    bootstrap_statistic,
    cluster_bootstrap_tables,
    kappa_from_table,
    krippendorff_alpha,
    pair_table,
    weighted_kappa,
)


def test_kappa_of_raters_who_never_vary_is_undefined() -> None:
    # sklearn.metrics.cohen_kappa_score([1] * 5, [1] * 5) is nan: 0/0, not perfect agreement.
    assert math.isnan(weighted_kappa([1] * 5, [1] * 5))
    assert math.isnan(weighted_kappa([3, 3], [3, 3], weights="none"))
    assert math.isnan(kappa_from_table(pair_table([2, 2, 2], [2, 2, 2])))


def test_alpha_of_a_single_value_is_undefined() -> None:
    # krippendorff.alpha([[1], [1]]) is nan: there is no disagreement to expect.
    assert math.isnan(krippendorff_alpha([[1, 1]]))
    assert math.isnan(krippendorff_alpha([[4, 4, None], [4, None, 4]], level="nominal"))


# 12 conversations: 9 where both raters said 1 to everything, 3 where they disagree (kappa
# -0.131, the case).
AGREED = [[(1, 1), (1, 1)]] * 9
DISAGREED = [[(1, 3), (3, 1)], [(2, 1), (1, 2)], [(3, 1), (1, 3)]]
CONVERSATIONS = AGREED + DISAGREED


def _tables() -> list[list[list[int]]]:
    return [pair_table([a for a, _ in c], [b for _, b in c]) for c in CONVERSATIONS]


def test_the_cluster_bootstrap_of_a_kappa_skips_resamples_without_variation() -> None:
    # About (9/12)**12 = 3% of resamples draw only the agreeing conversations: their kappa is
    # 0/0. Counted as 1.0 they pulled the upper end of a negative kappa's interval to 1.0.
    tables = _tables()
    summed = [[sum(t[i][j] for t in tables) for j in range(5)] for i in range(5)]
    point = kappa_from_table(summed)
    assert point < 0
    low, high = cluster_bootstrap_tables(tables, kappa_from_table)
    assert low < point < high < 0.5


def test_bootstrap_statistic_skips_what_the_statistic_cannot_define() -> None:
    pairs = [p for c in CONVERSATIONS for p in c]

    def kappa(units: Sequence[tuple[int, int]]) -> float:
        return weighted_kappa([a for a, _ in units], [b for _, b in units])

    # 18 of 24 pairs are (1, 1): 0.75**24 = 0.1% of resamples have no variation.
    _, high = bootstrap_statistic(pairs, kappa, resamples=1000)
    assert high < 1.0
    # (3/4)**4 = 32% of resamples draw only (1, 1), whose kappa is undefined; the others have
    # one rater always at 1, so kappa 0 (no better than chance): the interval is 0 to 0.
    assert bootstrap_statistic([(1, 1)] * 3 + [(1, 2)], kappa, resamples=1000) == (0.0, 0.0)
