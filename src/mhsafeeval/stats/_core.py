"""Constants, the :class:`Rate`, the normal and Student t quantiles and Wilson's interval."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

RESAMPLES: Final = 2000
"""Bootstrap resamples behind an interval, unless a caller asks for more or fewer."""
SEED: Final = 0
"""The resampling RNG's seed: the same data give the same intervals."""
CONFIDENCE: Final = 0.95
"""The coverage of every interval, unless a caller asks for another."""
FEW_CONVERSATIONS: Final = 5
"""Below this many conversations no interval can be trusted, and the reports say so; a rate
whose successes (or failures) come from fewer conversations than this treats each conversation
as one trial on that side (see :func:`~mhsafeeval.stats.clustered_interval`)."""

LEVELS: Final[tuple[int, ...]] = (1, 2, 3, 4, 5)
"""The severity levels, 1 (safe) to 5 (severe): what the agreement statistics count over."""


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate with its interval, so that a report carries ``x`` and ``x_ci`` the same way.

    Attributes:
        value: the point estimate (0.0 when there is no data; ``n`` then says so).
        low: lower end of the interval.
        high: upper end of the interval.
        n: the number of independent units behind it: trials for :func:`rate_wilson`,
            clusters (conversations) with at least one unit for
            :func:`~mhsafeeval.stats.rate_clustered`.

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


# --- the normal quantile -------------------------------------------------------------------

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


# --- Student's t ---------------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``, given ``x`` and ``y = 1 - x``
    (each computed without cancellation by the caller)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log(y) + _log_beta_inverse(a, b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def _log_beta_inverse(a: float, b: float) -> float:
    return math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)


def t_tail(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom (``df > 0``, not
    necessarily whole), through the regularized incomplete beta function.

    Example:
        >>> t_tail(0.0, 3)
        0.5
        >>> round(t_tail(12.706204736174698, 1), 9)
        0.025
    """
    if not df > 0:
        raise ValueError(f"df: expected degrees of freedom > 0, got {df!r}")
    if t < 0:
        return 1.0 - t_tail(-t, df)
    t2 = t * t
    return 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The quantile of Student's t with ``df`` degrees of freedom (``df > 0``, not necessarily
    whole): exact forms for 1 and 2 degrees of freedom, otherwise Newton's method on
    :func:`t_tail` from the Cornish-Fisher expansion (absolute error below 1e-9).

    Raises:
        ValueError: if ``p`` is not strictly between 0 and 1 or ``df <= 0``.

    Example:
        >>> round(t_quantile(0.975, 3), 9)
        3.182446305
        >>> round(t_quantile(0.975, 1e9), 6) == round(normal_quantile(0.975), 6)
        True
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p: expected a probability strictly between 0 and 1, got {p!r}")
    if not df > 0:
        raise ValueError(f"df: expected degrees of freedom > 0, got {df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    q = 1.0 - p  # the upper tail, solved for directly: no cancellation
    if q == 0.5:
        return 0.0
    if df == 1:
        return 1.0 / math.tan(math.pi * q)
    if df == 2:
        return (1.0 - 2.0 * q) / math.sqrt(2.0 * q * (1.0 - q))
    z = normal_quantile(p)
    if df > 1e7:
        return z
    z2 = z * z
    t = z + z * (z2 + 1.0) / (4.0 * df) + z * ((5.0 * z2 + 16.0) * z2 + 3.0) / (96.0 * df * df)
    log_density = _log_beta_inverse(df / 2.0, 0.5) - 0.5 * math.log(df)
    for _ in range(100):
        # The tail is convex and decreasing past 0: Newton's steps land left of the root,
        # then climb to it; a step below 0 is clamped to 0, where the tail is 0.5 > q.
        density = math.exp(log_density - (df + 1.0) / 2.0 * math.log1p(t * t / df))
        step = (t_tail(t, df) - q) / density
        t = max(0.0, t + step)
        if abs(step) <= 1e-12 * max(1.0, t):
            break
    return t


# --- Wilson --------------------------------------------------------------------------------


def check_confidence(confidence: float) -> float:
    """The normal quantile of a two-sided ``confidence`` interval (checked).

    Raises:
        ValueError: if ``confidence`` is not strictly between 0 and 1.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"confidence: expected a value strictly between 0 and 1, got {confidence!r}"
        )
    return normal_quantile(1.0 - (1.0 - confidence) / 2.0)


def wilson_bounds(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``p`` over ``n > 0`` trials (``n`` need not be
    whole: an effective sample size) at the quantile ``z``, clipped to [0, 1]."""
    z2 = z * z
    denominator = 1.0 + z2 / n
    center = (p + z2 / (2.0 * n)) / denominator
    half = z / denominator * math.sqrt(max(0.0, p * (1.0 - p)) / n + z2 / (4.0 * n * n))
    return (max(0.0, center - half), min(1.0, center + half))


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
    z = check_confidence(confidence)
    if trials == 0:
        return (0.0, 1.0)
    low, high = wilson_bounds(successes / trials, trials, z)
    # At the boundaries the exact ends are 0 and 1; rounding would leave 1e-17 of noise.
    return (0.0 if successes == 0 else low, 1.0 if successes == trials else high)


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
