"""The statistics module against hand computations, published worked examples and properties.

Every expected number is either derived in a comment next to it or taken from a publication
whose value this module reproduces (checked by hand or by a second, independent route here).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mhsafeeval.stats import (
    Rate,
    alpha_from_coincidences,
    bootstrap_statistic,
    cluster_bootstrap,
    cluster_bootstrap_tables,
    cluster_bootstraps,
    coincidence_table,
    confusion_matrix,
    kappa_from_table,
    krippendorff_alpha,
    normal_quantile,
    pair_table,
    permutation_test_paired,
    rate_clustered,
    rate_wilson,
    spearman_rho,
    threshold_rates,
    weighted_kappa,
    wilson_interval,
)

# Derandomized: the same examples on every run, so the suite is deterministic.
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True)
Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054, from the stdlib's own algorithm (AS241)

# --- normal quantile -----------------------------------------------------------------------


def test_normal_quantile_matches_the_stdlib_to_1e_9() -> None:
    # statistics.NormalDist uses Wichura's AS241, an independent algorithm (~1e-16).
    grid = [i / 1000 for i in range(1, 1000)]
    tails = [1e-10, 1e-8, 1e-6, 1e-4, 0.02425, 0.97575, 1 - 1e-4, 1 - 1e-6, 1 - 1e-8]
    for p in grid + tails:
        assert normal_quantile(p) == pytest.approx(NormalDist().inv_cdf(p), abs=1e-9), p


def test_normal_quantile_is_odd_around_one_half() -> None:
    assert normal_quantile(0.5) == 0.0
    for p in (0.001, 0.1, 0.3):
        assert normal_quantile(1 - p) == pytest.approx(-normal_quantile(p), abs=1e-12)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_normal_quantile_rejects_non_probabilities(p: float) -> None:
    with pytest.raises(ValueError, match=r"^p:"):
        normal_quantile(p)


# --- Wilson --------------------------------------------------------------------------------


def test_wilson_zero_of_ten_from_the_formula() -> None:
    # With p = 0 the centre (z^2 / 2n) / (1 + z^2/n) equals the half-width, so low = 0 and
    # high = (z^2 / n) / (1 + z^2 / n) = 0.384146 / 1.384146 = 0.277533.
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx((Z95**2 / 10) / (1 + Z95**2 / 10), abs=1e-12)
    assert high == pytest.approx(0.277533, abs=1e-6)


def test_wilson_five_of_ten_from_the_formula() -> None:
    # p = 0.5: centre 0.5; half-width = z / (1 + z^2/10) * sqrt(0.25/10 + z^2/400)
    #        = 1.959964 / 1.384146 * sqrt(0.025 + 0.0096036) = 1.415999 * 0.186020 = 0.263407.
    low, high = wilson_interval(5, 10)
    half = Z95 / (1 + Z95**2 / 10) * math.sqrt(0.025 + Z95**2 / 400)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-12)
    assert (low, high) == pytest.approx((0.236593, 0.763407), abs=1e-6)


@pytest.mark.parametrize(
    ("successes", "trials", "expected"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion",
        # Statistics in Medicine 17:857-872, Table II, method 3 (score interval, no
        # continuity correction); reproduced here to the published 4 decimals.
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0, 0.1611)),
        (1, 29, (0.0061, 0.1718)),
    ],
)
def test_wilson_matches_newcombes_table(
    successes: int, trials: int, expected: tuple[float, float]
) -> None:
    low, high = wilson_interval(successes, trials)
    assert (round(low, 4), round(high, 4)) == expected


def test_wilson_without_trials_is_uninformative() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert rate_wilson(0, 0) == Rate(value=0.0, low=0.0, high=1.0, n=0)


def test_wilson_all_successes_reaches_one() -> None:
    low, high = wilson_interval(10, 10)
    assert high == 1.0
    assert low == pytest.approx(1 - 0.277533, abs=1e-6)  # the mirror image of 0/10


def test_wilson_is_wider_at_lower_n_and_higher_confidence() -> None:
    def width(interval: tuple[float, float]) -> float:
        return interval[1] - interval[0]

    assert width(wilson_interval(5, 10)) > width(wilson_interval(50, 100))
    assert width(wilson_interval(5, 10, 0.99)) > width(wilson_interval(5, 10, 0.95))
    assert width(wilson_interval(5, 10, 0.95)) > width(wilson_interval(5, 10, 0.80))


@pytest.mark.parametrize(
    ("successes", "trials", "confidence", "argument"),
    [
        (0, -1, 0.95, "trials"),
        (-1, 10, 0.95, "successes"),
        (11, 10, 0.95, "successes"),
        (1, 10, 0.0, "confidence"),
        (1, 10, 1.0, "confidence"),
        (1, 10, 95.0, "confidence"),
    ],
)
def test_wilson_validates_and_names_the_argument(
    successes: int, trials: int, confidence: float, argument: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        wilson_interval(successes, trials, confidence)


@PROPERTY
@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_estimate_inside_the_unit_interval(counts: tuple[int, int]) -> None:
    successes, trials = counts
    rate = rate_wilson(successes, trials)
    assert 0.0 <= rate.low <= rate.value <= rate.high <= 1.0
    assert rate.low < rate.high


# --- cluster bootstrap ---------------------------------------------------------------------

CLUSTERS = [(0, 3), (2, 2), (1, 4), (0, 1), (3, 5), (1, 1), (0, 2), (2, 6)]  # 9 of 24


def test_cluster_bootstrap_is_deterministic_for_a_seed() -> None:
    assert cluster_bootstrap(CLUSTERS, seed=7) == cluster_bootstrap(CLUSTERS, seed=7)
    assert cluster_bootstrap(CLUSTERS, seed=7) != cluster_bootstrap(CLUSTERS, seed=8)


def test_cluster_bootstrap_contains_the_point_estimate() -> None:
    rate = rate_clustered(CLUSTERS)
    assert rate.value == 9 / 24
    assert rate.n == len(CLUSTERS)
    assert 0.0 <= rate.low < rate.value < rate.high <= 1.0


def test_cluster_bootstrap_is_narrower_with_more_clusters() -> None:
    few = cluster_bootstrap(CLUSTERS)
    many = cluster_bootstrap(CLUSTERS * 10)
    assert many[1] - many[0] < few[1] - few[0]


def test_cluster_bootstrap_is_wider_than_wilson_when_attempts_are_correlated() -> None:
    # Ten conversations of ten attempts each, all-or-nothing: 50 of 100 attempts succeed,
    # but there are only ten independent observations. Wilson on the 100 pooled attempts is
    # too narrow (width ~0.19); resampling whole conversations is not.
    clusters = [(10, 10)] * 5 + [(0, 10)] * 5
    pooled = wilson_interval(50, 100)
    low, high = cluster_bootstrap(clusters)
    assert high - low > 2 * (pooled[1] - pooled[0])


def test_cluster_bootstrap_skips_resamples_with_no_attempts() -> None:
    # A conversation with no attempts has no rate; resamples drawing only it are skipped, so
    # every remaining resample has the rate 1 of the other conversation.
    assert cluster_bootstrap([(0, 0), (1, 1)], resamples=200) == (1.0, 1.0)


def test_cluster_bootstrap_edge_cases() -> None:
    assert cluster_bootstrap([]) == (0.0, 1.0)
    assert cluster_bootstrap([(0, 0), (0, 0)]) == (0.0, 1.0)
    # n counts the conversations holding a unit: none here.
    assert rate_clustered([(0, 0)]) == Rate(value=0.0, low=0.0, high=1.0, n=0)
    # One cluster: every resample is that cluster again, so no spread can be seen.
    assert cluster_bootstrap([(3, 4)]) == (0.75, 0.75)


@pytest.mark.parametrize(
    ("clusters", "options", "argument"),
    [
        ([(1, -1)], {}, r"clusters\[0\]"),
        ([(1, 2), (math.nan, 1)], {}, r"clusters\[1\]"),
        ([(1, 2), (1, math.inf)], {}, r"clusters\[1\]"),
        (CLUSTERS, {"resamples": 0}, "resamples"),
        (CLUSTERS, {"confidence": 1.0}, "confidence"),
    ],
)
def test_cluster_bootstrap_validates(
    clusters: list[tuple[float, float]], options: dict[str, float], argument: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        cluster_bootstrap(clusters, **options)  # type: ignore[arg-type]


# --- generic bootstrap ---------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def test_bootstrap_statistic_is_deterministic_and_seed_dependent() -> None:
    data = [1.0, 4.0, 2.0, 8.0, 5.0, 7.0, 3.3, 9.1, 0.4, 6.6]
    assert bootstrap_statistic(data, _mean, seed=3) == bootstrap_statistic(data, _mean, seed=3)
    assert bootstrap_statistic(data, _mean, seed=3) != bootstrap_statistic(data, _mean, seed=4)
    low, high = bootstrap_statistic(data, _mean)
    assert min(data) <= low < _mean(data) < high <= max(data)


def test_bootstrap_statistic_skips_undefined_resamples() -> None:
    # A resample of only 1.0s has no spread: its rho is nan and it must not count.
    pairs = [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]

    def rho(units: Sequence[tuple[float, float]]) -> float:
        return spearman_rho([u[0] for u in units], [u[1] for u in units])

    assert bootstrap_statistic(pairs, rho, resamples=300) == (1.0, 1.0)
    assert math.isnan(bootstrap_statistic([(1.0, 1.0)], rho)[0])
    assert all(map(math.isnan, bootstrap_statistic([], _mean)))


def test_bootstrap_statistic_gives_kappa_an_interval() -> None:
    a = [1, 2, 3, 3, 2, 1, 4, 5, 2, 1, 3, 4]
    b = [1, 2, 3, 2, 2, 1, 5, 5, 3, 1, 3, 4]

    def kappa(units: Sequence[tuple[int, int]]) -> float:
        return weighted_kappa([u[0] for u in units], [u[1] for u in units])

    point = weighted_kappa(a, b)
    low, high = bootstrap_statistic(list(zip(a, b, strict=True)), kappa, resamples=500)
    assert low < point <= high <= 1.0


# --- weighted kappa ------------------------------------------------------------------------


def test_kappa_two_by_two_textbook_case() -> None:
    # 50 items: both yes 20, A yes / B no 5, A no / B yes 10, both no 15.
    # p_o = 35/50 = 0.7; p_e = (25/50)(30/50) + (25/50)(20/50) = 0.5; kappa = 0.2/0.5 = 0.4.
    # With two levels every weighting scheme is the same (weights 0 and 1 up to scale).
    a = [1] * 20 + [1] * 5 + [0] * 10 + [0] * 15
    b = [1] * 20 + [0] * 5 + [1] * 10 + [0] * 15
    for weights in ("none", "linear", "quadratic"):
        assert weighted_kappa(a, b, levels=(0, 1), weights=weights) == pytest.approx(0.4)


def test_kappa_three_levels_by_hand() -> None:
    # a = 1 2 3 3, b = 1 3 3 2: both marginals are (1/4, 1/4, 1/2) over levels 1, 2, 3.
    # Quadratic: observed = (0 + 1 + 0 + 1) / 4 = 0.5;
    #   expected = sum p_i q_j (i-j)^2 = 1/4 (1/4*1 + 1/2*4) + 1/4 (1/4*1 + 1/2*1)
    #            + 1/2 (1/4*4 + 1/4*1) = 0.5625 + 0.1875 + 0.625 = 1.375;
    #   kappa = 1 - 0.5/1.375 = 7/11.
    # Linear: observed 0.5; expected = 0.3125 + 0.1875 + 0.375 = 0.875; kappa = 1 - 4/7 = 3/7.
    # None: observed 0.5; expected = 1 - (1/16 + 1/16 + 1/4) = 0.625; kappa = 1 - 0.8 = 0.2.
    a, b, levels = [1, 2, 3, 3], [1, 3, 3, 2], (1, 2, 3)
    assert weighted_kappa(a, b, levels=levels) == pytest.approx(7 / 11)
    assert weighted_kappa(a, b, levels=levels, weights="linear") == pytest.approx(3 / 7)
    assert weighted_kappa(a, b, levels=levels, weights="none") == pytest.approx(0.2)


def test_kappa_weights_use_positions_not_values() -> None:
    # Relabelling the levels while keeping their order changes nothing.
    a, b = [1, 2, 3, 3], [1, 3, 3, 2]
    relabel = {1: 10, 2: 20, 3: 70}
    assert weighted_kappa(
        [relabel[x] for x in a], [relabel[x] for x in b], levels=(10, 20, 70)
    ) == pytest.approx(7 / 11)


def test_kappa_degenerate_cases() -> None:
    # Both raters constant and equal: expected disagreement 0 and observed 0, so kappa is
    # 0/0: undefined (nan, as scikit-learn's), not perfect agreement (issue 35).
    assert math.isnan(weighted_kappa([3, 3, 3], [3, 3, 3]))
    # Constant but different: expected = observed = weight(1, 2), so kappa = 0.
    assert weighted_kappa([1, 1, 1], [2, 2, 2]) == 0.0


def test_kappa_systematic_disagreement_is_negative() -> None:
    # b reverses a: the ranking is turned around, well below chance.
    assert weighted_kappa([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)


@PROPERTY
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=40))
def test_kappa_is_one_with_itself_symmetric_and_at_most_one(pairs: list[tuple[int, int]]) -> None:
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    if len(set(a)) > 1:
        assert weighted_kappa(a, a) == pytest.approx(1.0)
    else:  # one level throughout: no chance agreement to correct for
        assert math.isnan(weighted_kappa(a, a))
    for weights in ("none", "linear", "quadratic"):
        k = weighted_kappa(a, b, weights=weights)
        assert k == pytest.approx(weighted_kappa(b, a, weights=weights), nan_ok=True)
        assert math.isnan(k) or k <= 1.0 + 1e-12


@pytest.mark.parametrize(
    ("a", "b", "options", "argument"),
    [
        ([1, 2], [1], {}, "a, b"),
        ([], [], {}, "a"),
        ([1, 6], [1, 2], {}, r"a\[1\]"),
        ([1, 2], [0, 2], {}, r"b\[0\]"),
        ([1, 2], [1, 2], {"weights": "cubic"}, "weights"),
        ([1, 2], [1, 2], {"levels": (1, 2, 2)}, "levels"),
        ([1, 2], [1, 2], {"levels": ()}, "levels"),
    ],
)
def test_kappa_validates(
    a: list[int], b: list[int], options: dict[str, object], argument: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        weighted_kappa(a, b, **options)  # type: ignore[arg-type]


# --- Krippendorff's alpha ------------------------------------------------------------------

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section E: 4 observers
# (rows) x 12 units (columns), "." for a missing value. Unit 12 has a single value and drops.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]
UNITS_2011 = [list(unit) for unit in zip(*KRIPPENDORFF_2011, strict=True)]  # units x coders


@pytest.mark.parametrize(
    ("level", "published"),
    # The paper's values; this implementation reproduces all three to 3 decimals (nominal is
    # exactly 113/152 = 0.74342 and interval 951/1120 = 0.84911 here).
    [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)],
)
def test_alpha_reproduces_krippendorffs_worked_example(level: str, published: float) -> None:
    assert round(krippendorff_alpha(UNITS_2011, level=level), 3) == published


def test_alpha_three_units_by_hand() -> None:
    # Units (1,2), (2,2), (3,3); m = 2 each, so each ordered pair adds 1/(m-1) = 1:
    #   o[1][2] = o[2][1] = 1, o[2][2] = 2, o[3][3] = 2; n_1 = 1, n_2 = 3, n_3 = 2; n = 6.
    # alpha = 1 - (n - 1) * sum(o d) / sum(n_c n_k d) with:
    # nominal:  sum(o d) = 2; sum(n n d) = 2 (1*3 + 1*2 + 3*2) = 22      -> 1 - 10/22 = 6/11
    # interval: sum(o d) = 2; sum(n n d) = 2 (3*1 + 2*4 + 6*1) = 34      -> 1 - 10/34 = 12/17
    # ordinal:  d(1,2) = (1+3 - 2)^2 = 4, d(2,3) = (3+2 - 2.5)^2 = 6.25,
    #           d(1,3) = (1+3+2 - 1.5)^2 = 20.25; sum(o d) = 8;
    #           sum(n n d) = 2 (3*4 + 6*6.25 + 2*20.25) = 180           -> 1 - 40/180 = 7/9
    units: list[list[int | None]] = [[1, 2], [2, 2], [3, 3]]
    assert krippendorff_alpha(units, level="nominal") == pytest.approx(6 / 11)
    assert krippendorff_alpha(units, level="interval") == pytest.approx(12 / 17)
    assert krippendorff_alpha(units, level="ordinal") == pytest.approx(7 / 9)


def test_alpha_drops_units_with_fewer_than_two_ratings() -> None:
    units: list[list[int | None]] = [[1, 2], [2, 2], [3, 3]]
    padded: list[list[int | None]] = [*units, [5, None], [None, None], []]
    for level in ("nominal", "ordinal", "interval"):
        assert krippendorff_alpha(padded, level=level) == krippendorff_alpha(units, level=level)


def test_alpha_does_not_depend_on_the_order_of_coders_or_units() -> None:
    reordered = [list(reversed(unit)) for unit in reversed(UNITS_2011)]
    for level in ("nominal", "ordinal", "interval"):
        assert krippendorff_alpha(reordered, level=level) == pytest.approx(
            krippendorff_alpha(UNITS_2011, level=level)
        )


def test_alpha_metric_invariances() -> None:
    # Interval alpha is unchanged by an affine relabelling, ordinal by any monotone one,
    # nominal by any one-to-one relabelling.
    def relabel(mapping: dict[int, int]) -> list[list[int | None]]:
        return [[None if v is None else mapping[v] for v in unit] for unit in UNITS_2011]

    affine = {v: 3 * v + 7 for v in range(1, 6)}
    monotone = {1: 1, 2: 4, 3: 9, 4: 50, 5: 51}
    shuffled = {1: 4, 2: 1, 3: 5, 4: 2, 5: 3}
    for level, mapping in (("interval", affine), ("ordinal", monotone), ("nominal", shuffled)):
        levels = sorted(mapping.values())
        assert krippendorff_alpha(relabel(mapping), level=level, levels=levels) == pytest.approx(
            krippendorff_alpha(UNITS_2011, level=level)
        )


def test_alpha_ordinal_follows_the_order_of_levels() -> None:
    # Reversing the order of the levels is a monotone (decreasing) relabelling: no change.
    assert krippendorff_alpha(UNITS_2011, levels=(5, 4, 3, 2, 1)) == pytest.approx(
        krippendorff_alpha(UNITS_2011)
    )


def test_alpha_degenerate_cases() -> None:
    assert math.isnan(krippendorff_alpha([]))
    assert math.isnan(krippendorff_alpha([[1, None], [None, 2]]))
    # No variation: nothing to expect, so alpha is undefined (nan, as krippendorff's).
    assert math.isnan(krippendorff_alpha([[2, 2], [2, 2, None]]))


@PROPERTY
@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(2, 4)), min_size=2, max_size=15).filter(
        lambda units: len({v for v, _ in units}) > 1
    )
)
def test_alpha_of_perfect_agreement_is_one(units: list[tuple[int, int]]) -> None:
    # Each unit: one value given by 2-4 coders (padded with a missing rating).
    ratings: list[list[int | None]] = [[value] * coders + [None] for value, coders in units]
    for level in ("nominal", "ordinal", "interval"):
        assert krippendorff_alpha(ratings, level=level) == pytest.approx(1.0)


def test_alpha_validates() -> None:
    with pytest.raises(ValueError, match=r"^level:"):
        krippendorff_alpha(UNITS_2011, level="ratio")
    # Named by unit and coder column, counting the missing rating before it.
    with pytest.raises(ValueError, match=r"^ratings\[1\]\[2\]:"):
        krippendorff_alpha([[1, 2], [2, None, 7]])


# --- Spearman ------------------------------------------------------------------------------


def test_spearman_textbook_example_without_ties() -> None:
    # IQ against hours of TV per week (the Wikipedia worked example): sum d^2 = 194, so
    # rho = 1 - 6 * 194 / (10 * (100 - 1)) = -29/165 = -0.17576.
    iq = [106, 100, 86, 101, 99, 103, 97, 113, 112, 110]
    tv = [7, 27, 2, 50, 28, 29, 20, 12, 6, 17]
    assert spearman_rho(iq, tv) == pytest.approx(-29 / 165)


def test_spearman_averages_tied_ranks() -> None:
    # y = 5 6 7 8 7 -> ranks 1 2 3.5 5 3.5; x ranks 1..5; both have mean rank 3.
    # sxy = (-2)(-2) + (-1)(-1) + 0 + 1*2 + 2*0.5 = 8; sxx = 10; syy = 4+1+0.25+4+0.25 = 9.5;
    # rho = 8 / sqrt(95) = 0.82078.
    assert spearman_rho([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))


def test_spearman_undefined_without_variation() -> None:
    assert math.isnan(spearman_rho([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman_rho([1, 2, 3], [4, 4, 4]))
    assert math.isnan(spearman_rho([1], [2]))
    assert math.isnan(spearman_rho([], []))
    with pytest.raises(ValueError, match=r"^x, y:"):
        spearman_rho([1, 2], [1])


@PROPERTY
@given(st.lists(st.tuples(st.integers(-20, 20), st.integers(-20, 20)), min_size=2, max_size=30))
def test_spearman_is_symmetric_bounded_and_rank_invariant(pairs: list[tuple[int, int]]) -> None:
    x, y = [float(p[0]) for p in pairs], [float(p[1]) for p in pairs]
    rho = spearman_rho(x, y)
    if math.isnan(rho):
        assert len(set(x)) == 1 or len(set(y)) == 1
        return
    assert -1.0 <= rho <= 1.0
    assert spearman_rho(y, x) == pytest.approx(rho)
    # A strictly increasing transform keeps the ranks; a decreasing one flips the sign.
    assert spearman_rho([v**3 + 5 * v for v in x], y) == pytest.approx(rho)
    assert spearman_rho([-v for v in x], y) == pytest.approx(-rho)


# --- confusion matrix and threshold rates --------------------------------------------------


def test_confusion_matrix_counts_pairs() -> None:
    matrix = confusion_matrix([1, 1, 2, 3, 5, 5], [1, 2, 2, 2, 5, 4])
    assert matrix == [
        [1, 1, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1],
    ]
    assert confusion_matrix([], [], levels=(1, 2)) == [[0, 0], [0, 0]]


def test_confusion_matrix_validates() -> None:
    with pytest.raises(ValueError, match=r"^true, pred:"):
        confusion_matrix([1], [1, 2])
    with pytest.raises(ValueError, match=r"^pred\[0\]:"):
        confusion_matrix([1], [9])


def test_threshold_rates_by_hand() -> None:
    # Threshold 2. Negatives (true < 2): items 0, 1, 2, of which item 1 is predicted 2: FP 1/3.
    # Positives (true >= 2): items 3, 4, 5, 6; item 3 predicted 1: FN 1/4.
    true = [1, 1, 1, 3, 4, 2, 5]
    pred = [1, 2, 1, 1, 4, 2, 3]
    rates = threshold_rates(true, pred, threshold=2)
    assert rates == {
        "false_positive_rate": 1 / 3,
        "false_positive_rate_ci": wilson_interval(1, 3),
        "false_positives": 1,
        "negatives": 3,
        "false_negative_rate": 1 / 4,
        "false_negative_rate_ci": wilson_interval(1, 4),
        "false_negatives": 1,
        "positives": 4,
    }


def test_threshold_rates_without_negatives() -> None:
    rates = threshold_rates([3, 4], [3, 1], threshold=2)
    assert (rates["false_positive_rate"], rates["false_positive_rate_ci"]) == (0.0, (0.0, 1.0))
    assert rates["negatives"] == 0
    assert rates["false_negative_rate"] == 0.5
    with pytest.raises(ValueError, match=r"^true, pred:"):
        threshold_rates([1], [], threshold=2)


# --- paired permutation test ---------------------------------------------------------------


def _exact_p(diffs: Sequence[int]) -> Fraction:
    # Brute force over all sign patterns, in exact integer arithmetic.
    observed = abs(sum(diffs))
    patterns = list(itertools.product((1, -1), repeat=len(diffs)))
    hits = sum(abs(sum(s * d for s, d in zip(p, diffs, strict=True))) >= observed for p in patterns)
    return Fraction(hits, len(patterns))


def test_permutation_exact_by_hand() -> None:
    # Differences 1, 2, 3 (sum 6). The 8 sign patterns give sums 6, 4, 2, 0, 0, -2, -4, -6;
    # two have |sum| >= 6, so p = 2/8 = 0.25.
    assert permutation_test_paired([3, 4, 5], [2, 2, 2]) == 0.25


def test_permutation_exact_matches_integer_brute_force() -> None:
    a = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.5, 0.8, 0.6, 0.3, 0.2, 0.7]  # 12 pairs: exact
    b = [0.1, 0.2, 0.4, 0.2, 0.5, 0.5, 0.1, 0.6, 0.6, 0.4, 0.1, 0.3]
    tenths = [round(10 * x) - round(10 * y) for x, y in zip(a, b, strict=True)]
    # Float differences such as 0.3 - 0.1 must tie with their mirror images.
    assert permutation_test_paired(a, b) == float(_exact_p(tenths))
    assert permutation_test_paired(b, a) == permutation_test_paired(a, b)


def test_permutation_without_differences_is_one() -> None:
    assert permutation_test_paired([1, 2, 3], [1, 2, 3]) == 1.0
    assert permutation_test_paired([1.0] * 20, [1.0] * 20) == 1.0


def test_permutation_monte_carlo_is_close_to_exact() -> None:
    diffs = [3, -1, 2, 0, 4, -2, 1, 1, -3, 2, 5, -1, 2]  # 13 pairs: sampled
    exact = float(_exact_p(diffs))
    sampled = permutation_test_paired(diffs, [0] * len(diffs), resamples=20000)
    # Standard error of the estimate is sqrt(p(1-p)/20000) < 0.004.
    assert sampled == pytest.approx(exact, abs=0.015)


def test_permutation_monte_carlo_is_seeded() -> None:
    a = [float(i % 5) for i in range(20)]
    b = [x + (0.5 if i % 3 else -1.2) for i, x in enumerate(a)]  # sum of a - b: 1.1
    p = permutation_test_paired(a, b, resamples=2000, seed=1)
    assert p == permutation_test_paired(a, b, resamples=2000, seed=1)
    assert p != permutation_test_paired(a, b, resamples=2000, seed=2)


def test_permutation_detects_a_consistent_difference() -> None:
    # 20 pairs, all differences positive: only 2 of 2^20 patterns are as extreme, so the
    # sampled p-value is (0 + 1) / (resamples + 1) unless the draw hits one of them.
    p = permutation_test_paired([2.0] * 20, [1.0] * 20, resamples=2000)
    assert 0 < p < 0.001
    # Exact, 12 pairs: 2 / 4096.
    assert permutation_test_paired([2.0] * 12, [1.0] * 12) == 2 / 4096


def test_permutation_validates() -> None:
    with pytest.raises(ValueError, match=r"^a, b:"):
        permutation_test_paired([1], [1, 2])
    with pytest.raises(ValueError, match=r"^a:"):
        permutation_test_paired([], [])
    with pytest.raises(ValueError, match=r"^resamples:"):
        permutation_test_paired([1], [2], resamples=0)


# -- count tables: the fast path behind the report's agreement intervals -----------------------


def _random_ratings(rng: random.Random, units: int, coders: int) -> list[list[int | None]]:
    rows: list[list[int | None]] = []
    for _ in range(units):
        base = rng.randint(1, 5)
        row: list[int | None] = [
            None if rng.random() < 0.2 else max(1, min(5, base + rng.randint(-1, 1)))
            for _ in range(coders)
        ]
        rows.append(row)
    return rows


def test_kappa_and_alpha_from_tables_equal_the_direct_formulas() -> None:
    rng = random.Random(3)
    for trial in range(30):
        a = [rng.randint(1, 5) for _ in range(rng.randint(1, 40))]
        b = [max(1, min(5, x + rng.randint(-2, 1))) for x in a]
        for weights in ("quadratic", "linear", "none"):
            assert kappa_from_table(pair_table(a, b), weights=weights) == pytest.approx(
                weighted_kappa(a, b, weights=weights), abs=1e-12
            ), (trial, weights)
        coders = rng.randint(2, 5)
        rows = _random_ratings(rng, rng.randint(1, 30), coders)
        for level in ("ordinal", "nominal", "interval"):
            direct = krippendorff_alpha(rows, level=level)
            table = coincidence_table(rows, coders=coders)
            fast = alpha_from_coincidences(table, coders=coders, level=level)
            if math.isnan(direct):
                assert math.isnan(fast)
            else:
                assert fast == pytest.approx(direct, abs=1e-9), (trial, level)
    # Tables of disjoint units add up to the table of all of them.
    rows = _random_ratings(rng, 20, 3)
    whole = coincidence_table(rows, coders=3)
    parts = [coincidence_table(rows[:7], coders=3), coincidence_table(rows[7:], coders=3)]
    assert whole == [
        [x + y for x, y in zip(r, s, strict=True)] for r, s in zip(*parts, strict=True)
    ]
    with pytest.raises(ValueError, match="more than coders"):
        coincidence_table([[1, 2, 3]], coders=2)


def test_the_table_bootstrap_resamples_exactly_like_the_plain_one() -> None:
    rng = random.Random(5)
    groups = [
        [(rng.randint(1, 5), rng.randint(1, 5)) for _ in range(rng.randint(1, 6))]
        for _ in range(25)
    ]

    def kappa_of(gs: Sequence[list[tuple[int, int]]]) -> float:
        pairs = [p for g in gs for p in g]
        return weighted_kappa([p[0] for p in pairs], [p[1] for p in pairs])

    slow = bootstrap_statistic(groups, kappa_of, resamples=300, seed=9)
    tables = [pair_table([p[0] for p in g], [p[1] for p in g]) for g in groups]
    fast = cluster_bootstrap_tables(tables, kappa_from_table, resamples=300, seed=9)
    assert fast == pytest.approx(slow, abs=1e-12)
    assert math.isnan(cluster_bootstrap_tables([], kappa_from_table)[0])
    with pytest.raises(ValueError, match="must be >= 0"):
        cluster_bootstrap_tables([[[-1]]], kappa_from_table)


def test_the_counted_cluster_bootstrap_draws_exactly_the_plain_resamples() -> None:
    rng = random.Random(11)
    for _ in range(20):
        clusters = [(float(rng.randint(0, 4)), float(rng.randint(0, 6))) for _ in range(15)]
        clusters.append((1.0, 2.0))  # at least one cluster with a denominator
        plain = bootstrap_statistic(
            clusters,
            lambda cs: (
                math.fsum(n for n, _ in cs) / d if (d := math.fsum(d for _, d in cs)) else math.nan
            ),
            resamples=400,
            seed=3,
        )
        assert cluster_bootstrap(clusters, resamples=400, seed=3) == plain
    # Fractional counts take the general path and still work.
    low, high = cluster_bootstrap([(0.5, 1.0), (1.5, 2.0), (0.0, 1.0)], resamples=200)
    assert 0.0 <= low <= high <= 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda p: (min(p), max(p))),
            min_size=0,
            max_size=12,
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 3),
)
def test_cluster_bootstraps_equal_one_bootstrap_at_a_time(
    many: list[list[tuple[int, int]]], seed: int
) -> None:
    """Rates over as many clusters share their draws and still get exactly their own
    intervals (same resamples), edge cases (no clusters, one, zero denominators) included."""
    lists = [[(float(n), float(d)) for n, d in clusters] for clusters in many]
    lists.append([(0.5, 1.0), (1.0, 2.0)])  # real-valued: the general path
    together = cluster_bootstraps(lists, resamples=150, seed=seed)
    assert together == [cluster_bootstrap(c, resamples=150, seed=seed) for c in lists]
