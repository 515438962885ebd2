"""The engine runs any agent graph: scheduling, failure policy, limits and resume.

The graphs here are not MHSafeEval's: a few small agents of the tests' own, and the one in
``examples/custom_graph.py``, which is killed with SIGKILL at several points and resumed.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import ClassVar

import anyio
import anyio.lowlevel
import pytest

from helpers import kill_at_points, stored_count
from mhsafeeval.errors import InputError
from mhsafeeval.framework import Agent, HandlerFailed, Message, on
from mhsafeeval.framework.engine import Graph, Node, run_graph
from mhsafeeval.messages import CampaignFinished, ConversationFinished
from mhsafeeval.storage import MemoryEventStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_graph.py"


class Begin(Message, frozen=True, tag="test_engine.begin"):
    pass


class Step(Message, frozen=True, tag="test_engine.step"):
    pass


class Done(Message, frozen=True, tag="test_engine.done"):
    pass


BROKEN: set[str] = set()  # conversations whose worker raises
CALLS: Counter[str] = Counter()  # work done, by conversation and turn


class Starter(Agent):
    """Turns a conversation's start into two steps, then ends it."""

    @on(Begin)
    def begin(self, msg: Begin) -> None:
        self.publish(Step(**msg.child_ids()))

    @on(Done)
    def next(self, msg: Done) -> None:
        if msg.turn + 1 < 2:
            self.publish(Step(**msg.child_ids(turn=msg.turn + 1)))
        else:
            self.publish(ConversationFinished(**msg.child_ids(), turns=2))


class Worker(Agent):
    """Does each step's work in an async handler (a model call's stand-in)."""

    outcomes = (Done,)

    @on(Step)
    async def work(self, msg: Step) -> None:
        await anyio.lowlevel.checkpoint()
        if msg.conversation in BROKEN:
            raise RuntimeError("the worker broke")
        CALLS[f"{msg.conversation}#{msg.turn}"] += 1
        self.publish(Done(**msg.child_ids()))


class Silent(Agent):
    """Never answers: the conversation it receives can never end."""

    @on(Step)
    def ignore(self, msg: Step) -> None:
        pass


def graph(conversations: int = 3, *, worker: type[Agent] = Worker, config: str = "v1") -> Graph:
    return Graph(
        campaign="g",
        nodes=[Node.of(Starter), Node.of(worker)],
        conversations=[Begin(campaign="g", conversation=f"c{i}") for i in range(conversations)],
        concurrency=2,
        config=config,
    )


async def messages(store: MemoryEventStore) -> list[Message]:
    return [e.message async for e in store.events("g") if e.message is not None]


@pytest.fixture(autouse=True)
def _reset() -> None:
    BROKEN.clear()
    CALLS.clear()


@pytest.mark.anyio
async def test_a_graph_runs_every_conversation_and_records_its_end() -> None:
    async with MemoryEventStore() as store:
        result = await run_graph(graph(), store)
        stored = await messages(store)
    assert (result.status, result.finished, result.failed) == ("completed", 3, 0)
    assert set(CALLS.values()) == {1} and len(CALLS) == 6
    ends = [m for m in stored if isinstance(m, CampaignFinished)]
    assert [(m.key, m.status) for m in ends] == [("finish", "completed")]
    assert result.events_written == len(stored)


@pytest.mark.anyio
async def test_a_failing_handler_fails_its_conversation_only_and_a_rerun_retries_it() -> None:
    BROKEN.add("c1")
    async with MemoryEventStore() as store:
        first = await run_graph(graph(), store)
        assert (first.status, first.finished, first.failed) == ("completed_with_failures", 3, 1)
        failed = [m for m in await messages(store) if isinstance(m, HandlerFailed)]
        assert [m.conversation for m in failed] == ["c1"]
        BROKEN.clear()
        done_before = dict(CALLS)
        second = await run_graph(graph(), store)
    assert (second.status, second.failed) == ("completed", 0)
    assert second.resumed_from > 0
    # Only the failed conversation's work was done again; finished ones were left alone.
    again = {k: v - done_before.get(k, 0) for k, v in CALLS.items() if v != done_before.get(k)}
    assert again and all(k.startswith("c1#") for k in again), again


@pytest.mark.anyio
async def test_a_conversation_nothing_moves_is_closed_as_stalled() -> None:
    async with MemoryEventStore() as store:
        result = await run_graph(graph(2, worker=Silent), store)
        ends = [m for m in await messages(store) if isinstance(m, ConversationFinished)]
    assert result.status == "completed_with_failures" and result.failed == 2
    assert {m.status for m in ends} == {"stalled"}
    assert all("stalled" in m.detail for m in ends)


class _Stop:
    """Limits reached after ``after`` steps of work (a budget's stand-in)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.stop = anyio.Event()
        self.reached: str | None = None

    async def admit(self) -> None:
        if self.reached is not None:
            await anyio.sleep_forever()  # no work starts once a limit is reached
        if sum(CALLS.values()) + 1 >= self.after:
            self.reached = "test.steps"
            self.stop.set()

    async def drained(self) -> None:
        pass

    def spent(self) -> str:
        return f"{sum(CALLS.values())} steps"


LIMIT = _Stop(after=2)


class Gated(Worker):
    """A worker whose every step is admitted by LIMIT first."""

    @on(Step)
    async def work(self, msg: Step) -> None:
        await LIMIT.admit()
        await super().work(msg)


@pytest.mark.anyio
async def test_a_reached_limit_stops_the_run_and_says_so_and_a_rerun_starts_nothing() -> None:
    global LIMIT
    limits = LIMIT = _Stop(after=2)
    async with MemoryEventStore() as store:
        result = await run_graph(graph(5, worker=Gated), store, limits=limits)
        ends = [m for m in await messages(store) if isinstance(m, CampaignFinished)]
        assert result.status == "stopped_budget" and result.budget == "test.steps"
        assert result.finished < 5
        assert [m.status for m in ends] == ["stopped_budget"]
        again = await run_graph(graph(5, worker=Gated), store, limits=limits)
    assert again.status == "stopped_budget" and again.events_written == 0


@pytest.mark.anyio
async def test_a_stored_campaign_with_another_configuration_is_refused_before_any_write() -> None:
    async with MemoryEventStore() as store:
        await run_graph(graph(), store)
        count = len(await messages(store))
        with pytest.raises(InputError, match="another configuration"):
            await run_graph(graph(config="v2"), store)
        assert len(await messages(store)) == count


# -- the custom graph example, killed and resumed ------------------------------------------------


def _rows(db: Path) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT id, type, body FROM events").fetchall()
    return {i: (t, json.dumps(json.loads(b), sort_keys=True)) for i, t, b in rows}


def _example(db: Path, *extra: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--db", str(db), "--conversations", "4", *extra]


def test_the_custom_graph_example_killed_at_several_points_resumes_exactly(
    tmp_path: Path,
) -> None:
    clean, crashed = tmp_path / "clean.db", tmp_path / "crashed.db"
    subprocess.run(_example(clean), check=True, capture_output=True, timeout=120)
    total = stored_count(clean)
    command = _example(crashed, "--delay", "0.15")
    killed = kill_at_points(command, crashed, total, kills=6, seed=7)
    assert len(killed) >= 4 and all(0 < k < total for k in killed), (killed, total)
    done = subprocess.run(
        _example(crashed), check=True, capture_output=True, text=True, timeout=120
    )
    assert "resumed from" in done.stdout and "4/4 conversations finished (0 failed)" in done.stdout
    # The same events, ids and contents, as the run nobody killed: every question answered
    # once, every answer checked once, every conversation ended once.
    assert _rows(crashed) == _rows(clean)
    types = Counter(t for t, _ in _rows(crashed).values())
    assert types["example.question"] == types["example.answer"] == 12
    assert types["example.accepted"] + types["example.flagged"] == 12
    assert types["conversation.finished"] == 4 and types["campaign.finished"] == 1


def test_two_nodes_of_one_name_are_one_clear_error_at_construction() -> None:
    """Two ``Node.of(Worker)`` (two judges of one class, say) share the default name: the
    graph says so when it is built, naming the fix, instead of a nested exception group when
    the run registers the second agent."""
    with pytest.raises(InputError, match=r"two nodes are named 'worker'") as caught:
        Graph(
            campaign="g",
            nodes=[Node.of(Starter), Node.of(Worker), Node.of(Worker)],
            conversations=[Begin(campaign="g", conversation="c0")],
        )
    assert caught.value.field == "nodes[2].name"
    assert "name=" in str(caught.value) and "\n" not in str(caught.value)
    Graph(  # named apart, they are two nodes
        campaign="g",
        nodes=[Node.of(Starter), Node.of(Worker, name="a"), Node.of(Worker, name="b")],
        conversations=[Begin(campaign="g", conversation="c0")],
    )


class Orphan(Message, frozen=True, tag="test_engine.orphan"):
    pass


class Kept(Message, frozen=True, tag="test_engine.kept"):
    record = True


class Declared(Agent):
    """Takes Begin, publishes what ``sends`` says (declared)."""

    publishes: ClassVar[tuple[type[Message], ...] | None] = (Step, Orphan)

    @on(Begin)
    def begin(self, msg: Begin) -> None: ...


class Waiting(Agent):
    """Handles a type that nothing in the graph publishes."""

    publishes = (ConversationFinished,)

    @on(Orphan, Done)
    def wait(self, msg: Message) -> None: ...


def test_a_published_type_nothing_handles_is_refused_at_construction() -> None:
    with pytest.raises(InputError, match=r"'declared' publishes Step") as caught:
        Graph(
            campaign="g",
            nodes=[Node.of(Declared)],
            conversations=[Begin(campaign="g", conversation="c0")],
        )
    assert caught.value.field == "nodes[0].publishes" and "\n" not in str(caught.value)

    class Recording(Declared):
        publishes = (Kept,)

    Graph(  # a type kept for the log only needs no handler
        campaign="g",
        nodes=[Node.of(Recording, name="r")],
        conversations=[Begin(campaign="g", conversation="c0")],
    )


def test_a_handler_for_a_type_nothing_publishes_is_refused_at_construction() -> None:
    class Stepper(Declared):
        publishes = (Step,)

    class Taker(Agent):
        publishes = ()

        @on(Step)
        def take(self, msg: Step) -> None: ...

    with pytest.raises(InputError, match=r"'waiting' handles Orphan \('test_engine.orphan'\)") as e:
        Graph(
            campaign="g",
            nodes=[Node.of(Stepper), Node.of(Taker), Node.of(Waiting)],
            conversations=[Begin(campaign="g", conversation="c0")],
        )
    assert e.value.field == "nodes[2].types"
    # A node that does not say what it publishes may feed any handler: no verdict then.
    Graph(
        campaign="g",
        nodes=[Node.of(Stepper), Node.of(Taker), Node.of(Waiting), Node.of(Worker)],
        conversations=[Begin(campaign="g", conversation="c0")],
    )


def test_the_campaign_graph_declares_every_node_so_its_wiring_is_checked() -> None:
    from mhsafeeval.campaign import campaign_graph
    from mhsafeeval.config import parse_config
    from mhsafeeval.messages import ConversationStarted
    from mhsafeeval.plan import build_plan
    from mhsafeeval.providers import ScriptedModel
    from mhsafeeval.testing import scripted_models

    for controller in ("map-elites", "uct", "random", "single-turn"):
        text = f'[campaign]\nname = "w"\ncontroller = "{controller}"\n' + scripted_models()
        config = parse_config(text, "w.toml")
        plan = build_plan(config, "w.toml")
        model = ScriptedModel("m", ["x"])
        graph = campaign_graph(
            config,
            plan,
            [
                ConversationStarted(
                    campaign="w", conversation="c", counselor_model="m", profile_id="p"
                )
            ],
            roles=dict.fromkeys(("client", "mutator", "judge", "refiner"), model),
            counselors=dict.fromkeys(config.counselors, model),
        )
        assert [n.name for n in graph.nodes if n.publishes is None] == [], controller


class Shout(Message, frozen=True, tag="test_engine.shout"):
    loud: bool = False


class Caller(Agent):
    publishes = (Shout, ConversationFinished)

    @on(Begin)
    def call(self, msg: Begin) -> None:
        self.publish(Shout(**msg.child_ids(key="quiet")))
        self.publish(Shout(**msg.child_ids(key="loud"), loud=True), topic="loud")
        self.publish(ConversationFinished(**msg.child_ids(), turns=1))


class Listener(Agent):
    heard: list[tuple[str, bool]] = []
    publishes = ()

    @on(Shout)
    def hear(self, msg: Shout) -> None:
        Listener.heard.append((self.id.type, msg.loud))


@pytest.mark.anyio
async def test_a_node_with_a_topic_receives_only_that_topic() -> None:
    Listener.heard = []
    graph = Graph(
        campaign="t",
        nodes=[
            Node.of(Caller),
            Node.of(Listener, name="all"),
            Node.of(Listener, name="loud-only", topic="loud"),
        ],
        conversations=[Begin(campaign="t", conversation="c0")],
    )
    async with MemoryEventStore() as store:
        result = await run_graph(graph, store)
    assert result.status == "completed"
    assert sorted(Listener.heard) == [("all", False), ("all", True), ("loud-only", True)]
