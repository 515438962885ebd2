"""A judge against a reference: rank correlation, the confusion matrix, and error rates at the
attack-success threshold."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from ._agreement import _check_same_length, _level_index, _positions
from ._core import CONFIDENCE, LEVELS, rate_wilson


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
