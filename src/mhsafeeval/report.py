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
from mhsafeeval.messages import CampaignStarted, Message
from mhsafeeval.storage import EventStore, ModelMetrics, RoleUsage, compute_metrics

__all__ = ["SPARSE_ATTEMPTS", "CampaignReport", "load_report", "render_text", "report_json"]

SPARSE_ATTEMPTS = 5
"""A cell with fewer judged attempts than this is sparse: its ASR says little."""


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


async def load_report(
    store: EventStore, campaign: str | None = None, *, source: str | Path | None = None
) -> list[CampaignReport]:
    """Fold each stored campaign (or just ``campaign``) into its report.

    ``source`` names the database in errors.
    """
    known = [c.id for c in await store.list_campaigns()]
    if campaign is not None and campaign not in known:
        raise InputError(
            source, "campaign", f"no campaign {campaign!r} (stored: {', '.join(known) or 'none'})"
        )
    reports = []
    for name in [campaign] if campaign else known:
        events: list[Message] = []
        start: CampaignStarted | None = None
        async for stored in store.events(name):
            assert stored.message is not None
            events.append(stored.message)
            if isinstance(stored.message, CampaignStarted) and start is None:
                start = stored.message
        cells = [tuple(c) for c in start.cells] if start else []
        threshold = start.threshold if start else 2
        reports.append(
            CampaignReport(
                campaign=name,
                cells=cells,  # type: ignore[arg-type]
                threshold=threshold,
                events=len(events),
                models=compute_metrics(events, cells, threshold=threshold),  # type: ignore[arg-type]
                retried=await store.superseded(name),
            )
        )
    return reports


def _usd(usage: RoleUsage) -> str:
    cost = role_cost(usage)
    return "$?" if cost is None else f"${cost:.4f}"


def _pct(value: float | None) -> str:
    return "  -  " if value is None else f"{value:5.3f}"


def _ci(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}"


def _abbrev(word: str, width: int) -> str:
    return word.replace("_", " ")[:width]


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
    columns = ("ASR", "ASR w/o", "RR", "Cmp", "cover", "ASR>=3", "ASR>=4", "turns", "unjdg")
    header = f"{'model':<22}" + "".join(f"{c:>8}" for c in (*columns, "failed"))
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
        lines.append(f"{m.model[:22]:<22}" + "".join(f"{v:>8}" for v in values))
    if report.models:
        lines += ["", "95% intervals (conversations resampled; coverage has none; see README):"]
    for m in report.models.values():
        intervals = (
            ("ASR", m.overall_asr_ci),
            ("w/o", m.asr_first_attempt_ci),
            ("RR", m.refusal_rate_ci),
            ("Cmp", m.comprehension_rate_ci),
            (">=3", m.asr_at_3_ci),
            (">=4", m.asr_at_4_ci),
        )
        shown = "  ".join(f"{name} {_ci(ci)}" for name, ci in intervals if ci is not None)
        lines.append(f"{m.model[:22]:<22}" + (shown or "- (nothing judged)"))
    categories = list(dict.fromkeys(c for c, _ in report.cells))
    roles = list(dict.fromkeys(r for _, r in report.cells))
    for m in report.models.values():
        by_cell = {(c.category, c.role): c for c in m.cells}
        lines += ["", f"{m.model}: best severity / ASR per cell (. = not tried)"]
        lines.append(f"{'':<22}" + "".join(f"{_abbrev(r, 12):>14}" for r in roles))
        for cat in categories:
            row = f"{_abbrev(cat, 22):<22}"
            for role in roles:
                cell = by_cell.get((cat, role))
                if cell is None or cell.attempts == 0:
                    row += f"{'.':>14}"
                else:
                    mark = "*" if (cell.best_severity or 0) >= report.threshold else " "
                    row += f"{f'{cell.best_severity}{mark} {cell.asr:.2f}':>14}"
            lines.append(row)
        tried = [c for c in m.cells if c.attempts]
        sparse = sum(c.attempts < SPARSE_ATTEMPTS for c in tried)
        if sparse:
            lines.append(
                f"{'':<22}{sparse} of {len(tried)} tried cells have fewer than {SPARSE_ATTEMPTS} "
                "judged attempts: their ASR says little"
            )
        spent = ", ".join(
            f"{role} {u.calls} calls/{u.prompt_tokens + u.completion_tokens} tok/{_usd(u)}"
            for role, u in sorted(m.usage.items())
        )
        lines.append(
            f"{'':<22}ASR@k (counselor calls per turn): "
            + " ".join(f"@{k}={_pct(v).strip()}" for k, v in m.asr_at_k.items())
        )
        if any(ci is not None for ci in m.asr_at_k_ci.values()):
            lines.append(
                f"{'':<22}ASR@k 95% intervals: "
                + " ".join(f"@{k} {_ci(ci)}" for k, ci in m.asr_at_k_ci.items())
            )
        if m.lookahead_calls:
            lines.append(
                f"{'':<22}lookahead: {m.lookahead_calls} counselor calls played a later turn, "
                f"{m.lookahead_credited} of them on the committed history (see README)"
            )
        if m.filtered_replies or m.empty_replies or m.cut_replies:
            lines.append(
                f"{'':<22}counselor replies: {m.cut_replies} cut at the token limit, "
                f"{m.filtered_replies} withheld or cut by a content filter, {m.empty_replies} "
                "empty (judged as they are; see README)"
            )
        if m.omission_successes:
            lines.append(
                f"{'':<22}{m.omission_successes} success verdict(s) rest on harms of omission "
                "only (what the reply failed to do, tied to the client's words; no quote of "
                "the reply)"
            )
        if m.client_rejected or m.client_dropped:
            lines.append(
                f"{'':<22}client lines: {m.client_rejected} answers re-asked (empty or "
                f"repeating the client's instructions; never said), {m.client_dropped} "
                "sentences dropped from lines that were said"
            )
        if spent:
            lines.append(f"{'':<22}spent: {spent}")
    return "\n".join(lines)


def report_json(reports: list[CampaignReport]) -> Any:
    """The JSON form: per campaign and model, the table's keys plus per-cell entries.

    Each rate has its 95% interval next to it as ``<rate>_ci``, ``[low, high]`` (``null``
    where the rate is): ``overall_asr_ci``, ``asr_first_attempt_ci``, ``refusal_rate_ci``,
    ``comprehension_rate_ci``, ``asr_at_3_ci``, ``asr_at_4_ci``, ``asr_at_k_ci``,
    ``success_by_attempt_ci`` and per cell ``asr_ci``; ``coverage`` has none.
    """
    return msgspec.to_builtins(
        {
            r.campaign: {
                "threshold": r.threshold,
                "events": r.events,
                "retried": r.retried,
                "models": r.models,
            }
            for r in reports
        }
    )
