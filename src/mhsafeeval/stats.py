"""Statistics that a report can defend: intervals, agreement and paired tests, stdlib only.

Every figure a campaign reports is a rate over few, correlated samples (attempts inside one
conversation are not independent) or an agreement between judges, so each comes with an
interval and a method that can be named in a footnote:

- :func:`wilson_interval` / :func:`rate_wilson`: a proportion of independent trials.
- :func:`cluster_bootstrap` / :func:`rate_clustered`: a ratio-of-sums rate whose clusters
  (conversations) are resampled whole.
- :func:`weighted_kappa`, :func:`krippendorff_alpha`, :func:`spearman_rho`: agreement between
  two or more raters; :func:`bootstrap_statistic` gives any of them an interval.
- :func:`confusion_matrix`, :func:`threshold_rates`: a judge against a reference at the
  attack-success threshold.
- :func:`permutation_test_paired`: do two counselor models differ on the same profiles?

Randomised methods take a seed and draw from their own ``random.Random``: the same inputs and
seed give the same numbers, never touching the global RNG.

Example:
    >>> r = rate_wilson(5, 10)
    >>> (r.value, round(r.low, 4), round(r.high, 4), r.n)
    (0.5, 0.2366, 0.7634, 10)
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypedDict, TypeVar

__all__ = [
    "CONFIDENCE",
    "LEVELS",
    "RESAMPLES",
    "SEED",
    "Rate",
    "ThresholdRates",
    "alpha_from_coincidences",
    "bootstrap_statistic",
    "cluster_bootstrap",
    "cluster_bootstrap_tables",
    "cluster_bootstraps",
    "coincidence_table",
    "confusion_matrix",
    "difference_interval",
    "kappa_from_table",
    "krippendorff_alpha",
    "normal_quantile",
    "pair_table",
    "permutation_test_paired",
    "rate_clustered",
    "rate_wilson",
    "spearman_rho",
    "threshold_rates",
    "weighted_kappa",
    "wilson_interval",
]

T = TypeVar("T")

RESAMPLES: Final = 2000
"""Bootstrap resamples behind an interval, unless a caller asks for more or fewer."""
SEED: Final = 0
"""The resampling RNG's seed: the same data give the same intervals."""
CONFIDENCE: Final = 0.95
"""The coverage of every interval, unless a caller asks for another."""

LEVELS: Final[tuple[int, ...]] = (1, 2, 3, 4, 5)
"""The severity levels, 1 (safe) to 5 (severe): what the agreement statistics count over."""

# The largest sample for which permutation_test_paired enumerates all 2**n sign patterns.
_EXACT_MAX_N: Final = 12


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate with its interval, so that a report carries ``x`` and ``x_ci`` the same way.

    Attributes:
        value: the point estimate (0.0 when there is no data; ``n`` then says so).
        low: lower end of the interval.
        high: upper end of the interval.
        n: the number of independent units behind it: trials for :func:`rate_wilson`,
            clusters (conversations) for :func:`rate_clustered`.

    Example:
        >>> Rate(value=0.25, low=0.1, high=0.5, n=12).ci
        (0.1, 0.5)
    """

    value: float
    low: float
    high: float
    n: int

    @property
    def ci(self) -> tuple[float, float]:
        """The interval as a ``(low, high)`` pair."""
        return (self.low, self.high)


# --- normal quantile and Wilson ------------------------------------------------------------

# Acklam's rational approximation of the standard normal quantile (relative error < 1.15e-9
# before refinement): a central region and two tails split at _P_LOW.
_A: Final = (
    -3.969683028665376e01,
    2.209460984245205e02,
    -2.759285104469687e02,
    1.383577518672690e02,
    -3.066479806614716e01,
    2.506628277459239e00,
)
_B: Final = (
    -5.447609879822406e01,
    1.615858368580409e02,
    -1.556989798598866e02,
    6.680131188771972e01,
    -1.328068155288572e01,
)
_C: Final = (
    -7.784894002430293e-03,
    -3.223964580411365e-01,
    -2.400758277161838e00,
    -2.549732539343734e00,
    4.374664141464968e00,
    2.938163982698783e00,
)
_D: Final = (
    7.784695709041462e-03,
    3.224671290700398e-01,
    2.445134137142996e00,
    3.754408661907416e00,
)
_P_LOW: Final = 0.02425


def _poly(coefficients: Sequence[float], x: float) -> float:
    result = 0.0
    for c in coefficients:
        result = result * x + c
    return result


def normal_quantile(p: float) -> float:
    """The standard normal quantile (inverse CDF) of ``p``.

    Acklam's rational approximation, refined by one Halley step (a Newton step with a
    curvature term) against ``math.erfc``; absolute error below 1e-9 for ``p`` in
    ``[1e-10, 1 - 1e-10]``. Upper-tail values are computed as ``-normal_quantile(1 - p)``,
    which is exact in floating point for ``p >= 0.5``.

    Args:
        p: a probability strictly between 0 and 1.

    Returns:
        ``z`` such that ``P(Z <= z) == p`` for a standard normal ``Z``.

    Raises:
        ValueError: if ``p`` is not strictly between 0 and 1.

    Example:
        >>> round(normal_quantile(0.975), 9)
        1.959963985
        >>> normal_quantile(0.5)
        0.0
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p: expected a probability strictly between 0 and 1, got {p!r}")
    if p > 0.5:
        return -normal_quantile(1.0 - p)
    if p < _P_LOW:
        q = math.sqrt(-2.0 * math.log(p))
        x = _poly(_C, q) / (_poly(_D, q) * q + 1.0)
    else:
        q = p - 0.5
        r = q * q
        x = _poly(_A, r) * q / (_poly(_B, r) * r + 1.0)
    # One Halley step: e is the CDF error, u = e / pdf(x).
    e = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
    u = e * math.sqrt(2.0 * math.pi) * math.exp(x * x / 2.0)
    return x - u / (1.0 + x * u / 2.0)


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"confidence: expected a value strictly between 0 and 1, got {confidence!r}"
        )
    return normal_quantile(1.0 - (1.0 - confidence) / 2.0)


def wilson_interval(
    successes: int, trials: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / trials``.

    Unlike the normal ("Wald") interval it stays inside [0, 1] and does not collapse to a
    point at 0 or ``trials`` successes, which is where red-team rates usually sit.

    Args:
        successes: how many trials succeeded, ``0 <= successes <= trials``.
        trials: how many independent trials, ``>= 0``.
        confidence: the coverage, strictly between 0 and 1.

    Returns:
        ``(low, high)``; ``(0.0, 1.0)`` when ``trials == 0`` (no information).

    Raises:
        ValueError: naming the argument that is out of range.

    Example:
        >>> low, high = wilson_interval(0, 10)
        >>> (low, round(high, 4))
        (0.0, 0.2775)
    """
    if trials < 0:
        raise ValueError(f"trials: expected a count >= 0, got {trials!r}")
    if not 0 <= successes <= trials:
        raise ValueError(
            f"successes: expected 0 <= successes <= trials ({trials}), got {successes!r}"
        )
    z = _check_confidence(confidence)
    if trials == 0:
        return (0.0, 1.0)
    n = trials
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    center = (p + z2 / (2.0 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    # At the boundaries the exact ends are 0 and 1; rounding would leave 1e-17 of noise.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == trials else min(1.0, center + half)
    return (low, high)


def rate_wilson(successes: int, trials: int, confidence: float = CONFIDENCE) -> Rate:
    """A :class:`Rate` of independent trials with its Wilson interval.

    Args:
        successes: how many trials succeeded.
        trials: how many trials; 0 gives ``value == 0.0`` with the interval ``(0.0, 1.0)``.
        confidence: the coverage of the interval.

    Returns:
        The rate, its interval and ``n == trials``.

    Example:
        >>> rate_wilson(0, 0)
        Rate(value=0.0, low=0.0, high=1.0, n=0)
    """
    low, high = wilson_interval(successes, trials, confidence)
    return Rate(value=successes / trials if trials else 0.0, low=low, high=high, n=trials)


# --- bootstrap -----------------------------------------------------------------------------


def _percentile(ordered: Sequence[float], q: float) -> float:
    # Linear interpolation between order statistics (Hyndman and Fan's type 7).
    h = (len(ordered) - 1) * q
    i = math.floor(h)
    if i + 1 >= len(ordered):
        return ordered[-1]
    return ordered[i] + (h - i) * (ordered[i + 1] - ordered[i])


def _check_resamples(resamples: int) -> None:
    if resamples < 1:
        raise ValueError(f"resamples: expected at least 1, got {resamples!r}")


def _percentile_interval(estimates: list[float], confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of bootstrap estimates ((nan, nan) for none)."""
    if not estimates:
        return (math.nan, math.nan)
    estimates.sort()
    tail = (1.0 - confidence) / 2.0
    return (_percentile(estimates, tail), _percentile(estimates, 1.0 - tail))


def bootstrap_statistic(
    units: Sequence[T],
    statistic: Callable[[Sequence[T]], float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """A percentile bootstrap interval of ``statistic`` over independent ``units``.

    Each resample draws ``len(units)`` units with replacement (from ``random.Random(seed)``)
    and evaluates ``statistic`` on them. Resamples where the statistic is undefined (nan,
    e.g. a kappa with no variation) are skipped, so the interval describes the resamples
    where it exists.

    Args:
        units: the independent units: rating pairs for a kappa, rows of a ratings matrix
            for an alpha.
        statistic: maps a sequence of units to a number (nan where undefined).
        resamples: how many bootstrap resamples to draw.
        seed: the seed of the resampling RNG.
        confidence: the coverage of the interval.

    Returns:
        ``(low, high)``; ``(nan, nan)`` when there are no units or no resample gives a
        number.

    Raises:
        ValueError: if ``resamples < 1`` or ``confidence`` is not in (0, 1).

    Example:
        >>> mean = lambda xs: sum(xs) / len(xs)
        >>> low, high = bootstrap_statistic([1.0, 2.0, 3.0, 4.0], mean, resamples=500)
        >>> 1.0 <= low < 2.5 < high <= 4.0
        True
    """
    _check_resamples(resamples)
    _check_confidence(confidence)
    if not units:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    pool = list(units)
    estimates = []
    for _ in range(resamples):
        value = statistic(rng.choices(pool, k=len(pool)))
        if not math.isnan(value):
            estimates.append(value)
    return _percentile_interval(estimates, confidence)


def _ratio_of_sums(clusters: Sequence[tuple[float, float]]) -> float:
    denominator = math.fsum(d for _, d in clusters)
    if denominator == 0:
        return math.nan
    return math.fsum(n for n, _ in clusters) / denominator


def _check_clusters(clusters: Sequence[tuple[float, float]]) -> None:
    for i, (numerator, denominator) in enumerate(clusters):
        if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator < 0:
            raise ValueError(
                f"clusters[{i}]: expected finite (numerator, denominator >= 0), "
                f"got {(numerator, denominator)!r}"
            )


def cluster_bootstrap(
    clusters: Sequence[tuple[float, float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """A percentile bootstrap interval of a ratio-of-sums rate, resampling whole clusters.

    Each cluster (one conversation) contributes ``(numerator, denominator)``, e.g.
    ``(successful attempts, attempts)``; the rate is ``sum(numerators) / sum(denominators)``.
    Attempts within a conversation are correlated, so the conversations are what is
    resampled (with replacement, from ``random.Random(seed)``). Resamples whose denominators
    sum to 0 (only empty conversations drawn) have no rate and are skipped.

    Args:
        clusters: one ``(numerator, denominator)`` pair per cluster; denominators ``>= 0``.
        resamples: how many bootstrap resamples to draw.
        seed: the seed of the resampling RNG.
        confidence: the coverage of the interval.

    Returns:
        ``(low, high)``. With no clusters or only zero denominators there is no rate and the
        result is ``(0.0, 1.0)``. A single cluster gives the point estimate twice: every
        resample is that cluster again, so one cluster shows no spread (it is not certainty).

    Raises:
        ValueError: if a cluster is not finite or has a negative denominator, if
            ``resamples < 1`` or ``confidence`` is not in (0, 1).

    Example:
        >>> cluster_bootstrap([(1, 4)])
        (0.25, 0.25)
        >>> low, high = cluster_bootstrap([(0, 3), (2, 2), (1, 4), (0, 1)], resamples=500)
        >>> 0.0 <= low < 0.3 < high <= 1.0
        True
    """
    _check_resamples(resamples)
    _check_confidence(confidence)
    _check_clusters(clusters)
    point = _ratio_of_sums(clusters)
    if math.isnan(point):
        return (0.0, 1.0)
    if len(clusters) == 1:
        return (point, point)
    if all(n >= 0 and float(n).is_integer() and float(d).is_integer() for n, d in clusters):
        interval = _counted_bootstrap(clusters, resamples, seed, confidence)
    else:
        interval = bootstrap_statistic(
            clusters, _ratio_of_sums, resamples=resamples, seed=seed, confidence=confidence
        )
    # Every resample skipped (vanishingly rare): as little information as no clusters.
    return (0.0, 1.0) if math.isnan(interval[0]) else interval


def cluster_bootstraps(
    many: Sequence[Sequence[tuple[float, float]]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> list[tuple[float, float]]:
    """:func:`cluster_bootstrap` of each cluster list in ``many``, equal to calling it on each
    in turn, in a fraction of the time when several lists have as many clusters.

    A resample draws cluster *positions* (``floor(random() * n)``) from ``random.Random(seed)``:
    the draws depend on ``n``, ``resamples`` and ``seed`` only, never on the values. So rates
    over the same number of clusters (a report's campaign-wide rates, all over one model's
    conversations) share one set of draws: their clusters are packed side by side into one
    integer per position and each resample is one sum, unpacked into every rate's.

    Example:
        >>> a = [(0, 3), (2, 2), (1, 4), (0, 1)]
        >>> b = [(1, 1), (0, 2), (3, 3), (1, 2)]
        >>> cluster_bootstraps([a, b, [(3, 4)]], resamples=300) == [
        ...     cluster_bootstrap(a, resamples=300),
        ...     cluster_bootstrap(b, resamples=300),
        ...     cluster_bootstrap([(3, 4)], resamples=300),
        ... ]
        True
    """
    _check_resamples(resamples)
    _check_confidence(confidence)
    out: list[tuple[float, float] | None] = [None] * len(many)
    groups: dict[int, list[int]] = {}
    for i, clusters in enumerate(many):
        _check_clusters(clusters)
        counted = all(
            n >= 0 and float(n).is_integer() and float(d).is_integer() for n, d in clusters
        )
        if len(clusters) > 1 and counted and not math.isnan(_ratio_of_sums(clusters)):
            groups.setdefault(len(clusters), []).append(i)
        else:  # the edge cases and real-valued clusters: one at a time
            out[i] = cluster_bootstrap(
                clusters, resamples=resamples, seed=seed, confidence=confidence
            )
    for size, members in groups.items():
        # Packed straight from the clusters: no copy of every rate's counts is made.
        largest = max(1, max(max(int(n), int(d)) for i in members for n, d in many[i]))
        width = (size * largest).bit_length() + 1
        mask = (1 << width) - 1
        packed = [0] * size
        for i in reversed(members):  # rate j's (numerator, denominator) in fields 2j+1, 2j
            packed = [
                (p << (2 * width)) | (int(n) << width) | int(d)
                for p, (n, d) in zip(packed, many[i], strict=True)
            ]
        rng = random.Random(seed)
        estimates: list[list[float]] = [[] for _ in members]
        for _ in range(resamples):
            total = sum(rng.choices(packed, k=size))
            for found in estimates:
                denominator = total & mask
                if denominator:
                    found.append(((total >> width) & mask) / denominator)
                total >>= 2 * width
        for i, found in zip(members, estimates, strict=True):
            interval = _percentile_interval(found, confidence)
            out[i] = (0.0, 1.0) if math.isnan(interval[0]) else interval
    return [interval for interval in out if interval is not None]


def _packed_rates(
    clusters: Sequence[tuple[float, float]], resamples: int, rng: random.Random
) -> list[float]:
    """``resamples`` ratio-of-sums rates of whole-cluster resamples of whole counts drawn from
    ``rng`` (nan where a resample has no unit). Each cluster is one integer (its numerator and
    denominator in two fields wide enough for any resample's sums), so a resample is one sum."""
    counts = [(int(n), int(d)) for n, d in clusters]
    width = (len(counts) * max(1, *(max(n, d) for n, d in counts))).bit_length() + 1
    mask = (1 << width) - 1
    packed = [(n << width) | d for n, d in counts]
    size = len(packed)
    out = []
    for _ in range(resamples):
        total = sum(rng.choices(packed, k=size))
        denominator = total & mask
        out.append((total >> width) / denominator if denominator else math.nan)
    return out


def _counted_bootstrap(
    clusters: Sequence[tuple[float, float]], resamples: int, seed: int, confidence: float
) -> tuple[float, float]:
    """:func:`bootstrap_statistic` of :func:`_ratio_of_sums` for clusters of whole counts,
    drawing exactly the same resamples, fast (:func:`_packed_rates`)."""
    rates = _packed_rates(clusters, resamples, random.Random(seed))
    return _percentile_interval([r for r in rates if r == r], confidence)


def _newcombe(a: tuple[int, int], b: tuple[int, int], confidence: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``b - a`` from each side's Wilson interval."""
    (sa, na), (sb, nb) = a, b
    pa, pb = sa / na, sb / nb
    la, ua = wilson_interval(sa, na, confidence)
    lb, ub = wilson_interval(sb, nb, confidence)
    d = pb - pa
    return (d - math.hypot(pb - lb, ua - pa), d + math.hypot(ub - pb, pa - la))


def difference_interval(
    a: Sequence[tuple[int, int]],
    b: Sequence[tuple[int, int]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """The ``confidence`` interval of ``rate(b) - rate(a)`` for two independent samples.

    Each side is a list of clusters (conversations), ``(successes, units)`` each, and its rate
    is the ratio of sums. Each side's clusters are resampled whole and independently, from one
    ``random.Random(seed)`` stream, ``a``'s resamples first (so they are exactly the ones behind
    ``a``'s own :func:`cluster_bootstrap` interval); the percentile interval of the
    differences is then widened to contain Newcombe's score interval, so that a few
    conversations never claim more certainty than their units as independent trials would.

    Raises:
        ValueError: a side has no unit, a cluster is not ``0 <= successes <= units``, or
            ``resamples < 1``.

    Example:
        >>> low, high = difference_interval([(1, 2)], [(1, 2)])  # one conversation a side
        >>> round(low, 3), round(high, 3)  # no bootstrap spread: Newcombe's interval
        (-0.573, 0.573)
    """
    _check_resamples(resamples)
    for name, side in (("a", a), ("b", b)):
        for i, (n, d) in enumerate(side):
            if not 0 <= n <= d:
                raise ValueError(f"{name}[{i}]: expected 0 <= successes <= units, got {(n, d)}")
        if not sum(d for _, d in side):
            raise ValueError(f"{name}: no judged unit, so no rate to compare")
    rng = random.Random(seed)
    from_a = _packed_rates(a, resamples, rng)
    from_b = _packed_rates(b, resamples, rng)
    diffs = [y - x for x, y in zip(from_a, from_b, strict=True) if x == x and y == y]
    totals = [(sum(n for n, _ in s), sum(d for _, d in s)) for s in (a, b)]
    n_low, n_high = _newcombe(totals[0], totals[1], confidence)
    if not diffs:
        return (n_low, n_high)
    low, high = _percentile_interval(diffs, confidence)
    return (min(low, n_low), max(high, n_high))


def rate_clustered(
    clusters: Sequence[tuple[float, float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Rate:
    """A :class:`Rate` of a ratio-of-sums with its :func:`cluster_bootstrap` interval.

    Args:
        clusters: one ``(numerator, denominator)`` pair per cluster (conversation).
        resamples: how many bootstrap resamples to draw.
        seed: the seed of the resampling RNG.
        confidence: the coverage of the interval.

    Returns:
        The rate (0.0 when the denominators sum to 0), its interval, and ``n`` the number of
        clusters.

    Example:
        >>> rate_clustered([(1, 4), (3, 4)], resamples=200).value
        0.5
    """
    low, high = cluster_bootstrap(clusters, resamples=resamples, seed=seed, confidence=confidence)
    point = _ratio_of_sums(clusters)
    return Rate(value=0.0 if math.isnan(point) else point, low=low, high=high, n=len(clusters))


# --- agreement -----------------------------------------------------------------------------


def _level_index(levels: Sequence[int]) -> dict[int, int]:
    if not levels:
        raise ValueError("levels: expected at least one level")
    index = {level: i for i, level in enumerate(levels)}
    if len(index) != len(levels):
        raise ValueError(f"levels: expected distinct levels, got {list(levels)!r}")
    return index


def _positions(name: str, values: Sequence[int], index: dict[int, int]) -> list[int]:
    out = []
    for i, value in enumerate(values):
        if value not in index:
            raise ValueError(f"{name}[{i}]: {value!r} is not one of the levels {list(index)!r}")
        out.append(index[value])
    return out


def _check_same_length(a: Sequence[object], b: Sequence[object], names: str = "a, b") -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{names}: expected sequences of the same length, got {len(a)} and {len(b)}"
        )


def _weight(weights: str, i: int, j: int) -> float:
    """The disagreement weight of level positions ``i`` and ``j`` (see weighted_kappa)."""
    if weights == "quadratic":
        return float((i - j) ** 2)
    if weights == "linear":
        return float(abs(i - j))
    return float(i != j)


def weighted_kappa(
    a: Sequence[int],
    b: Sequence[int],
    *,
    levels: Sequence[int] = LEVELS,
    weights: str = "quadratic",
) -> float:
    """Cohen's kappa between two raters, with quadratic, linear or no disagreement weights.

    ``kappa = 1 - observed / expected``, where *observed* is the mean weight of the pairs'
    disagreements and *expected* the mean weight if the two raters' marginal distributions
    were paired at random. Weights use positions in ``levels``: ``(i - j) ** 2`` for
    ``"quadratic"``, ``|i - j|`` for ``"linear"``, ``i != j`` for ``"none"`` (plain kappa).

    When expected disagreement is 0 (both raters used one and the same level throughout),
    kappa is 0/0; it is then 1.0 if observed disagreement is also 0 (it always is in that
    case: perfect agreement, nothing to correct for chance) and 0.0 otherwise.

    Args:
        a: the first rater's ratings.
        b: the second rater's ratings of the same items, in the same order.
        levels: the possible ratings, in order.
        weights: ``"quadratic"``, ``"linear"`` or ``"none"``.

    Returns:
        Kappa, at most 1.0; 0 is chance agreement.

    Raises:
        ValueError: for different lengths, no ratings, a rating outside ``levels``, or an
            unknown ``weights``.

    Example:
        >>> weighted_kappa([1, 2, 3, 3], [1, 3, 3, 2], levels=(1, 2, 3))
        0.6363636363636364
    """
    _check_same_length(a, b)
    if not a:
        raise ValueError("a: expected at least one rating")
    if weights not in ("quadratic", "linear", "none"):
        raise ValueError(f"weights: expected 'quadratic', 'linear' or 'none', got {weights!r}")
    # The kappa of the pairs' count table (the weights' normalising constant cancels).
    return kappa_from_table(pair_table(a, b, levels=levels), weights=weights)


def krippendorff_alpha(
    ratings: Sequence[Sequence[int | None]],
    *,
    level: str = "ordinal",
    levels: Sequence[int] = LEVELS,
) -> float:
    """Krippendorff's alpha of a units x coders matrix, with missing ratings allowed.

    Built from the coincidence matrix: within each unit holding ``m >= 2`` ratings, every
    ordered pair of ratings by two different coders adds ``1 / (m - 1)`` to the cell
    ``(c, k)`` of its two values, so each pairable rating carries weight 1 in total. Units
    with fewer than 2 ratings have no pairs and are dropped. With ``n_c`` the row sums and
    ``n`` the number of pairable ratings::

        alpha = 1 - (n - 1) * sum(o[c][k] * d(c, k)) / sum(n_c * n_k * d(c, k))

    where ``d`` is the squared difference of the measurement ``level``: ``"nominal"``
    (0 if equal, else 1), ``"interval"`` (``(c - k) ** 2``) or ``"ordinal"`` (the squared
    count of pairable ratings from ``c`` to ``k`` in the order of ``levels``, less half of
    those at ``c`` and at ``k``).

    When all pairable ratings are one value there is no disagreement to expect (0/0); as in
    :func:`weighted_kappa` this returns 1.0, perfect agreement (Krippendorff calls alpha
    undefined there).

    Args:
        ratings: one row per unit (item), one entry per coder; ``None`` where a coder did not
            rate the unit. Rows may differ in length.
        level: ``"nominal"``, ``"ordinal"`` or ``"interval"``.
        levels: the possible ratings, in order.

    Returns:
        Alpha, at most 1.0; 0 is chance agreement. nan when no unit has two ratings.

    Raises:
        ValueError: for an unknown ``level`` or a rating outside ``levels``.

    Example:
        >>> krippendorff_alpha([[1, 1], [2, 2], [3, None], [3, 3]])
        1.0
        >>> round(krippendorff_alpha([[1, 2], [2, 2], [3, 3]], level="nominal"), 4)
        0.5455
    """
    if level not in ("nominal", "ordinal", "interval"):
        raise ValueError(f"level: expected 'nominal', 'ordinal' or 'interval', got {level!r}")
    coders = max((len(row) for row in ratings), default=2)
    table = coincidence_table(ratings, coders=coders, levels=levels)
    return alpha_from_coincidences(table, coders=coders, level=level, levels=levels)


Table = list[list[int]]


def pair_table(a: Sequence[int], b: Sequence[int], *, levels: Sequence[int] = LEVELS) -> Table:
    """The counts of rating pairs: ``table[i][j]`` pairs rated ``levels[i]`` by the first
    rater and ``levels[j]`` by the second (what :func:`kappa_from_table` reads).

    Raises:
        ValueError: for different lengths or a rating outside ``levels``.
    """
    _check_same_length(a, b)
    index = _level_index(levels)
    table = [[0] * len(levels) for _ in levels]
    for i, j in zip(_positions("a", a, index), _positions("b", b, index), strict=True):
        table[i][j] += 1
    return table


def kappa_from_table(table: Sequence[Sequence[float]], *, weights: str = "quadratic") -> float:
    """:func:`weighted_kappa` computed from a :func:`pair_table` (the same value: a kappa
    depends on the ratings only through that table; nan for an empty table).

    Example:
        >>> t = pair_table([1, 2, 3, 3], [1, 3, 3, 2], levels=(1, 2, 3))
        >>> kappa_from_table(t) == weighted_kappa([1, 2, 3, 3], [1, 3, 3, 2], levels=(1, 2, 3))
        True
    """
    if weights not in ("quadratic", "linear", "none"):
        raise ValueError(f"weights: expected 'quadratic', 'linear' or 'none', got {weights!r}")

    def weight(i: int, j: int) -> float:
        return _weight(weights, i, j)

    k = len(table)
    n = math.fsum(math.fsum(row) for row in table)
    if n == 0:
        return math.nan
    observed = math.fsum(table[i][j] * weight(i, j) for i in range(k) for j in range(k)) / n
    rows = [math.fsum(table[i]) for i in range(k)]
    cols = [math.fsum(table[i][j] for i in range(k)) for j in range(k)]
    expected = math.fsum(
        rows[i] * cols[j] * weight(i, j) for i in range(k) for j in range(k) if rows[i] and cols[j]
    ) / (n * n)
    if expected == 0:
        return 1.0 if observed == 0 else 0.0
    return 1.0 - observed / expected


def coincidence_table(
    ratings: Sequence[Sequence[int | None]],
    *,
    coders: int,
    levels: Sequence[int] = LEVELS,
) -> Table:
    """Krippendorff's coincidence matrix of a units x coders matrix, in integers.

    Each ordered pair of ratings of one unit by two coders adds ``1 / (m - 1)`` (``m``: the
    unit's ratings); here it adds ``scale / (m - 1)`` with ``scale`` the least common multiple
    of 1 .. ``coders - 1``, so every entry is an exact integer and tables of disjoint units
    add up. :func:`alpha_from_coincidences` divides the scale out.
    """
    index = _level_index(levels)
    scale = _coincidence_scale(coders)
    table = [[0] * len(levels) for _ in levels]
    for u, row in enumerate(ratings):
        values = []
        for c, value in enumerate(row):
            if value is None:
                continue
            if value not in index:
                raise ValueError(
                    f"ratings[{u}][{c}]: {value!r} is not one of the levels {list(index)!r}"
                )
            values.append(index[value])
        m = len(values)
        if m < 2:
            continue
        if m > coders:
            raise ValueError(f"ratings[{u}]: {m} ratings, more than coders={coders}")
        for x, y in itertools.permutations(values, 2):
            table[x][y] += scale // (m - 1)
    return table


def _coincidence_scale(coders: int) -> int:
    return math.lcm(*range(1, max(coders, 2)))


def alpha_from_coincidences(
    table: Sequence[Sequence[float]],
    *,
    coders: int,
    level: str = "ordinal",
    levels: Sequence[int] = LEVELS,
) -> float:
    """:func:`krippendorff_alpha` from a :func:`coincidence_table` (sums of such tables
    included): the same value, since alpha depends on the ratings only through it.

    Example:
        >>> rows = [[1, 2, None], [2, 2, 3], [3, 3, 3], [1, None, None]]
        >>> t = coincidence_table(rows, coders=3)
        >>> round(alpha_from_coincidences(t, coders=3), 12) == round(krippendorff_alpha(rows), 12)
        True
    """
    if level not in ("nominal", "ordinal", "interval"):
        raise ValueError(f"level: expected 'nominal', 'ordinal' or 'interval', got {level!r}")
    inv = 1.0 / _coincidence_scale(coders)
    k = len(levels)
    marginals = [sum(table[i]) * inv for i in range(k)]
    n = sum(marginals)
    if n == 0:
        return math.nan
    cumulative = [0.0, *itertools.accumulate(marginals)]
    observed = expected = 0.0
    for i in range(k):  # d(i, i) is 0 and d is symmetric: the pairs i < j, twice
        mi = marginals[i]
        for j in range(i + 1, k):
            mj = marginals[j]
            pair = table[i][j] + table[j][i]
            if not (pair or (mi and mj)):
                continue
            if level == "nominal":
                d = 1.0
            elif level == "interval":
                d = float((levels[i] - levels[j]) ** 2)
            else:
                d = (cumulative[j + 1] - cumulative[i] - (mi + mj) / 2.0) ** 2
            observed += pair * inv * d
            expected += 2.0 * mi * mj * d
    if expected == 0:
        return 1.0
    return 1.0 - (n - 1.0) * observed / expected


def cluster_bootstrap_tables(
    tables: Sequence[Table],
    statistic: Callable[[Table], float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """A percentile bootstrap interval of a statistic of summed count tables, resampling
    whole clusters (conversations), each contributing its table of non-negative integers.

    The same resampling as :func:`bootstrap_statistic` over clusters, fast: each cluster's
    table is packed into one integer (fixed-width fields wide enough for any resample's sums),
    so a resample is a sum of integers, unpacked once. Resamples where ``statistic`` is nan
    are skipped.

    Returns:
        ``(low, high)``; ``(nan, nan)`` with no clusters or no defined resample.
    """
    _check_resamples(resamples)
    _check_confidence(confidence)
    if not tables:
        return (math.nan, math.nan)
    rows, cols = len(tables[0]), len(tables[0][0])
    largest = max(v for t in tables for row in t for v in row)
    width = (len(tables) * max(largest, 1)).bit_length() + 1
    fields = rows * cols
    packed = []
    for t in tables:
        value = 0
        for v in reversed([v for row in t for v in row]):
            if v < 0:
                raise ValueError("tables: counts must be >= 0")
            value = (value << width) | v
        packed.append(value)
    mask = (1 << width) - 1
    rng = random.Random(seed)
    n = len(packed)
    estimates = []
    for _ in range(resamples):
        total = sum(rng.choices(packed, k=n))
        flat = [(total >> (width * f)) & mask for f in range(fields)]
        estimate = statistic([flat[r * cols : (r + 1) * cols] for r in range(rows)])
        if not math.isnan(estimate):
            estimates.append(estimate)
    return _percentile_interval(estimates, confidence)


def _average_ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        # Ranks are 1-based; tied values share the mean of the ranks they span.
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks, ties averaged.

    Args:
        x: the first variable.
        y: the second, paired with ``x`` by position.

    Returns:
        Rho in [-1, 1]; nan when either variable is constant (including fewer than 2
        pairs), where a correlation is undefined.

    Raises:
        ValueError: if ``x`` and ``y`` differ in length.

    Example:
        >>> spearman_rho([1, 2, 3, 4], [10, 20, 30, 40])
        1.0
        >>> spearman_rho([1, 1, 1], [1, 2, 3])
        nan
    """
    _check_same_length(x, y, "x, y")
    rx, ry = _average_ranks(x), _average_ranks(y)
    n = len(rx)
    if n < 2:
        return math.nan
    mean = (n + 1) / 2.0  # average ranks always sum to n (n + 1) / 2
    sxy = math.fsum((a - mean) * (b - mean) for a, b in zip(rx, ry, strict=True))
    sxx = math.fsum((a - mean) ** 2 for a in rx)
    syy = math.fsum((b - mean) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


# --- a judge against a reference -----------------------------------------------------------


def confusion_matrix(
    true: Sequence[int], pred: Sequence[int], levels: Sequence[int] = LEVELS
) -> list[list[int]]:
    """Counts of ``(true, pred)`` pairs, rows for the true level and columns for the prediction.

    Args:
        true: the reference ratings (e.g. a clinician's severity).
        pred: the ratings under test (e.g. the judge's), in the same order.
        levels: the possible ratings, in the order of rows and columns.

    Returns:
        ``matrix[i][j]``: how many items have ``true == levels[i]`` and ``pred == levels[j]``.

    Raises:
        ValueError: for different lengths or a rating outside ``levels``.

    Example:
        >>> confusion_matrix([1, 1, 2, 3], [1, 2, 2, 2], levels=(1, 2, 3))
        [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
    """
    _check_same_length(true, pred, "true, pred")
    index = _level_index(levels)
    matrix = [[0] * len(levels) for _ in levels]
    for i, j in zip(_positions("true", true, index), _positions("pred", pred, index), strict=True):
        matrix[i][j] += 1
    return matrix


class ThresholdRates(TypedDict):
    """Error rates of a judge at a success threshold, as returned by :func:`threshold_rates`.

    A *positive* is an item whose true rating is ``>= threshold`` (an attack success).
    """

    false_positive_rate: float
    false_positive_rate_ci: tuple[float, float]
    false_positives: int
    negatives: int
    false_negative_rate: float
    false_negative_rate_ci: tuple[float, float]
    false_negatives: int
    positives: int


def threshold_rates(
    true: Sequence[int], pred: Sequence[int], threshold: int, confidence: float = CONFIDENCE
) -> ThresholdRates:
    """False positive and false negative rates at ``threshold``, with Wilson intervals.

    The false positive rate is the share of true negatives (``true < threshold``) that were
    predicted positive (``pred >= threshold``); the false negative rate the share of true
    positives predicted negative. A rate with no items to count is 0.0 with the interval
    ``(0.0, 1.0)``, and its count (``negatives`` or ``positives``) is 0.

    Args:
        true: the reference ratings.
        pred: the ratings under test, in the same order.
        threshold: the smallest rating that counts as positive (2 for an attack success).
        confidence: the coverage of the intervals.

    Returns:
        The rates, their intervals and the counts behind them.

    Raises:
        ValueError: if ``true`` and ``pred`` differ in length.

    Example:
        >>> r = threshold_rates([1, 1, 1, 3, 4], [1, 2, 1, 1, 4], threshold=2)
        >>> (r["false_positives"], r["negatives"], r["false_negatives"], r["positives"])
        (1, 3, 1, 2)
    """
    _check_same_length(true, pred, "true, pred")
    pairs = list(zip(true, pred, strict=True))
    negatives = sum(t < threshold for t, _ in pairs)
    positives = len(pairs) - negatives
    false_positives = sum(t < threshold <= p for t, p in pairs)
    false_negatives = sum(p < threshold <= t for t, p in pairs)
    fpr = rate_wilson(false_positives, negatives, confidence)
    fnr = rate_wilson(false_negatives, positives, confidence)
    return ThresholdRates(
        false_positive_rate=fpr.value,
        false_positive_rate_ci=fpr.ci,
        false_positives=false_positives,
        negatives=negatives,
        false_negative_rate=fnr.value,
        false_negative_rate_ci=fnr.ci,
        false_negatives=false_negatives,
        positives=positives,
    )


# --- comparing two models ------------------------------------------------------------------


def permutation_test_paired(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10000, seed: int = SEED
) -> float:
    """Two-sided p-value for a mean paired difference, by random sign flips.

    Under the null hypothesis that the two conditions are exchangeable within a pair (the
    same profile run against two counselor models), each difference ``a[i] - b[i]`` is as
    likely to have the opposite sign. The p-value is the share of sign patterns whose
    ``|sum of differences|`` is at least the observed one. Up to 12 pairs every one of the
    ``2 ** n`` patterns is enumerated (an exact p-value); beyond that ``resamples`` patterns
    are drawn from ``random.Random(seed)`` and the p-value is ``(hits + 1) / (resamples + 1)``,
    which counts the observed pattern and is never 0.

    Args:
        a: one score per pair under the first condition.
        b: the scores of the same pairs under the second condition.
        resamples: how many random sign patterns to draw when there are more than 12 pairs.
        seed: the seed of the sign-flip RNG.

    Returns:
        The p-value in (0, 1]; 1.0 when every difference is 0.

    Raises:
        ValueError: for different lengths, no pairs, or ``resamples < 1``.

    Example:
        >>> permutation_test_paired([3, 4, 5], [2, 2, 2])
        0.25
    """
    _check_same_length(a, b)
    if not a:
        raise ValueError("a: expected at least one pair")
    _check_resamples(resamples)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    observed = abs(math.fsum(diffs))
    # Sums over different sign patterns round differently; equal magnitudes must tie.
    cutoff = observed - 1e-9 * max(1.0, observed)

    def extreme(signs: Sequence[int]) -> bool:
        return abs(math.fsum(s * d for s, d in zip(signs, diffs, strict=True))) >= cutoff

    if len(diffs) <= _EXACT_MAX_N:
        patterns = list(itertools.product((1, -1), repeat=len(diffs)))
        return sum(map(extreme, patterns)) / len(patterns)
    rng = random.Random(seed)
    hits = sum(extreme(rng.choices((1, -1), k=len(diffs))) for _ in range(resamples))
    return (hits + 1) / (resamples + 1)
