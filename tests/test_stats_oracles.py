"""mhsafeeval.stats against reference implementations written by others (issue 35).

scipy, scikit-learn, statsmodels and krippendorff are test-only dependencies: on generated
data (seeded) every point statistic must match them to machine precision, the clustered
interval must be the cluster-robust (statsmodels) variance put through Wilson's interval at
Student's t quantile (scipy), and the percentile bootstrap must agree with scipy's within
Monte Carlo error. A regression in our code is then caught by code we did not write.
"""

from __future__ import annotations

import math
import random
import warnings
from typing import Any, Literal

import krippendorff
import numpy as np
import pytest
import scipy.stats  # type: ignore[import-untyped]
import statsmodels.api as sm  # type: ignore[import-untyped]
from sklearn.metrics import cohen_kappa_score  # type: ignore[import-untyped]
from statsmodels.stats.proportion import (  # type: ignore[import-untyped]
    confint_proportions_2indep,
    proportion_confint,
)

from mhsafeeval.stats import (
    LEVELS,
    bootstrap_interval,
    clustered_interval,
    difference_interval,
    krippendorff_alpha,
    normal_quantile,
    permutation_test_paired,
    spearman_rho,
    t_quantile,
    weighted_kappa,
    wilson_interval,
)

SEEDS = range(40)


def _ratings(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    """Two raters' severities of ``n`` items: the second near the first, sometimes far."""
    a = [rng.choice(LEVELS) for _ in range(n)]
    b = [min(5, max(1, x + rng.choice((-2, -1, 0, 0, 0, 1, 1)))) for x in a]
    return a, b


@pytest.mark.parametrize("weights", ["quadratic", "linear", None])
def test_weighted_kappa_is_scikit_learns(weights: str | None) -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        a, b = _ratings(rng, rng.randint(2, 60))
        ours = weighted_kappa(a, b, weights=weights or "none")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns where kappa is undefined (0/0)
            theirs = cohen_kappa_score(a, b, weights=weights, labels=list(LEVELS))
        if math.isnan(theirs):
            assert math.isnan(ours)
        else:
            assert ours == pytest.approx(theirs, abs=1e-12)


def test_an_undefined_kappa_is_undefined_in_both() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(cohen_kappa_score([2] * 4, [2] * 4, weights="quadratic"))
    assert math.isnan(weighted_kappa([2] * 4, [2] * 4))


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval"])
def test_krippendorff_alpha_is_the_krippendorff_packages(
    level: Literal["nominal", "ordinal", "interval"],
) -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        units, coders = rng.randint(2, 40), rng.randint(2, 4)
        base = [rng.choice(LEVELS) for _ in range(units)]
        rows: list[list[int | None]] = [
            [
                None if rng.random() < 0.2 else min(5, max(1, x + rng.choice((-1, 0, 0, 1))))
                for _ in range(coders)
            ]
            for x in base
        ]
        ours = krippendorff_alpha(rows, level=level)
        data = np.array([[np.nan if v is None else v for v in row] for row in rows]).T
        pairable = sum(sum(v is not None for v in row) >= 2 for row in rows)
        values = {v for row in rows if sum(x is not None for x in row) >= 2 for v in row}
        if not pairable or len(values - {None}) < 2:
            assert math.isnan(ours)  # the package raises here: nothing to expect
            continue
        theirs = krippendorff.alpha(
            reliability_data=data, level_of_measurement=level, value_domain=list(LEVELS)
        )
        assert ours == pytest.approx(theirs, abs=1e-9)


def test_spearman_rho_is_scipys() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        a, b = _ratings(rng, rng.randint(3, 50))
        ours = spearman_rho(a, b)
        if len(set(a)) < 2 or len(set(b)) < 2:
            assert math.isnan(ours)
            continue
        assert ours == pytest.approx(scipy.stats.spearmanr(a, b).statistic, abs=1e-12)


def test_wilson_is_statsmodels_and_the_quantiles_are_scipys() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        n = rng.randint(1, 500)
        k = rng.randint(0, n)
        confidence = rng.choice((0.8, 0.9, 0.95, 0.99))
        low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
        assert wilson_interval(k, n, confidence) == pytest.approx((low, high), abs=1e-9)
        p = rng.uniform(0.001, 0.999)
        assert normal_quantile(p) == pytest.approx(scipy.stats.norm.ppf(p), abs=1e-9)
        df = rng.randint(1, 60)
        assert t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), abs=1e-8)


def _cluster_robust(successes: list[int], units: list[int]) -> tuple[float, float]:
    """The rate and its cluster-robust variance, from statsmodels (OLS of every unit's 0/1 on
    a constant, errors clustered by conversation, CR1: ``G / (G - 1)``)."""
    y = np.concatenate([[1.0] * s + [0.0] * (n - s) for s, n in zip(successes, units, strict=True)])
    groups = np.repeat(np.arange(len(units)), units)
    fit = sm.OLS(y, np.ones_like(y)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    return float(fit.params[0]), float(fit.bse[0] ** 2)


def test_the_clustered_interval_is_wilson_over_the_cluster_robust_effective_size() -> None:
    # Rebuilt from statsmodels and scipy: deff = V_cluster / V_binomial (at least 1), Wilson's
    # interval over N / deff trials at Student's t quantile with G - 1 degrees of freedom.
    for seed in SEEDS:
        rng = random.Random(seed)
        g = rng.randint(8, 40)
        units = [rng.randint(1, 12) for _ in range(g)]
        p = [rng.betavariate(2, 3) for _ in range(g)]
        successes = [sum(rng.random() < q for _ in range(n)) for q, n in zip(p, units, strict=True)]
        if (
            sum(s > 0 for s in successes) < 5
            or sum(s < n for s, n in zip(successes, units, strict=True)) < 5
        ):
            continue  # the few-conversations floor applies there (tested elsewhere)
        rate, variance = _cluster_robust(successes, units)
        total = sum(units)
        deff = max(1.0, variance / (rate * (1 - rate) / total))
        q = scipy.stats.t.ppf(0.975, g - 1)
        alpha = 2 * scipy.stats.norm.sf(q)  # the normal tail whose quantile is t's
        low, high = proportion_confint(rate * total / deff, total / deff, alpha, "wilson")
        assert clustered_interval(successes, units) == pytest.approx((low, high), abs=1e-7)


def test_the_difference_of_many_single_unit_conversations_is_newcombes() -> None:
    # One unit per conversation: the clustered interval tends to Wilson's, so the difference
    # interval tends to Newcombe's hybrid score interval (statsmodels' "newcomb").
    for seed in range(10):
        rng = random.Random(seed)
        n = 4000
        ka, kb = rng.randint(400, 3600), rng.randint(400, 3600)
        a = [(1, 1)] * ka + [(0, 1)] * (n - ka)
        b = [(1, 1)] * kb + [(0, 1)] * (n - kb)
        low, high = confint_proportions_2indep(kb, n, ka, n, method="newcomb", compare="diff")
        assert difference_interval(a, b) == pytest.approx((low, high), abs=2e-3)


def test_the_exact_sign_flip_test_is_scipys_permutation_test() -> None:
    for seed in range(15):
        rng = random.Random(seed)
        n = rng.randint(2, 10)
        a = [rng.randint(0, 8) / 8 for _ in range(n)]
        b = [rng.randint(0, 8) / 8 for _ in range(n)]
        if a == b:
            continue

        def mean_difference(x: Any, y: Any, axis: int = -1) -> Any:
            return np.mean(x - y, axis=axis)

        theirs = scipy.stats.permutation_test(
            (np.array(a), np.array(b)),
            mean_difference,
            permutation_type="samples",
            n_resamples=np.inf,
            alternative="two-sided",
        ).pvalue
        assert permutation_test_paired(a, b) == pytest.approx(min(1.0, theirs), abs=1e-12)


def test_the_percentile_bootstrap_agrees_with_scipys_within_monte_carlo_error() -> None:
    rng = random.Random(3)
    values = [rng.gauss(0.0, 1.0) ** 2 for _ in range(40)]

    def mean(xs: Any) -> float:
        return float(np.mean(xs))

    ours = bootstrap_interval(values, mean, resamples=4000, seed=1)
    theirs = scipy.stats.bootstrap(
        (np.array(values),),
        np.mean,
        n_resamples=4000,
        method="percentile",
        rng=np.random.default_rng(2),
    ).confidence_interval
    width = theirs.high - theirs.low
    assert ours.low == pytest.approx(theirs.low, abs=0.1 * width)
    assert ours.high == pytest.approx(theirs.high, abs=0.1 * width)
    assert ours.skipped == 0
