"""Do two counselor models differ on the same profiles? The paired sign-flip test, and what
its sample size lets it say at all."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Final

from ._agreement import _check_same_length
from ._bootstrap import check_resamples
from ._core import SEED

# The largest sample for which permutation_test_paired enumerates all 2**n sign patterns.
_EXACT_MAX_N: Final = 12


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
    check_resamples(resamples)
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


def smallest_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """The smallest p-value :func:`permutation_test_paired` can give for pairs like these,
    whatever their differences' sizes: ``2 / 2 ** k`` with ``k`` the pairs that differ (the
    two sign patterns where every difference points one way; pairs that do not differ flip
    nothing). Above the significance level, the test cannot tell the two conditions apart
    at this sample size: "too few to tell", which is not "no difference".

    Raises:
        ValueError: for different lengths.

    Example:
        >>> smallest_p_value([1, 1, 1, 1, 1], [0, 0, 0, 0, 0])
        0.0625
        >>> smallest_p_value([1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0])
        0.03125
    """
    _check_same_length(a, b)
    differing = sum(x != y for x, y in zip(a, b, strict=True))
    return min(1.0, 2.0 ** (1 - differing))
