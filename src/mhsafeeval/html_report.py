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
``REPORT_files/c0-p0001.js`` ..., each a page of whole conversations (about
:data:`PAGE_ATTEMPTS` attempts), and the page loads one when asked, with a ``<script>`` element
(a browser lets a ``file://`` page load a script beside it, never ``fetch()`` it). The main file
keeps the summary, the figures, the heatmaps and each cell's elite trajectory (with its
conversation's committed turns). A page file is one call, ``mhsafeevalPage(campaign, page,
attempts)``, with the same escaped JSON as the data block; the policy then also allows scripts
of the report's own origin (``'self'``: its folder, on ``file://``). Records reach the pages as
they stream from the store (:func:`~mhsafeeval.export.stream_records`): the report never holds
more than a page of transcripts.

Every rate shows its 95% interval (see :mod:`mhsafeeval.storage._metrics`): a second row of the
metrics table, error bars on the charts, and a table of each cell's ASR with its interval, where
cells with fewer than :data:`~mhsafeeval.report.SPARSE_ATTEMPTS` judged attempts are marked
``sparse``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
from collections import Counter
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from mhsafeeval._files import write_private_atomic
from mhsafeeval.compare import Change, Comparison, ModelChange
from mhsafeeval.costs import role_cost
from mhsafeeval.errors import InputError
from mhsafeeval.export import AttemptRecord, archive_of, stream_records
from mhsafeeval.report import SPARSE_ATTEMPTS, CampaignReport, load_reports_and_logs
from mhsafeeval.storage import CampaignLog, EventStore, ModelMetrics

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
_PAGE_GLOB = "c*-p*.js"  # the side files this module writes (and replaces)

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
            out.append(
                f'<td{attrs} title="{cell.attempts} judged attempt(s){note}">'
                f"{_fmt(cell.asr)}<br>{_ci(cell.asr_ci)}</td>"
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


def _severity_table(models: list[str], log: CampaignLog) -> str:
    counts: dict[str, Counter[str]] = {m: Counter() for m in models}
    for a in log.attempts.values():
        key = str(a.severity) if a.outcome == "verdict" else a.outcome
        counts.setdefault(log.model_of(a.conversation) or "", Counter())[key] += 1
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


def _section(index: int, report: CampaignReport, log: CampaignLog) -> str:
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
            _severity_table(list(report.models), log),
            "<h3>Calls and tokens per agent role</h3>",
            _usage_table(models),
            _cost_table(report),
            *(
                _judges_table(m, report.threshold)
                for m in models
                if m.judges or m.panel_failed_calls
            ),
            _comparison_table(report),
            "<h3>Transcripts</h3>",
            f'<div class="transcripts" data-campaign="{index}"></div>',
            "<h3>Configuration</h3>",
            f'<pre class="config">{_e(log.config) or "(no configuration text stored)"}</pre>',
            "</section>",
        ]
    )


def pages_folder(out: str | os.PathLike[str]) -> Path:
    """Where :func:`write_html` puts the side files of ``out``: ``REPORT_files`` beside it."""
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
) -> list[Path]:
    """Write the HTML report of ``campaign`` (``None``: every stored one) to ``out``, and its
    pages of transcripts, if it has any, to :func:`pages_folder` (owner-only files, each
    replaced whole; pages left there by an earlier report are removed). Returns the side files.
    ``inline_attempts``, ``page_attempts`` and ``comparison``: as :func:`build_html`'s.

    Raises:
        InputError: No such campaign, or a file cannot be written.
    """
    folder = pages_folder(out)
    if not folder.parent.is_dir():
        raise InputError(Path(out), None, f"cannot write: no such folder {folder.parent}")
    written: list[Path] = []
    text = await build_html(
        store,
        campaign,
        source=source,
        pages=folder,
        written=written,
        inline_attempts=inline_attempts,
        page_attempts=page_attempts,
        comparison=comparison,
    )
    _drop_stale(folder, written)
    write_private_atomic(out, text)
    return written


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise InputError(folder, None, f"cannot create the folder ({exc})") from exc


def _drop_stale(folder: Path, written: list[Path]) -> None:
    """Remove the pages an earlier report left in ``folder`` (and the folder, if empty)."""
    if folder.is_dir():
        for stale in folder.glob(_PAGE_GLOB):
            if stale not in written:
                stale.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()


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
            (:func:`mhsafeeval.compare.compare_files`), shown as a section after the
            campaigns' (``report --html OUT --baseline A.db``).

    Raises:
        InputError: No such campaign (``source`` names the database in the message).
    """
    loaded = await load_reports_and_logs(store, campaign, source=source)
    reports = [r for r, _ in loaded]
    sections, data = [], []
    paged = False
    for index, (report, log) in enumerate(loaded):
        sections.append(_section(index, report, log))
        records = _html_records(stream_records(store, report.campaign, log))
        entry: dict[str, Any] = {
            "campaign": report.campaign,
            "threshold": report.threshold,
            "categories": list(dict.fromkeys(c for c, _ in report.cells)),
            "roles": list(dict.fromkeys(r for _, r in report.cells)),
            "models": {
                name: [msgspec.to_builtins(c) for c in m.cells] for name, m in report.models.items()
            },
            "archive": archive_of(log, report.campaign),
            "attempts": [],
            "pages": [],
            "total": len(log.attempts),
        }
        wanted = dict.fromkeys(e.conversation for e in log.archive.values())  # in archive order
        context: dict[str, list[dict[str, Any]]] = {c: [] for c in wanted}
        entry["context"] = context
        if pages is None or len(log.attempts) <= inline_attempts:
            async for record in records:
                entry["attempts"].append(record)
                _keep_context(context, record)
        else:
            paged = True
            _make_folder(pages)
            sizes = _conversation_sizes(log)
            batch: list[dict[str, Any]] = []
            conversations = 0
            async for group in _by_conversation(records, sizes):
                batch += group
                conversations += 1
                for record in group:
                    _keep_context(context, record)
                if len(batch) >= page_attempts:
                    entry["pages"].append(_page(pages, index, entry, batch, conversations))
                    batch, conversations = [], 0
            if batch:
                entry["pages"].append(_page(pages, index, entry, batch, conversations))
            if written is not None:
                written += [pages / p["file"] for p in entry["pages"]]
        data.append(entry)
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


async def _html_records(records: AsyncIterator[AttemptRecord]) -> AsyncIterator[dict[str, Any]]:
    """The fields of each record that the page shows."""
    async for r in records:
        yield {f: getattr(r, f) for f in _RECORD_FIELDS}


def _keep_context(context: dict[str, list[dict[str, Any]]], record: dict[str, Any]) -> None:
    """Keep a committed turn of an elite's conversation (its trajectory shows them)."""
    if record["committed"] and record["conversation"] in context:
        context[record["conversation"]].append(
            {k: record[k] for k in ("turn", "utterance", "reply")}
        )


def _conversation_sizes(log: CampaignLog) -> dict[str, int]:
    return dict(Counter(key[0] for key in log.attempts))


async def _by_conversation(
    records: AsyncIterator[dict[str, Any]], sizes: dict[str, int]
) -> AsyncIterator[list[dict[str, Any]]]:
    """Records grouped by conversation, in order of each conversation's first record; a
    conversation is given once all its records came (only those in flight are held)."""
    open_: dict[str, list[dict[str, Any]]] = {}  # insertion order: first record's
    async for record in records:
        open_.setdefault(record["conversation"], []).append(record)
        while open_:
            first = next(iter(open_))
            if len(open_[first]) < sizes.get(first, 0):
                break
            yield open_.pop(first)
    for group in open_.values():
        yield group


def _page(
    folder: Path, campaign: int, entry: dict[str, Any], batch: list[Any], conversations: int
) -> dict[str, Any]:
    """Write one page of transcripts; its entry in the document's data."""
    number = len(entry["pages"]) + 1
    name = f"c{campaign}-p{number:04d}.js"
    write_private_atomic(
        folder / name, f"mhsafeevalPage({campaign}, {number - 1}, {embed_json(batch)});\n"
    )
    return {
        "file": name,
        "src": f"{quote(folder.name)}/{name}",
        "attempts": len(batch),
        "conversations": conversations,
        "first": batch[0]["conversation"],
        "last": batch[-1]["conversation"],
    }


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
    """The HTML section of a :class:`~mhsafeeval.compare.Comparison`: both campaigns and their
    judges, any warning, and per counselor model its overall ASR, coverage and each cell tried
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
