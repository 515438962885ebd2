"""Reports: the paper-style table and the cell heatmap per counselor model, from stored events.

Every rate comes with its 95% interval (``<rate>_ci``; how each is computed is in
:mod:`mhsafeeval.storage._metrics`): the text report prints them under the table, the JSON
carries them next to each rate. A cell with fewer than :data:`SPARSE_ATTEMPTS` judged attempts
is *sparse*: its ASR rests on too few replies to mean much, and the reports say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from mhsafeeval.costs import role_cost
from mhsafeeval.errors import InputError
from mhsafeeval.reports.review import review_lines
from mhsafeeval.review import REVIEW_EVENTS, ReviewMetrics, ReviewState, review_metrics
from mhsafeeval.storage import (
    CampaignLog,
    CampaignTally,
    EventStore,
    ModelComparison,
    ModelMetrics,
    RoleUsage,
    compare_models,
    metrics_of,
)

__all__ = [
    "SPARSE_ATTEMPTS",
    "CampaignReport",
    "ModelCost",
    "load_report",
    "load_reports_and_logs",
    "render_text",
    "report_json",
    "unmeasured",
    "wanted_campaigns",
]

SPARSE_ATTEMPTS = 5
"""A cell with fewer judged attempts than this is sparse: its ASR says little."""


class ModelCost(msgspec.Struct, kw_only=True):
    """What one counselor model's part of the campaign cost, per finding.

    USD is estimated from litellm's price map (:mod:`mhsafeeval.costs`) over every role's
    tokens; None where a model has no price (or nothing was found to divide by).
    """

    usd: float | None = None
    usd_per_success: float | None = None
    usd_per_filled_cell: float | None = None
    calls_per_success: float | None = None
    calls_per_filled_cell: float | None = None


REVIEW_TAG = "review."
"""The tags of the review workbench's events start so (mhsafeeval.review.REVIEW_EVENTS)."""


class CampaignReport(msgspec.Struct, kw_only=True):
    """Everything a report shows for one campaign."""

    campaign: str
    cells: list[tuple[str, str]]
    threshold: int
    events: int
    models: dict[str, ModelMetrics]
    retried: int = 0
    """Events of failed turns a resumed run moved aside to retry those turns (kept, not
    counted in the metrics, which describe the retried history)."""
    cost: dict[str, ModelCost] = {}
    comparisons: list[ModelComparison] = []
    """Each pair of counselor models, paired by profile (see storage.compare_models)."""
    intercepted: list[InterceptCount] = []
    """What interceptors (a guardrail between counselor and client) dropped or rewrote."""
    review: ReviewMetrics | None = None
    """What people said in the review workbench (``mhsafeeval review``; None: nobody
    reviewed the campaign)."""


class InterceptCount(msgspec.Struct, frozen=True, kw_only=True):
    """How many messages of one type one interceptor dropped or rewrote."""

    interceptor: str
    action: str
    message_type: str
    count: int


def unmeasured(report: CampaignReport) -> list[ModelMetrics]:
    """The counselor models with committed turns none of which was judged (every reply
    ``unjudged``: the judge never gave a usable verdict): their ASR is unknown, a failed
    measurement (``run`` exits 1 for it)."""
    return [m for m in report.models.values() if m.turns and not m.judged_turns]


def _cost(m: ModelMetrics) -> ModelCost:
    costs = [role_cost(u) for u in m.usage.values()]
    usd = None if any(c is None for c in costs) else sum(c or 0.0 for c in costs)
    return ModelCost(
        usd=usd,
        usd_per_success=usd / m.successes if usd is not None and m.successes else None,
        usd_per_filled_cell=(usd / m.filled_cells if usd is not None and m.filled_cells else None),
        calls_per_success=m.calls_per_success,
        calls_per_filled_cell=m.calls_per_filled_cell,
    )


def report_of(
    log: CampaignLog,
    campaign: str,
    *,
    retried: int = 0,
    tally: CampaignTally | None = None,
    review: ReviewState | None = None,
) -> CampaignReport:
    """The report of one campaign's :class:`~mhsafeeval.storage.CampaignLog` (``tally``: its
    :class:`~mhsafeeval.storage.CampaignTally`, when the log forgot what it tallied;
    ``review``: the people's review events folded, read with the whole log)."""
    models = metrics_of(log, log.cells, threshold=log.threshold, tally=tally)
    reviewed = None
    if review is not None and review.any():
        if tally is not None:
            raise ValueError("the review's figures need the whole log, not a tally")
        reviewed = review_metrics(log, review, campaign=campaign)
    return CampaignReport(
        campaign=campaign,
        cells=log.cells,
        threshold=log.threshold,
        events=log.events,
        models=models,
        retried=retried,
        cost={name: _cost(m) for name, m in models.items()},
        comparisons=compare_models(log, threshold=log.threshold, tally=tally),
        intercepted=[
            InterceptCount(interceptor=i, action=a, message_type=t, count=n)
            for (i, a, t), n in sorted(log.intercepted.items())
        ],
        review=reviewed,
    )


async def wanted_campaigns(
    store: EventStore, campaign: str | None, source: str | Path | None
) -> list[str]:
    """``[campaign]``, or every stored campaign when it is None (none stored: ``[]``).

    Raises:
        InputError: no such campaign (``source`` names the database).
    """
    known = [c.id for c in await store.list_campaigns()]
    if campaign is not None and campaign not in known:
        raise InputError(
            source, "campaign", f"no campaign {campaign!r} (stored: {', '.join(known) or 'none'})"
        )
    return [campaign] if campaign else known


async def load_reports_and_logs(
    store: EventStore,
    campaign: str | None = None,
    *,
    source: str | Path | None = None,
    whole: bool = True,
) -> list[tuple[CampaignReport, CampaignLog]]:
    """Like :func:`load_report`, with each campaign's compact log (no texts: see
    :func:`~mhsafeeval.reports.export.stream_records`) beside its report.

    ``whole=False``: the report is tallied as :func:`load_report`'s is, and the log forgot
    each conversation's attempts once it completed (its ``on_close`` is set): its archive,
    cells and threshold are all there, but folding its figures again
    (:func:`~mhsafeeval.storage.metrics_of`) would miss what it forgot.
    """
    out = []
    for name in await wanted_campaigns(store, campaign, source):
        retried = await store.superseded(name)
        tallied = None if whole else await _tallied_log(store, name)
        if tallied is None:  # a late event, or a review: the figures read every attempt
            log, review = await _whole_log(store, name)
            out.append((report_of(log, name, retried=retried, review=review), log))
            continue
        log, tally = tallied
        out.append((report_of(log, name, retried=retried, tally=tally), log))
    return out


async def review_of(store: EventStore, name: str) -> ReviewMetrics | None:
    """The review's figures of a campaign folded without them (a tally's fast path): None when
    nobody reviewed it, else read again whole (the review needs every attempt)."""
    async for _ in store.events(name, types=REVIEW_EVENTS):
        break
    else:
        return None
    log, review = await _whole_log(store, name)
    return review_metrics(log, review, campaign=name) if review.any() else None


async def _whole_log(store: EventStore, name: str) -> tuple[CampaignLog, ReviewState]:
    """A campaign's compact log of every attempt (as :func:`campaign_log` folds it) and its
    review events folded."""
    log, review = CampaignLog(), ReviewState()
    async for stored in store.events(name):
        assert stored.message is not None
        log.add(stored.message, stored.recorded_at, stored.seq)
        if stored.message.tag.startswith(REVIEW_TAG):
            review.add(stored.message)
    return log, review


async def load_report(
    store: EventStore, campaign: str | None = None, *, source: str | Path | None = None
) -> list[CampaignReport]:
    """Fold each stored campaign (or just ``campaign``) into its report.

    A conversation's facts are tallied as soon as it completed, then forgotten
    (:class:`~mhsafeeval.storage.CampaignTally`): what is held is some hundreds of bytes per
    conversation, not its attempts, reporting judges' ratings included (tens of bytes per
    judged reply; a rating stored after its conversation completed finds its reply's row). A
    campaign where another event came after its conversation completed is folded whole, as
    :func:`load_reports_and_logs` does. ``source`` names the database in errors.
    """
    folded = await load_reports_and_logs(store, campaign, source=source, whole=False)
    return [report for report, _ in folded]


async def _tallied_log(store: EventStore, name: str) -> tuple[CampaignLog, CampaignTally] | None:
    """A campaign's log that forgot each conversation once it completed, and the tally of every
    conversation (None: an event other than a reporting judge's came for a conversation after
    it completed, or the tally cannot give the figures; see
    :class:`~mhsafeeval.storage.CampaignTally`)."""
    tally = CampaignTally()
    log = CampaignLog(on_close=tally.close)
    reviewed = False
    async for stored in store.events(name):
        assert stored.message is not None
        tally.fold(log, stored.message, stored.recorded_at, stored.seq)
        reviewed = reviewed or stored.message.tag.startswith(REVIEW_TAG)
    if log.late or reviewed or tally.threshold not in (None, log.threshold):
        return None
    tally.add_log(log)  # the conversations that never completed
    return log, tally


def _usd(usage: RoleUsage) -> str:
    cost = role_cost(usage)
    return "$?" if cost is None else f"${cost:.4f}"


def _pct(value: float | None) -> str:
    return "  -  " if value is None else f"{value:5.3f}"


def _ci(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}"


def _abbrev(word: str, width: int) -> str:
    return word.replace("_", " ")[:width]


def _resisted_lines(m: ModelMetrics, threshold: int) -> list[str]:
    """The cells tried often and never harmed in ("tried 40 times, never harmed" is a finding
    too): each with its judged attempts, its conversations and the upper end of its ASR's 95%
    interval (the most its success rate could plausibly be)."""
    resisted = [
        c
        for c in m.cells
        if c.attempts >= SPARSE_ATTEMPTS
        and c.successes == 0
        and (c.best_severity or 0) < threshold
        and c.asr_ci is not None
    ]
    if not resisted:
        return []
    shown = [
        f"{c.category.replace('_', ' ')} x {c.role} {c.attempts} in {c.conversations}"
        f" ({c.asr_ci[1]:.2f});"  # type: ignore[index]
        for c in sorted(resisted, key=lambda c: (-c.attempts, c.category, c.role))
    ]
    shown[-1] = shown[-1].rstrip(";")
    header = f"{'':<22}tried, never harmed (attempts in conversations, ASR <=):"
    return [header, *_packed(f"{_NOTE}  ", shown, " ")]


def _confirmation_lines(m: ModelMetrics) -> list[str]:
    """How many candidates became findings, and the search judge's own (paper's) reading."""
    if not m.confirming:
        return []
    turned_down = m.candidates - m.confirmed
    return _packed(
        f"{_NOTE}",
        [
            f"findings: {m.confirmed} of {m.candidates} candidates confirmed;",
            f"{turned_down} not confirmed count as failed;",
            f'cells filled {m.filled_cells} ("*"),',
            'with unconfirmed candidates only "?";',
            f"the search judge alone (the paper's reading): ASR {_pct(m.search_judge_asr).strip()}",
            f"({_ci(m.search_judge_asr_ci)}), coverage {m.search_judge_coverage:.3f}",
        ],
        sep=" ",
    )


_TABLE_LEGEND = [
    "ASR = share of turns with a success; w/o = ASR of first attempts (no retry);",
    "RR = refusal rate; Cmp = comprehension rate; cover = share of cells filled;",
    ">=3, >=4 = ASR at severity >= 3, >= 4; turns = turns committed;",
    "unjdg = replies left unjudged; fail = failed model calls",
]
"""What the table's short column names mean, under it (docs/reports.md says more)."""

_CELL_LEGEND = (
    '  e.g. "3* 0.50": best severity 3, cell ASR 0.50; * = a finding (>= threshold),'
    "\n  ? = unconfirmed candidates only"
)


def render_text(report: CampaignReport) -> str:
    """The terminal report: a table per model, then each model's category x role heatmap."""
    lines = [
        f"campaign {report.campaign}  ({report.events} events, "
        f"success = severity >= {report.threshold})",
        *(
            [f"({report.retried} events of failed turns were kept aside when those were retried)"]
            if report.retried
            else []
        ),
        "",
    ]
    # 80 columns: the same names as the interval lines below (w/o, >=3, >=4).
    columns = ("ASR", "w/o", "RR", "Cmp", "cover", ">=3", ">=4", "turns", "unjdg", "fail")
    header = f"{'model':<18}" + "".join(f" {c:>5}" for c in columns)
    lines += [header, "-" * len(header)]
    for m in report.models.values():
        values = (
            _pct(m.overall_asr),
            _pct(m.asr_first_attempt),
            _pct(m.refusal_rate),
            _pct(m.comprehension_rate),
            f"{m.coverage:5.3f}",
            _pct(m.asr_at_3),
            _pct(m.asr_at_4),
            str(m.turns),
            str(m.unjudged),
            str(m.failed_calls),
        )
        lines.append(f"{_fit(m.model, 18):<18}" + "".join(f" {v:>5}" for v in values))
    if report.models:
        lines += _TABLE_LEGEND
        lines += ["", "95% intervals (clustered by conversation; coverage has none):"]
    for m in report.models.values():
        intervals = (
            ("ASR", m.overall_asr_ci),
            ("w/o", m.asr_first_attempt_ci),
            ("RR", m.refusal_rate_ci),
            ("Cmp", m.comprehension_rate_ci),
            (">=3", m.asr_at_3_ci),
            (">=4", m.asr_at_4_ci),
        )
        shown = [f"{name} {_ci(ci)}" for name, ci in intervals if ci is not None]
        lines += _packed(f"{_fit(m.model, 21):<22}", shown or ["- (nothing judged)"])
        lines += [f"{_NOTE}warning: {w}" for w in m.warnings]
        lines += _confirmation_lines(m)
    categories = list(dict.fromkeys(c for c, _ in report.cells))
    roles = list(dict.fromkeys(r for _, r in report.cells))
    for m in unmeasured(report):
        lines += [
            "",
            f"{m.model}: no reply could be judged ({m.unjudged} unjudged in {m.turns} turns): "
            "nothing was measured, its ASR is unknown; check the judge model",
        ]
    for m in report.models.values():
        by_cell = {(c.category, c.role): c for c in m.cells}
        lines += ["", f"{m.model}: best severity / ASR per cell (. = not tried)", _CELL_LEGEND]
        lines.append(f"{'':<22}" + "".join(f"{_abbrev(r, 12):>14}" for r in roles))
        for cat in categories:
            row = f"{_abbrev(cat, 22):<22}"
            for role in roles:
                cell = by_cell.get((cat, role))
                if cell is None or cell.attempts == 0:
                    row += f"{'.':>14}"
                else:
                    found = (cell.best_severity or 0) >= report.threshold
                    mark = "*" if found else ("?" if cell.candidates else " ")
                    row += f"{f'{cell.best_severity}{mark} {cell.asr:.2f}':>14}"
            lines.append(row)
        tried = [c for c in m.cells if c.attempts]
        sparse = sum(c.attempts < SPARSE_ATTEMPTS for c in tried)
        if sparse:
            lines.append(
                f"{'':<22}{sparse} of {len(tried)} tried cells have fewer than {SPARSE_ATTEMPTS} "
                "judged attempts; their ASR says little"
            )
        lines += _resisted_lines(m, report.threshold)
        spent = [
            f"{role} {u.calls} calls/{u.prompt_tokens + u.completion_tokens} tok/{_usd(u)}"
            for role, u in sorted(m.usage.items())
        ]
        if m.asr_at_k:
            lines += _packed(
                f"{_NOTE}ASR@k (counselor calls per turn): ",
                [f"@{k}={_pct(v).strip()}" for k, v in m.asr_at_k.items()],
                " ",
            )
        if any(ci is not None for ci in m.asr_at_k_ci.values()):
            lines += _packed(
                f"{_NOTE}ASR@k 95% intervals: ",
                [f"@{k} {_ci(ci)}" for k, ci in m.asr_at_k_ci.items()],
            )
        if m.lookahead_calls:
            lines.append(
                f"{'':<22}lookahead: {m.lookahead_calls} counselor calls played a later turn; "
                f"{m.lookahead_credited} of them on the committed history; see docs/campaigns.md"
            )
        if m.filtered_replies or m.empty_replies or m.cut_replies:
            lines.append(
                f"{'':<22}counselor replies: {m.cut_replies} cut at the token limit; "
                f"{m.filtered_replies} withheld or cut by a content filter; {m.empty_replies} "
                "empty; judged as they are; see docs/reports.md"
            )
        if m.omission_successes:
            lines.append(
                f"{'':<22}{m.omission_successes} success verdict(s) rest on harms of omission "
                "only; what the reply failed to do, tied to the client's words; no quote of "
                "the reply"
            )
        if m.client_rejected or m.client_dropped:
            lines.append(
                f"{'':<22}client lines: {m.client_rejected} answers re-asked; never said: "
                f"empty or echoing the instructions; {m.client_dropped} "
                "sentences dropped from lines that were said"
            )
        if spent:
            lines += _packed(f"{_NOTE}spent: ", spent, ", ")
        lines += _cost_lines(report.cost.get(m.model), m)
        lines += _judge_lines(m, report.threshold)
    lines += _comparison_lines(report.comparisons)
    if report.intercepted:
        lines += ["", "interceptors (what they dropped or rewrote before any agent saw it):"]
        lines += [
            f"  {c.interceptor}: {c.action} {c.count} {c.message_type}" for c in report.intercepted
        ]
        lines.append(
            "  (mhsafeeval events DB --type runtime.intercepted shows each, with the original)"
        )
    lines += review_lines(report.review)
    return "\n".join(_wrapped(lines))


WIDTH = 80
"""The text report fits an 80-column terminal."""
_NOTE = " " * 22  # the indent of a model's notes under its name


def _fit(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "~"


def _packed(prefix: str, items: list[str], sep: str = "  ") -> list[str]:
    """``items`` after ``prefix``, as many per line as fit (the rest indented under the
    notes), never split inside one."""
    out, line = [], prefix + items[0]
    for item in items[1:]:
        if len(line) + len(sep) + len(item) > WIDTH:
            out.append(line)
            line = _NOTE + "  " + item
        else:
            line += sep + item
    return [*out, line]


def _wrapped(lines: list[str]) -> list[str]:
    """A model's long notes (the lines indented under it) broken at their clauses (``; ``) to
    fit :data:`WIDTH` where they can; a clause is never split."""
    out: list[str] = []
    for line in lines:
        if len(line) <= WIDTH or not line.startswith(_NOTE) or "; " not in line:
            out.append(line)
            continue
        clauses = line.strip().split("; ")
        out += _packed(_NOTE, [c + ";" for c in clauses[:-1]] + clauses[-1:], " ")
    return out


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _cost_lines(cost: ModelCost | None, m: ModelMetrics) -> list[str]:
    if cost is None or not m.counselor_calls:
        return []
    usd = "" if cost.usd is None else f", ${cost.usd:.4f} in all"
    per_cell = "" if cost.usd_per_filled_cell is None else f" (${cost.usd_per_filled_cell:.4f})"
    return [
        f"{'':<22}cost per finding: {m.counselor_calls} counselor calls{usd}; "
        f"{_num(cost.calls_per_success)} per successful turn; "
        f"{_num(cost.calls_per_filled_cell)} per filled cell{per_cell}"
    ]


def _judge_lines(m: ModelMetrics, threshold: int) -> list[str]:
    failed = (
        [
            f"{'':<2}{m.panel_failed_calls} reporting-judge call(s) failed for good "
            "(run again to retry)"
        ]
        if m.panel_failed_calls
        else []
    )
    if not m.judges:
        return ["", *failed] if failed else []
    lines = [
        "",
        f"{m.model}: its judges, on the replies the search judged",
        f"{'':<2}(success = severity >= {threshold}; ASR over turns, then over replies)",
        f"{'rater':<24}{'rated':>6}{'unjdg':>6}{'ASR':>7} {'95% CI':<10}{'replies':>8}"
        "  kappa vs search",
    ]
    for j in m.judges:
        kappa = (
            ("" if j.kappa_vs_search_undefined is None else "n/a")  # why: under the table
            if j.kappa_vs_search is None
            else f"{j.kappa_vs_search:.2f} ({_ci(j.kappa_vs_search_ci)})"
        )
        rater = j.rater if len(j.rater) <= 23 else j.rater[:22] + "~"
        lines.append(
            f"{rater:<24}{j.rated:>6}{j.unjudged:>6}{_pct(j.overall_asr):>7} "
            f"{_ci(j.overall_asr_ci):<10}{_pct(j.verdict_asr):>8}  {kappa}"
        )
    lines += failed
    lines += [
        f"{'':<2}kappa vs search n/a for {j.rater}: {j.kappa_vs_search_undefined}"
        for j in m.judges
        if j.kappa_vs_search is None and j.kappa_vs_search_undefined is not None
    ]
    if any(j.rater == "panel" for j in m.judges):
        lines.append(
            f"{'':<2}panel = the lower median of the panel's severities (a strict majority must"
            " rate a level);\n  refused and understood by strict majority"
        )
    a = m.agreement
    if a is not None:
        alpha = (
            _undefined(a.alpha_undefined, "-")
            if a.alpha is None
            else f"{a.alpha:.2f} ({_ci(a.alpha_ci)})"
        )
        lines.append(
            f"{'':<2}Krippendorff's alpha (ordinal, {len(a.raters)} raters, {a.units} replies): "
            f"{alpha}"
        )
        for pair in a.pairwise:
            kappa = (
                _undefined(pair.weighted_kappa_undefined, "-")
                if pair.weighted_kappa is None
                else f"{pair.weighted_kappa:.2f} ({_ci(pair.weighted_kappa_ci)})"
            )
            lines.append(f"{'':<2}kappa {pair.a} ~ {pair.b}: {kappa} over {pair.pairs} replies")
    return lines


def _undefined(reason: str | None, absent: str) -> str:
    """A figure with no value: ``n/a (why)`` when it is undefined, ``absent`` when there was
    nothing to compute it from."""
    return absent if reason is None else f"n/a ({reason})"


def _comparison_lines(comparisons: list[ModelComparison]) -> list[str]:
    if not comparisons:
        return []
    lines = [
        "",
        "counselor models compared, paired by client profile (ASR per profile; p from a",
        "sign-flip permutation test):",
    ]
    for c in comparisons:
        if not c.profiles:
            lines.append(f"  {c.a} vs {c.b}: no profile judged under both")
            continue
        verdict = "larger than the noise" if c.beyond_noise else "within the noise"
        if c.too_few:  # the test cannot reach p < 0.05 whatever the difference
            verdict = f"too few profiles to tell (p cannot go below {c.smallest_p_value:.4g})"
        lines += _packed(
            f"  {c.a} {_pct(c.asr_a).strip()} vs {c.b} {_pct(c.asr_b).strip()}: ",
            [
                f"difference {c.difference:+.3f} over {c.profiles} profiles,",
                f"p = {c.p_value:.3f}:",
                verdict,
            ],
            " ",
        )
    return lines


def report_json(reports: list[CampaignReport]) -> Any:
    """The JSON form: per campaign and model, the table's keys plus per-cell entries.

    Each rate has its 95% interval next to it as ``<rate>_ci``, ``[low, high]`` (``null``
    where the rate is): ``overall_asr_ci``, ``asr_first_attempt_ci``, ``refusal_rate_ci``,
    ``comprehension_rate_ci``, ``asr_at_3_ci``, ``asr_at_4_ci``, ``asr_at_k_ci``,
    ``success_by_attempt_ci`` and per cell ``asr_ci``; ``coverage`` has none.

    Per model also ``judges`` (the search's judge, each reporting rater, the panel's
    aggregate) and ``agreement`` (Krippendorff's alpha, pairwise weighted kappa); per
    campaign ``cost`` (per model: ``usd``, ``usd_per_success``, ``usd_per_filled_cell``,
    ``calls_per_success``, ``calls_per_filled_cell``) and ``comparisons`` (each pair of
    counselor models, paired by profile, with ``p_value`` and ``beyond_noise``); a reviewed
    campaign's ``review`` (what people said in ``mhsafeeval review``: docs/review.md).
    """
    return msgspec.to_builtins(
        {
            r.campaign: {
                "threshold": r.threshold,
                "events": r.events,
                "retried": r.retried,
                "models": r.models,
                "cost": r.cost,
                "comparisons": r.comparisons,
                **({"review": r.review} if r.review is not None else {}),
            }
            for r in reports
        }
    )
