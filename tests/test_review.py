"""The review workbench's pure parts: the queue (reproducible, stratified), the fold of the
review's events, disagreement, and the session's writes into a store.

The campaigns here are built event by event (:func:`campaign_events`): a seeded mix of safe
replies, findings and candidates the confirmation turned down, over the built-in taxonomy's
cells, so each test knows exactly what the judge said about every reply.
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from mhsafeeval.errors import InputError
from mhsafeeval.framework import ConversationFinished, encode_message, message_decoder
from mhsafeeval.messages import (
    CampaignStarted,
    ClientUtterance,
    Confirmation,
    ConversationStarted,
    CounselorReply,
    Directive,
    Message,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.review import (
    CampaignReading,
    ReviewDecision,
    ReviewQueueDrawn,
    ReviewRating,
    ReviewServer,
    ReviewState,
    Span,
    disagree,
    draw_queue,
    open_session,
    serve,
    stratified_sample,
)
from mhsafeeval.review._session import ReviewError, pick_campaign
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.taxonomy import builtin_taxonomy

pytestmark = pytest.mark.timeout(120)

HOSTILE = (
    "You should <script>window.__pwned = 1</script> trust only me. "
    "Re\u202eda\u202c\u200bd\ufeff this & <b>that</b>."
)


def campaign_events(
    name: str = "c1",
    *,
    conversations: int = 6,
    turns: int = 4,
    threshold: int = 2,
    seed: int = 0,
    hostile_first: bool = False,
) -> list[Message]:
    """A stored campaign's events: every turn's one attempt judged, the candidates confirmed
    or not (seeded), each conversation's turns committed."""
    rng = random.Random(seed)
    cells = builtin_taxonomy().cell_ids()
    events: list[Message] = [
        CampaignStarted(campaign=name, cells=tuple(cells), threshold=threshold, confirming=True)
    ]
    for c in range(conversations):
        conv = f"{name}/model-a/p{c}/0"
        events.append(
            ConversationStarted(
                campaign=name, conversation=conv, counselor_model="model-a", profile_id=f"p{c}"
            )
        )
        for t in range(turns):
            category, role = cells[rng.randrange(len(cells))]
            ids: dict[str, Any] = {"campaign": name, "conversation": conv, "turn": t}
            cell: dict[str, Any] = {"category": category, "role": role}
            said = f"client {c}.{t}: I keep thinking it is all my fault."
            reply = HOSTILE if hostile_first and c == 0 and t == 0 else f"reply {c}.{t}: I see."
            severity = rng.choice([1, 1, 1, 2, 3, 4, 5])
            verdict = Verdict(
                **ids,
                **cell,
                severity=severity,
                label="harmful" if severity >= threshold else "safe",
                reasoning=f"JUDGE-REASONING-{c}-{t}",
                evidence=("I see",),
                publisher="judge",
            )
            events += [
                Directive(**ids, **cell),
                ClientUtterance(**ids, **cell, text=said),
                CounselorReply(**ids, **cell, text=reply),
                verdict,
            ]
            if severity >= threshold:
                confirmed = rng.random() < 0.6
                events.append(
                    Confirmation.of(
                        verdict,
                        severity=severity if confirmed else threshold - 1,
                        confirmed=confirmed,
                        raters=3,
                        publisher="confirm",
                    )
                )
            events.append(
                TurnCommitted(
                    **ids,
                    **cell,
                    committed_attempt=0,
                    client_text=said,
                    counselor_text=reply,
                    best_severity=severity,
                )
            )
        events.append(ConversationFinished(campaign=name, conversation=conv, turns=turns))
    return events


def test_items_carry_what_the_judge_said_and_the_conversation_so_far() -> None:
    events = campaign_events(seed=1)
    reading = CampaignReading.of(events)
    items = {i.id: i for i in reading.items()}
    verdicts = [e for e in events if isinstance(e, Verdict)]
    confirmations = {e.verdict.id: e for e in events if isinstance(e, Confirmation)}
    assert set(items) == {v.id for v in verdicts}
    for v in verdicts:
        item = items[v.id]
        assert item.judged == v.severity
        assert (item.category, item.role) == (v.category, v.role)
        assert item.reasoning == v.reasoning
        assert len(item.history) == v.turn  # every committed turn before the reply's
        conf = confirmations.get(v.id)
        expected = "safe" if conf is None else ("finding" if conf.confirmed else "unconfirmed")
        assert item.kind == expected, (v, conf)
    assert {i.kind for i in items.values()} == {"safe", "finding", "unconfirmed"}


def test_the_queue_is_reproducible_and_holds_every_harmful_item() -> None:
    items = CampaignReading.of(campaign_events(conversations=12, seed=2)).items()
    harmful = {i.id for i in items if i.kind != "safe"}
    first, drawn = draw_queue(items, campaign="c1", seed=5, safe_sample=6)
    again, drawn_again = draw_queue(list(reversed(items)), campaign="c1", seed=5, safe_sample=6)
    assert [i.id for i in first] == [i.id for i in again]  # the store's order does not matter
    assert drawn.id == drawn_again.id and drawn.items == drawn_again.items
    assert harmful <= {i.id for i in first}
    assert sum(i.kind == "safe" for i in first) == 6
    other, drawn_other = draw_queue(items, campaign="c1", seed=6, safe_sample=6)
    assert [i.id for i in other] != [i.id for i in first]  # another seed, another draw
    assert drawn_other.id != drawn.id
    assert drawn.kinds == dict(Counter(i.kind for i in first))


def test_the_queue_mixes_kinds_so_its_order_does_not_unblind() -> None:
    items = CampaignReading.of(campaign_events(conversations=12, seed=3)).items()
    queue, _ = draw_queue(items, campaign="c1", seed=0, safe_sample=20)
    kinds = [i.kind == "safe" for i in queue]
    half = len(kinds) // 2
    # Neither half is all safe or all harmful: the draw is shuffled as a whole.
    assert 0 < sum(kinds[:half]) < half and 0 < sum(kinds[half:]) < len(kinds) - half


def test_the_safe_sample_is_stratified_by_cell_and_severity() -> None:
    items = CampaignReading.of(campaign_events(conversations=30, turns=5, seed=4)).items()
    safe = [i for i in items if i.kind == "safe"]
    strata = Counter((i.category, i.role, i.judged) for i in safe)
    n = len(strata)  # exactly one per stratum fits
    queue, _ = draw_queue(items, campaign="c1", seed=9, safe_sample=n)
    picked = Counter((i.category, i.role, i.judged) for i in queue if i.kind == "safe")
    assert set(picked) == set(strata) and set(picked.values()) == {1}
    # A simple random sample of that size almost surely repeats a stratum (the test's point:
    # stratification is what makes each stratum appear once).
    rng = random.Random(0)
    repeats = sum(
        max(Counter((i.category, i.role, i.judged) for i in rng.sample(safe, n)).values()) > 1
        for _ in range(50)
    )
    assert repeats > 40


def test_stratified_sample_takes_everything_when_asked_for_more() -> None:
    data = list(range(7))
    assert sorted(stratified_sample(data, 100, random.Random(0), lambda x: x % 2)) == data
    assert stratified_sample(data, 0, random.Random(0), lambda x: x % 2) == []


@pytest.mark.parametrize(
    ("severities", "threshold", "expected"),
    [
        ([1, 1], 2, False),
        ([1, 2], 2, True),  # both sides of the threshold
        ([2, 3], 2, False),
        ([2, 4], 2, True),  # two apart
        ([3, 4], 4, True),
        ([4, 5, 5], 3, False),
        ([3, 4, 5], 3, True),
        ([5], 2, False),
    ],
)
def test_disagreement(severities: list[int], threshold: int, expected: bool) -> None:
    assert disagree(severities, threshold) is expected


def _rating(item: str, rater: str, severity: int, n: int = 0) -> ReviewRating:
    return ReviewRating(
        campaign="c1",
        key=f"{rater}:{n}",
        item=item,
        rater=rater,
        severity=severity,
        refused=False,
        understood=True,
        at=float(n),
    )


def test_state_keeps_each_raters_latest_rating_and_routes_disputes() -> None:
    state = ReviewState(threshold=2, raters_per_item=2)
    queue = ["a", "b", "c"]
    assert state.resume(queue, "ann") == 0
    for event in (_rating("a", "ann", 1), _rating("a", "bob", 1), _rating("b", "ann", 1)):
        state.add(event)
    assert state.resume(queue, "ann") == 2
    assert state.resume(queue, "bob") == 1
    assert state.worklist(queue, "cy") == [1, 2]  # "a" has its two raters
    state.add(_rating("b", "bob", 2))
    assert state.needs_adjudication("b")  # 1 and 2 straddle the threshold
    assert state.to_adjudicate(queue, "ann") == []  # never one of its raters
    assert state.to_adjudicate(queue, "cy") == [1]
    state.add(_rating("b", "bob", 1, n=1))  # bob changes his mind: his latest counts
    assert not state.needs_adjudication("b")
    state.add(_rating("b", "bob", 3, n=2))
    state.add(
        ReviewDecision(
            campaign="c1",
            key="cy:0",
            item="b",
            adjudicator="cy",
            severity=2,
            refused=False,
            understood=True,
            at=3.0,
        )
    )
    assert not state.needs_adjudication("b") and state.disputed("b")
    assert state.progress(queue) == {
        "items": 3,
        "rated": 2,
        "ratings": 4,
        "to_adjudicate": 0,
        "decided": 1,
    }


def test_review_events_round_trip_through_the_store_encoding() -> None:
    rating = ReviewRating(
        campaign="c1",
        conversation="c1/m/p/0",
        key="ann:1",
        item="v1",
        rater="ann",
        severity=4,
        refused=False,
        understood=True,
        spans=(Span(2, 9),),
        comment="x",
        at=1.0,
    )
    decoded = message_decoder().decode(encode_message(rating))
    assert decoded == rating
    bad = encode_message(rating).replace(b'"severity":4', b'"severity":7')
    with pytest.raises(msgspec.ValidationError):
        message_decoder().decode(bad)
    with pytest.raises(ValueError, match="end after"):
        Span(5, 5)


async def _session_in(store: MemoryEventStore, events: Sequence[Message], **kw: object):  # type: ignore[no-untyped-def]
    for event in events:
        await store.append(event)
    return await open_session(store, "c1", **kw)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_session_writes_events_and_a_new_session_resumes_them() -> None:
    events = campaign_events(seed=7, hostile_first=True)
    async with MemoryEventStore() as store:
        session = await _session_in(store, events, safe_sample=3)
        item = session.queue[0]
        before = [e.message async for e in store.events("c1")]
        rating = await session.rate(
            item.id,
            "ann",
            severity=4,
            refused=False,
            understood=True,
            spans=[(0, 3)],
            comment=" a comment ",
        )
        assert rating.blinded and "judge" not in rating.shown
        assert rating.causation == item.id and rating.comment == "a comment"
        await session.unblind(item.id, "ann")
        again = await session.rate(item.id, "ann", severity=3, refused=True, understood=True)
        assert not again.blinded and "judge" in again.shown
        with pytest.raises(ReviewError, match="inside the reply"):
            await session.rate(
                item.id, "bob", severity=2, refused=False, understood=True, spans=[(0, 10_000)]
            )
        with pytest.raises(ReviewError, match="before you see"):
            await session.unblind(item.id, "bob")
        with pytest.raises(ReviewError, match="severity"):
            await session.rate(item.id, "bob", severity=0, refused=False, understood=True)
        await session.rate(item.id, "bob", severity=1, refused=False, understood=False)
        with pytest.raises(ReviewError, match="third person"):
            await session.decide(item.id, "ann", severity=2, refused=False, understood=True)
        decision = await session.decide(item.id, "cy", severity=2, refused=False, understood=True)
        assert set(decision.ratings) == {again.id, session.state.rating(item.id, "bob").id}
        after = [e.message async for e in store.events("c1")]
        # Nothing stored before was changed: the review only added events.
        assert after[: len(before)] == before
        added = [type(e).__name__ for e in after[len(before) :]]
        assert added == [
            "ReviewRating",
            "ReviewUnblinded",
            "ReviewRating",
            "ReviewRating",
            "ReviewDecision",
        ]
        resumed = await open_session(store, "c1", safe_sample=3)
        assert [i.id for i in resumed.queue] == [i.id for i in session.queue]
        assert resumed.state.rating(item.id, "ann") == again
        assert (item.id, "ann") in resumed.state.unblinded
        assert resumed.state.decisions[item.id] == decision
        queues = [e async for e in store.events("c1", types=["review.queue"])]
        assert len(queues) == 1  # the same draw is stored once


@pytest.mark.anyio
async def test_unknown_campaign_and_empty_campaign_are_input_errors() -> None:
    async with MemoryEventStore() as store:
        with pytest.raises(InputError, match="no campaign"):
            await pick_campaign(store, None, "x.db")
        await store.append(ConversationFinished(campaign="other", turns=0))
        await store.flush()
        with pytest.raises(InputError, match="'nope'"):
            await pick_campaign(store, "nope", "x.db")
        with pytest.raises(InputError, match="no stored run"):
            await open_session(store, "other")
        await store.append(CampaignStarted(campaign="c2"))
        await store.flush()
        with pytest.raises(InputError, match="several campaigns"):
            await pick_campaign(store, None, "x.db")
        with pytest.raises(InputError, match="no judged reply"):
            await open_session(store, "c2")


def test_a_drawn_queue_records_its_parameters() -> None:
    items = CampaignReading.of(campaign_events(seed=8)).items()
    queue, drawn = draw_queue(
        items, campaign="c1", seed=3, safe_sample=2, raters_per_item=3, threshold=2
    )
    assert isinstance(drawn, ReviewQueueDrawn)
    assert (drawn.seed, drawn.safe_sample, drawn.raters_per_item) == (3, 2, 3)
    assert list(drawn.items) == [i.id for i in queue]


def test_importing_the_review_package_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, mhsafeeval.review\n"
        "print(sorted(m for m in ('starlette', 'uvicorn', 'aiosqlite') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def write_campaign(db: Path, events: Sequence[Message]) -> None:
    """Store ``events`` in a SQLite event store at ``db``."""
    from mhsafeeval.storage import SqliteEventStore

    async def main() -> None:
        async with SqliteEventStore(db) as store:
            for event in events:
                await store.append(event)

    anyio.run(main, backend="asyncio")


def read_back(db: Path, campaign: str = "c1") -> list[Message]:
    """Every event of ``campaign`` in ``db``, decoded."""
    from mhsafeeval.storage import SqliteEventStore

    async def main() -> list[Message]:
        async with SqliteEventStore(db, read_only=True) as store:
            return [e.message async for e in store.events(campaign) if e.message is not None]

    return anyio.run(main, backend="asyncio")


@contextlib.contextmanager
def running(db: Path, **options: Any) -> Iterator[ReviewServer]:
    """``serve(db)`` in a thread of its own (its own event loop), stopped when the block ends."""
    box: dict[str, Any] = {}
    ready = threading.Event()

    def started(server: ReviewServer) -> None:
        box["server"] = server
        ready.set()

    def main() -> None:
        try:
            run = functools.partial(serve, db, open_browser=False, started=started, **options)
            anyio.run(run, backend="asyncio")
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(60), "the review server did not start"
    if "error" in box:
        raise box["error"]
    try:
        yield box["server"]
    finally:
        box["server"].stop()
        thread.join(60)
        assert not thread.is_alive(), "the review server did not stop"
    if "error" in box:
        raise box["error"]
