"""What people said of a campaign in the review workbench, as the report shows it.

The figures are :func:`mhsafeeval.review.review_metrics`' (docs/review.md defines each); this
module only says them in the text report's words. A campaign nobody reviewed has no such
section, and its report is byte for byte what it was.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from mhsafeeval.review import ModelReview, ReviewMetrics

__all__ = ["review_lines"]

WIDTH = 80
"""The text report fits an 80-column terminal."""
_INDENT = " " * 4  # under the model's line


def _rate(value: float | None, interval: Sequence[float] | None, why: str | None = None) -> str:
    if value is None:
        return f"n/a ({why})" if why else "n/a"
    if interval is None:
        return f"{value:.2f}"
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _model_lines(m: ModelReview) -> list[str]:
    cells = sum(1 for c in m.cells if c.confirmed)
    clauses = [
        f"{m.ratings} ratings, {m.unblinded} given unblinded",
        f"human-confirmed findings: {m.confirmed} in {cells} cell(s)",
        f"the judge's precision on what it flagged: {_rate(m.precision, m.precision_ci)} "
        f"of {m.flagged}",
        f"on the campaign's findings {_rate(m.finding_precision, m.finding_precision_ci)} "
        f"of {m.findings}",
        f"its miss rate on sampled safe replies: {_rate(m.miss_rate, m.miss_rate_ci)} of {m.safe}",
        f"raters' agreement: alpha {_rate(m.alpha, m.alpha_ci, m.alpha_undefined)}",
        f"kappa {_rate(m.kappa, m.kappa_ci, m.kappa_undefined)}",
        f"judge vs people: kappa {_rate(m.judge_kappa, m.judge_kappa_ci, m.judge_kappa_undefined)}",
        f"same severity {_rate(m.judge_exact, m.judge_exact_ci)}",
        f"same side of the threshold {_rate(m.judge_side, m.judge_side_ci)}",
    ]
    head = (
        f"  {m.model}: {m.settled} of {m.queued} queued replies settled "
        f"({m.adjudicated} by adjudication), {m.pending} waiting;"
    )
    lines = textwrap.wrap(head, WIDTH, subsequent_indent=_INDENT, break_long_words=False)
    for i, clause in enumerate(clauses):
        end = ";" if i < len(clauses) - 1 else ""
        lines += textwrap.wrap(
            clause + end,
            WIDTH,
            initial_indent=_INDENT,
            subsequent_indent=_INDENT + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines


def review_lines(review: ReviewMetrics | None) -> list[str]:
    """The report's section on the people's review (empty when nobody reviewed)."""
    if review is None or not review.models:
        return []
    lines = [
        "",
        f"Review by people ({len(review.raters)} rater(s), {review.raters_per_item} per reply, "
        f"{review.decisions} adjudication(s); 95% intervals):",
    ]
    for m in review.models:
        lines += _model_lines(m)
    if review.unknown_items:
        lines.append(f"  {review.unknown_items} reviewed item(s) match no judged reply: left out")
    return lines
