"""Interceptors: a check between publishers and everyone else that may drop or rewrite a
message, recorded so that a resumed run keeps its decisions (issue 32)."""

from __future__ import annotations

from collections import Counter

import anyio
import anyio.lowlevel
import msgspec
import pytest

from mhsafeeval.errors import InputError
from mhsafeeval.framework import Agent, Intercepted, Message, Runtime, on
from mhsafeeval.framework.engine import Graph, Intercept, Node, run_graph
from mhsafeeval.messages import ConversationFinished
from mhsafeeval.storage import MemoryEventStore

pytestmark = pytest.mark.anyio


class Hello(Message, frozen=True, tag="test.intercept_hello"):
    pass


class Question(Message, frozen=True, tag="test.intercept_question"):
    text: str


class Answer(Message, frozen=True, tag="test.intercept_answer"):
    text: str


class Aside(Message, frozen=True, tag="test.intercept_aside"):
    """Published with each question; nobody needs it (the interceptor drops some)."""

    text: str


ANSWERS = ("Sleep matters.", "I guarantee it gets better.", "Talk to her when ready.")


class Asker(Agent):
    publishes = (Question, Aside, ConversationFinished)

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[str] = []

    @on(Hello)
    def first(self, msg: Hello) -> None:
        self.ask(msg, 0)

    def ask(self, parent: Message, turn: int) -> None:
        self.publish(Question(**parent.child_ids(turn=turn), text=f"question {turn}"))
        self.publish(Aside(**parent.child_ids(turn=turn), text=f"drop aside {turn}"))

    @on(Answer)
    def next(self, msg: Answer) -> None:
        self.heard.append(msg.text)
        if msg.turn + 1 < len(ANSWERS):
            self.ask(msg, msg.turn + 1)
        else:
            self.publish(ConversationFinished(**msg.child_ids(), turns=msg.turn + 1))


class Aside_(Agent):
    """Takes asides (so the graph's wiring check sees a handler)."""

    publishes = ()

    @on(Aside)
    def take(self, msg: Aside) -> None: ...


class Answerer(Agent):
    outcomes = (Answer,)
    publishes = (Answer,)

    @on(Question)
    async def answer(self, msg: Question) -> None:
        await anyio.lowlevel.checkpoint()
        self.publish(Answer(**msg.child_ids(), text=ANSWERS[msg.turn]))


class Guard:
    """Rewrites answers that promise outcomes; drops asides that ask for it. Counts what it
    is asked about, by message id."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()

    def __call__(self, msg: Message) -> Message | None:
        self.asked[msg.id] += 1
        if isinstance(msg, Answer) and "guarantee" in msg.text:
            return msgspec.structs.replace(msg, text="[blocked: promises an outcome]")
        if isinstance(msg, Aside) and msg.text.startswith("drop"):
            return None
        return msg


def graph(guard: Guard, conversations: int = 2) -> Graph:
    return Graph(
        campaign="guarded",
        nodes=[Node.of(Asker), Node.of(Answerer), Node.of(Aside_, name="asides")],
        conversations=[
            Hello(campaign="guarded", conversation=f"c{i}") for i in range(conversations)
        ],
        interceptors=[Intercept("guardrail", guard, (Answer, Aside))],
    )


async def stored(store: MemoryEventStore) -> list[Message]:
    return [e.message async for e in store.events("guarded") if e.message is not None]


async def test_an_interceptor_rewrites_and_drops_before_any_agent_sees_and_records_it() -> None:
    seen: list[Message] = []
    guard = Guard()
    async with MemoryEventStore() as store:
        result = await run_graph(graph(guard), store, observers=(seen.append,))
        events = await stored(store)
    assert result.status == "completed"
    answers = [m.text for m in events if isinstance(m, Answer)]
    assert answers.count("[blocked: promises an outcome]") == 2
    assert not any("guarantee" in a for a in answers)  # the original never went on
    assert not any(isinstance(m, Aside) for m in events + seen)
    records = [m for m in events if isinstance(m, Intercepted)]
    assert Counter(r.action for r in records) == {"dropped": 6, "rewritten": 2}
    rewritten = [r for r in records if r.action == "rewritten"]
    assert all(
        "I guarantee" in r.original and r.original_publisher == "answerer" for r in rewritten
    )
    assert {r.publisher for r in records} == {"guardrail"}
    # the rewrite keeps the original's id: it answers what the original answered
    assert {r.replacement_id for r in rewritten} == {r.message_id for r in rewritten}


async def test_a_resume_keeps_the_decisions_recorded_before_the_stop() -> None:
    """Cut after every event and resume: the same log as the uninterrupted run, and the
    interceptor is never asked again about a message whose decision is stored."""
    async with MemoryEventStore() as store:
        await run_graph(graph(Guard()), store)
        [info] = await store.list_campaigns()
        clean = await stored(store)
    for n in range(1, len(clean)):
        guard = Guard()
        async with MemoryEventStore() as store:
            await store.register_campaign("guarded", info.config)
            for message in clean[:n]:
                await store.append(message)
            with anyio.fail_after(30):
                result = await run_graph(graph(guard), store)
            events = await stored(store)
        assert result.status == "completed", n
        assert {e.id: e for e in events} == {e.id: e for e in clean}, n
        decided = {m.message_id for m in clean[:n] if isinstance(m, Intercepted)}
        assert not decided & set(guard.asked), n


def test_interceptor_names_are_checked_with_the_nodes() -> None:
    with pytest.raises(InputError, match="'asker' already names a node") as caught:
        Graph(
            campaign="g",
            nodes=[Node.of(Asker), Node.of(Answerer), Node.of(Aside_, name="asides")],
            conversations=[Hello(campaign="g", conversation="c0")],
            interceptors=[Intercept("asker", Guard())],
        )
    assert caught.value.field == "interceptors[0].name"


async def test_an_interceptor_that_returns_something_else_fails_the_publisher() -> None:
    def broken(msg: Message) -> Message | None:
        return "no"  # type: ignore[return-value]

    failures: list[Message] = []
    async with Runtime() as rt:
        rt.intercept(broken, name="broken", types=(Question,))
        rt.subscribe(failures.append, name="seen")
        rt.add(Asker(), name="asker")
        rt.publish(Hello(conversation="c0"))
        await rt.run_until_idle()
    [failed] = [m for m in failures if m.tag == "runtime.handler_failed"]
    assert "interceptor 'broken' returned str" in failed.error  # type: ignore[attr-defined]
