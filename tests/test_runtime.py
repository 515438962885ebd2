"""The bus: routing, actor ordering, per-conversation instances, failure isolation, cancellation."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
import sniffio

from mhsafeeval.framework import Agent, AgentId, HandlerFailed, Message, Runtime, on
from mhsafeeval.testing import Recorder

pytestmark = pytest.mark.anyio


class Ping(Message, frozen=True, tag="test.ping"):
    n: int = 0


class LoudPing(Ping, frozen=True, tag="test.loud_ping"):
    pass


class Pong(Message, frozen=True, tag="test.pong"):
    n: int = 0


class Boom(Message, frozen=True, tag="test.boom"):
    pass


class Collector(Agent):
    def __init__(self) -> None:
        super().__init__()
        self.pings: list[int] = []
        self.pongs: list[int] = []

    @on(Ping)
    def ping(self, msg: Ping) -> None:
        self.pings.append(msg.n)

    @on(Pong)
    async def pong(self, msg: Pong) -> None:
        await anyio.lowlevel.checkpoint()
        self.pongs.append(msg.n)


async def test_routes_by_type_including_subclasses() -> None:
    rec = Recorder()
    async with Runtime() as rt:
        agent = Collector()
        rt.add(agent)
        rt.subscribe(rec, name="rec")
        rt.publish(Ping(n=1))
        rt.publish(LoudPing(n=2))
        rt.publish(Pong(n=3))
        rt.publish(Boom())
        await rt.run_until_idle()
    assert agent.pings == [1, 2]
    assert agent.pongs == [3]
    assert rec.tags() == ["test.ping", "test.loud_ping", "test.pong", "test.boom"]


async def test_topic_filter() -> None:
    async with Runtime() as rt:
        red, any_topic = Collector(), Collector()
        rt.add(red, name="red", topic="red")
        rt.add(any_topic, name="any")
        rt.publish(Ping(n=1), topic="red")
        rt.publish(Ping(n=2), topic="blue")
        rt.publish(Ping(n=3))
        await rt.run_until_idle()
    assert red.pings == [1]
    assert any_topic.pings == [1, 2, 3]


class Sequential(Agent):
    """Records the order of handling and how many handlers ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[int] = []
        self.running = 0
        self.max_running = 0

    @on(Ping)
    async def handle(self, msg: Ping) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        for _ in range(msg.n % 3 + 1):  # uneven work per message
            await anyio.lowlevel.checkpoint()
        self.order.append(msg.n)
        self.running -= 1


async def test_actor_handles_one_message_at_a_time_in_order() -> None:
    async with Runtime() as rt:
        agent = Sequential()
        rt.add(agent)
        for n in range(200):
            rt.publish(Ping(n=n))
        await rt.run_until_idle()
    assert agent.order == list(range(200))
    assert agent.max_running == 1


class Waiter(Agent):
    """Conversation c0 waits for an event that only conversation c1 sets."""

    gate: anyio.Event

    @on(Ping)
    async def handle(self, msg: Ping) -> None:
        if msg.conversation == "c0":
            await type(self).gate.wait()
            self.publish(Pong(conversation="c0", n=msg.n))
        else:
            type(self).gate.set()


async def test_per_conversation_instances_run_concurrently() -> None:
    Waiter.gate = anyio.Event()
    rec = Recorder()
    made: list[AgentId] = []

    def factory(agent_id: AgentId) -> Agent:
        made.append(agent_id)
        return Waiter()

    with anyio.fail_after(10):  # a serialised runtime would deadlock here
        async with Runtime() as rt:
            rt.register("waiter", factory, types=(Ping,), scope="conversation")
            rt.subscribe(rec, name="rec", types=(Pong,))
            rt.publish(Ping(conversation="c0", n=1))
            rt.publish(Ping(conversation="c1", n=2))
            await rt.run_until_idle()
    assert [m.n for m in rec.of(Pong)] == [1]
    assert made == [AgentId("waiter", "c0"), AgentId("waiter", "c1")]


async def test_global_scope_registers_a_single_lazy_instance() -> None:
    made: list[AgentId] = []

    def factory(agent_id: AgentId) -> Agent:
        made.append(agent_id)
        return Collector()

    async with Runtime() as rt:
        rt.register("one", factory, types=(Ping,), scope="global")
        for c in ("a", "b", "c"):
            rt.publish(Ping(conversation=c))
        await rt.run_until_idle()
    assert made == [AgentId("one", "")]


class Stepper(Agent):
    """A two-step pipeline per conversation: Ping -> (slow) Pong; Boom raises."""

    started: list[str]
    finished: list[str]

    @on(Ping)
    async def step(self, msg: Ping) -> None:
        type(self).started.append(msg.conversation)
        await anyio.sleep(0 if msg.n == 0 else 3600)  # conversation "bad" hangs until cancelled
        type(self).finished.append(msg.conversation)
        self.publish(Pong(**msg.child_ids(), n=msg.n))

    @on(Boom)
    def explode(self, msg: Boom) -> None:
        raise ValueError(f"broken in {msg.conversation}")


async def test_handler_failure_cancels_only_its_conversation() -> None:
    Stepper.started, Stepper.finished = [], []
    rec = Recorder()
    with anyio.fail_after(10):
        async with Runtime() as rt:
            rt.register("stepper", Stepper, scope="conversation")
            rt.register("exploder", Stepper, scope="conversation", types=(Boom,))
            rt.subscribe(rec, name="rec")
            rt.publish(Ping(conversation="bad", n=1))  # in flight in another agent, hangs
            rt.publish(Ping(conversation="good", n=0))
            # Let both pings start before the failure arrives.
            while len(Stepper.started) < 2:
                await anyio.lowlevel.checkpoint()
            rt.publish(Boom(conversation="bad", turn=4))
            await rt.run_until_idle()
            rt.publish(Ping(conversation="bad", n=0))  # dropped: the conversation is cancelled
            rt.publish(Ping(conversation="good", n=0))
            await rt.run_until_idle()
            for conversation in ("bad", "good"):
                rt.end_conversation(conversation)
            for _ in range(10):  # the mailboxes' tasks leave their conversations' scopes
                await anyio.lowlevel.checkpoint()
            assert not rt._scopes
    assert Stepper.finished == ["good", "good"]
    failures = rec.of(HandlerFailed)
    assert len(failures) == 1
    failed = failures[0]
    assert (failed.conversation, failed.turn, failed.message_type) == ("bad", 4, "test.boom")
    assert (failed.error_type, failed.error) == ("ValueError", "broken in bad")
    assert failed.agent == "exploder[bad]"
    assert failed.handler == "explode"
    assert rt.cancelled_conversations == {"bad"}
    assert rt.dropped >= 1
    # Observers still saw everything that was published, including the dropped ping.
    assert [m.conversation for m in rec.of(Ping)] == ["bad", "good", "bad", "good"]


async def test_failure_without_conversation_is_recorded_and_runtime_goes_on() -> None:
    rec = Recorder()
    async with Runtime() as rt:
        rt.register("exploder", Stepper, scope="global", types=(Boom,))
        rt.subscribe(rec, name="rec")
        rt.publish(Boom())
        rt.publish(Boom(key="2"))
        await rt.run_until_idle()
    assert len(rec.of(HandlerFailed)) == 2
    assert rt.cancelled_conversations == frozenset()


class Slow(Agent):
    stopped = False
    cancelled = False

    @on(Ping)
    async def handle(self, msg: Ping) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            type(self).cancelled = True
            raise

    async def on_stop(self) -> None:
        type(self).stopped = True


async def test_cancellation_propagates_and_agents_stop() -> None:
    Slow.stopped = Slow.cancelled = False
    with anyio.CancelScope() as outer:
        async with Runtime() as rt:
            rt.add(Slow())
            rt.publish(Ping(conversation="c"))
            while not rt.pending:
                await anyio.lowlevel.checkpoint()
            await anyio.wait_all_tasks_blocked()
            outer.cancel()
            await rt.run_until_idle()  # cancelled here: never swallowed
            pytest.fail("cancellation was swallowed")
    assert outer.cancelled_caught
    assert Slow.cancelled
    assert Slow.stopped


async def test_critical_observer_failure_stops_the_runtime() -> None:
    def broken_store(msg: Message) -> None:
        raise OSError("disk full")

    with pytest.raises(ExceptionGroup) as info:
        async with Runtime() as rt:
            rt.subscribe(broken_store, name="store", critical=True)
            rt.publish(Ping())
            await rt.run_until_idle()
            await anyio.sleep_forever()
    assert info.group_contains(OSError, match="disk full")


async def test_a_failing_non_critical_observer_is_detached_and_cancels_nothing() -> None:
    seen: list[Message] = []

    def broken(msg: Message) -> None:
        seen.append(msg)
        raise RuntimeError("observer bug")

    rec = Recorder()
    async with Runtime() as rt:
        rt.subscribe(broken, name="broken")
        rt.subscribe(rec, name="rec")
        rt.publish(Ping(conversation="c1"))
        rt.publish(Ping(conversation="c1", n=1, key="1"))
        await rt.run_until_idle()
        rt.publish(Ping(conversation="c1", n=2, key="2"))
        await rt.run_until_idle()
    # Logged once and detached: it sees nothing more, no conversation is cancelled, no
    # HandlerFailed is published, and the other observer gets everything.
    assert rt.failures == 1 and len(seen) == 1
    assert rt.cancelled_conversations == frozenset()
    assert [m.n for m in rec.of(Ping)] == [0, 1, 2] and not rec.of(HandlerFailed)


async def test_run_until_idle_waits_for_chains() -> None:
    class Relay(Agent):
        @on(Ping)
        async def relay(self, msg: Ping) -> None:
            await anyio.lowlevel.checkpoint()
            if msg.n < 50:
                self.publish(Ping(n=msg.n + 1, key=str(msg.n + 1)))

    rec = Recorder()
    async with Runtime() as rt:
        rt.add(Relay())
        rt.subscribe(rec, name="rec")
        rt.publish(Ping(n=0))
        await rt.run_until_idle()
        assert [m.n for m in rec.of(Ping)] == list(range(51))
        assert rt.pending == 0


async def test_names_are_unique_and_runtime_must_run() -> None:
    rt = Runtime()
    with pytest.raises(RuntimeError, match="not running"):
        rt.add(Collector())
    async with Runtime() as rt:
        rt.add(Collector(), name="x")
        with pytest.raises(ValueError, match="already registered"):
            rt.subscribe(print, name="x")


async def test_end_conversation_stops_its_instances() -> None:
    stopped: list[str] = []

    class Tracked(Collector):
        async def on_stop(self) -> None:
            stopped.append(self.id.key)

    async with Runtime() as rt:
        rt.register("tracked", Tracked, scope="conversation")
        rt.publish(Ping(conversation="a"))
        rt.publish(Ping(conversation="b"))
        await rt.run_until_idle()
        rt.end_conversation("a")
        await anyio.wait_all_tasks_blocked()
        assert stopped == ["a"]
    assert sorted(stopped) == ["a", "b"]


def test_on_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        on(int)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        on()


def test_overridden_handler_without_on_is_not_a_handler() -> None:
    class Quiet(Collector):
        def ping(self, msg: Ping) -> None:  # overrides without @on
            pass

    assert Quiet.handled_types() == (Pong,)
    assert Collector.handled_types() == (Ping, Pong)


class Wide(Agent):
    """Opts in to four handlers at once: four pings meet at a barrier no single handler passes."""

    max_concurrent_handlers = 4

    def __init__(self) -> None:
        super().__init__()
        self.arrived = 0
        self.everyone = anyio.Event()
        self.started: list[int] = []
        self.peak = 0
        self.running = 0

    @on(Ping)
    async def meet(self, msg: Ping) -> None:
        self.started.append(msg.n)
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.arrived += 1
        if self.arrived == 4:
            self.everyone.set()
        await self.everyone.wait()
        self.running -= 1


async def test_an_agent_may_opt_in_to_concurrent_handlers() -> None:
    agent = Wide()
    with anyio.fail_after(10):  # one handler at a time would wait at the barrier forever
        async with Runtime() as rt:
            rt.add(agent)
            for n in range(9):
                rt.publish(Ping(n=n, key=str(n)))
            await rt.run_until_idle()
    assert agent.started == list(range(9))  # started in mailbox order
    assert agent.peak == 4  # never more than it asked for


def _current_task() -> object:
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_task()
    import asyncio

    return asyncio.current_task()


class Counted(Agent):
    """Four handlers at once; notes which task ran each and whether the agent had stopped."""

    max_concurrent_handlers = 4

    def __init__(self) -> None:
        super().__init__()
        self.tasks: set[object] = set()  # held: a dead task's id could be reused
        self.handled = 0
        self.running = self.peak = 0
        self.stops = 0
        self.handled_after_stop = 0
        self.seen: list[int] = []

    @on(Ping)
    def note(self, msg: Ping) -> None:
        self.seen.append(msg.n)

    @on(Ping)
    async def work(self, msg: Ping) -> None:
        self.tasks.add(_current_task())
        self.running += 1
        self.peak = max(self.peak, self.running)
        for _ in range(msg.n % 3):
            await anyio.lowlevel.checkpoint()
        self.running -= 1
        self.handled += 1
        self.handled_after_stop += self.stops > 0

    async def on_stop(self) -> None:
        self.stops += 1


async def test_concurrent_handlers_run_in_a_few_tasks_not_one_per_message() -> None:
    agent = Counted()
    async with Runtime() as rt:
        rt.add(agent)
        for n in range(200):
            rt.publish(Ping(n=n, key=str(n)))
            if n % 7 == 0:
                await anyio.lowlevel.checkpoint()  # some arrive while handlers run
        await rt.run_until_idle()
        assert agent.stops == 0
    assert agent.handled == 200 and agent.seen == list(range(200))
    assert agent.peak <= 4
    assert len(agent.tasks) <= 4  # at most one task per concurrent handler
    assert agent.stops == 1 and agent.handled_after_stop == 0  # stopped once, after the last


async def test_a_wide_agent_per_conversation_stops_once_after_its_handlers() -> None:
    agents: list[Counted] = []

    def make(aid: AgentId) -> Counted:
        agents.append(Counted())
        return agents[-1]

    async with Runtime() as rt:
        rt.register("wide", make, types=(Ping,))
        for n in range(40):
            rt.publish(Ping(conversation=f"c{n % 4}", n=n, key=str(n)))
        await anyio.lowlevel.checkpoint()
        for c in range(4):
            rt.end_conversation(f"c{c}")  # the queued pings are still handled, then it stops
        await rt.run_until_idle()
    assert [a.handled for a in agents] == [10] * 4
    assert all(a.stops == 1 and a.handled_after_stop == 0 for a in agents)
    assert all(a.peak <= 4 and len(a.tasks) <= 4 for a in agents)


# -- replay and redo (resume) -------------------------------------------------------------------


class Task(Message, frozen=True, tag="test.replay.task"):
    n: int = 0


class Done(Message, frozen=True, tag="test.replay.done"):
    n: int = 0


class Worker(Agent):
    """State in a sync handler, work (and its answer) in an async one."""

    outcomes = (Done,)
    seen: list[int]
    worked: list[int]

    def __init__(self) -> None:
        super().__init__()
        self.seen = []
        self.worked = []

    @on(Task)
    def note(self, msg: Task) -> None:
        self.seen.append(msg.n)

    @on(Task)
    async def work(self, msg: Task) -> None:
        await anyio.lowlevel.checkpoint()
        self.worked.append(msg.n)
        self.publish(Done(**msg.child_ids(), n=msg.n))


class Planner(Agent):
    """Decides the next task from what it saw (sync), like a search controller."""

    @on(Done)
    def next_task(self, msg: Done) -> None:
        if msg.n < 3:
            self.publish(Task(conversation=msg.conversation, turn=msg.n + 1, n=msg.n + 1))


async def test_replay_rebuilds_state_and_redo_finishes_only_unanswered_work() -> None:
    workers: dict[str, Worker] = {}

    def make(aid: AgentId) -> Worker:
        workers[aid.key] = Worker()
        return workers[aid.key]

    # What a stopped run stored: task 0 done, task 1 decided but never answered.
    t0 = Task(conversation="c", turn=0, n=0)
    d0 = Done(**t0.child_ids(), n=0)
    t1 = Task(conversation="c", turn=1, n=1)
    stored = [t0, d0, t1]
    async with Runtime() as rt:
        replayed = Recorder()
        live = Recorder()
        rt.subscribe(replayed, name="progress", replay=True)
        rt.subscribe(live, name="store")
        rt.register("worker", make, types=Worker.handled_types())
        rt.add(Planner(), name="planner")
        rt.begin_replay({m.id for m in stored})
        for m in stored:
            rt.replay(m)
        assert workers["c"].seen == [0, 1] and workers["c"].worked == []  # no work redone
        suppressed, fresh = rt.end_replay()
        assert (suppressed, fresh) == (1, [])  # the planner's task 1 was already stored
        children = {t0.id: [d0]}
        redone = [rt.redo(m, children.get(m.id, ())) for m in stored]
        assert redone == [[], [], ["worker[c]"]]  # only the unanswered task, only the worker
        await rt.run_until_idle()
    assert workers["c"].worked == [1, 2, 3]  # task 1 redone, then the run went on
    assert workers["c"].seen == [0, 1, 2, 3]  # task 1's sync handler did not run twice
    assert [m.tag for m in replayed.messages][:3] == [t0.tag, d0.tag, t1.tag]
    assert [getattr(m, "n", None) for m in live.messages] == [1, 2, 2, 3, 3]


async def test_decisions_missing_from_the_store_are_published_after_replay() -> None:
    t0 = Task(conversation="c", turn=0, n=0)
    d0 = Done(**t0.child_ids(), n=0)
    async with Runtime() as rt:
        worker = Worker()
        rt.add(worker, name="worker")
        rt.add(Planner(), name="planner")
        rt.begin_replay({t0.id, d0.id})
        with pytest.raises(RuntimeError, match="already"):
            rt.begin_replay(set())
        for m in (t0, d0):
            rt.replay(m)
        suppressed, fresh = rt.end_replay()  # the stopped run had decided task 1, not stored it
        planned = Task(conversation="c", turn=1, publisher="planner")  # the node that decided
        assert suppressed == 0 and [m.id for m in fresh] == [planned.id]
        await rt.run_until_idle()
    assert worker.worked == [1, 2, 3]
    with pytest.raises(RuntimeError, match="begin_replay"):
        Runtime().replay(t0)


# --- the delivery contract ----------------------------------------------------------------------


async def test_cancelling_a_conversation_never_cuts_an_observer_short() -> None:
    """An observer that is still handling a message when that message's conversation is
    cancelled finishes it: the event store's append must never be cancelled."""
    stored: list[str] = []
    gate = anyio.Event()

    async def slow_store(msg: Message) -> None:
        if isinstance(msg, Boom):
            await gate.wait()  # a store waiting for room, at the worst moment
        stored.append(msg.id)

    class Fails(Agent):
        @on(Ping)
        async def fail(self, msg: Ping) -> None:
            raise RuntimeError("bug")  # cancels c1 while the store still waits on its Boom

    def opener(msg: Message) -> None:
        if isinstance(msg, HandlerFailed):  # published after the cancellation
            gate.set()

    published: list[str] = []
    async with Runtime() as rt:
        rt.subscribe(slow_store, name="store", critical=True)
        rt.subscribe(lambda m: published.append(m.id), name="rec")
        rt.subscribe(opener, name="opener")
        rt.register("fails", Fails)
        rt.publish(Boom(conversation="c1"))
        rt.publish(Ping(conversation="c1"))
        with anyio.fail_after(30):
            await rt.run_until_idle()
    assert "c1" in rt.cancelled_conversations
    assert stored == published  # the Boom, the Ping and the HandlerFailed, in order


def test_a_sqlite_store_keeps_every_message_when_a_handler_fails(tmp_path: Path) -> None:
    """The reproduction from the issue: a small batch and pending limit make the store's
    append wait for the writer, and a failing handler used to cancel that wait, losing a
    message. The stored log must be exactly what was published, in order."""
    from mhsafeeval.storage import SqliteEventStore

    class Relay(Agent):
        @on(Ping)
        async def relay(self, msg: Ping) -> None:
            await anyio.lowlevel.checkpoint()
            if msg.n == 700:
                raise RuntimeError("bug")
            if msg.n < 1500:
                self.publish(Ping(conversation=msg.conversation, n=msg.n + 1, key=str(msg.n + 1)))

    async def main() -> tuple[list[str], list[str]]:
        published: list[str] = []
        async with SqliteEventStore(tmp_path / "e.db", batch_size=8, max_pending=8) as store:
            await store.register_campaign("")
            async with Runtime() as rt:
                rt.subscribe(store.append, name="store", critical=True)
                rt.subscribe(lambda m: published.append(m.id), name="rec")
                rt.register("relay", Relay)
                for conversation in ("c1", "c2"):
                    rt.publish(Ping(conversation=conversation))
                with anyio.fail_after(60):
                    await rt.run_until_idle()
            await store.flush()
            stored = [e.id async for e in store.events("")]
        return published, stored

    published, stored = anyio.run(main, backend="asyncio")
    assert len(published) > 1000
    assert stored == published


async def test_a_factory_or_on_start_that_raises_fails_only_its_conversation() -> None:
    class Picky(Agent):
        def __init__(self, agent_id: AgentId) -> None:
            super().__init__()
            if agent_id.key == "bad-factory":
                raise ValueError("cannot build this one")
            self.key = agent_id.key

        async def on_start(self) -> None:
            if self.key == "bad-start":
                raise RuntimeError("cannot start this one")

        @on(Ping)
        async def pong(self, msg: Ping) -> None:
            self.publish(Pong(**msg.child_ids(key="pong")))

    rec = Recorder()
    async with Runtime() as rt:
        rt.subscribe(rec, name="rec")
        rt.register("picky", lambda aid: Picky(aid), types=(Ping,))
        for conversation in ("bad-factory", "good", "bad-start"):
            rt.publish(Ping(conversation=conversation))
        with anyio.fail_after(30):
            await rt.run_until_idle()
        rt.publish(Ping(conversation="good", n=1, key="again"))  # the runtime still runs
        await rt.run_until_idle()
    assert [p.conversation for p in rec.of(Pong)] == ["good", "good"]
    failures = {f.conversation: f for f in rec.of(HandlerFailed)}
    assert set(failures) == {"bad-factory", "bad-start"}
    assert failures["bad-factory"].handler == "factory"
    assert failures["bad-factory"].error == "cannot build this one"
    assert failures["bad-start"].handler == "on_start"
    assert rt.cancelled_conversations == {"bad-factory", "bad-start"}


# -- mailbox tasks are reused -------------------------------------------------------------------


class Greeter(Agent):
    """Per conversation: says which conversation it started in and stops."""

    started: list[tuple[str, str]] = []
    stopped: list[str] = []

    async def on_start(self) -> None:
        import structlog.contextvars

        bound = structlog.contextvars.get_contextvars()
        Greeter.started.append((self.id.key, bound.get("conversation", "")))

    @on(Ping)
    async def greet(self, msg: Ping) -> None:
        await anyio.lowlevel.checkpoint()
        self.publish(Pong(**msg.child_ids(), n=msg.n))

    async def on_stop(self) -> None:
        Greeter.stopped.append(self.id.key)


async def test_conversations_one_after_another_reuse_their_mailbox_tasks(
    anyio_backend: str,
) -> None:
    """Every conversation gets its own agent instances and mailboxes, but on asyncio the tasks
    that drain them are handed on when a conversation ends instead of each mailbox starting a
    task (anyio's task start and end cost as much as a model call's HTTP exchange). Each
    instance still starts and stops once, with its own conversation's log context."""
    Greeter.started, Greeter.stopped = [], []
    made = 0
    rec = Recorder()

    async with Runtime() as rt:
        if anyio_backend == "asyncio":
            import asyncio

            loop = asyncio.get_running_loop()

            def counting(loop: asyncio.AbstractEventLoop, coro: object, **kw: object) -> object:
                nonlocal made
                made += 1
                return asyncio.Task(coro, loop=loop, **kw)  # type: ignore[arg-type]

            loop.set_task_factory(counting)  # type: ignore[arg-type]
        rt.register("greeter", Greeter)
        rt.subscribe(rec, name="rec")
        for n in range(30):
            conversation = f"c{n}"
            rt.publish(Ping(conversation=conversation, n=n))
            await rt.run_until_idle()
            rt.end_conversation(conversation)
            await rt.run_until_idle()
        started = getattr(rt, "tasks_started", None)
        if anyio_backend == "asyncio":
            loop.set_task_factory(None)
    if anyio_backend == "asyncio":
        assert made <= 3, made  # the first mailbox's task, handed on 29 times
        assert started is not None and started <= 2
    else:
        assert started == 31  # trio: a task per mailbox (30 greeters and the observer)
    assert Greeter.started == [(f"c{n}", f"c{n}") for n in range(30)]
    assert Greeter.stopped == [f"c{n}" for n in range(30)]
    assert [m.n for m in rec.messages if isinstance(m, Pong)] == list(range(30))


async def test_a_runtime_with_parked_tasks_exits() -> None:
    async with Runtime() as rt:
        rt.register("greeter", Greeter)
        for n in range(5):
            rt.publish(Ping(conversation=f"p{n}", n=n))
        await rt.run_until_idle()
        for n in range(5):
            rt.end_conversation(f"p{n}")
        await rt.run_until_idle()
    # leaving the block ends the parked tasks: reaching here is the test (hang guard: timeout)


async def test_parked_mailbox_tasks_keep_no_ended_agent_alive() -> None:
    import gc
    import weakref

    made: list[weakref.ref[Agent]] = []

    def make(_: AgentId) -> Agent:
        agent = Greeter()
        made.append(weakref.ref(agent))
        return agent

    async with Runtime() as rt:
        rt.register("greeter", make, types=(Ping,))
        for n in range(20):
            rt.publish(Ping(conversation=f"g{n}", n=n))
            await rt.run_until_idle()
            rt.end_conversation(f"g{n}")
            await rt.run_until_idle()
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        gc.collect()
        alive = [ref for ref in made if ref() is not None]
        assert alive == [], f"{len(alive)} of {len(made)} ended agents still held"
