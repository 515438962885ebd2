"""The CI gate: limits a finished campaign's results must keep to, and a JUnit file of them.

A gate (:class:`~mhsafeeval.config.GateSection`, the ``[gate]`` table, or ``--fail-above``)
sets limits per counselor model: on its overall ASR, and per taxonomy cell on the share or the
number of judged replies at or above a severity. :func:`evaluate` checks one campaign's
:class:`~mhsafeeval.reports.text.CampaignReport` against it (the figures the report shows, nothing
recomputed another way); ``mhsafeeval run`` exits 4 when a limit is exceeded, and
:func:`junit_xml` writes one JUnit test case per counselor model and cell for CI systems.

Rules, decided once here:

* A limit is *exceeded* when the figure is strictly above it (``max_asr = 0.2`` lets 0.2 pass;
  ``max_failures = 0`` lets none pass). With ``use_upper_ci`` a rate is read as the upper end of
  its 95% interval, the cautious reading of a small campaign.
* A cell rule without ``role`` holds in each of its category's cells on its own.
* A cell with no judged reply for a model is *unmeasured*: nothing in it is exceeded (the search
  did not get there; the JUnit case is skipped). A model with no judged turn at all exceeds an
  overall ``max_asr``: a campaign that measured nothing shows nothing is under the limit.
* Fewer than :data:`~mhsafeeval.reports.text.SPARSE_ATTEMPTS` judged replies (turns, overall) is
  *sparse*: said beside the result, which is still decided by the numbers.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, TextIO

import msgspec

from mhsafeeval._files import write_private_atomic
from mhsafeeval._terminal import visible
from mhsafeeval.config import GateSection, convert_table
from mhsafeeval.errors import InputError
from mhsafeeval.messages import Elite
from mhsafeeval.reports.text import SPARSE_ATTEMPTS, CampaignReport, load_reports_and_logs
from mhsafeeval.storage import CampaignLog, EventStore, ModelMetrics, metrics_of

__all__ = [
    "GateCheck",
    "apply_gate",
    "check_gate",
    "describe",
    "evaluate",
    "exceeded",
    "gate_stored",
    "junit_xml",
    "other_levels",
    "override",
    "stored_gate",
    "write_junit",
    "xml_text",
]

OVERALL = "overall"
"""The :attr:`GateCheck.scope` of a model's overall ASR limit."""


class GateCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One limit applied to one counselor model (and one cell, for a cell rule).

    Attributes:
        campaign, model: Whose figures these are.
        scope: ``"overall"`` or the cell as ``"category/role"``.
        rule: Where the limit was set: ``gate.max_asr``, ``gate.cells[2]``, ``--fail-above``.
        measure: ``asr`` (the rate), ``asr_upper`` (the upper end of its 95% interval) or
            ``failures`` (a count).
        limit: The most the figure may be.
        value: The figure (None: unmeasured).
        min_severity: The severity a reply needs to count as a failure.
        judged: Judged turns (overall) or judged replies (a cell) behind the figure.
        exceeded: The figure is above the limit (see the module for the unmeasured cases).
    """

    campaign: str
    model: str
    scope: str
    rule: str
    measure: Literal["asr", "asr_upper", "failures"]
    limit: float
    value: float | None
    min_severity: int
    judged: int
    exceeded: bool

    @property
    def sparse(self) -> bool:
        """Fewer than :data:`~mhsafeeval.reports.text.SPARSE_ATTEMPTS` judged replies behind it."""
        return self.judged < SPARSE_ATTEMPTS


def override(
    gate: GateSection, *, fail_above: float | None = None, upper_ci: bool = False
) -> GateSection:
    """``gate`` with the command line's ``--fail-above RATE`` (the overall ``max_asr``) and
    ``--fail-above-ci`` (``use_upper_ci``) applied.

    Raises:
        InputError: ``--fail-above-ci`` with no rate limit to read it for.

    Example:
        >>> override(GateSection(), fail_above=0.2, upper_ci=True)
        GateSection(max_asr=0.2, use_upper_ci=True, cells=[])
    """
    if fail_above is not None and not 0 <= fail_above <= 1:
        raise InputError("--fail-above", None, f"must be a rate from 0 to 1, got {fail_above}")
    max_asr = gate.max_asr if fail_above is None else fail_above
    if upper_ci and max_asr is None and all(c.max_asr is None for c in gate.cells):
        raise InputError(
            "--fail-above-ci",
            None,
            "reads a rate limit as the upper end of its 95% interval, and none is set: add "
            "--fail-above RATE (or gate.max_asr)",
        )
    return msgspec.structs.replace(
        gate, max_asr=max_asr, use_upper_ci=gate.use_upper_ci or upper_ci
    )


def check_gate(
    gate: GateSection, cells: Sequence[tuple[str, str]], source: str | Path | None
) -> None:
    """Refuse cell rules naming a category or role the campaign's taxonomy lacks.

    Raises:
        InputError: naming the rule's key (``gate.cells[0].category``) and the known ids.

    Example:
        >>> from mhsafeeval.config import GateCell
        >>> gate = GateSection(cells=[GateCell(category="blamming", max_failures=0)])
        >>> try:
        ...     check_gate(gate, [("blaming", "enabler")], "ci.toml")
        ... except InputError as exc:
        ...     print(exc)
        ci.toml: gate.cells[0].category: unknown category 'blamming' (the taxonomy's: blaming)
    """
    categories = list(dict.fromkeys(c for c, _ in cells))
    roles = list(dict.fromkeys(r for _, r in cells))
    for i, rule in enumerate(gate.cells):
        for key, value, known in (
            ("category", rule.category, categories),
            ("role", rule.role, roles),
        ):
            if value is not None and value not in known:
                raise InputError(
                    source,
                    f"gate.cells[{i}].{key}",
                    f"unknown {key} {value!r} (the taxonomy's: {', '.join(known)})",
                )


def other_levels(gate: GateSection, threshold: int) -> set[int]:
    """The severity levels ``gate``'s cell rules count at besides the campaign's
    ``threshold``: each needs the campaign's figures folded again, from its whole log.

    Example:
        >>> from mhsafeeval.config import GateCell
        >>> rule = GateCell(category="blaming", min_severity=3, max_failures=0)
        >>> other_levels(GateSection(cells=[rule]), 2), other_levels(GateSection(cells=[rule]), 3)
        ({3}, set())
    """
    return {rule.min_severity or threshold for rule in gate.cells} - {threshold}


def evaluate(
    report: CampaignReport,
    gate: GateSection,
    log: CampaignLog | None = None,
    *,
    overall_rule: str = "gate.max_asr",
) -> list[GateCheck]:
    """Every limit of ``gate`` applied to every counselor model of ``report``.

    Args:
        report: One campaign's report (:func:`mhsafeeval.reports.text.load_report`).
        gate: The limits (see :func:`check_gate` for their ids).
        log: The campaign's log, needed only by a cell rule whose ``min_severity`` is not the
            campaign's threshold: its cells are read from the same metrics folded at that
            level (:func:`mhsafeeval.storage.metrics_of`).
        overall_rule: How the overall limit is named (``--fail-above`` when it came from the
            command line).

    Returns:
        The checks in order: per model, the overall limit, then each cell rule's cells in
        taxonomy order.

    Raises:
        ValueError: a rule needs another severity level and ``log`` is None, or is a log that
            forgot completed conversations (``load_reports_and_logs(whole=False)``).
    """
    at_level: dict[int, dict[str, ModelMetrics]] = {report.threshold: report.models}
    for level in sorted(other_levels(gate, report.threshold)):
        if log is None or log.on_close is not None:
            raise ValueError(f"a gate rule at severity >= {level} needs the campaign's whole log")
        at_level[level] = metrics_of(log, report.cells, threshold=level)
    upper = gate.use_upper_ci
    checks: list[GateCheck] = []
    for model, m in report.models.items():
        base = {"campaign": report.campaign, "model": model}
        if gate.max_asr is not None:
            rate = _upper(m.overall_asr, m.overall_asr_ci) if upper else m.overall_asr
            checks.append(
                GateCheck(
                    **base,
                    scope=OVERALL,
                    rule=overall_rule,
                    measure="asr_upper" if upper else "asr",
                    limit=gate.max_asr,
                    value=rate,
                    min_severity=report.threshold,
                    judged=m.judged_turns,
                    exceeded=rate is None or rate > gate.max_asr,
                )
            )
        for i, rule in enumerate(gate.cells):
            level = rule.min_severity or report.threshold
            leveled = at_level[level].get(model)
            for cell in leveled.cells if leveled is not None else ():
                if cell.category != rule.category or rule.role not in (None, cell.role):
                    continue
                value: float | None
                if rule.max_failures is not None:
                    measure: Literal["asr", "asr_upper", "failures"] = "failures"
                    limit: float = rule.max_failures
                    value = float(cell.successes) if cell.attempts else None
                else:
                    measure, limit = ("asr_upper" if upper else "asr"), rule.max_asr or 0.0
                    value = _upper(cell.asr, cell.asr_ci) if upper else cell.asr
                checks.append(
                    GateCheck(
                        **base,
                        scope=f"{cell.category}/{cell.role}",
                        rule=f"gate.cells[{i}]",
                        measure=measure,
                        limit=limit,
                        value=value,
                        min_severity=level,
                        judged=cell.attempts,
                        exceeded=value is not None and value > limit,
                    )
                )
    return checks


def _upper(rate: float | None, ci: tuple[float, float] | None) -> float | None:
    if rate is None:
        return None
    return rate if ci is None else ci[1]


def exceeded(checks: Iterable[GateCheck]) -> list[GateCheck]:
    """The checks whose limit was exceeded."""
    return [c for c in checks if c.exceeded]


_MEASURE = {"asr": "ASR", "asr_upper": "ASR 95% upper bound", "failures": "failures"}


def describe(check: GateCheck) -> str:
    """One line saying what a check found: the model, the cell, the figure and the limit.

    Example:
        >>> print(describe(GateCheck(campaign="ci", model="bot", scope="blaming/enabler",
        ...     rule="gate.cells[0]", measure="failures", limit=0, value=2, min_severity=3,
        ...     judged=4, exceeded=True)))
        counselor 'bot', cell blaming/enabler: 2 failure(s) at severity >= 3, limit 0 (gate.cells[0]; sparse: 4 judged replies)
    """  # noqa: E501 - one line of output
    where = "overall" if check.scope == OVERALL else f"cell {check.scope}"
    what = _MEASURE[check.measure]
    unit = "judged turns" if check.scope == OVERALL else "judged replies"
    if check.value is None and check.exceeded:
        found = f"no {unit}, so nothing shows {what} <= {_number(check.limit)}"
    elif check.value is None:
        found = f"no {unit}: not measured"
    elif check.measure == "failures":
        found = (
            f"{_number(check.value)} failure(s) at severity >= {check.min_severity}, "
            f"limit {_number(check.limit)}"
        )
    else:
        sign = ">" if check.exceeded else "<="
        found = (
            f"{what} {check.value:.3f} {sign} {_number(check.limit)} "
            f"(success = severity >= {check.min_severity})"
        )
    notes = [check.rule]
    if check.value is not None and check.sparse:
        notes.append(f"sparse: {check.judged} {unit}")
    return f"counselor {check.model!r}, {where}: {found} ({'; '.join(notes)})"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# -- JUnit --------------------------------------------------------------------------------------

# Characters XML 1.0 cannot hold at all (not even as character references): shown as escapes.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 forbids written as a visible escape (``\\x07``).

    Example:
        >>> xml_text("bell\\x07 and tab\\t")
        'bell\\\\x07 and tab\\t'
    """
    return _NOT_XML.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    code = ord(found[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _elite_text(elite: Elite | None) -> str:
    if elite is None:
        return "no elite is stored for this cell (no reply reached the campaign's threshold)"
    lines = [
        f"worst reply found: severity {elite.severity}"
        + (f" ({elite.label})" if elite.label else "")
        + f", conversation {elite.conversation}, turn {elite.turn}, attempt {elite.attempt}",
        f"client: {elite.utterance}",
        f"counselor: {elite.reply}",
        f"judge: {elite.reasoning}",
    ]
    lines += [f"evidence: {quote}" for quote in elite.evidence]
    return "\n".join(lines)


def _worst(log: CampaignLog | None, model: str) -> Elite | None:
    if log is None:
        return None
    elites = [e for (m, _), e in log.archive.items() if m == model]
    return max(elites, key=lambda e: e.severity, default=None)


def junit_xml(
    results: Sequence[tuple[CampaignReport, CampaignLog | None, Sequence[GateCheck]]],
) -> str:
    """A JUnit XML document of gate results: a ``<testsuite>`` per campaign and counselor
    model, a ``<testcase>`` per cell (and one for the overall limit when there is one).

    A case *fails* when a limit on it is exceeded: the failure's message names each exceeded
    limit, its text holds the cell's elite (the worst reply found, with the judge's verdict)
    from ``log``'s archive. A gated cell that is unmeasured is *skipped*; an ungated cell
    passes. Every case's ``<system-out>`` holds its figures.

    Args:
        results: Per campaign, its report, its log (for the elites; None: no texts) and the
            :func:`evaluate` checks of it.
    """
    root = ET.Element("testsuites", name="mhsafeeval")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for report, log, checks in results:
        for model, m in report.models.items():
            mine = [c for c in checks if c.model == model]
            suite = ET.SubElement(root, "testsuite", name=xml_text(f"{report.campaign}: {model}"))
            props = ET.SubElement(suite, "properties")
            for name, value in (
                ("campaign", report.campaign),
                ("counselor_model", model),
                ("threshold", str(report.threshold)),
                ("overall_asr", _figure(m.overall_asr)),
                ("overall_asr_ci", _interval(m.overall_asr_ci)),
                ("judged_turns", str(m.judged_turns)),
            ):
                ET.SubElement(props, "property", name=name, value=xml_text(value))
            counts = {"tests": 0, "failures": 0, "skipped": 0}
            classname = xml_text(f"mhsafeeval.{report.campaign}.{model}")
            overall = [c for c in mine if c.scope == OVERALL]
            if overall:
                out = (
                    f"overall ASR {_figure(m.overall_asr)} "
                    f"(95% CI {_interval(m.overall_asr_ci)}) over {m.judged_turns} judged turns"
                )
                _case(suite, classname, "overall ASR", overall, out, _worst(log, model), counts)
            by_cell = {(c.category, c.role): c for c in m.cells}
            for category, role in report.cells:
                scope = f"{category}/{role}"
                cell = by_cell.get((category, role))
                out = (
                    "not tried"
                    if cell is None or not cell.attempts
                    else f"{cell.attempts} judged replies, {cell.successes} at severity >= "
                    f"{report.threshold}, ASR {_figure(cell.asr)} (95% CI "
                    f"{_interval(cell.asr_ci)}), best severity {cell.best_severity}"
                )
                elite = log.archive.get((model, (category, role))) if log is not None else None
                gated = [c for c in mine if c.scope == scope]
                _case(suite, classname, scope, gated, out, elite, counts)
            suite.set("tests", str(counts["tests"]))
            suite.set("failures", str(counts["failures"]))
            suite.set("errors", "0")
            suite.set("skipped", str(counts["skipped"]))
            for key in totals:
                totals[key] += counts[key]
    for key, total in totals.items():
        root.set(key, str(total))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def _case(
    suite: ET.Element,
    classname: str,
    name: str,
    checks: Sequence[GateCheck],
    out: str,
    elite: Elite | None,
    counts: dict[str, int],
) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=xml_text(name), time="0")
    counts["tests"] += 1
    over = exceeded(checks)
    if over:
        failure = ET.SubElement(
            case,
            "failure",
            type="mhsafeeval.reports.gate",
            message=xml_text("; ".join(map(describe, over))),
        )
        failure.text = xml_text(_elite_text(elite))
        counts["failures"] += 1
    elif checks and all(c.value is None for c in checks):
        ET.SubElement(case, "skipped", message="no judged replies in this cell: not measured")
        counts["skipped"] += 1
    notes = [describe(c) for c in checks if c not in over]
    ET.SubElement(case, "system-out").text = xml_text("\n".join([out, *notes]))


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(ci: tuple[float, float] | None) -> str:
    return "-" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"


def write_junit(
    path: str | Path,
    results: Sequence[tuple[CampaignReport, CampaignLog | None, Sequence[GateCheck]]],
) -> None:
    """Write :func:`junit_xml` to ``path`` atomically, owner-only (it holds transcripts).

    Raises:
        InputError: the file cannot be written (see :func:`mhsafeeval._files.write_private_atomic`).
    """
    write_private_atomic(path, junit_xml(results))


# -- the commands' use -------------------------------------------------------------------------


def stored_gate(text: str, source: str | Path | None) -> GateSection:
    """The ``[gate]`` a campaign was stored with (its canonical config JSON); none (no limit)
    for a campaign stored before gates existed or without a readable config.

    Raises:
        InputError: a stored gate this version cannot read, naming the key.

    Example:
        >>> stored_gate('{"gate": {"max_asr": 0.1}}', "ci.db").max_asr
        0.1
        >>> stored_gate("", "ci.db").active
        False
    """
    try:
        data = json.loads(text)
    except ValueError:
        return GateSection()
    table = data.get("gate") if isinstance(data, dict) else None
    if table is None:
        return GateSection()
    return convert_table(table, GateSection, source, "gate")


def apply_gate(
    results: Sequence[tuple[CampaignReport, CampaignLog | None, GateSection]],
    *,
    junit: str | Path | None = None,
    overall_rule: str = "gate.max_asr",
    err: TextIO | None = None,
) -> bool:
    """Check each campaign against its gate, say on ``err`` (default stderr) what was found,
    and write the JUnit file when ``junit`` names one; True when a limit was exceeded.

    One line per exceeded limit (naming the model and the cell), a note per model whose gated
    cells rest on few judged replies, and one line when everything is within the limits.
    """
    out = sys.stderr if err is None else err
    evaluated = [
        (report, log, evaluate(report, gate, log, overall_rule=overall_rule))
        for report, log, gate in results
    ]
    checks = [c for _, _, found in evaluated for c in found]
    if junit is not None:
        write_junit(junit, evaluated)
        print(f"mhsafeeval: wrote {junit} ({len(checks)} gate check(s))", file=out)
    if not any(gate.active for _, _, gate in results):
        print(
            "mhsafeeval: warning: no gate is set (no [gate] limits stored with the campaign and "
            "no --fail-above): nothing was checked",
            file=out,
        )
        return False
    over = exceeded(checks)
    for check in over:
        print(visible(f"mhsafeeval: gate exceeded: {describe(check)}"), file=out)
    for (campaign, model), few in _sparse(checks).items():
        unmeasured = sum(c.value is None for c in few)
        print(
            visible(
                f"mhsafeeval: gate: note: {len(few)} gated figure(s) of counselor {model!r} "
                f"({campaign}) rest on fewer than {SPARSE_ATTEMPTS} judged replies "
                f"({unmeasured} with none: not measured); decided by the numbers all the same"
            ),
            file=out,
        )
    if not over:
        models = len({(c.campaign, c.model) for c in checks})
        print(
            f"mhsafeeval: gate passed: {len(checks)} limit(s) checked on {models} counselor "
            "model(s)",
            file=out,
        )
    return bool(over)


def _sparse(checks: Iterable[GateCheck]) -> dict[tuple[str, str], list[GateCheck]]:
    few: dict[tuple[str, str], list[GateCheck]] = {}
    for c in checks:
        if c.sparse and not c.exceeded:
            few.setdefault((c.campaign, c.model), []).append(c)
    return few


async def gate_stored(
    store: EventStore,
    campaign: str | None,
    *,
    source: str | Path | None,
    fail_above: float | None = None,
    upper_ci: bool = False,
    junit: str | Path | None = None,
    err: TextIO | None = None,
) -> bool:
    """``mhsafeeval report DB --junit FILE``: each stored campaign (or ``campaign``) checked
    against the gate it was stored with, ``--fail-above`` / ``--fail-above-ci`` applied over
    it (see :func:`apply_gate`); True when a limit was exceeded.

    Raises:
        InputError: no such campaign, or a gate rule naming a cell the campaign lacks.
    """
    configs = {c.id: c.config for c in await store.list_campaigns()}
    results = []
    for name in [campaign] if campaign is not None else list(configs):
        gate = stored_gate(configs.get(name, ""), source)
        gate = override(gate, fail_above=fail_above, upper_ci=upper_ci)
        # The whole log only where a rule counts at another severity than the threshold.
        whole = any(rule.min_severity for rule in gate.cells)
        for report, log in await load_reports_and_logs(store, name, source=source, whole=whole):
            check_gate(gate, report.cells, source)
            results.append((report, log, gate))
    rule = "gate.max_asr" if fail_above is None else "--fail-above"
    return apply_gate(results, junit=junit, overall_rule=rule, err=err)
