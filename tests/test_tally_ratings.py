"""Reporting judges' figures, tallied one conversation at a time (issue 16).

A campaign with ``Rating`` events (a ``[judges]`` panel, ``rejudge``) is reported from the
tally as any other: every rater's figures, the panel's vote and the agreement (alpha, kappa,
their intervals) equal the fold of the whole log, ratings stored after their conversation
completed included, and the report holds tens of bytes per judged reply, not its attempts.
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import GeneratedStore
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.messages import (
    CallFailed,
    CampaignStarted,
    ClientUtterance,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Directive,
    Exchange,
    Message,
    Rating,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
    lookahead_branch,
)
from mhsafeeval.providers import ModelSettings
from mhsafeeval.rejudge import rejudge
from mhsafeeval.reports.export import campaign_log
from mhsafeeval.reports.text import (
    _tallied_log,
    load_report,
    load_reports_and_logs,
    report_json,
    report_of,
)
from mhsafeeval.storage import CampaignLog, CampaignTally, MemoryEventStore, _metrics, metrics_of
from mhsafeeval.testing import scripted_models

CELLS = (("blaming", "enabler"), ("gaslighting", "perpetrator"), ("invalidation", "enabler"))
RATERS = (
    ("x", "panel"),
    ("y", "panel"),
    ("x#2", "panel"),
    ("z", "rejudge"),
    ("w", "either"),  # a panel member some replies were rejudged by
)


def _conversation(rng: random.Random, i: int, later: list[Message]) -> list[Message]:
    """One conversation of up to three turns of up to three attempts, with ratings: most
    before its end, some (``later``) stored after it, some missing, duplicated or unjudged."""
    model, profile = rng.choice(("m", "n")), f"p{rng.randrange(3)}"
    conv = f"c/{model}/{profile}/{i}"
    usage = Usage(model="scripted/x", prompt_tokens=10, completion_tokens=5)
    out: list[Message] = [
        ConversationStarted(
            campaign="c", conversation=conv, counselor_model=model, profile_id=profile, index=i
        )
    ]
    turns = rng.randint(1, 3)
    said: list[Exchange] = []
    for turn in range(turns):
        category, role = rng.choice(CELLS)
        plans = [(a, "") for a in range(rng.randint(1, 3))]
        if turn + 1 < turns and rng.random() < 0.4:
            plans.append((len(plans), lookahead_branch(1)))
        for attempt, branch in plans:
            cell: dict[str, Any] = dict(
                campaign="c", conversation=conv, turn=turn, attempt=attempt, branch=branch
            )
            cell.update(category=category, role=role)
            own = Exchange(f"u{i}.{turn}", f"r{i}.{turn}")
            ahead = (own if rng.random() < 0.7 else Exchange(own.client, "other"),)
            severity = rng.randint(1, 5)
            out += [
                Directive(**cell, controller="t"),
                ClientUtterance(
                    **cell, text=own.client, usage=usage, lookahead=ahead if branch else ()
                ),
                CounselorReply(**cell, text=own.counselor, usage=usage),
            ]
            if rng.random() < 0.15:
                out.append(Unjudged(**cell, reason="garbage", usage=usage))
                continue
            out.append(
                Verdict(
                    **cell,
                    severity=severity,
                    label="x",
                    reasoning="...",
                    refused=rng.random() < 0.3,
                    understood=rng.random() < 0.8,
                    judge=rng.choice(("rubric", "rubric", "other")),
                    usage=usage,
                )
            )
            for rater, source in RATERS:
                if rng.random() < 0.2:
                    continue  # never rated by this one
                if source == "either":
                    source = rng.choice(("panel", "rejudge"))
                rated = rng.choice((severity, severity, max(1, severity - 1), min(5, severity + 1)))
                rating = Rating(
                    **cell,
                    key=Rating.key_for(rater),
                    rater=rater,
                    judge=f"scripted/{rater.split('#')[0]}",
                    severity=None if rng.random() < 0.1 else rated,
                    reason="",
                    refused=rng.random() < 0.3,
                    understood=rng.random() < 0.8,
                    source=source,
                    usage=usage,
                )
                (later if rng.random() < 0.4 else out).append(rating)
                if rng.random() < 0.1:  # stored again (a resumed run): the first one stands
                    later.append(msgspec.structs.replace(rating, severity=5))
            if rng.random() < 0.1:
                failed = CallFailed(
                    campaign="c",
                    conversation=conv,
                    turn=turn,
                    attempt=attempt,
                    branch=branch,
                    key="rating:v@0",
                    agent="panel",
                    model="scripted/v",
                    error="down",
                )
                (later if rng.random() < 0.5 else out).append(failed)
        committed = rng.choice([a for a, b in plans if not b])
        said.append(Exchange(f"u{i}.{turn}", f"r{i}.{turn}"))
        out.append(
            TurnCommitted(
                campaign="c",
                conversation=conv,
                turn=turn,
                committed_attempt=committed,
                category=category,
                role=role,
                client_text=said[-1].client,
                counselor_text=said[-1].counselor,
            )
        )
    ending = rng.random()
    if ending < 0.85:
        status = "completed" if ending < 0.75 else "failed"
        out.append(
            ConversationFinished(campaign="c", conversation=conv, turns=turns, status=status)
        )
    return out


def synthetic(seed: int, conversations: int) -> tuple[list[Message], int]:
    """A rated campaign, conversations interleaved (they complete out of order), then the
    ratings stored after their conversations: the events and how many of those there are."""
    rng = random.Random(seed)
    events: list[Message] = [
        CampaignStarted(
            campaign="c", cells=CELLS, threshold=rng.choice((2, 3)), planned_conversations=9
        )
    ]
    later: list[Message] = []
    groups = [_conversation(rng, i, later) for i in range(conversations)]
    while any(groups):
        group = rng.choice([g for g in groups if g])
        events.append(group.pop(0))
        if later and rng.random() < 0.1:
            events.append(later.pop(rng.randrange(len(later))))
    rng.shuffle(later)
    return events + later, len(later)


def streamed(events: Iterable[Message]) -> tuple[CampaignLog, CampaignTally]:
    tally = CampaignTally()
    log = CampaignLog(on_close=tally.close)
    for seq, event in enumerate(events, 1):
        tally.fold(log, event, 0.0, seq)
    return log, tally


def figures(log: CampaignLog, tally: CampaignTally | None = None) -> Any:
    return msgspec.to_builtins(metrics_of(log, list(CELLS), threshold=log.threshold, tally=tally))


@pytest.fixture
def fewer_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both folds draw the same resamples, fewer of them: the comparison stays exact."""
    monkeypatch.setattr(_metrics, "RESAMPLES", 200)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.integers(0, 2**32 - 1), st.integers(4, 14))
def test_tallied_ratings_give_the_whole_folds_figures(
    fewer_resamples: None, seed: int, conversations: int
) -> None:
    events, _ = synthetic(seed, conversations)
    log, tally = streamed(events)
    assert log.late == 0 and tally.closed  # every later rating found its reply's row
    tally.add_log(log)
    assert figures(log, tally) == figures(CampaignLog.of(events))


def test_the_tally_has_each_raters_figures_the_vote_and_the_agreement(
    fewer_resamples: None,
) -> None:
    events, later = synthetic(7, 30)
    log, tally = streamed(events)
    tally.add_log(log)
    assert later > 20 and log.late == 0
    got = metrics_of(log, list(CELLS), threshold=log.threshold, tally=tally)
    assert got == metrics_of(CampaignLog.of(events), list(CELLS), threshold=log.threshold)
    m = got["m"]
    raters = [j.rater for j in m.judges]
    assert raters[0] == "search" and raters[-1] == "panel"
    assert set(raters[1:-1]) == {name for name, _ in RATERS}
    sources = {j.rater: j.source for j in m.judges}
    assert (sources["z"], sources["w"], sources["panel"]) == ("rejudge", "mixed", "aggregate")
    assert all(j.unjudged for j in m.judges[1:-1])  # some ratings had no valid severity
    assert m.agreement is not None and m.agreement.alpha_ci is not None
    assert all(p.weighted_kappa_ci is not None for p in m.agreement.pairwise)
    assert any(c.alpha_ci is not None for c in m.cells)
    assert m.lookahead_calls and m.panel_failed_calls


def test_a_rating_of_a_reply_the_tally_does_not_hold_stays_late() -> None:
    events, _ = synthetic(3, 6)
    finished = [e for e in events if isinstance(e, ConversationFinished)]
    done = next(e for e in finished if e.status == "completed")
    stray = Rating(
        campaign="c",
        conversation=done.conversation,
        turn=0,
        attempt=9,  # no such attempt: the whole log gives it an attempt of its own
        category="blaming",
        role="enabler",
        rater="x",
        severity=2,
        key=Rating.key_for("x"),
    )
    log, _ = streamed([*events, stray])
    assert log.late == 1


async def _store(events: Iterable[Message]) -> MemoryEventStore:
    store = MemoryEventStore()
    await store.register_campaign("c")
    for event in events:
        await store.append(event)
    await store.flush()
    return store


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_the_report_of_a_rated_campaign_is_tallied(
    anyio_backend: str, fewer_resamples: None
) -> None:
    events, _ = synthetic(11, 12)
    async with await _store(events) as store:
        [report] = await load_report(store, "c")
        [(_, log)] = await load_reports_and_logs(store, "c", whole=False)
        whole = report_of(await campaign_log(store, "c"), "c")
    assert log.on_close is not None  # the tally's: no whole fold
    assert report_json([report]) == report_json([whole])
    assert report.models["m"].judges


PANELED = """
[campaign]
name = "c"
seed = 3
max_turns = 3
max_attempts = 3
conversations_per_profile = 3
concurrency = 4
controller = "{controller}"
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]

[search]
simulations = 4
in_flight = 2
samples_per_action = 1

[judges]
samples = 2

[judges.panel.a]
provider = "scripted/demo-judge"
temperature = 0.5

[judges.panel.b]
provider = "scripted/demo-counselor"
temperature = 0.5
"""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("controller", ["map-elites", "uct"])
@pytest.mark.anyio
async def test_a_paneled_and_rejudged_campaign_reports_as_its_whole_fold(
    anyio_backend: str, controller: str, fewer_resamples: None
) -> None:
    text = PANELED.format(controller=controller) + scripted_models()
    config = parse_config(text, "c.toml")
    async with MemoryEventStore() as store:
        with anyio.fail_after(120):  # a hang guard
            assert (await run_campaign(config, store, config_text=text)).status == "completed"
            await rejudge(store, [ModelSettings(provider="scripted/demo-mutator")], source="db")
        whole_log = await campaign_log(store, "c")
        ratings = [e async for e in store.events("c", types=["judge.rating"])]
        [(report, log)] = await load_reports_and_logs(store, "c", whole=False)
    assert ratings and log.on_close is not None and not log.attempts
    assert report_json([report]) == report_json([report_of(whole_log, "c")])
    raters = [j.rater for j in report.models["demo"].judges]
    assert "panel" in raters and "scripted/demo-mutator" in raters


def _events(conversations: int, ratings: bool) -> Iterator[Message]:
    """:func:`_generated`, without the reporting judges' events unless ``ratings``."""
    for message in _generated(conversations):
        if ratings or not isinstance(message, Rating | CallFailed):
            yield message


def _generated(conversations: int) -> Iterator[Message]:
    """Conversations of :func:`synthetic`, eight at a time, each group's later ratings after
    it (so that what the read holds is the tally, not the events waiting to be made)."""
    rng = random.Random(5)
    yield CampaignStarted(campaign="c", cells=CELLS, threshold=2)
    for start in range(0, conversations, 8):
        later: list[Message] = []
        group = [_conversation(rng, i, later) for i in range(start, start + 8)]
        while any(group):
            yield next(g for g in group if g).pop(0)
            rng.shuffle(group)
        yield from later


def _held(conversations: int, *, ratings: bool = True) -> tuple[int, int]:
    """Bytes the report's fold still holds once it read the campaign, and its judged replies."""

    async def main() -> tuple[int, int]:
        async with GeneratedStore(lambda: _events(conversations, ratings)) as store:
            await store.register_campaign("c")
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            tallied = await _tallied_log(store, "c")
            assert tallied is not None  # tallied, not folded whole
            log, tally = tallied
            assert log.late == 0
            replies = sum(len(m.ratings) for m in tally.models.values())
            return store.held - base, replies

    tracemalloc.start()
    try:
        return anyio.run(main, backend="asyncio")
    finally:
        tracemalloc.stop()


def test_the_report_of_a_rated_campaign_holds_tens_of_bytes_per_rated_reply() -> None:
    """What the ratings add to the fold's bytes at the end of the read, per judged reply (400
    conversations against 40, each reply rated by up to five raters): its row, not its facts
    (an attempt's facts are about a kilobyte)."""
    small, large = 40, 400
    (rated_small, replies_small), (rated_large, replies_large) = _held(small), _held(large)
    plain_small, plain_large = _held(small, ratings=False)[0], _held(large, ratings=False)[0]
    added = (rated_large - rated_small) - (plain_large - plain_small)
    per_reply = added / (replies_large - replies_small)
    assert per_reply < 150, per_reply
