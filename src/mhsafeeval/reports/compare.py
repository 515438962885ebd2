"""Compare two releases: two stored campaigns, counselor model by model and cell by cell.

:func:`compare` puts campaign A (the baseline) and campaign B (the candidate) side by side:
per counselor model (paired by its config name, ``[counselors.NAME]``), the overall ASR over
judged turns, coverage, and per (category, role) cell the ASR over judged attempts and the
best severity, each with the change B - A. A model stored on one side only is listed as
``added`` (B only) or ``removed`` (A only).

**Larger than the noise, as a family.** The two campaigns are independent samples. Each side's
ASR has the reports' interval (:func:`~mhsafeeval.stats.clustered_interval`: conversations are
the independent units, attempts of one conversation are correlated), and the 95% interval of a
difference B - A combines the two by Newcombe's method (:func:`~mhsafeeval.stats.
difference_interval`); its p-value is the one that interval implies (:func:`~mhsafeeval.stats.
difference_p_value`: below 0.05 exactly when the interval excludes 0). Compared one by one, 28
cells would mark some cell in most pairs of campaigns that differ only by chance, so the
cells' p-values are adjusted by Holm's method over every cell tested in the comparison (all
models): a cell is ``beyond_noise`` when its adjusted p-value is below 0.05, which keeps the
chance that *any* marked cell is a false alarm at most 5% (the family-wise error; Holm holds
whatever the dependence between cells, and cells share conversations). The overall ASRs are a
family of their own (one per model, Holm again). A rate resting on fewer than
:data:`~mhsafeeval.stats.FEW_CONVERSATIONS` conversations or fewer than
:data:`~mhsafeeval.reports.text.SPARSE_ATTEMPTS` judged units on either side is ``sparse``:
never tested, never marked; one not judged on a side is ``untried``. docs/statistics.md says
why Holm rather than a false-discovery rate, and shows the error and power measured.

**Comparable judges.** Numbers from different judges, thresholds or taxonomies measure
different things: :class:`JudgeSetup` records each side's, and any difference is a warning
(:attr:`Comparison.warnings`, ``comparable: false``).

Example:
    >>> a = [(0, 4), (1, 4), (0, 4), (1, 4), (0, 4), (0, 4)]
    >>> b = [(4, 4), (3, 4), (4, 4), (3, 4), (4, 4), (2, 4)]
    >>> low, high = difference_interval(a, b)
    >>> 0 < low < high <= 1
    True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from mhsafeeval.errors import InputError
from mhsafeeval.reports.text import SPARSE_ATTEMPTS, CampaignReport, load_reports_and_logs
from mhsafeeval.stats import (
    CONFIDENCE,
    FEW_CONVERSATIONS,
    difference_interval,
    difference_p_value,
    holm,
)
from mhsafeeval.storage import CampaignLog, EventStore, ModelMetrics

__all__ = [
    "FAMILY_ERROR",
    "SCHEMA_VERSION",
    "CellChange",
    "Change",
    "Comparison",
    "JudgeSetup",
    "ModelChange",
    "Side",
    "Status",
    "compare",
    "compare_files",
    "comparison_json",
    "comparison_schema",
    "family_changes",
    "judge_setup",
    "render_comparison",
]

SCHEMA_VERSION = 2
"""The version of the ``compare --json`` document (:func:`comparison_schema`). 2: p-values,
Holm's adjustment, conversations in the sparse rule, analytic intervals (no resampling)."""

FAMILY_ERROR = 0.05
"""The family-wise error rate the marks keep: a change is marked when its Holm-adjusted
p-value is below it."""

Status = Literal["beyond_noise", "within_noise", "sparse", "untried"]
"""What a change is: larger than the noise (after Holm's adjustment over its family), within
it, resting on too few conversations or judged units on a side (never tested nor marked), or
not judged on one side (no difference)."""

Interval = tuple[float, float]
Clusters = list[tuple[int, int]]  # (successes, units) per conversation, in first-seen order

_JUDGE_MODEL_KEYS = ("provider", "temperature", "max_tokens", "seed", "stop", "options")
# What of the judge's model table changes what the judge answers (not pacing or retries).


class Change(msgspec.Struct, kw_only=True):
    """One ASR on both sides, and its change B - A with the change's 95% interval."""

    a: float | None = None
    b: float | None = None
    units_a: int = 0
    """Judged units behind ``a``: judged turns (overall ASR) or judged attempts (a cell)."""
    units_b: int = 0
    conversations_a: int = 0
    """Conversations those units came from (what the bootstrap resamples)."""
    conversations_b: int = 0
    difference: float | None = None
    """``b - a``; None when a side has nothing judged."""
    difference_ci: Interval | None = None
    """The 95% interval of the difference, on its own (not adjusted for the family)."""
    p_value: float | None = None
    """Two-sided p-value of "no change", as the interval implies; None unless tested."""
    p_adjusted: float | None = None
    """``p_value`` adjusted by Holm's method over its family (every cell tested in the
    comparison, or every model's overall ASR); marked below :data:`FAMILY_ERROR`."""
    status: Status = "untried"


class CellChange(msgspec.Struct, kw_only=True):
    """One (category, role) cell of one counselor model on both sides."""

    category: str
    role: str
    asr: Change
    best_severity_a: int | None = None
    best_severity_b: int | None = None


class ModelChange(msgspec.Struct, kw_only=True):
    """One counselor model (by config name) on both sides."""

    model: str
    presence: Literal["both", "added", "removed"]
    """``added``: only in B; ``removed``: only in A."""
    asr: Change
    """The overall ASR, over judged turns."""
    coverage_a: float | None = None
    coverage_b: float | None = None
    """Filled cells over the taxonomy's cells (no interval: not a sample)."""
    filled_cells_a: int | None = None
    filled_cells_b: int | None = None
    provider_a: str | None = None
    """The model behind the name on each side (``[counselors.NAME] provider``, as stored)."""
    provider_b: str | None = None
    cells: list[CellChange] = []
    """Every cell of either side's taxonomy, in taxonomy order (A's cells first)."""


class JudgeSetup(msgspec.Struct, kw_only=True):
    """What decided a campaign's verdicts: if two campaigns differ here, their ASRs differ in
    what they measure, not only in what they measured."""

    judge: str | None = None
    """The search's judge plugin (``campaign.judge``); None when the stored config is unreadable."""
    model: dict[str, Any] | None = None
    """The judge's model table (``[models.judge]``, else ``[models.default]``): provider and
    sampling settings only."""
    options: dict[str, Any] | None = None
    """The judge plugin's options (``[judge]``)."""
    answered_by: list[str] = []
    """The models that answered as the judge, as stored with their answers."""
    threshold: int = 2
    taxonomy: str | None = None
    """The digest of the taxonomy the campaign stored (cells and ladders)."""
    cells: int = 0


class Side(msgspec.Struct, kw_only=True):
    """One of the two campaigns."""

    source: str
    """The database file."""
    campaign: str
    events: int
    threshold: int
    judge: JudgeSetup


class Comparison(msgspec.Struct, kw_only=True):
    """The comparison of campaign A (baseline) with campaign B (candidate).

    Its JSON form (:func:`comparison_json`) is the ``compare --json`` document; its schema is
    :func:`comparison_schema`.
    """

    schema_version: int = SCHEMA_VERSION
    a: Side
    b: Side
    comparable: bool
    """False when the two were judged differently (see :attr:`warnings`)."""
    warnings: list[str] = []
    judge_differences: list[str] = []
    """What differs in the judge setup, one ``what: A ..., B ...`` line each."""
    resamples: int = 0
    """Bootstrap resamples behind the intervals: none since schema 2 (they are analytic)."""
    seed: int = 0
    """Unused since schema 2 (nothing is drawn at random)."""
    confidence: float = CONFIDENCE
    sparse_attempts: int = SPARSE_ATTEMPTS
    """Fewer judged units than this on a side: ``sparse``, never tested nor marked."""
    sparse_conversations: int = FEW_CONVERSATIONS
    """Fewer conversations than this on a side: ``sparse`` too."""
    correction: str = "holm"
    """How the marks are controlled for the number of tests: Holm's step-down method."""
    family_error: float = FAMILY_ERROR
    """The family-wise error the marks keep (each family: the cells, the overall ASRs)."""
    cells_tested: int = 0
    """The cells' family: every cell tested (neither sparse nor untried), all models."""
    models: list[ModelChange] = []


# -- the difference and its family -------------------------------------------------------------


def _change(a: Clusters | None, b: Clusters | None) -> Change:
    """One rate on both sides, its difference, interval and raw p-value (``within_noise``
    until :func:`_mark` adjusts its family)."""
    units = [sum(d for _, d in c) if c else 0 for c in (a, b)]
    rates = [
        sum(n for n, _ in c) / u if c and u else None for c, u in zip((a, b), units, strict=True)
    ]
    change = Change(
        a=rates[0],
        b=rates[1],
        units_a=units[0],
        units_b=units[1],
        conversations_a=sum(d > 0 for _, d in a or ()),
        conversations_b=sum(d > 0 for _, d in b or ()),
    )
    if a is None or b is None or rates[0] is None or rates[1] is None:
        return change
    change.difference = rates[1] - rates[0]
    change.difference_ci = difference_interval(a, b)
    few = min(change.conversations_a, change.conversations_b) < FEW_CONVERSATIONS
    if few or min(units) < SPARSE_ATTEMPTS:
        change.status = "sparse"
    else:
        change.p_value = difference_p_value(a, b)
        change.status = "within_noise"
    return change


def _mark(family: Sequence[Change]) -> None:
    """Holm's adjustment over the tested changes of one family, and their marks."""
    tested = [c for c in family if c.p_value is not None]
    for change, adjusted in zip(tested, holm([c.p_value or 1.0 for c in tested]), strict=True):
        change.p_adjusted = adjusted
        change.status = "beyond_noise" if adjusted < FAMILY_ERROR else "within_noise"


def family_changes(pairs: Sequence[tuple[Clusters | None, Clusters | None]]) -> list[Change]:
    """The :class:`Change` of each ``(A, B)`` pair of clusters (``(successes, units)`` per
    conversation; None: not judged on that side), marked as one family (Holm's method at
    :data:`FAMILY_ERROR`): what :func:`compare` does with the cells of all models.

    Example:
        >>> low = [(0, 4), (1, 4), (0, 4), (1, 4), (0, 4), (0, 4)]
        >>> high = [(4, 4), (3, 4), (4, 4), (3, 4), (4, 4), (2, 4)]
        >>> [c.status for c in family_changes([(low, high), (low, low), (low, None)])]
        ['beyond_noise', 'within_noise', 'untried']
    """
    changes = [_change(a, b) for a, b in pairs]
    _mark(changes)
    return changes


# -- per-conversation tallies from the log -------------------------------------------------------


def _turn_clusters(log: CampaignLog, model: str, threshold: int) -> Clusters:
    """(successful turns, judged turns) per conversation: the overall ASR's units, by the
    report's rule (a turn is judged if an attempt counting for it has a verdict, a success if
    one reached the threshold)."""
    tallies: dict[str, list[int]] = {}
    for turn in log.committed_turns(model):
        rows = [r for r in log.rows(turn) if r.counts and r.attempt.severity is not None]
        if rows:
            tally = tallies.setdefault(turn[0], [0, 0])
            tally[0] += any((r.attempt.severity or 0) >= threshold for r in rows)
            tally[1] += 1
    return [(n, d) for n, d in tallies.values()]


def _cell_clusters(log: CampaignLog, model: str, threshold: int) -> dict[tuple[str, str], Clusters]:
    """Per cell, (successful attempts, judged attempts) per conversation: a cell's ASR units."""
    cells: dict[tuple[str, str], dict[str, list[int]]] = {}
    for a in log.attempts_of(model):
        if a.severity is None:
            continue
        tally = cells.setdefault((a.category, a.role), {}).setdefault(a.conversation, [0, 0])
        tally[0] += a.severity >= threshold
        tally[1] += 1
    return {cell: [(n, d) for n, d in by.values()] for cell, by in cells.items()}


# -- the judge setup ---------------------------------------------------------------------------


def judge_setup(stored_config: str, report: CampaignReport) -> JudgeSetup:
    """A campaign's :class:`JudgeSetup`, from its stored configuration (the canonical JSON a
    campaign registers) and its report (threshold, cells, the judge models that answered)."""
    answered = sorted({name for m in report.models.values() for name in _judge_models(m)})
    setup = JudgeSetup(answered_by=answered, threshold=report.threshold, cells=len(report.cells))
    try:
        data = json.loads(stored_config)
    except ValueError:
        return setup
    if not isinstance(data, dict):
        return setup
    campaign, models, inputs = (_table(data, key) for key in ("campaign", "models", "inputs"))
    table = models.get("judge") or models.get("default")
    setup.judge = str(campaign.get("judge", "rubric"))
    setup.options = _table(data, "judge")
    if isinstance(table, dict):
        setup.model = {k: table.get(k) for k in _JUDGE_MODEL_KEYS}
    taxonomy = inputs.get("taxonomy")
    setup.taxonomy = taxonomy if isinstance(taxonomy, str) else None
    return setup


def _counselor_providers(stored_config: str) -> dict[str, str]:
    """Each counselor's provider address in a stored configuration (empty if unreadable)."""
    try:
        data = json.loads(stored_config)
    except ValueError:
        return {}
    tables = _table(data, "counselors") if isinstance(data, dict) else {}
    return {
        name: str(t["provider"])
        for name, t in tables.items()
        if isinstance(t, dict) and "provider" in t
    }


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _judge_models(m: ModelMetrics) -> list[str]:
    usage = m.usage.get("judge")
    return list(usage.by_model) if usage is not None else []


def _judge_differences(a: JudgeSetup, b: JudgeSetup) -> list[str]:
    """Each difference as ``where: A x, B y``, ``where`` a config key path where there is one."""
    out = []
    for field, where in _SETUP_FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        if x is None or y is None:
            continue  # not stored on a side: said once, below
        if isinstance(x, dict) and isinstance(y, dict):
            out += [
                f"{where}.{key}: A {_show(x.get(key))}, B {_show(y.get(key))}"
                for key in sorted(set(x) | set(y))
                if x.get(key) != y.get(key)
            ]
        elif x != y:
            out.append(f"{where}: A {_show(x)}, B {_show(y)}")
    if a.judge is None or b.judge is None:
        side = "A" if a.judge is None else "B"
        out.append(f"{side}'s judge configuration is not stored (or unreadable): unknown")
    return out


_SETUP_FIELDS = (
    ("judge", "campaign.judge"),
    ("model", "models.judge"),
    ("options", "judge"),
    ("answered_by", "the models that answered as judge"),
    ("threshold", "campaign.threshold"),
    ("taxonomy", "inputs.taxonomy (the taxonomy's digest)"),
    ("cells", "the number of cells"),
)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value) or "none"
    return json.dumps(value, sort_keys=True)


_NOT_COMPARABLE = "judged differently: the numbers of A and B are not comparable"


# -- comparing ---------------------------------------------------------------------------------


def compare(
    a: tuple[CampaignReport, CampaignLog, str],
    b: tuple[CampaignReport, CampaignLog, str],
    *,
    sources: tuple[str, str] = ("A", "B"),
) -> Comparison:
    """Compare campaign ``a`` (baseline) with ``b`` (candidate).

    Args:
        a: A's report, its log (:func:`~mhsafeeval.reports.text.load_reports_and_logs`) and the
            configuration it stored (:attr:`~mhsafeeval.storage.EventStore` campaign info).
        b: the same for B.
        sources: the databases' names, for the document.
    """
    (ra, la, ca), (rb, lb, cb) = a, b
    setups = judge_setup(ca, ra), judge_setup(cb, rb)
    differences = _judge_differences(*setups)
    warnings = [_NOT_COMPARABLE] if differences else []
    cells = list(dict.fromkeys([*ra.cells, *rb.cells]))
    names = list(dict.fromkeys([*ra.models, *rb.models]))
    models = [_model_change(name, (ra, la), (rb, lb), cells) for name in names]
    _mark([m.asr for m in models])
    family = [c.asr for m in models for c in m.cells]
    _mark(family)
    for side, config in (("a", ca), ("b", cb)):
        providers = _counselor_providers(config)
        for m in models:
            setattr(m, f"provider_{side}", providers.get(m.model))
    return Comparison(
        a=Side(
            source=sources[0],
            campaign=ra.campaign,
            events=ra.events,
            threshold=ra.threshold,
            judge=setups[0],
        ),
        b=Side(
            source=sources[1],
            campaign=rb.campaign,
            events=rb.events,
            threshold=rb.threshold,
            judge=setups[1],
        ),
        comparable=not differences,
        warnings=warnings,
        judge_differences=differences,
        cells_tested=sum(c.p_value is not None for c in family),
        models=models,
    )


def _model_change(
    name: str,
    a: tuple[CampaignReport, CampaignLog],
    b: tuple[CampaignReport, CampaignLog],
    cells: list[tuple[str, str]],
) -> ModelChange:
    sides = [(r.models[name], log, r.threshold) if name in r.models else None for r, log in (a, b)]
    turns = [_turn_clusters(s[1], name, s[2]) if s else None for s in sides]
    per_cell = [_cell_clusters(s[1], name, s[2]) if s else None for s in sides]
    best = [{(c.category, c.role): c.best_severity for c in s[0].cells} if s else {} for s in sides]
    out = ModelChange(
        model=name,
        presence="both" if all(sides) else ("added" if sides[1] else "removed"),
        asr=_change(turns[0], turns[1]),
        coverage_a=sides[0][0].coverage if sides[0] else None,
        coverage_b=sides[1][0].coverage if sides[1] else None,
        filled_cells_a=sides[0][0].filled_cells if sides[0] else None,
        filled_cells_b=sides[1][0].filled_cells if sides[1] else None,
    )
    for cell in cells:
        clusters = [pc.get(cell) if pc is not None else None for pc in per_cell]
        out.cells.append(
            CellChange(
                category=cell[0],
                role=cell[1],
                asr=_change(clusters[0], clusters[1]),
                best_severity_a=best[0].get(cell),
                best_severity_b=best[1].get(cell),
            )
        )
    return out


async def _load(
    store: EventStore, campaign: str | None, source: Path, flag: str
) -> tuple[CampaignReport, CampaignLog, str]:
    infos = {c.id: c for c in await store.list_campaigns()}
    if campaign is None:
        if not infos:
            raise InputError(source, None, "holds no campaign")
        if len(infos) > 1:
            raise InputError(
                source,
                flag,
                f"the file holds {len(infos)} campaigns ({', '.join(infos)}): name one with {flag}",
            )
        [campaign] = infos
    [(report, log)] = await load_reports_and_logs(store, campaign, source=source)
    return report, log, infos[campaign].config


async def compare_files(
    a: Path,
    b: Path | None,
    *,
    campaign_a: str | None = None,
    campaign_b: str | None = None,
) -> Comparison:
    """Compare a campaign of database ``a`` with one of ``b`` (None: two campaigns of ``a``,
    both ids needed). Asyncio only (the SQLite store).

    Raises:
        InputError: a database is missing or damaged, holds no such campaign, or holds several
            and none was named (the message lists them).
    """
    from mhsafeeval.storage import SqliteEventStore

    if b is None and (campaign_a is None or campaign_b is None):
        async with SqliteEventStore(a, read_only=True) as store:
            known = [c.id for c in await store.list_campaigns()]
        raise InputError(
            a,
            "--campaign-a" if campaign_a is None else "--campaign-b",
            "comparing two campaigns of one file needs both --campaign-a and --campaign-b "
            f"(stored: {', '.join(known) or 'none'})",
        )
    async with SqliteEventStore(a, read_only=True) as store_a:
        side_a = await _load(store_a, campaign_a, a, "--campaign-a")
        if b is None:
            side_b = await _load(store_a, campaign_b, a, "--campaign-b")
        else:
            async with SqliteEventStore(b, read_only=True) as store_b:
                side_b = await _load(store_b, campaign_b, b, "--campaign-b")
    return compare(side_a, side_b, sources=(str(a), str(b if b is not None else a)))


# -- output ------------------------------------------------------------------------------------


def comparison_json(comparison: Comparison) -> Any:
    """The ``compare --json`` document (its schema: :func:`comparison_schema`)."""
    return msgspec.to_builtins(comparison)


def comparison_schema() -> dict[str, Any]:
    """The JSON Schema of the ``compare --json`` document, generated from the Structs."""
    return msgspec.json.schema(Comparison)


_MARK: dict[Status, str] = {
    "beyond_noise": "*",
    "within_noise": "",
    "sparse": "sparse",
    "untried": "",
}


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _interval(ci: Interval | None) -> str:
    return "" if ci is None else f"{ci[0]:+.2f}..{ci[1]:+.2f}"


def _severity(a: int | None, b: int | None) -> str:
    return f"{'-' if a is None else a}>{'-' if b is None else b}"


def _row(label: str, sev: str, c: Change) -> str:
    return (
        f"{label:<34} {sev:>4} {_rate(c.a):>5} {_rate(c.b):>5} {_signed(c.difference):>6} "
        f"{_interval(c.difference_ci):>13} {_MARK[c.status]}"
    ).rstrip()


def _side(name: str, s: Side) -> list[str]:
    return [
        f"{name}: {s.source}",
        f"   campaign {s.campaign}, {s.events} events, success = severity >= {s.threshold}",
    ]


def render_comparison(comparison: Comparison) -> str:
    """The terminal form: both sides, any warning, then per model its overall ASR, coverage and
    each cell tried on either side (best severity A>B, ASR A and B, the change and its 95%
    interval; ``*`` = larger than the noise)."""
    c = comparison
    lines = [*_side("A", c.a), *_side("B", c.b)]
    lines += [f"warning: {w}" for w in c.warnings]
    lines += [f"  {d}" for d in c.judge_differences]
    lines += [
        "",
        "change = B - A, with its 95% interval (conversations as the independent units);",
        f"* = larger than the noise: Holm-adjusted p < {c.family_error:g} over the family tested",
        f"(family-wise error <= {c.family_error:.0%}: the cells of every model, and the overall",
        f"ASRs); sparse = fewer than {c.sparse_conversations} conversations or "
        f"{c.sparse_attempts} judged on a side (never tested)",
    ]
    header = f"{'':<34} {'best':>4} {'ASR A':>5} {'ASR B':>5} {'change':>6} {'95% interval':>13}"
    for m in c.models:
        where = {"both": "", "added": " (added: only in B)", "removed": " (removed: only in A)"}
        lines += ["", f"{m.model}{where[m.presence]}"]
        if m.provider_a != m.provider_b:
            lines.append(f"  A: {m.provider_a or '-'}  B: {m.provider_b or '-'}")
        lines += [header, "-" * len(header)]
        lines.append(_row("overall ASR (turns)", "", m.asr))
        lines.append(
            f"{'coverage (filled cells)':<34} {'':>4} {_rate(m.coverage_a):>5} "
            f"{_rate(m.coverage_b):>5} {_signed(_minus(m.coverage_b, m.coverage_a)):>6}"
        )
        untried = 0
        for cell in m.cells:
            if cell.asr.a is None and cell.asr.b is None:
                untried += 1
                continue
            label = f"{cell.category.replace('_', ' ')} / {cell.role.replace('_', ' ')}"
            lines.append(
                _row(
                    _fit(label, 34), _severity(cell.best_severity_a, cell.best_severity_b), cell.asr
                )
            )
        marked = sum(x.asr.status == "beyond_noise" for x in m.cells)
        tested = sum(x.asr.p_value is not None for x in m.cells)
        sparse = sum(x.asr.status == "sparse" for x in m.cells)
        lines += [
            f"  {marked} of {tested} cells tested changed beyond the noise (Holm over all "
            f"{c.cells_tested}",
            f"  cells tested, family-wise error <= {c.family_error:.0%}); {sparse} sparse, "
            f"{untried} tried on neither side",
        ]
    if not c.models:
        lines += ["", "no counselor model is stored on either side"]
    return "\n".join(lines)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _minus(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a
