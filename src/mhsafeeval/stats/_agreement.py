"""Agreement between raters: weighted kappa, Krippendorff's alpha and Spearman's rho.

Kappa and alpha depend on the ratings only through a count table (:func:`pair_table`,
:func:`coincidence_table`), so tables of disjoint units add up and a bootstrap over
conversations resamples tables; :func:`kappa_from_tables` and
:func:`alpha_from_coincidence_tables` evaluate a whole stack of tables at once. Where a figure
is undefined (a table without variation: no agreement by chance to correct for) it is nan, as
in the reference implementations (scikit-learn, krippendorff), never 1.0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from ._core import LEVELS

Table = list[list[int]]
"""A count table: ``table[i][j]`` for level positions ``i`` and ``j``."""
Floats = npt.NDArray[np.float64]

NO_VARIATION: Final = "no variation"
"""Why a kappa or an alpha is undefined (nan): every rating in its table is one and the same
level, so there is no chance agreement (kappa) or expected disagreement (alpha) to correct for."""


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
    kappa is 0/0: undefined, nan (as scikit-learn's ``cohen_kappa_score``), not perfect
    agreement: there is no chance agreement to correct for.

    Args:
        a: the first rater's ratings.
        b: the second rater's ratings of the same items, in the same order.
        levels: the possible ratings, in order.
        weights: ``"quadratic"``, ``"linear"`` or ``"none"``.

    Returns:
        Kappa, at most 1.0; 0 is chance agreement; nan where undefined (see above).

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

    When all pairable ratings are one value there is no disagreement to expect (0/0): alpha
    is undefined there (Krippendorff), nan, as in the ``krippendorff`` package.

    Args:
        ratings: one row per unit (item), one entry per coder; ``None`` where a coder did not
            rate the unit. Rows may differ in length.
        level: ``"nominal"``, ``"ordinal"`` or ``"interval"``.
        levels: the possible ratings, in order.

    Returns:
        Alpha, at most 1.0; 0 is chance agreement. nan when no unit has two ratings or all
        pairable ratings are one value.

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
    depends on the ratings only through that table; nan for an empty table or one without
    variation).

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
        return math.nan  # one level throughout: 0/0, no chance agreement to correct for
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
        return math.nan  # one value throughout: no disagreement to expect
    return 1.0 - (n - 1.0) * observed / expected


def _weights(weights: str, k: int) -> Floats:
    """The matrix of :func:`_weight` over ``k`` level positions."""
    out = np.array([[_weight(weights, i, j) for j in range(k)] for i in range(k)], np.float64)
    return out


def kappa_from_tables(tables: npt.ArrayLike, *, weights: str = "quadratic") -> Floats:
    """:func:`kappa_from_table` of each table of a ``(count, k, k)`` stack at once (nan where
    undefined): what a bootstrap evaluates on its resamples.

    Example:
        >>> t = pair_table([1, 2, 3, 3], [1, 3, 3, 2], levels=(1, 2, 3))
        >>> float(kappa_from_tables([t, t])[1]) == kappa_from_table(t)
        True
    """
    if weights not in ("quadratic", "linear", "none"):
        raise ValueError(f"weights: expected 'quadratic', 'linear' or 'none', got {weights!r}")
    t = np.asarray(tables, dtype=np.float64)
    w = _weights(weights, t.shape[-1])
    n = t.sum(axis=(1, 2))
    rows, cols = t.sum(axis=2), t.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        observed = (t * w).sum(axis=(1, 2)) / n
        expected = np.einsum("bi,ij,bj->b", rows, w, cols) / (n * n)
        out = 1.0 - observed / expected
    return np.where((n > 0) & (expected > 0), out, np.nan)


def alpha_from_coincidence_tables(
    tables: npt.ArrayLike,
    *,
    coders: int,
    level: str = "ordinal",
    levels: Sequence[int] = LEVELS,
) -> Floats:
    """:func:`alpha_from_coincidences` of each table of a ``(count, k, k)`` stack at once (nan
    where undefined): what a bootstrap evaluates on its resamples.

    Example:
        >>> t = coincidence_table([[1, 2, None], [2, 2, 3], [3, 3, 3]], coders=3)
        >>> a = float(alpha_from_coincidence_tables([t], coders=3)[0])
        >>> round(a, 12) == round(alpha_from_coincidences(t, coders=3), 12)
        True
    """
    if level not in ("nominal", "ordinal", "interval"):
        raise ValueError(f"level: expected 'nominal', 'ordinal' or 'interval', got {level!r}")
    t = np.asarray(tables, dtype=np.float64) / _coincidence_scale(coders)
    k = len(levels)
    marginals = t.sum(axis=2)
    n = marginals.sum(axis=1)
    if level == "nominal":
        d = np.broadcast_to(1.0 - np.eye(k), t.shape)
    elif level == "interval":
        values = np.asarray(levels, dtype=np.float64)
        d = np.broadcast_to((values[:, None] - values[None, :]) ** 2, t.shape)
    else:  # from c to k in the order of levels, less half of those at c and at k, squared
        cumulative = np.concatenate([np.zeros((len(t), 1)), np.cumsum(marginals, axis=1)], 1)
        span = cumulative[:, None, 1:] - cumulative[:, :-1, None]
        span -= (marginals[:, :, None] + marginals[:, None, :]) / 2.0
        upper = np.triu(span * span, 1)
        d = upper + upper.transpose(0, 2, 1)
    observed = (t * d).sum(axis=(1, 2))
    expected = np.einsum("bi,bij,bj->b", marginals, d, marginals)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 1.0 - (n - 1.0) * observed / expected
    return np.where((n > 0) & (expected > 0), out, np.nan)
