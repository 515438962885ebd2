"""A self-contained HTML report: no network, every piece of model text escaped.

:func:`build_html` folds the stored campaigns into one HTML document. The figures that never
change (the paper-style table, the charts, spend, severity counts, the configuration) are rendered
here with :func:`html.escape`; the interactive parts (the category x role heatmaps, each cell's
elite trajectory, the transcripts with their filters) are drawn by a small vanilla-JS renderer
from a JSON data block. That block is escaped so model text cannot close it (every ``<``, ``>``
and ``&`` becomes a ``\\u`` escape), and the renderer inserts text only as DOM text nodes.
A Content-Security-Policy lets nothing load and nothing run but the renderer itself (by hash).

A large campaign keeps the main file small: past :data:`INLINE_ATTEMPTS` attempts (and when
given a ``pages`` folder, as :func:`write_html` does) the transcripts are written to side files,
``REPORT_files/RUN/c0-p0001.js`` ..., each a page of whole conversations (about
:data:`PAGE_ATTEMPTS` attempts), and the page loads one when asked, with a ``<script>`` element
(a browser lets a ``file://`` page load a script beside it, never ``fetch()`` it). The main file
keeps the summary, the figures, the heatmaps and each cell's elite trajectory (with its
conversation's committed turns). A page file is one call, ``mhsafeevalPage(campaign, page,
attempts)``, with the same escaped JSON as the data block; the policy then also allows scripts
of the report's own origin (``'self'``: its folder, on ``file://``). The report and its pages
are replaced as one unit (:class:`~mhsafeeval._files.FileSet`): ``RUN`` is a folder of this
report's pages only, named when they are all written, just before the main file is replaced.

Given ``fresh`` (as ``report --html`` and ``view`` do), a campaign's part of the document, its
pages' records included, is read from the store where it was kept for the same code, log and
page sizes (:mod:`mhsafeeval.reports.kept`), and kept there when it had to be read from the
events.

The report reads the store once per campaign (:class:`~mhsafeeval.reports.export.RecordStream`):
each conversation is tallied for the figures and its records are put on a page as it completes,
then forgotten, so what is held is a page of transcripts, the conversations in flight and the
elites' conversations, not the campaign. Pages hold whole conversations in order of completion
(the ones that never completed last). Reporting judges' ratings stored after their conversation
completed (a panel rates after the turn, ``rejudge`` after the campaign) go to the tally
(:meth:`~mhsafeeval.storage.CampaignTally.fold`); a campaign with any other event stored after
its conversation completed is folded whole instead (its pages then hold the conversations in
order of their first attempt). Transcripts kept inline are in order of each attempt's first
event either way.

Every rate shows its 95% interval (see :mod:`mhsafeeval.storage._metrics`): a second row of the
metrics table, error bars on the charts, and a table of each cell's ASR with its interval, where
cells with fewer than :data:`~mhsafeeval.reports.text.SPARSE_ATTEMPTS` judged attempts are marked
``sparse``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from mhsafeeval._files import FileSet, check_output, write_private_atomic
from mhsafeeval.costs import role_cost
from mhsafeeval.errors import InputError
from mhsafeeval.messages import Elite
from mhsafeeval.reports.compare import Change, Comparison, ModelChange
from mhsafeeval.reports.export import (
    AttemptRecord,
    RecordStream,
    archive_of,
    stream_records,
)
from mhsafeeval.reports.kept import HTML_KIND, Fresh, kept_body, log_position
from mhsafeeval.reports.text import (
    SPARSE_ATTEMPTS,
    CampaignReport,
    load_reports_and_logs,
    report_of,
    review_of,
    wanted_campaigns,
)
from mhsafeeval.storage import CampaignLog, CampaignTally, EventStore, ModelMetrics

__all__ = [
    "INLINE_ATTEMPTS",
    "PAGE_ATTEMPTS",
    "WARNING",
    "build_html",
    "comparison_html",
    "comparison_section",
    "embed_json",
    "pages_folder",
    "write_html",
]

INLINE_ATTEMPTS = 1000
"""A campaign with at most this many attempts keeps its transcripts in the main file."""
PAGE_ATTEMPTS = 500
"""Attempts per side file of transcripts (whole conversations: a page may hold a few more)."""
_PAGE_GLOB = "c*-p*.js"  # the pages an older version wrote straight into REPORT_files

WARNING = (
    "Content warning: this report quotes adversarial counseling conversations. Transcripts "
    "discuss self-harm, abuse, suicide, grief and other distressing topics, and quote harmful "
    "replies on purpose. It stays on your machine: it loads nothing from the network."
)
# Rules of the parts drawn here (report.css styles the rest).
_CSS = (
    ".ci { color: #555; font-size: 12px; white-space: nowrap; }"
    "table.cellasr caption { font-weight: bold; text-align: left; padding: 4px 0; }"
    "table.cellasr td { text-align: center; }"
    "table.cellasr td.sparse { color: #999; font-style: italic; border: 1px dashed #999; }"
    "svg .err { stroke-width: 1.5; stroke-opacity: 0.6; }"
)
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")
_RECORD_FIELDS = (
    "counselor_model",
    "profile_id",
    "style",
    "conversation",
    "turn",
    "attempt",
    "branch",
    "category",
    "role",
    "operator",
    "instruction",
    "utterance",
    "reply",
    "outcome",
    "severity",
    "success",
    "label",
    "reasoning",
    "evidence",
    "committed",
    "unjudged_reason",
    "failed_agent",
    "failed_error",
)


def _asset(name: str) -> str:
    return (resources.files("mhsafeeval") / "data" / "report" / name).read_text(encoding="utf-8")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: float | None) -> str:
    """A rate as the page shows it: three decimals, or an en dash when undefined."""
    return "\u2013" if value is None else f"{value:.3f}"


def _ci(interval: tuple[float, float] | None) -> str:
    """An interval as the page shows it: ``low-high`` (an en dash), or an en dash when undefined."""
    if interval is None:
        return '<span class="ci">\u2013</span>'
    return f'<span class="ci">{interval[0]:.3f}\u2013{interval[1]:.3f}</span>'


def _label(word: str) -> str:
    return word.replace("_", " ")


def embed_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&``."""
    text = msgspec.json.encode(data).decode()
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """An HTML table; ``head`` is plain text, ``rows`` are already-escaped HTML fragments."""
    out = [f'<table class="{cls}"><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    return "".join(out) + "</tbody></table>"


def _metrics_table(report: CampaignReport) -> str:
    head = ["model", "ASR", "ASR w/o iteration", "refusal rate", "comprehension", "coverage"]
    head += ["ASR sev\u22653", "ASR sev\u22654", "unjudged", "failed calls", "turns"]
    head += ["filtered replies", "empty replies", "cut replies", "client re-asks"]
    rows = []
    for m in report.models.values():
        rows.append(
            [
                f"<b>{_e(m.model)}</b>",
                *(
                    _fmt(v)
                    for v in (
                        m.overall_asr,
                        m.asr_first_attempt,
                        m.refusal_rate,
                        m.comprehension_rate,
                        m.coverage,
                        m.asr_at_3,
                        m.asr_at_4,
                    )
                ),
                str(m.unjudged),
                str(m.failed_calls),
                str(m.turns),
                str(m.filtered_replies),
                str(m.empty_replies),
                str(m.cut_replies),
                str(m.client_rejected),
            ]
        )
        rows.append(
            [
                '<span class="ci">95% interval</span>',
                *(
                    _ci(ci)
                    for ci in (
                        m.overall_asr_ci,
                        m.asr_first_attempt_ci,
                        m.refusal_rate_ci,
                        m.comprehension_rate_ci,
                    )
                ),
                '<span class="ci">none: cells are not a sample</span>',
                _ci(m.asr_at_3_ci),
                _ci(m.asr_at_4_ci),
                *([""] * (len(head) - 8)),  # the counts have no interval
            ]
        )
    return _table(head, rows, "metrics")


def _findings_table(models: list[ModelMetrics]) -> str:
    """Candidates and findings per model, and the search judge's own (the paper's) reading."""
    confirming = [m for m in models if m.confirming]
    if not confirming:
        return ""
    head = ["model", "candidates", "confirmed (findings)", "not confirmed"]
    head += ["search judge alone: ASR", "its 95% interval", "its coverage"]
    rows = [
        [
            f"<b>{_e(m.model)}</b>",
            str(m.candidates),
            str(m.confirmed),
            str(m.candidates - m.confirmed),
            _fmt(m.search_judge_asr),
            _ci(m.search_judge_asr_ci),
            _fmt(m.search_judge_coverage),
        ]
        for m in confirming
    ]
    legend = (
        '<p class="legend">A reply the search\'s judge rated at or above the threshold is a '
        "candidate; it is a finding only once independent raters confirmed it ([confirm]). "
        "Every figure above, the heatmap and the cells count findings; unconfirmed candidates "
        "count as failed attempts and are shown apart. The search judge's own columns are "
        "the paper-comparable reading (every candidate a success).</p>"
    )
    return "<h3>Candidates and findings</h3>" + _table(head, rows, "findings") + legend


def _cell_table(report: CampaignReport, m: ModelMetrics) -> str:
    """One model's ASR per cell with its interval; sparse cells are marked (class and title)."""
    by_cell = {(c.category, c.role): c for c in m.cells}
    roles = list(dict.fromkeys(r for _, r in report.cells))
    out = [f'<table class="cellasr"><caption>{_e(m.model)}</caption><thead><tr><th></th>']
    out += [f"<th>{_e(_label(r))}</th>" for r in roles]
    out.append("</tr></thead><tbody>")
    for category in dict.fromkeys(c for c, _ in report.cells):
        out.append(f"<tr><th>{_e(_label(category))}</th>")
        for role in roles:
            cell = by_cell.get((category, role))
            if cell is None or cell.asr is None:
                out.append('<td title="not tried">\u00b7</td>')
                continue
            sparse = cell.attempts < SPARSE_ATTEMPTS
            attrs = ' class="sparse"' if sparse else ""
            note = ", sparse" if sparse else ""
            turned_down = cell.candidates - cell.confirmed
            unconfirmed = (
                f'<br><span class="unconfirmed">{turned_down} unconfirmed</span>'
                if turned_down
                else ""
            )
            out.append(
                f'<td{attrs} title="{cell.attempts} judged attempt(s){note}">'
                f"{_fmt(cell.asr)}<br>{_ci(cell.asr_ci)}{unconfirmed}</td>"
            )
        out.append("</tr>")
    return "".join(out) + "</tbody></table>"


def _cell_tables(report: CampaignReport) -> str:
    tried = [c for m in report.models.values() for c in m.cells if c.attempts]
    sparse = sum(c.attempts < SPARSE_ATTEMPTS for c in tried)
    legend = (
        f'<p class="legend">Each cell: the share of its judged attempts that succeeded, and its '
        f"95% interval (conversations resampled). Cells marked sparse (grey, dashed) have fewer "
        f"than {SPARSE_ATTEMPTS} judged attempts, too few for their ASR to mean much: {sparse} "
        f"of {len(tried)} tried cells. \u00b7 = not tried.</p>"
    )
    tables = "".join(_cell_table(report, m) for m in report.models.values())
    return f'{legend}<div class="grid">{tables}</div>'


def _line_chart(
    title: str,
    xlabel: str,
    series: dict[str, dict[int, float | None]],
    xname: str = "{}",
    bars: dict[str, dict[int, tuple[float, float] | None]] | None = None,
) -> str:
    """A small inline SVG line chart of rates (0..1) over integer x values, with ``bars``
    (95% intervals, per model and x) drawn as error bars."""
    xs = sorted({x for points in series.values() for x in points})
    w, h, left, bottom, top, right = 420, 230, 44, 40, 26, 16
    pw, ph = w - left - right, h - top - bottom
    out = [f'<figure class="chart"><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">']
    out.append(f'<text x="{w / 2}" y="16" class="ct">{_e(title)}</text>')
    for i in range(6):
        y = top + ph - ph * i / 5
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="yl">{i / 5:.1f}</text>')

    def px(x: int) -> float:
        return left + (pw * xs.index(x) / (len(xs) - 1) if len(xs) > 1 else pw / 2)

    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{h - bottom + 16}" class="xl">')
        out.append(f"{_e(xname.format(x))}</text>")
    out.append(f'<text x="{left + pw / 2}" y="{h - 6}" class="xl">{_e(xlabel)}</text>')
    legend = []
    for n, (model, points) in enumerate(series.items()):
        colour = _PALETTE[n % len(_PALETTE)]
        coords = [(px(x), top + ph - ph * v) for x, v in sorted(points.items()) if v is not None]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in coords]
        for x, ci in sorted((bars or {}).get(model, {}).items()):
            if ci is not None and x in xs:
                y1, y2 = (f"{top + ph - ph * v:.1f}" for v in ci)
                out.append(
                    f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{y1}" y2="{y2}" '
                    f'stroke="{colour}" class="err"/>'
                )
        legend.append(f'<span style="color:{colour}">\u25a0</span> {_e(model)}')
    out.append("</svg><figcaption>" + " &nbsp; ".join(legend) + "</figcaption></figure>")
    return "".join(out)


def _severity_table(models: list[str], severities: dict[str, Counter[str]]) -> str:
    """Attempts per severity (or outcome) and counselor model (``severities``: as
    :class:`_Transcripts` counts them)."""
    counts = {m: severities.get(m, Counter()) for m in models}
    counts.update((m, c) for m, c in severities.items() if m not in counts)
    keys = ["1", "2", "3", "4", "5", "unjudged", "failed", "incomplete"]
    rows = []
    for model, count in counts.items():
        most = max(count.values(), default=1)
        cells = [f"<b>{_e(model)}</b>"]
        for k in keys:
            bar = f'<span class="bar s{_e(k)}" style="width:{40 * count[k] / most:.0f}px"></span>'
            cells.append(f"{bar} {count[k]}")
        rows.append(cells)
    return _table(["model", *(f"severity {k}" if k.isdigit() else k for k in keys)], rows, "sev")


def _usd(cost: float | None) -> str:
    return "unknown price" if cost is None else f"{cost:.4f}"


def _usage_table(models: list[ModelMetrics]) -> str:
    rows = [
        [
            _e(m.model),
            _e(role),
            str(u.calls),
            str(u.prompt_tokens),
            str(u.completion_tokens),
            str(u.prompt_tokens + u.completion_tokens),
            _usd(role_cost(u)),
        ]
        for m in models
        for role, u in sorted(m.usage.items())
    ]
    head = [
        "model",
        "agent role",
        "calls",
        "prompt tokens",
        "completion tokens",
        "total tokens",
        "est. cost (USD)",
    ]
    return _table(head, rows, "usage")


def _cost_table(report: CampaignReport) -> str:
    rows = []
    for name, m in report.models.items():
        c = report.cost.get(name)
        if c is None or not m.counselor_calls:
            continue
        rows.append(
            [
                _e(name),
                str(m.counselor_calls),
                str(m.successes),
                str(m.filled_cells),
                _num(c.calls_per_success),
                _num(c.calls_per_filled_cell),
                _usd(c.usd),
                "\u2013" if c.usd_per_filled_cell is None else f"{c.usd_per_filled_cell:.4f}",
            ]
        )
    if not rows:
        return ""
    head = ["model", "counselor calls", "successful turns", "filled cells"]
    head += ["calls per success", "calls per filled cell", "est. USD", "USD per filled cell"]
    return "<h3>Cost per finding</h3>" + _table(head, rows, "cost")


def _num(value: float | None) -> str:
    return "\u2013" if value is None else f"{value:.1f}"


def _judges_table(m: ModelMetrics, threshold: int) -> str:
    failed = (
        f"<p>{m.panel_failed_calls} reporting-judge call(s) failed for good: run the same "
        "command again (or <code>rejudge</code>) to retry them.</p>"
        if m.panel_failed_calls
        else ""
    )
    if not m.judges:
        return f"<h3>Judges of {_e(m.model)}</h3>{failed}"
    rows = []
    for j in m.judges:
        kappa = "\u2013" if j.kappa_vs_search is None else f"{j.kappa_vs_search:.2f}"
        rows.append(
            [
                f"<b>{_e(j.rater)}</b>",
                _e(j.source),
                str(j.rated),
                str(j.unjudged),
                f"{_fmt(j.overall_asr)} {_ci(j.overall_asr_ci)}",
                f"{_fmt(j.verdict_asr)} {_ci(j.verdict_asr_ci)}",
                "\u2013" if j.mean_severity is None else f"{j.mean_severity:.2f}",
                f"{kappa} {_ci(j.kappa_vs_search_ci)}",
            ]
        )
    head = ["rater", "source", "rated", "unjudged", "ASR (turns)", "ASR (replies)"]
    head += ["mean severity", "kappa vs search judge"]
    out = [
        f"<h3>Judges of {_e(m.model)}: the search's judge and the reporting judges</h3>",
        f"<p>On the replies the search judged; success = severity \u2265 {threshold}."
        + (
            " <i>panel</i>: the lower median of the panel's severities (a strict majority must "
            "rate a level), refused and understood by strict majority."
            if any(j.rater == "panel" for j in m.judges)
            else ""
        )
        + "</p>",
        _table(head, rows, "judges"),
        failed,
    ]
    a = m.agreement
    if a is not None:
        alpha = "\u2013" if a.alpha is None else f"{a.alpha:.2f}"
        out.append(
            f"<p>Krippendorff's alpha (ordinal), {len(a.raters)} raters over {a.units} replies: "
            f"<b>{alpha}</b> {_ci(a.alpha_ci)}</p>"
        )
        pairs = [
            [
                _e(p.a),
                _e(p.b),
                str(p.pairs),
                ("\u2013" if p.weighted_kappa is None else f"{p.weighted_kappa:.2f}")
                + f" {_ci(p.weighted_kappa_ci)}",
            ]
            for p in a.pairwise
        ]
        out.append(_table(["rater", "rater", "replies", "weighted kappa"], pairs, "agreement"))
    return "".join(out)


def _comparison_table(report: CampaignReport) -> str:
    if not report.comparisons:
        return ""
    rows = [
        [
            _e(c.a),
            _e(c.b),
            str(c.profiles),
            _fmt(c.asr_a),
            _fmt(c.asr_b),
            "\u2013" if c.difference is None else f"{c.difference:+.3f}",
            "\u2013" if c.p_value is None else f"{c.p_value:.3f}",
            "larger than the noise" if c.beyond_noise else "within the noise",
        ]
        for c in report.comparisons
    ]
    head = ["model A", "model B", "profiles", "ASR A", "ASR B", "difference", "p", "verdict"]
    return (
        "<h3>Counselor models compared (paired by client profile)</h3>"
        "<p>Per-profile ASR, sign-flip permutation test over profiles.</p>"
        + _table(head, rows, "compare")
    )


def _review_table(report: CampaignReport) -> str:
    """What people said in the review workbench (nothing when nobody reviewed)."""
    review = report.review
    if review is None or not review.models:
        return ""

    def rate(value: float | None, ci: tuple[float, float] | None, why: str | None = None) -> str:
        if value is None:
            return _e(f"n/a ({why})" if why else "n/a")
        return f"{_fmt(value)}<br>{_ci(ci)}"

    head = [
        "model",
        "settled / queued",
        "adjudicated",
        "waiting",
        "human-confirmed findings",
        "judge's precision",
        "on its findings",
        "miss rate (safe sample)",
        "raters' alpha",
        "raters' kappa",
        "judge vs people (kappa)",
    ]
    rows = [
        [
            _e(m.model),
            f"{m.settled} / {m.queued}",
            str(m.adjudicated),
            str(m.pending),
            f"{m.confirmed} in {sum(1 for c in m.cells if c.confirmed)} cell(s)",
            rate(m.precision, m.precision_ci),
            rate(m.finding_precision, m.finding_precision_ci),
            rate(m.miss_rate, m.miss_rate_ci),
            rate(m.alpha, m.alpha_ci, m.alpha_undefined),
            rate(m.kappa, m.kappa_ci, m.kappa_undefined),
            rate(m.judge_kappa, m.judge_kappa_ci, m.judge_kappa_undefined),
        ]
        for m in review.models
    ]
    legend = (
        f'<p class="legend">Blinded ratings by {len(review.raters)} people, '
        f"{review.raters_per_item} per reply, {review.decisions} adjudication(s) "
        "(mhsafeeval review; docs/review.md). Intervals: 95%.</p>"
    )
    return "<h3>Review by people</h3>" + _table(head, rows, "review") + legend


def _section(
    index: int, report: CampaignReport, config: str, severities: dict[str, Counter[str]]
) -> str:
    models = list(report.models.values())
    refine = {m.model: {k + 1: v for k, v in m.success_by_attempt.items()} for m in models}
    refine_ci = {m.model: {k + 1: v for k, v in m.success_by_attempt_ci.items()} for m in models}
    at_k = {m.model: dict(m.asr_at_k) for m in models}
    at_k_ci = {m.model: dict(m.asr_at_k_ci) for m in models}
    return "".join(
        [
            f'<section class="campaign" id="campaign-{index}">',
            f"<h2>Campaign {_e(report.campaign)}</h2>",
            f"<p>{report.events} events; an attack succeeds at severity \u2265 "
            f"{report.threshold}; {len(models)} counselor model(s).</p>",
            "<h3>Results per counselor model</h3>",
            _metrics_table(report),
            _findings_table(models),
            "<h3>Harm heatmap: category \u00d7 role</h3>",
            f'<div class="heatmaps" data-campaign="{index}"></div>',
            f'<div class="elite" id="elite-{index}" hidden></div>',
            "<h3>ASR per cell, with 95% intervals</h3>",
            _cell_tables(report),
            '<h3>Refinement and budget</h3><div class="charts">',
            _line_chart("Success rate by attempt", "attempt", refine, bars=refine_ci),
            _line_chart(
                "ASR@k vs counselor calls per turn", "counselor calls", at_k, "@{}", at_k_ci
            ),
            '</div><p class="legend">Bars: 95% intervals (conversations resampled).</p>',
            "<h3>Severity distribution (all judged attempts)</h3>",
            _severity_table(list(report.models), severities),
            "<h3>Calls and tokens per agent role</h3>",
            _usage_table(models),
            _cost_table(report),
            *(
                _judges_table(m, report.threshold)
                for m in models
                if m.judges or m.panel_failed_calls
            ),
            _comparison_table(report),
            _review_table(report),
            "<h3>Transcripts</h3>",
            f'<div class="transcripts" data-campaign="{index}"></div>',
            "<h3>Configuration</h3>",
            f'<pre class="config">{_e(config) or "(no configuration text stored)"}</pre>',
            "</section>",
        ]
    )


def pages_folder(out: str | os.PathLike[str]) -> Path:
    """Where :func:`write_html` puts the side files of ``out``: ``REPORT_files`` beside it (in
    a folder of each report's own in it)."""
    path = Path(out)
    return path.with_name(f"{path.stem}_files")


async def write_html(
    store: EventStore,
    campaign: str | None,
    out: str | os.PathLike[str],
    *,
    source: str | Path | None = None,
    inline_attempts: int = INLINE_ATTEMPTS,
    page_attempts: int = PAGE_ATTEMPTS,
    comparison: Comparison | None = None,
    fresh: Fresh | None = None,
) -> list[Path]:
    """Write the HTML report of ``campaign`` (``None``: every stored one) to ``out``, and its
    pages of transcripts, if it has any, to a new folder in :func:`pages_folder`; owner-only
    files. The report and its pages replace the previous ones as one unit (the pages an earlier
    report left are removed; so are those of a report killed while it was written). Returns
    the side files. ``inline_attempts``, ``page_attempts``, ``comparison`` and ``fresh``: as
    :func:`build_html`'s.

    Raises:
        InputError: No such campaign, or a file cannot be written (or ``out`` would destroy a
            database or a config: :func:`~mhsafeeval._files.check_output`).
    """
    folder = pages_folder(out)
    if not folder.parent.is_dir():
        raise InputError(Path(out), None, f"cannot write: no such folder {folder.parent}")
    check_output(out)
    written: list[Path] = []
    with FileSet(out, folder, legacy=_PAGE_GLOB) as files:
        text = await _build(
            store,
            campaign,
            source=source,
            pages=_Pages(files.side_folder, f"{quote(folder.name)}/{files.name}"),
            written=written,
            inline_attempts=inline_attempts,
            page_attempts=page_attempts,
            comparison=comparison,
            fresh=fresh,
        )
        files.publish(text)
    return [files.published / path.name for path in written]


class _Pages:
    """Where the pages of transcripts go: ``make()`` gives the folder to write them in (made
    on the first call), ``href`` its address from the main file."""

    def __init__(self, make: Callable[[], Path], href: str) -> None:
        self.make, self.href = make, href


def _make_folder(folder: Path) -> Path:
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise InputError(folder, None, f"cannot create the folder ({exc})") from exc
    return folder


async def build_html(
    store: EventStore,
    campaign: str | None,
    *,
    source: str | Path | None = None,
    pages: Path | None = None,
    written: list[Path] | None = None,
    inline_attempts: int = INLINE_ATTEMPTS,
    page_attempts: int = PAGE_ATTEMPTS,
    comparison: Comparison | None = None,
    fresh: Fresh | None = None,
) -> str:
    """The main HTML document reporting ``campaign`` (``None``: every stored one).

    Args:
        store: The event store.
        campaign: A stored campaign, or None for all.
        source: Names the database in errors.
        pages: The folder for the pages of transcripts of a campaign with more than
            ``inline_attempts`` attempts (its name is how the document finds them, so it must
            sit beside the document). None: every transcript inline.
        written: Collects the paths of the page files written.
        inline_attempts: Transcripts of a campaign this small stay inline.
        page_attempts: Attempts per page (whole conversations).
        comparison: A comparison with a baseline campaign
            (:func:`mhsafeeval.reports.compare.compare_files`), shown as a section after the
            campaigns' (``report --html OUT --baseline A.db``).
        fresh: Read each campaign's part where it was kept in the store for the same code,
            log and page sizes (:mod:`mhsafeeval.reports.kept`), and collect here the parts
            read from the events, for :func:`~mhsafeeval.reports.kept.keep`. None: read every
            event and keep nothing.

    Raises:
        InputError: No such campaign (``source`` names the database in the message).
    """
    return await _build(
        store,
        campaign,
        source=source,
        pages=None if pages is None else _Pages(lambda: _make_folder(pages), quote(pages.name)),
        written=written,
        inline_attempts=inline_attempts,
        page_attempts=page_attempts,
        comparison=comparison,
        fresh=fresh,
    )


async def _build(
    store: EventStore,
    campaign: str | None,
    *,
    source: str | Path | None,
    pages: _Pages | None,
    written: list[Path] | None,
    inline_attempts: int,
    page_attempts: int,
    comparison: Comparison | None,
    fresh: Fresh | None,
) -> str:
    reports, sections, data = [], [], []
    paged = False
    for index, name in enumerate(await wanted_campaigns(store, campaign, source)):
        shown = await _campaign(
            store, name, index, pages, inline_attempts, page_attempts, source, fresh
        )
        report = shown.report
        reports.append(report)
        sections.append(_section(index, report, shown.config, shown.severities))
        data.append(
            {
                "campaign": report.campaign,
                "threshold": report.threshold,
                "categories": list(dict.fromkeys(c for c, _ in report.cells)),
                "roles": list(dict.fromkeys(r for _, r in report.cells)),
                "models": {
                    name: [msgspec.to_builtins(c) for c in m.cells]
                    for name, m in report.models.items()
                },
                "archive": shown.archive,
                "attempts": shown.attempts,
                "pages": shown.pages,
                "total": shown.total,
                "context": shown.context,
            }
        )
        paged = paged or bool(shown.pages)
        if written is not None:
            written += shown.written
    script = _asset("report.js")
    if "</script" in script.lower() or "<!--" in script:
        raise AssertionError("the renderer must not contain </script or <!--")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    # With pages, scripts of the report's own origin may load too (its folder, on file://).
    own = " 'self'" if paged else ""
    csp = (
        f"default-src 'none'; script-src 'sha256-{digest}'{own}; style-src 'unsafe-inline'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )  # no quotes, < or & in it: safe in a double-quoted attribute as it is
    title = "mhsafeeval report" + (f": {reports[0].campaign}" if len(reports) == 1 else "")
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title><style>{_asset('report.css')}{_CSS}",
            _COMPARE_CSS if comparison is not None else "",
            "</style></head><body>",
            f'<div class="warning" role="alert"><b>\u26a0</b> {_e(WARNING)}</div>',
            f"<h1>{_e(title)}</h1>",
            *(sections or ["<p>No campaign is stored.</p>"]),
            comparison_section(comparison) if comparison is not None else "",
            f'<script type="application/json" id="data">{embed_json(data)}</script>',
            f"<script>{script}</script></body></html>\n",
        ]
    )


Shown = tuple[int, dict[str, Any]]
"""A record as the page shows it (:data:`_RECORD_FIELDS`), with its attempt's serial."""


class _Campaign(msgspec.Struct, kw_only=True):
    """What the document shows of one campaign. Kept in the store (kind :data:`HTML_KIND`,
    :mod:`mhsafeeval.reports.kept`) with its pages' records, so the report of an unchanged
    campaign reads one row instead of every event; the pages' file names and addresses are
    the document's own (its index, its folder), so they are not kept."""

    report: CampaignReport
    config: str
    severities: dict[str, dict[str, int]]
    """Per counselor model: attempts per severity, or per outcome when unjudged."""
    archive: dict[str, dict[str, dict[str, Any]]]
    attempts: list[dict[str, Any]]
    """The records shown inline (none when paged)."""
    pages: list[dict[str, Any]]
    """Each page's entry in the document's data."""
    total: int
    context: dict[str, list[dict[str, Any]]]
    """The committed turns of each elite's conversation, in archive order."""
    bodies: list[bytes] = []
    """Each page's records as the page embeds them (:func:`embed_json`), zlib-compressed."""


async def _campaign(
    store: EventStore,
    name: str,
    index: int,
    pages: _Pages | None,
    inline_attempts: int,
    page_attempts: int,
    source: str | Path | None,
    fresh: Fresh | None,
) -> _Shown:
    """One campaign's part of the document, its pages written: read from the store where it
    was kept for the same code, log and page sizes; else read from the events, and offered
    in ``fresh`` for keeping (``fresh`` None: neither)."""
    mode = "paged" if pages is not None else "inline"
    key = f"{await log_position(store, name)}; html {mode} {inline_attempts} {page_attempts}"
    body = None if fresh is None else await kept_body(store, name, HTML_KIND, key)
    if body is not None:
        try:
            kept = msgspec.msgpack.decode(body, type=_Campaign)
        except msgspec.MsgspecError:  # written by other code under the same key: read again
            kept = None
        if kept is not None:
            return _Shown.of(kept, index, pages)
    report, log, shown = await _read_campaign(
        store, name, index, pages, inline_attempts, page_attempts, source
    )
    wanted = dict.fromkeys(e.conversation for e in log.archive.values())  # in archive order
    part = _Campaign(
        report=report,
        config=log.config,
        severities={m: dict(c) for m, c in shown.severities.items()},
        archive=archive_of(log, report.campaign),
        attempts=shown.attempts(),
        pages=shown.pages,
        total=shown.total,
        context={c: shown.context.get(c, []) for c in wanted},
    )
    if fresh is not None:
        own = ("file", "src")
        entries = [{k: v for k, v in e.items() if k not in own} for e in shown.pages]
        kept = msgspec.structs.replace(part, pages=entries, bodies=shown.bodies)
        fresh[name] = (key, msgspec.msgpack.encode(kept))
    return _Shown(part, shown.written)


class _Shown:
    """One campaign's part of the document and the page files written for it."""

    def __init__(self, part: _Campaign, written: list[Path]) -> None:
        self.report, self.config, self.archive = part.report, part.config, part.archive
        self.severities = {m: Counter(c) for m, c in part.severities.items()}
        self.attempts, self.pages, self.total = part.attempts, part.pages, part.total
        self.context = part.context
        self.written = written

    @classmethod
    def of(cls, kept: _Campaign, index: int, pages: _Pages | None) -> _Shown:
        """A kept part, its pages written again under this document's names."""
        written, entries = [], []
        for page, (entry, body) in enumerate(zip(kept.pages, kept.bodies, strict=True)):
            assert pages is not None  # kept with pages only when written with them
            name = f"c{index}-p{page + 1:04d}.js"
            records = zlib.decompress(body).decode()
            write_private_atomic(pages.make() / name, _page_text(index, page, records))
            written.append(pages.make() / name)
            entries.append({"file": name, "src": f"{pages.href}/{name}", **entry})
        return cls(msgspec.structs.replace(kept, pages=entries), written)


async def _read_campaign(
    store: EventStore,
    name: str,
    index: int,
    pages: _Pages | None,
    inline_attempts: int,
    page_attempts: int,
    source: str | Path | None,
) -> tuple[CampaignReport, CampaignLog, _Transcripts]:
    """One campaign's report, its log and its transcripts (pages written), from one read of
    the store; folded whole when ratings or a late event need it (see the module)."""
    retried = await store.superseded(name)
    shown = _Transcripts(index, pages, inline_attempts, page_attempts)
    # Ratings stored after their conversation was given go to the tally's rows (the page shows
    # no ratings, so the records given stay right), not to the log: they are not late.
    tally = CampaignTally()
    stream = RecordStream(store, name, on_close=tally.close, fold=tally.fold)
    async for group in stream.numbered():
        shown.add(_shown(group), stream.log.archive.values())
    shown.finish()
    log = stream.log
    late = stream.stale or stream.late_elites
    if not late and tally.threshold in (None, log.threshold):
        tally.add_log(log)  # the conversations that never completed
        report = report_of(log, name, retried=retried, tally=tally)
        report.review = await review_of(store, name)
        return report, log, shown
    first, shown = shown.written, _Transcripts(index, pages, inline_attempts, page_attempts)
    [(report, log)] = await load_reports_and_logs(store, name, source=source)
    async for group in _whole_groups(stream_records(store, name, log), log):
        shown.add(_shown(group), log.archive.values())
    shown.finish()
    for path in set(first) - set(shown.written):  # pages of the read that was not kept
        path.unlink(missing_ok=True)
    return report, log, shown


def _shown(group: list[tuple[int, AttemptRecord]]) -> list[Shown]:
    """The fields of each record that the page shows."""
    return [(n, {f: getattr(r, f) for f in _RECORD_FIELDS}) for n, r in group]


async def _whole_groups(
    records: AsyncIterator[AttemptRecord], log: CampaignLog
) -> AsyncIterator[list[tuple[int, AttemptRecord]]]:
    """The records of a whole log (in order of each attempt's first event) grouped by
    conversation, in order of each conversation's first record; a conversation is given once
    all its records came (only those in flight are held)."""
    sizes = Counter(key[0] for key in log.attempts)
    open_: dict[str, list[tuple[int, AttemptRecord]]] = {}  # insertion order: first record's
    async for r in records:
        serial = log.attempts[(r.conversation, r.turn, r.attempt, r.branch)].serial
        open_.setdefault(r.conversation, []).append((serial, r))
        while open_:
            first = next(iter(open_))
            if len(open_[first]) < sizes[first]:
                break
            yield open_.pop(first)
    for group in open_.values():
        yield group


class _Transcripts:
    """What the page shows of one campaign's records, gathered a conversation at a time: the
    inline attempts or the pages written (past ``inline`` attempts, when given a folder), the
    severity counts, and the committed turns of the elites' conversations."""

    def __init__(self, index: int, folder: _Pages | None, inline: int, per_page: int) -> None:
        self.index, self.folder, self.inline, self.per_page = index, folder, inline, per_page
        self.total = 0
        self.paged = False
        self.pages: list[dict[str, Any]] = []
        self.written: list[Path] = []
        self.bodies: list[bytes] = []
        """Each page's records as embedded, zlib-compressed (what is kept)."""
        self.severities: dict[str, Counter[str]] = {}
        """Per counselor model: attempts per severity, or per outcome when unjudged."""
        self.context: dict[str, list[dict[str, Any]]] = {}
        """The committed turns of each conversation that was an elite's when it came."""
        self._held: list[list[Shown]] = []  # conversations, while they all fit inline
        self._batch: list[dict[str, Any]] = []
        self._conversations = 0

    def add(self, group: list[Shown], elites: Iterable[Elite]) -> None:
        """One conversation's records; ``elites``: the archive's elites so far."""
        self.total += len(group)
        wanted = {e.conversation for e in elites}
        for _, r in group:
            key = str(r["severity"]) if r["outcome"] == "verdict" else r["outcome"]
            self.severities.setdefault(r["counselor_model"], Counter())[key] += 1
            if r["committed"] and r["conversation"] in wanted:
                turn = {k: r[k] for k in ("turn", "utterance", "reply")}
                self.context.setdefault(r["conversation"], []).append(turn)
        if self.paged:
            self._paginate(group)
            return
        self._held.append(group)
        if self.folder is not None and self.total > self.inline:
            self.paged = True
            for held in self._held:
                self._paginate(held)
            self._held = []

    def finish(self) -> None:
        """Write the last page."""
        if self._batch:
            self._page()

    def attempts(self) -> list[dict[str, Any]]:
        """The inline records, in order of each attempt's first event (none when paged)."""
        return [r for _, r in sorted((s for g in self._held for s in g), key=_serial)]

    def _paginate(self, group: list[Shown]) -> None:
        self._batch += (r for _, r in group)
        self._conversations += 1
        if len(self._batch) >= self.per_page:
            self._page()

    def _page(self) -> None:
        assert self.folder is not None
        records = embed_json(self._batch)
        name = f"c{self.index}-p{len(self.pages) + 1:04d}.js"
        write_private_atomic(
            self.folder.make() / name, _page_text(self.index, len(self.pages), records)
        )
        self.pages.append(
            {
                "file": name,
                "src": f"{self.folder.href}/{name}",
                "attempts": len(self._batch),
                "conversations": self._conversations,
                "first": self._batch[0]["conversation"],
                "last": self._batch[-1]["conversation"],
            }
        )
        self.written.append(self.folder.make() / name)
        self.bodies.append(zlib.compress(records.encode(), 6))
        self._batch, self._conversations = [], 0


def _serial(shown: Shown) -> int:
    return shown[0]


def _page_text(campaign: int, page: int, records: str) -> str:
    """A page file: one call with its records (:func:`embed_json`)."""
    return f"mhsafeevalPage({campaign}, {page}, {records});\n"


# -- comparing two campaigns (mhsafeeval compare --html) ---------------------------------------

_COMPARE_CSS = (
    "table.comparison td.beyond_noise { background: #fff3cd; font-weight: bold; }"
    "table.comparison td.sparse { color: #999; font-style: italic; }"
    "table.comparison tr.overall td { border-bottom: 2px solid #bbb; }"
)
_VERDICT = {
    "beyond_noise": "larger than the noise",
    "within_noise": "within the noise",
    "sparse": "sparse: never marked",
    "untried": "not judged on a side",
}


def _signed(value: float | None) -> str:
    return "\u2013" if value is None else f"{value:+.3f}"


def _severity(value: int | None) -> str:
    return "\u2013" if value is None else str(value)


def _change_cells(change: Change) -> list[str]:
    """ASR A, ASR B, the change and its interval, and the verdict, as escaped cells."""
    ci = change.difference_ci
    interval = "" if ci is None else f"{ci[0]:+.3f}\u2013{ci[1]:+.3f}"
    return [
        f'{_fmt(change.a)} <span class="ci">n={change.units_a}</span>',
        f'{_fmt(change.b)} <span class="ci">n={change.units_b}</span>',
        _signed(change.difference),
        f'<span class="ci">{interval}</span>',
        f'<span class="{_e(change.status)}">{_e(_VERDICT[change.status])}</span>',
    ]


def _comparison_model(m: ModelChange) -> str:
    presence = {"both": "", "added": " (added: only in B)", "removed": " (removed: only in A)"}
    head = ["", "best severity A", "best severity B", "ASR A", "ASR B", "change B \u2212 A"]
    head += ["95% interval", "verdict"]
    coverage = [
        "coverage (filled cells)",
        "",
        "",
        _fmt(m.coverage_a),
        _fmt(m.coverage_b),
        "\u2013"
        if m.coverage_a is None or m.coverage_b is None
        else _signed(m.coverage_b - m.coverage_a),
        '<span class="ci">none: cells are not a sample</span>',
        "",
    ]
    providers = (
        f'<p class="meta">A: {_e(m.provider_a or "none")}, B: {_e(m.provider_b or "none")}</p>'
        if m.provider_a != m.provider_b
        else ""
    )
    out = [
        f"<h3>{_e(m.model)}{_e(presence[m.presence])}</h3>{providers}",
        '<table class="comparison"><thead><tr>',
        *(f"<th>{_e(h)}</th>" for h in head),
        "</tr></thead><tbody>",
        '<tr class="overall">',
        *(
            f'<td class="{_e(m.asr.status)}">{c}</td>' if i == 7 else f"<td>{c}</td>"
            for i, c in enumerate(["<b>overall ASR (turns)</b>", "", "", *_change_cells(m.asr)])
        ),
        "</tr><tr>",
        *(f"<td>{c}</td>" for c in coverage),
        "</tr>",
    ]
    for cell in m.cells:
        if cell.asr.a is None and cell.asr.b is None:
            continue
        name = f"{_label(cell.category)} / {_label(cell.role)}"
        values = [
            _e(name),
            _severity(cell.best_severity_a),
            _severity(cell.best_severity_b),
            *_change_cells(cell.asr),
        ]
        status = _e(cell.asr.status)
        out.append(f'<tr class="{status}">')
        out += [f"<td>{c}</td>" for c in values[:-1]]
        out.append(f'<td class="{status}">{values[-1]}</td></tr>')
    return "".join(out) + "</tbody></table>"


def comparison_section(comparison: Comparison) -> str:
    """The HTML section of a :class:`~mhsafeeval.reports.compare.Comparison`: both campaigns and
    their judges, any warning, and per counselor model its overall ASR, coverage and each cell tried
    on either side, with the change B - A and its 95% interval (every text escaped)."""
    c = comparison
    sides = [
        [
            name,
            _e(s.source),
            _e(s.campaign),
            str(s.events),
            str(s.threshold),
            _e(s.judge.judge or "unknown"),
            _e(", ".join(s.judge.answered_by) or "none"),
        ]
        for name, s in (("A (baseline)", c.a), ("B (candidate)", c.b))
    ]
    head = ["", "database", "campaign", "events", "threshold", "judge", "judge model(s)"]
    differences = "".join(f"<li>{_e(d)}</li>" for d in c.judge_differences)
    warnings = "".join(
        f'<div class="warning" role="alert">{_e(w)}<ul>{differences}</ul></div>' for w in c.warnings
    )
    legend = (
        '<p class="legend">change = B \u2212 A. Its 95% interval resamples each side\'s '
        f"conversations independently ({c.resamples} resamples, seed {c.seed}), widened to "
        "contain the interval independent trials would give; a change is larger than the "
        "noise when the interval excludes 0. Cells with fewer than "
        f"{c.sparse_attempts} judged attempts on a side are sparse and never marked. "
        "n = judged turns (overall) or judged attempts (cells).</p>"
    )
    models = "".join(_comparison_model(m) for m in c.models) or "<p>No counselor model.</p>"
    return "".join(
        [
            '<section class="comparison"><h2>Comparison of two campaigns</h2>',
            _table(head, sides, "sides"),
            warnings,
            legend,
            models,
            "</section>",
        ]
    )


def comparison_html(comparison: Comparison) -> str:
    """A self-contained HTML page of :func:`comparison_section`, in the report's style; it
    runs no script and loads nothing."""
    csp = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
    title = f"mhsafeeval comparison: {comparison.a.campaign} vs {comparison.b.campaign}"
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title>",
            f"<style>{_asset('report.css')}{_CSS}{_COMPARE_CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            comparison_section(comparison),
            "</body></html>\n",
        ]
    )
