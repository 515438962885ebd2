"""What the report says about its statistics (issue 35): too few conversations for an interval,
figures that are undefined (and why), resamples a bootstrap had to skip, and paired tests
that cannot reach significance at their sample size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from mhsafeeval.messages import (
    CampaignStarted,
    ConversationStarted,
    CounselorReply,
    Message,
    Rating,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.reports.text import CampaignReport, load_report, render_text, report_json
from mhsafeeval.storage import CampaignLog, MemoryEventStore, compare_models, compute_metrics

CELLS = [("blaming", "enabler"), ("gaslighting", "enabler")]


def _campaign(
    conversations: Sequence[Sequence[tuple[int, int | None]]], model: str = "m", profiles: int = 0
) -> list[Message]:
    """One model; per conversation, its turns as (search severity, rater x's severity or None:
    no rating). ``profiles``: spread the conversations over that many profiles (0: one each)."""
    events: list[Message] = [CampaignStarted(campaign="c", cells=tuple(CELLS), threshold=2)]
    for i, turns in enumerate(conversations):
        profile = f"p{i % profiles if profiles else i}"
        conv = f"c/{model}/{profile}/{i}"
        for turn, (severity, rated) in enumerate(turns):
            ids: dict[str, Any] = {"campaign": "c", "conversation": conv, "turn": turn}
            cat, role = CELLS[turn % 2]
            if turn == 0:
                events.append(ConversationStarted(**ids, counselor_model=model, profile_id=profile))
            events += [
                CounselorReply(**ids, category=cat, role=role, text="r"),
                Verdict(**ids, category=cat, role=role, severity=severity, label="", reasoning=""),
            ]
            if rated is not None:
                events.append(
                    Rating(
                        **ids,
                        key=Rating.key_for("x"),
                        category=cat,
                        role=role,
                        rater="x",
                        judge="scripted/x",
                        severity=rated,
                        source="rejudge",
                    )
                )
            events.append(
                TurnCommitted(
                    **ids,
                    committed_attempt=0,
                    category=cat,
                    role=role,
                    client_text="c",
                    counselor_text="r",
                )
            )
    return events


def _report(events: list[Message]) -> CampaignReport:
    async def main() -> CampaignReport:
        async with MemoryEventStore() as store:
            await store.register_campaign("c")
            for e in events:
                await store.append(e)
            await store.flush()
            [report] = await load_report(store, "c")
            return report

    return anyio.run(main, backend="asyncio")


def test_too_few_conversations_for_an_interval_are_a_warning() -> None:
    few = [[(1, None), (3, None), (1, None)] for _ in range(3)]
    m = compute_metrics(_campaign(few), CELLS)["m"]
    assert any("3 conversations" in w for w in m.warnings)
    text = render_text(_report(_campaign(few)))
    assert "3 conversations judged" in text and "can be trusted" in text
    enough = [[(1, None), (3, None), (1, None)] for _ in range(12)]
    assert not any(
        "conversations" in w for w in compute_metrics(_campaign(enough), CELLS)["m"].warnings
    )


def test_a_kappa_without_variation_is_not_available_and_says_why() -> None:
    # The search's judge and rater x said 1 to every reply: no chance agreement to correct for.
    same = [[(1, 1), (1, 1)] for _ in range(6)]
    report = _report(_campaign(same))
    m = report.models["m"]
    assert m.agreement is not None
    [pair] = m.agreement.pairwise
    assert pair.weighted_kappa is None and pair.weighted_kappa_ci is None
    assert pair.weighted_kappa_undefined is not None
    assert m.agreement.alpha is None and m.agreement.alpha_undefined is not None
    text = render_text(report)
    assert "kappa search ~ x: n/a (no variation)" in text
    assert "kappa vs search n/a for x: no variation" in text
    assert "alpha (ordinal, 2 raters, 12 replies): n/a (" in text
    data = report_json([report])["c"]["models"]["m"]
    assert data["agreement"]["pairwise"][0]["weighted_kappa"] is None


def test_resamples_skipped_for_want_of_variation_are_counted_in_the_report() -> None:
    # 9 conversations where both said 1 throughout, 3 where they disagree: about 3% of the
    # resamples draw only the agreeing ones and have no kappa.
    agreed = [[(1, 1), (1, 1)] for _ in range(9)]
    disagreed = [[(1, 3), (3, 1)], [(2, 1), (1, 2)], [(3, 1), (1, 3)]]
    m = compute_metrics(_campaign(agreed + disagreed), CELLS)["m"]
    assert m.agreement is not None
    [pair] = m.agreement.pairwise
    assert pair.weighted_kappa is not None and pair.weighted_kappa < 0
    assert pair.weighted_kappa_ci is not None and pair.weighted_kappa_ci[1] < 0.5
    assert any("skipped" in w and "kappa search ~ x" in w for w in m.warnings)


def test_five_profiles_are_too_few_to_tell_two_counselors_apart() -> None:
    # 12% against 88% on each of 5 profiles: the most extreme of the 2**5 sign patterns, and
    # still p = 2/32 = 0.0625. That is "too few profiles to tell", not "within the noise".
    a = [[(3, None)] + [(1, None)] * 7 for _ in range(5)]
    b = [[(1, None)] + [(3, None)] * 7 for _ in range(5)]
    events = _campaign(a, "a") + _campaign(b, "b")[1:]
    text = render_text(_report(events))
    assert "within the noise" not in text
    assert "too few profiles to tell" in text
    [c] = compare_models(CampaignLog.of(events), threshold=2)
    assert c.profiles == 5 and c.p_value == 0.0625 and not c.beyond_noise
    assert c.too_few and c.smallest_p_value == 0.0625
    # With 6 profiles the test can tell (p = 2/64).
    six = _campaign(a + a[:1], "a") + _campaign(b + b[:1], "b")[1:]
    [c] = compare_models(CampaignLog.of(six), threshold=2)
    assert c.beyond_noise and not c.too_few


def test_the_warning_of_cells_on_few_conversations_fits_80_columns() -> None:
    import random

    from mhsafeeval.reports.text import report_of
    from test_report_speed import _campaign

    log = CampaignLog.of(_campaign(random.Random(3), 2))
    report = report_of(log, "c")
    text = render_text(report)
    assert any("few conversations" in w for m in report.models.values() for w in m.warnings)
    assert "lookahead:" in text  # a long note of its own, wrapped too
    assert [line for line in text.splitlines() if len(line) > 80] == []
