"""Rates whose units come in clusters (conversations), their differences, and a family of them.

The interval of a clustered rate is analytic (no resampling): Wilson's score interval over
the *effective* number of units (the units divided by the design effect that the spread
between conversations shows) at Student's t quantile with one degree of freedom fewer than
the conversations; a side of the rate resting on fewer than :data:`FEW_CONVERSATIONS`
conversations falls back to treating each conversation as one trial. Its coverage was
measured, not assumed: ``benchmarks/coverage.py`` prints the table (docs/statistics.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._core import (
    CONFIDENCE,
    FEW_CONVERSATIONS,
    Rate,
    check_confidence,
    t_quantile,
    wilson_bounds,
)

Floats = npt.NDArray[np.float64]


class _Side:
    """What a clustered rate's interval needs at any confidence, computed once."""

    __slots__ = ("conversations", "deff", "failing", "p", "succeeding", "total", "units")

    def __init__(self, successes: Floats, units: Floats) -> None:
        keep = units > 0
        y, n = successes[keep], units[keep]
        self.conversations = len(n)
        self.units = float(n.sum())
        self.total = float(y.sum())
        self.p = self.total / self.units if self.units else math.nan
        self.succeeding = int(np.count_nonzero(y > 0))
        self.failing = int(np.count_nonzero(y < n))
        self.deff = 1.0
        if self.conversations > 1 and 0.0 < self.p < 1.0:
            residuals = y - self.p * n
            g = self.conversations
            # fsum: correctly rounded, so the same clusters in any order give the same bits.
            squares = math.fsum((residuals * residuals).tolist())
            between = g / (g - 1) * squares / (self.units * self.units)
            binomial = self.p * (1.0 - self.p) / self.units
            self.deff = max(1.0, between / binomial)

    def interval(self, confidence: float) -> tuple[float, float]:
        z = check_confidence(confidence)
        if not self.units:
            return (0.0, 1.0)
        # Each conversation as one trial: what a rate can claim whatever the spread between
        # conversations (all-or-nothing ones are the widest case), so no variance is estimated.
        trials = wilson_bounds(self.p, self.conversations, z)
        if self.conversations == 1:
            low, high = trials
        else:
            q = t_quantile(1.0 - (1.0 - confidence) / 2.0, self.conversations - 1)
            low, high = wilson_bounds(self.p, self.units / self.deff, q)
            if self.succeeding < FEW_CONVERSATIONS:
                high = max(high, trials[1])
            if self.failing < FEW_CONVERSATIONS:
                low = min(low, trials[0])
        return (0.0 if self.total == 0 else low, 1.0 if self.total == self.units else high)


def _arrays(successes: object, units: object) -> tuple[Floats, Floats]:
    y = np.asarray(successes, dtype=np.float64)
    n = np.asarray(units, dtype=np.float64)
    if y.ndim != 1 or y.shape != n.shape:
        raise ValueError(
            f"successes, units: expected two sequences of the same length, got {y.shape} and "
            f"{n.shape}"
        )
    bad = ~(np.isfinite(y) & np.isfinite(n) & (y >= 0) & (y <= n))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"clusters[{i}]: expected finite 0 <= successes <= units, got {(y[i], n[i])!r}"
        )
    return y, n


def clustered_interval(
    successes: Sequence[float] | npt.ArrayLike,
    units: Sequence[float] | npt.ArrayLike,
    *,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """The ``confidence`` interval of a rate ``sum(successes) / sum(units)`` whose units come
    in clusters (conversations: ``successes[i]`` of ``units[i]`` in the ``i``-th).

    Units of one conversation share its profile and history, so they are not independent
    trials. With ``G`` conversations holding units, ``N`` units and ``p`` the pooled rate:

    1. the design effect ``deff = max(1, V_c / V_b)``: ``V_c = G / (G - 1) * sum((s_i - p
       u_i) ** 2) / N ** 2`` the cluster-robust variance of the rate, ``V_b = p (1 - p) / N``
       that of ``N`` independent trials;
    2. Wilson's score interval of ``p`` over ``N / deff`` effective trials, at the quantile of
       Student's t with ``G - 1`` degrees of freedom (the variance is estimated from ``G``
       conversations: with few of them the quantile is far above the normal's);
    3. where the successes come from fewer than :data:`FEW_CONVERSATIONS` conversations the
       upper end is at least that of Wilson's interval over ``G`` trials (each conversation one
       trial: what a rate can claim whatever the spread between conversations), and likewise
       the lower end where the failures do. A spread the conversations at hand cannot show
       (one vulnerable conversation in twenty) is what makes the plain interval undercover.

    Being a Wilson interval over at most ``N`` trials at a quantile at least the normal's, it
    always contains the Wilson interval of the pooled counts. Conversations with no unit are
    left out; 1 conversation gives Wilson's interval of one trial (no spread can be seen:
    the reports warn below :data:`FEW_CONVERSATIONS` conversations).

    Args:
        successes: per conversation, its successful units.
        units: per conversation, its units (``0 <= successes[i] <= units[i]``).
        confidence: the coverage, strictly between 0 and 1.

    Returns:
        ``(low, high)``; ``(0.0, 1.0)`` when there is no unit.

    Raises:
        ValueError: for sequences of different lengths, a cluster that is not finite with
            ``0 <= successes <= units``, or a confidence outside (0, 1).

    Example:
        >>> low, high = clustered_interval([5, 0, 0, 0, 0, 0], [5, 5, 5, 5, 5, 5])
        >>> round(low, 3), round(high, 3)
        (0.017, 0.696)
        >>> clustered_interval([], [])
        (0.0, 1.0)
    """
    check_confidence(confidence)
    return _Side(*_arrays(successes, units)).interval(confidence)


def rate_clustered(
    clusters: Sequence[tuple[float, float]], *, confidence: float = CONFIDENCE
) -> Rate:
    """A :class:`Rate` of ``(successes, units)`` clusters with its :func:`clustered_interval`.

    Returns:
        The rate (0.0 when there is no unit), its interval, and ``n`` the number of clusters
        holding at least one unit.

    Example:
        >>> r = rate_clustered([(1, 4), (3, 4)])
        >>> r.value, r.n
        (0.5, 2)
    """
    y, n = _arrays([s for s, _ in clusters], [u for _, u in clusters])
    side = _Side(y, n)
    low, high = side.interval(confidence)
    value = 0.0 if math.isnan(side.p) else side.p
    return Rate(value=value, low=low, high=high, n=side.conversations)


# --- two independent rates ------------------------------------------------------------------


def _sides(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> tuple[_Side, _Side]:
    out = []
    for name, clusters in (("a", a), ("b", b)):
        for i, (s, u) in enumerate(clusters):
            if not 0 <= s <= u:
                raise ValueError(f"{name}[{i}]: expected 0 <= successes <= units, got {(s, u)}")
        side = _Side(*_arrays([s for s, _ in clusters], [u for _, u in clusters]))
        if not side.units:
            raise ValueError(f"{name}: no judged unit, so no rate to compare")
        out.append(side)
    return out[0], out[1]


def _mover(a: _Side, b: _Side, confidence: float) -> tuple[float, float]:
    """Newcombe's combination (MOVER) of two sides' intervals into one of ``b - a``."""
    la, ua = a.interval(confidence)
    lb, ub = b.interval(confidence)
    d = b.p - a.p
    return (d - math.hypot(b.p - lb, ua - a.p), d + math.hypot(ub - b.p, a.p - la))


def difference_interval(
    a: Sequence[tuple[float, float]],
    b: Sequence[tuple[float, float]],
    *,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """The ``confidence`` interval of ``rate(b) - rate(a)`` for two independent samples.

    Each side is a list of clusters (conversations), ``(successes, units)`` each, and its rate
    the ratio of sums. Each side's :func:`clustered_interval` is combined by Newcombe's method
    (the MOVER of Zou and Donner: ``d - sqrt((p_b - l_b)^2 + (u_a - p_a)^2)`` to ``d +
    sqrt((u_b - p_b)^2 + (p_a - l_a)^2)``); with one unit per conversation and many
    conversations it is Newcombe's hybrid score interval.

    Raises:
        ValueError: a side has no unit, a cluster is not ``0 <= successes <= units``, or the
            confidence is outside (0, 1).

    Example:
        >>> low, high = difference_interval([(1, 2)], [(1, 2)])  # one conversation a side
        >>> round(low, 3), round(high, 3)
        (-0.63, 0.63)
    """
    check_confidence(confidence)
    return _mover(*_sides(a, b), confidence)


def difference_p_value(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """The two-sided p-value of "the two rates are equal" that :func:`difference_interval`
    implies: the largest ``alpha`` whose ``1 - alpha`` interval still contains 0, so that
    ``p < 1 - confidence`` exactly when that interval excludes 0 (to 1e-9).

    Returns:
        The p-value in [1e-12, 1]; 1.0 when the rates are equal.

    Example:
        >>> p = difference_p_value([(0, 4)] * 8, [(4, 4)] * 8)
        >>> p < 0.001
        True
        >>> difference_p_value([(1, 2)], [(1, 2)])
        1.0
    """
    sa, sb = _sides(a, b)
    d = sb.p - sa.p
    if d == 0:
        return 1.0

    def gap(log_alpha: float) -> float:  # > 0: the 1 - alpha interval excludes 0
        low, high = _mover(sa, sb, 1.0 - math.exp(log_alpha))
        return low if d > 0 else -high

    lo, hi = math.log(1e-12), math.log(1.0 - 1e-12)
    if gap(lo) > 0:
        return 1e-12
    if gap(hi) <= 0:
        return 1.0
    for _ in range(200):  # bisection on log alpha: the ends move monotonically with alpha
        mid = (lo + hi) / 2.0
        if gap(mid) > 0:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-10:
            break
    return math.exp(hi)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values, in the order given.

    The ``i``-th smallest of ``m`` p-values is multiplied by ``m - i + 1`` and made no smaller
    than the adjusted ones before it (capped at 1). Rejecting where the adjusted p-value is
    below ``alpha`` keeps the chance of *any* false rejection in the family at most
    ``alpha``, whatever the dependence between the tests.

    Example:
        >>> holm([0.01, 0.04, 0.03, 0.5])
        [0.04, 0.09, 0.09, 0.5]
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out
