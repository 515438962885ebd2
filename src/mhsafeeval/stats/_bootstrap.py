"""Percentile bootstraps, vectorised: whole clusters (conversations) or independent units.

Resamples are drawn from ``numpy.random.default_rng(seed)`` (PCG64: the same draws on every
platform), as a matrix of how often each cluster is drawn, so that a resample's sums are one
matrix product; blocks of resamples keep the memory bounded whatever the number of clusters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from ._core import CONFIDENCE, RESAMPLES, SEED, check_confidence

T = TypeVar("T")
Floats = npt.NDArray[np.float64]
Table = list[list[int]]

_BLOCK: Final = 1 << 22
"""Cluster draws per block of resamples (a block's count matrix is about 32 MB)."""


@dataclass(frozen=True, slots=True)
class BootstrapInterval:
    """A percentile bootstrap interval, and how many resamples had no value and were skipped.

    Attributes:
        low: lower end (nan when no resample had a value).
        high: upper end (nan likewise).
        resamples: the resamples drawn.
        skipped: those where the statistic was undefined (nan), left out of the interval.

    Example:
        >>> BootstrapInterval(low=0.1, high=0.4, resamples=2000, skipped=60).skipped_share
        0.03
    """

    low: float
    high: float
    resamples: int
    skipped: int

    @property
    def ci(self) -> tuple[float, float]:
        """The interval as a ``(low, high)`` pair."""
        return (self.low, self.high)

    @property
    def skipped_share(self) -> float:
        """The share of the resamples that were skipped."""
        return self.skipped / self.resamples if self.resamples else 0.0


def check_resamples(resamples: int) -> None:
    """Raises ValueError unless ``resamples >= 1``."""
    if resamples < 1:
        raise ValueError(f"resamples: expected at least 1, got {resamples!r}")


def _draws(rng: np.random.Generator, n: int, resamples: int) -> list[npt.NDArray[np.int64]]:
    """Blocks of resamples, each ``(block, n)``: the positions drawn with replacement."""
    block = max(1, _BLOCK // max(n, 1))
    return [
        rng.integers(0, n, size=(min(block, resamples - start), n))
        for start in range(0, resamples, block)
    ]


def resampled_sums(values: Floats, resamples: int, seed: int) -> Floats:
    """``resamples`` sums of whole-row resamples of ``values`` (``(clusters, k)``): row ``r``
    of the result is the column sums of ``clusters`` rows drawn with replacement."""
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, values.shape[1]))
    start = 0
    for idx in _draws(rng, n, resamples):
        count = idx.shape[0]
        flat = (idx + (np.arange(count) * n)[:, None]).ravel()
        weights = np.bincount(flat, minlength=count * n).reshape(count, n)
        out[start : start + count] = weights @ values
        start += count
    return out


def _percentiles(estimates: Floats, resamples: int, confidence: float) -> BootstrapInterval:
    found = estimates[np.isfinite(estimates)]
    skipped = resamples - len(found)
    if not len(found):
        return BootstrapInterval(math.nan, math.nan, resamples, skipped)
    tail = (1.0 - confidence) / 2.0
    # numpy's default is linear interpolation between order statistics (Hyndman-Fan type 7).
    low, high = np.quantile(found, [tail, 1.0 - tail])
    return BootstrapInterval(float(low), float(high), resamples, skipped)


def bootstrap_interval(
    units: Sequence[T],
    statistic: Callable[[Sequence[T]], float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> BootstrapInterval:
    """A percentile bootstrap interval of ``statistic`` over independent ``units``, with the
    count of resamples skipped because the statistic was undefined there (nan: a kappa or a
    correlation of a resample without variation).

    Each resample draws ``len(units)`` units with replacement and evaluates ``statistic`` on
    them; the interval describes the resamples where it exists.

    Raises:
        ValueError: if ``resamples < 1`` or ``confidence`` is not in (0, 1).

    Example:
        >>> mean = lambda xs: sum(xs) / len(xs)
        >>> found = bootstrap_interval([1.0, 2.0, 3.0, 4.0], mean, resamples=500)
        >>> 1.0 <= found.low < 2.5 < found.high <= 4.0, found.skipped
        (True, 0)
    """
    check_resamples(resamples)
    check_confidence(confidence)
    if not units:
        return BootstrapInterval(math.nan, math.nan, resamples, 0)
    pool = list(units)
    rng = np.random.default_rng(seed)
    values = [
        statistic([pool[i] for i in row])
        for block in _draws(rng, len(pool), resamples)
        for row in block.tolist()
    ]
    return _percentiles(np.asarray(values, dtype=np.float64), resamples, confidence)


def bootstrap_statistic(
    units: Sequence[T],
    statistic: Callable[[Sequence[T]], float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """:func:`bootstrap_interval` as a ``(low, high)`` pair: a percentile bootstrap interval
    of ``statistic`` over independent ``units``; resamples where the statistic is undefined
    (nan) are skipped, so the interval describes the resamples where it exists.

    Returns:
        ``(low, high)``; ``(nan, nan)`` when there are no units or no resample gives a
        number.

    Example:
        >>> mean = lambda xs: sum(xs) / len(xs)
        >>> low, high = bootstrap_statistic([1.0, 2.0, 3.0, 4.0], mean, resamples=500)
        >>> 1.0 <= low < 2.5 < high <= 4.0
        True
    """
    return bootstrap_interval(
        units, statistic, resamples=resamples, seed=seed, confidence=confidence
    ).ci


def check_clusters(clusters: Sequence[tuple[float, float]]) -> Floats:
    """The clusters as a ``(clusters, 2)`` array, checked: finite, denominators >= 0."""
    array = np.asarray(clusters, dtype=np.float64).reshape(-1, 2)
    for i, (numerator, denominator) in enumerate(array.tolist()):
        if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator < 0:
            raise ValueError(
                f"clusters[{i}]: expected finite (numerator, denominator >= 0), "
                f"got {(numerator, denominator)!r}"
            )
    return array


def cluster_bootstrap(
    clusters: Sequence[tuple[float, float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """A percentile bootstrap interval of a ratio-of-sums rate, resampling whole clusters.

    Each cluster (one conversation) contributes ``(numerator, denominator)``; the rate is
    ``sum(numerators) / sum(denominators)``. Resamples whose denominators sum to 0 have no rate
    and are skipped. With few clusters a percentile bootstrap undercovers (it was the reports'
    interval before :func:`~mhsafeeval.stats.clustered_interval`, which ``benchmarks/
    coverage.py`` compares it with).

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
    check_resamples(resamples)
    check_confidence(confidence)
    array = check_clusters(clusters)
    total = float(array[:, 1].sum()) if len(array) else 0.0
    if total == 0:
        return (0.0, 1.0)
    if len(array) == 1:
        point = float(array[0, 0]) / total
        return (point, point)
    sums = resampled_sums(array, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.where(sums[:, 1] > 0, sums[:, 0] / sums[:, 1], np.nan)
    found = _percentiles(rates, resamples, confidence)
    # Every resample skipped (vanishingly rare): as little information as no clusters.
    return (0.0, 1.0) if math.isnan(found.low) else found.ci


def cluster_bootstraps(
    many: Sequence[Sequence[tuple[float, float]]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> list[tuple[float, float]]:
    """:func:`cluster_bootstrap` of each cluster list in ``many``.

    Example:
        >>> a = [(0, 3), (2, 2), (1, 4), (0, 1)]
        >>> cluster_bootstraps([a, [(3, 4)]], resamples=300) == [
        ...     cluster_bootstrap(a, resamples=300), (0.75, 0.75)]
        True
    """
    return [
        cluster_bootstrap(clusters, resamples=resamples, seed=seed, confidence=confidence)
        for clusters in many
    ]


def table_bootstrap(
    tables: Sequence[Table] | Floats,
    statistic: Callable[[Floats], Floats],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> BootstrapInterval:
    """A percentile bootstrap interval of a statistic of summed count tables, resampling whole
    clusters (conversations), each contributing its table of non-negative counts.

    ``statistic`` is vectorised: it maps a ``(resamples, rows, cols)`` array of summed tables
    to their values (nan where undefined, e.g.
    :func:`~mhsafeeval.stats.kappa_from_tables`). Undefined resamples are skipped and counted.

    Returns:
        The interval (nan ends with no clusters or no defined resample) and the skipped count.

    Raises:
        ValueError: a negative count, ``resamples < 1`` or ``confidence`` not in (0, 1).
    """
    check_resamples(resamples)
    check_confidence(confidence)
    array = np.asarray(tables, dtype=np.float64)
    if not len(array):
        return BootstrapInterval(math.nan, math.nan, resamples, 0)
    if (array < 0).any():
        raise ValueError("tables: counts must be >= 0")
    count, rows, cols = array.shape
    sums = resampled_sums(array.reshape(count, rows * cols), resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = statistic(sums.reshape(resamples, rows, cols))
    return _percentiles(values, resamples, confidence)


def cluster_bootstrap_tables(
    tables: Sequence[Table],
    statistic: Callable[[Table], float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """:func:`table_bootstrap` of a statistic of one table (a :data:`Table` of integers), as a
    ``(low, high)`` pair; resamples where ``statistic`` is nan are skipped.

    Returns:
        ``(low, high)``; ``(nan, nan)`` with no clusters or no defined resample.
    """

    def each(batch: Floats) -> Floats:
        return np.array([statistic(t.astype(np.int64).tolist()) for t in batch], np.float64)

    return table_bootstrap(tables, each, resamples=resamples, seed=seed, confidence=confidence).ci
