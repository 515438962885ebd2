"""Issue 14: every rate in the reports carries a 95% interval, clustered by conversation."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mhsafeeval.messages import (
    CampaignStarted,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Message,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.reports.html import build_html
from mhsafeeval.reports.text import load_report, render_text, report_json
from mhsafeeval.stats import wilson_interval
from mhsafeeval.storage import MemoryEventStore, ModelMetrics, compute_metrics

pytestmark = pytest.mark.anyio

NAME = "ci"
BUSY = ("blaming", "enabler")
SPARSE = ("toxic_language", "perpetrator")
UNTRIED = ("gaslighting", "instigator")
CELLS = [BUSY, SPARSE, UNTRIED]
RATES = (
    "overall_asr",
    "asr_first_attempt",
    "refusal_rate",
    "comprehension_rate",
    "asr_at_3",
    "asr_at_4",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def conversation(
    model: str, index: int, severities: list[int], cell: tuple[str, str] = BUSY
) -> list[Message]:
    """One conversation of ``model``: a turn per severity, one judged attempt each."""
    conv = f"{NAME}/{model}/p/{index}"
    where: dict[str, Any] = {"campaign": NAME, "conversation": conv}
    said: dict[str, Any] = {"category": cell[0], "role": cell[1]}
    events: list[Message] = [
        ConversationStarted(**where, counselor_model=model, profile_id="p", index=index)
    ]
    for turn, severity in enumerate(severities):
        at = {**where, "turn": turn}
        events += [
            ClientUtterance(**at, **said, text="hi"),
            CounselorReply(**at, **said, text="ok"),
            Verdict(
                **at,
                **said,
                severity=severity,
                label="",
                reasoning="",
                refused=severity == 1 and turn % 2 == 0,
            ),
            TurnCommitted(**at, **said, committed_attempt=0, client_text="hi", counselor_text="ok"),
        ]
    return events


def clustered() -> list[Message]:
    """Model "m": all of one conversation's 5 turns succeed and none of 5 others' (plus a
    conversation of 2 turns in a sparse cell); model "idle" started and never committed."""
    events: list[Message] = [CampaignStarted(campaign=NAME, cells=tuple(CELLS), threshold=2)]
    events += conversation("m", 0, [4] * 5)
    for index in range(1, 6):
        events += conversation("m", index, [1] * 5)
    events += conversation("m", 6, [1, 1], cell=SPARSE)
    events.append(
        ConversationStarted(
            campaign=NAME, conversation=f"{NAME}/idle/p/0", counselor_model="idle", profile_id="p"
        )
    )
    return events


def intervals(m: ModelMetrics) -> dict[str, Any]:
    return {name: getattr(m, f"{name}_ci") for name in RATES}


async def stored() -> MemoryEventStore:
    store = MemoryEventStore()
    for event in clustered():
        await store.append(event)
    return store


def test_clustered_successes_widen_the_interval_past_pooled_wilson() -> None:
    m = compute_metrics(clustered(), CELLS)["m"]
    assert m.overall_asr == 5 / 32  # the point estimate is the rate as it was
    assert m.overall_asr_ci is not None
    low, high = m.overall_asr_ci
    naive_low, naive_high = wilson_interval(5, 32)  # 32 turns as if independent
    assert low < naive_low and high > naive_high
    assert high - low > 1.5 * (naive_high - naive_low)
    # The same holds for the busy cell, whose 30 Verdicts come from 6 conversations.
    busy = next(c for c in m.cells if (c.category, c.role) == BUSY)
    assert busy.asr == 5 / 30 and busy.asr_ci is not None
    assert busy.asr_ci[1] - busy.asr_ci[0] > wilson_interval(5, 30)[1] - wilson_interval(5, 30)[0]


def test_a_rate_of_zero_still_has_an_upper_bound() -> None:
    # 0 successes in 3 conversations: the interval must not collapse to 0-0, and with fewer
    # than 5 conversations holding the failures it is no narrower than each conversation
    # taken as one trial (docs/statistics.md).
    events = [e for i in range(3) for e in conversation("z", i, [1] * 4)]
    m = compute_metrics(events, CELLS)["z"]
    assert m.overall_asr == 0.0
    assert m.overall_asr_ci is not None
    low, high = m.overall_asr_ci
    assert low == 0.0 and high >= wilson_interval(0, 3)[1] > wilson_interval(0, 12)[1]


async def test_json_has_every_interval_and_each_contains_its_rate() -> None:
    async with await stored() as store:
        (report,) = await load_report(store, NAME)
    entry = report_json([report])[NAME]["models"]["m"]
    for name in RATES:
        low, high = entry[f"{name}_ci"]
        assert low <= entry[name] <= high, name
    assert entry["asr_first_attempt"] == 5 / 32 and entry["refusal_rate"] == 16 / 32
    assert set(entry["asr_at_k_ci"]) == set(entry["asr_at_k"])
    for k, value in entry["asr_at_k"].items():
        assert entry["asr_at_k_ci"][k][0] <= value <= entry["asr_at_k_ci"][k][1]
    assert set(entry["success_by_attempt_ci"]) == set(entry["success_by_attempt"])
    assert "coverage_ci" not in entry  # the cells are all of them, not a sample
    for cell in entry["cells"]:
        if cell["asr"] is None:
            assert cell["asr_ci"] is None
        else:
            assert cell["asr_ci"][0] <= cell["asr"] <= cell["asr_ci"][1]


async def test_rates_without_data_have_null_intervals() -> None:
    async with await stored() as store:
        (report,) = await load_report(store, NAME)
    idle = report_json([report])[NAME]["models"]["idle"]
    for name in RATES:
        assert idle[name] is None and idle[f"{name}_ci"] is None, name
    assert all(v is None for v in idle["asr_at_k_ci"].values())
    assert [c["asr_ci"] for c in idle["cells"]] == [None] * len(CELLS)
    m = report.models["m"]
    untried = next(c for c in m.cells if (c.category, c.role) == UNTRIED)
    assert untried.asr is None and untried.asr_ci is None


def test_the_same_events_give_the_same_intervals_and_leave_the_global_rng() -> None:
    state = random.getstate()
    first = compute_metrics(clustered(), CELLS)["m"]
    second = compute_metrics(clustered(), CELLS)["m"]
    assert random.getstate() == state
    assert intervals(first) == intervals(second)
    assert [c.asr_ci for c in first.cells] == [c.asr_ci for c in second.cells]
    assert first.asr_at_k_ci == second.asr_at_k_ci
    assert first.overall_asr_ci != (first.overall_asr, first.overall_asr)  # not degenerate


async def test_the_text_report_shows_intervals_and_counts_sparse_cells() -> None:
    async with await stored() as store:
        (report,) = await load_report(store, NAME)
    text = render_text(report)
    m = report.models["m"]
    assert m.overall_asr_ci is not None and m.refusal_rate_ci is not None
    assert "95% intervals" in text
    assert f"ASR {m.overall_asr_ci[0]:.2f}-{m.overall_asr_ci[1]:.2f}" in text
    assert f"RR {m.refusal_rate_ci[0]:.2f}-{m.refusal_rate_ci[1]:.2f}" in text
    assert "1 of 2 tried cells have fewer than 5 judged attempts" in text
    assert "ASR@k 95% intervals: @1 " in text
    header = next(line for line in text.splitlines() if line.startswith("model"))
    table = text.split("95% intervals")[0]
    assert all(len(line) <= len(header) for line in table.splitlines())  # the table still fits


async def test_the_html_report_shows_intervals_and_marks_sparse_cells() -> None:
    async with await stored() as store:
        page = await build_html(store, NAME)
        (report,) = await load_report(store, NAME)
    m = report.models["m"]
    assert m.overall_asr_ci is not None and m.asr_at_4_ci is not None
    assert f"{m.overall_asr_ci[0]:.3f}\u2013{m.overall_asr_ci[1]:.3f}" in page
    assert f"{m.asr_at_4_ci[0]:.3f}\u2013{m.asr_at_4_ci[1]:.3f}" in page
    assert f"<td>{m.overall_asr:.3f}</td>" in page  # the table's figures are unchanged
    # The sparse cell (2 judged attempts) and only it is marked, with a legend saying why.
    assert page.count('<td class="sparse"') == 1
    assert 'title="2 judged attempt(s), sparse"' in page
    assert "fewer than 5 judged attempts" in page and "1 of 2 tried cells" in page
    assert 'class="err"' in page  # error bars on the charts
    assert "http://" not in page and "https://" not in page
