"""A resume streams the stored campaign: it holds the work left, not every event (issue 16)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections import Counter
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskStatus

from mhsafeeval.budget import Budget, StoredSpending
from mhsafeeval.campaign import SETTLED, owes, run_campaign
from mhsafeeval.config import BudgetSection, Config, parse_config
from mhsafeeval.framework import Agent, configure_logging, on
from mhsafeeval.framework.engine import Graph, Node, load_stored, run_graph
from mhsafeeval.messages import (
    CallFailed,
    CampaignFinished,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Message,
    Rating,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.providers import CallParams, ChatMessage
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.testing import register_script, scripted_models

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

CONFIG = """
[campaign]
name = "stream"
seed = 4
max_turns = {turns}
max_attempts = 2
conversations_per_profile = {conversations}
concurrency = {concurrency}
controller = "{controller}"
profile_ids = ["grief-widower"]

[search]
simulations = 3
in_flight = 2
samples_per_action = 1
"""


def config(
    conversations: int,
    *,
    turns: int = 2,
    concurrency: int = 4,
    controller: str = "map-elites",
    extra: str = "",
) -> Config:
    text = CONFIG.format(
        conversations=conversations, turns=turns, concurrency=concurrency, controller=controller
    )
    return parse_config(text + scripted_models() + extra, "stream.toml")


async def events_of(store: MemoryEventStore) -> list[Message]:
    return [e.message async for e in store.events("stream") if e.message is not None]


async def cut_store(
    events: Sequence[Message], keep: int, stored_config: str, campaign: str = "stream"
) -> MemoryEventStore:
    """A store holding ``events`` up to the ``keep``-th conversation end, as a crash right
    after it would leave it (the conversations then in flight are unfinished)."""
    ends = [i for i, m in enumerate(events) if isinstance(m, ConversationFinished)]
    store = MemoryEventStore()
    await store.open()
    await store.register_campaign(campaign, stored_config)
    for message in events[: ends[keep - 1] + 1]:
        await store.append(message)
    await store.flush()
    return store


async def resume_peak(size: int, left: int) -> int:
    """Bytes allocated at the peak of resuming a finished ``size``-conversation campaign cut
    ``left`` conversation ends before its end, above what was allocated before it started."""
    cfg = config(size)
    async with MemoryEventStore() as full:
        assert (await run_campaign(cfg, full)).status == "completed"
        events = await events_of(full)
        [info] = await full.list_campaigns()
    store = await cut_store(events, size - left, info.config)
    try:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            result = await run_campaign(cfg, store)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result.status == "completed" and result.resumed_from > 0, result
        assert result.finished == size
    finally:
        await store.aclose()
    return peak - before


async def test_a_resume_holds_little_per_finished_conversation() -> None:
    """What a resume holds beyond the work left grows by a few hundred bytes per finished
    conversation (it held every stored message, and every finished conversation's agents:
    about 55 KB each here)."""
    configure_logging("warning")  # log lines would be kept by pytest's capture
    small, large, left = 30, 150, 6
    grows = (await resume_peak(large, left)) - (await resume_peak(small, left))
    per_conversation = grows / (large - small)
    assert per_conversation < 2500, per_conversation


def verdicts_and_turns(events: Sequence[Message]) -> tuple[dict[str, bytes], Counter[str]]:
    """Every stored verdict (its content) and each conversation's committed turns."""
    verdicts = {
        m.id: json.dumps([m.severity, m.category, m.role, m.reasoning]).encode()
        for m in events
        if isinstance(m, Verdict)
    }
    turns = Counter(m.conversation for m in events if isinstance(m, TurnCommitted))
    return verdicts, turns


@pytest.mark.parametrize(("controller", "concurrency"), [("map-elites", 1), ("uct", 1)])
async def test_stopped_by_a_budget_at_several_points_and_resumed_equals_one_run(
    controller: str, concurrency: int
) -> None:
    conversations = 4
    async with MemoryEventStore() as reference:
        cfg = config(conversations, concurrency=concurrency, controller=controller, turns=3)
        assert (await run_campaign(cfg, reference)).status == "completed"
        clean = await events_of(reference)
    calls = sum(isinstance(m, CounselorReply) for m in clean)
    stops = [calls // 5, calls // 2, calls - 2]
    async with MemoryEventStore() as store:
        for limit in stops:
            limited = config(
                conversations,
                concurrency=concurrency,
                controller=controller,
                turns=3,
                extra=f"[budget]\ncounselor_calls = {limit}\n",
            )
            result = await run_campaign(limited, store)
            assert result.status == "stopped_budget", result
            assert sum(isinstance(m, CounselorReply) for m in await events_of(store)) == limit
        result = await run_campaign(cfg, store)
        assert result.status == "completed" and result.resumed_from > 0
        resumed = await events_of(store)
    assert verdicts_and_turns(resumed) == verdicts_and_turns(clean)
    assert set(verdicts_and_turns(resumed)[1].values()) == {3}  # every planned turn, once
    stopped = {m.id for m in resumed if isinstance(m, CampaignFinished) and m.key != "finish"}
    assert {m.id for m in resumed} - stopped == {m.id for m in clean}


async def test_load_stored_streams_into_folds_and_keeps_only_an_index() -> None:
    """Folds see every stored message in stored order; the index keeps no message."""
    cfg = config(6)
    async with MemoryEventStore() as store:
        await run_campaign(cfg, store)
        events = await events_of(store)
        seen: list[Message] = []
        spending = StoredSpending()
        starts = {m.id for m in events if isinstance(m, ConversationStarted)}
        stored = await load_stored(
            store,
            "stream",
            starts,
            accepts=lambda _: None,
            settled=SETTLED,
            on_bus=lambda _: True,
            owes=owes,
            folds=(seen.append, spending.add),
        )
    assert stored is not None
    assert [m.id for m in seen] == [m.id for m in events]
    assert stored.count == len(events)
    assert all(m.id in stored.ids for m in events)
    assert sum(f"{m.id}x" in stored.ids for m in events) == 0
    assert stored.finished == {
        m.conversation: m.status for m in events if isinstance(m, ConversationFinished)
    }
    assert {m.conversation for m in events if m.id in starts} == set(stored.finished)
    assert stored.started == set()  # started and not finished: none
    assert stored.outcome is not None and stored.outcome.status == "completed"
    assert not hasattr(stored, "messages")
    budget = Budget(BudgetSection(), events)
    streamed = Budget(BudgetSection(), spending)
    assert (streamed.counselor_calls, streamed.tokens, streamed.usd) == (
        budget.counselor_calls,
        budget.tokens,
        budget.usd,
    )
    assert streamed.counselor_calls == sum(isinstance(m, CounselorReply) for m in events)


FAILING: set[str] = set()


def flaky_judge(messages: Sequence[ChatMessage], params: CallParams) -> str | BaseException:
    """The scripted panel judge, failing for good while ``FAILING`` holds "panel"."""
    from mhsafeeval.providers import PermanentProviderError

    if "panel" in FAILING:
        return PermanentProviderError("refused", status=400)
    return json.dumps(
        {
            "reasoning": "fine",
            "evidence": [],
            "refused": False,
            "understood": True,
            "severity": 1,
            "label": "safe",
        }
    )


register_script("stream-panel", flaky_judge)
PANEL = """
[judges.panel.a]
provider = "scripted/stream-panel"
"""


async def test_a_paged_resume_rates_each_reply_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored part reaches the panel a few messages at a time: a reply whose ratings come
    pages after it is still known to be rated (no second rating call), and a reply the last run
    could not rate is rated now."""
    import mhsafeeval.framework.engine._run as engine_run

    monkeypatch.setattr(engine_run, "_PAGE", 3)
    cfg = config(4, extra=PANEL)
    async with MemoryEventStore() as store:
        FAILING.add("panel")
        try:
            first = await run_campaign(cfg, store)
        finally:
            FAILING.clear()
        events = await events_of(store)
        failed = [m for m in events if isinstance(m, CallFailed) and m.agent == "panel"]
        rated = [m for m in events if isinstance(m, Rating)]
        assert first.status == "completed" and failed and not rated
        again = await run_campaign(cfg, store)  # rates what the first run could not
        assert again.panel is not None and again.panel.made == len(failed)
        third = await run_campaign(cfg, store)  # everything rated: nothing asked again
        assert third.panel is not None and (third.panel.made, third.panel.failed) == (0, 0)
        events = await events_of(store)
    verdicts = {(m.conversation, m.turn, m.attempt) for m in events if isinstance(m, Verdict)}
    ratings = Counter((m.conversation, m.turn, m.attempt) for m in events if isinstance(m, Rating))
    assert set(ratings) == verdicts and set(ratings.values()) == {1}


class Step(Message, frozen=True, tag="test.stream_step"):
    pass


class Walker(Agent):
    """Three steps per conversation, each an async handler (a model call's place)."""

    outcomes = (Step, ConversationFinished)
    made = 0
    stopped = 0

    def __init__(self) -> None:
        super().__init__()
        Walker.made += 1

    @on(Step)
    async def step(self, msg: Step) -> None:
        await anyio.lowlevel.checkpoint()
        if msg.turn < 2:
            self.publish(Step(**msg.child_ids(turn=msg.turn + 1)))
        else:
            self.publish(ConversationFinished(**msg.child_ids(), turns=3))

    async def on_stop(self) -> None:
        Walker.stopped += 1


class Pages:
    """A service that records how the stored part reached it."""

    types = (ConversationFinished,)
    pending = False

    def __init__(self) -> None:
        self.pages: list[list[str]] = []
        self.serving_after = -1

    def owns(self, msg: Message) -> bool:
        return False

    def resume(self, stored: Sequence[Message]) -> None:
        self.pages.append([m.id for m in stored])

    def observe(self, msg: Message) -> None:
        pass

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.serving_after = len(self.pages)
        task_status.started()
        await anyio.sleep_forever()

    async def join(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_a_finished_conversation_s_agents_end_as_its_end_is_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the resumed run does its first live work, the agents of the finished
    conversations it replayed have stopped; the services got the stored part page by page,
    in stored order, before serving."""
    import mhsafeeval.framework.engine._run as engine_run

    monkeypatch.setattr(engine_run, "_PAGE", 7)
    total, left = 40, 3

    def graph(service: Pages) -> Graph:
        starts = [Step(campaign="walk", conversation=f"c{i:02}") for i in range(total)]
        return Graph(
            campaign="walk", nodes=[Node.of(Walker)], conversations=starts, services=[service]
        )

    async with MemoryEventStore() as full:
        assert (await run_graph(graph(Pages()), full)).status == "completed"
        events = [e.message async for e in full.events("walk") if e.message is not None]
    store = await cut_store(events, total - left, "", "walk")
    alive_at_first_live_call: list[int] = []
    original = Walker.step

    async def step(self: Walker, msg: Step) -> None:
        if not alive_at_first_live_call:
            alive_at_first_live_call.append(Walker.made - Walker.stopped)
        await original(self, msg)

    monkeypatch.setattr(Walker, "step", step)
    Walker.made = Walker.stopped = 0
    service = Pages()
    try:
        result = await run_graph(graph(service), store)
        stored = [e.message async for e in store.events("walk") if e.message is not None]
    finally:
        await store.aclose()
    assert result.status == "completed" and result.finished == total
    assert result.resumed_from == len(stored) - result.events_written
    # Only the conversations left open (at most ``left`` plus the ones in flight) have agents.
    [alive] = alive_at_first_live_call
    assert alive <= 8 + left, alive
    pages = service.pages
    assert len(pages) > 1 and all(len(p) <= 7 for p in pages)
    assert [i for p in pages for i in p] == [m.id for m in stored[: result.resumed_from]]
    assert service.serving_after == len(pages)
