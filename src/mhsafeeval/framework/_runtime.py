"""The runtime: routes published messages to agents and observers, each with one mailbox."""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Container, Iterable, Iterator
from types import TracebackType
from typing import Any, Literal, cast

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup
from structlog.contextvars import bind_contextvars

from ._agent import Agent, AgentId
from ._message import (
    HandlerFailed,
    Intercepted,
    Message,
    MessageCollision,
    decode_message,
    fingerprint,
    message_id,
)

__all__ = ["Interceptor", "Observer", "Runtime", "Scope"]

log = structlog.get_logger("mhsafeeval.framework")

Scope = Literal["global", "conversation"]
"""How many instances of a registered agent type there are: one per conversation, or one."""
Observer = Callable[[Message], Awaitable[None] | None]
Interceptor = Callable[[Message], Message | None]
"""Given a message before any agent sees it: returns it (pass), another message (rewrite) or
None (drop). Synchronous: it runs inside ``publish``."""
_FAIRNESS = 64  # messages a mailbox may handle in a row before yielding to other tasks
_PARKED = 1024  # idle mailbox tasks kept for the next mailbox (asyncio; see Runtime._hand)
OBSERVER_BACKLOG = 2000
"""Messages an observer may have queued before agents' ``async`` handlers wait for it: what
bounds memory when agents publish faster than, say, the event store writes."""


class _Redo:
    """A stored message queued again for an agent's async handlers only (see Runtime.redo)."""

    __slots__ = ("msg",)

    def __init__(self, msg: Message) -> None:
        self.msg = msg


class _Parked:
    """A mailbox task with nothing to drain, waiting to be handed the next mailbox."""

    __slots__ = ("job", "wake")

    def __init__(self, wake: anyio.Event) -> None:
        self.wake = wake
        self.job: tuple[Callable[[_Mailbox], Awaitable[None]], _Mailbox] | None = None


class _Unbuilt(Agent):
    """Stands in for an agent whose factory or ``on_start`` raised: it handles nothing."""


class _Replay:
    __slots__ = ("fresh", "intercepted", "known", "replacements", "suppressed")

    def __init__(self, known: Container[str]) -> None:
        self.known = known
        self.fresh: list[tuple[Message, str]] = []
        self.suppressed = 0
        self.intercepted: set[str] = set()  # ids an interceptor took before the stop
        self.replacements: dict[str, str] = {}  # what it put on instead, by id (JSON)


def _unpublished_id(msg: Message) -> str:
    """The id ``msg`` had before publishers were part of ids: what a campaign stored by an
    earlier version holds for it (a resumed run of such a campaign finds its messages so)."""
    return message_id(
        msg.tag, msg.campaign, msg.conversation, msg.turn, msg.attempt, msg.branch, msg.key
    )


def _answer_intercepted(agent: Agent, children: Iterable[Message]) -> bool:
    """Whether an interceptor dropped or rewrote this agent's answer (one of its outcomes,
    published by its node): the answer was given, and the interceptor's decision stands."""
    tags = {t.tag_name() for t in agent.outcomes}
    return any(
        isinstance(c, Intercepted)
        and c.original_publisher == agent.id.type
        and c.message_type in tags
        for c in children
    )


def _bind(msg: Message) -> None:
    bind_contextvars(
        campaign=msg.campaign, conversation=msg.conversation, turn=msg.turn, attempt=msg.attempt
    )


class _Mailbox:
    """One queue, drained by one task (by up to ``width`` tasks for an agent with concurrent
    handlers). ``agent`` is set for agents, ``callback`` for observers."""

    __slots__ = (
        "agent",
        "busy",
        "callback",
        "closed",
        "conversation",
        "critical",
        "detached",
        "drainers",
        "name",
        "queue",
        "wake",
        "width",
    )

    def __init__(
        self, name: str, agent: Agent | None, callback: Observer | None, critical: bool
    ) -> None:
        self.name = name
        self.agent = agent
        self.callback = callback
        self.critical = critical
        self.queue: deque[Message | _Redo] = deque()
        self.wake: anyio.Event | None = None  # set by whoever queues; every idle drainer waits
        self.closed = False
        self.width = agent.max_concurrent_handlers if agent is not None else 1
        self.drainers = 0  # tasks draining the queue (at most width)
        self.busy = 0  # of them, those handling a message
        self.detached = False  # a non-critical observer that raised: sees nothing more
        self.conversation = ""  # an agent instance of one conversation: its id


class _Subscription:
    __slots__ = ("factory", "instances", "mailbox", "name", "replay", "scope", "topic", "types")

    def __init__(
        self,
        name: str,
        types: tuple[type[Message], ...],
        topic: str | None,
        *,
        factory: Callable[[AgentId], Agent] | None = None,
        scope: Scope = "global",
        mailbox: _Mailbox | None = None,
        replay: bool = False,
    ) -> None:
        self.name = name
        self.replay = replay  # observers: also see replayed messages
        self.types = types
        self.topic = topic
        self.factory = factory
        self.scope = scope
        self.mailbox = mailbox  # observers and single agents
        self.instances: dict[str, _Mailbox] = {}


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Runtime:
    """Owns a task group, starts agents and observers, and routes messages to them.

    Routing is by message type (an agent receives the types its ``@on`` handlers declare,
    subclasses included) and optionally by topic. Agent types registered with
    ``scope="conversation"`` get one instance per conversation id, created on its first message,
    so conversations run concurrently while each instance stays sequential.

    Observers (the event store, loggers, progress displays) subscribe with :meth:`subscribe` and
    see every message, including those of a cancelled conversation.

    The contract, in three parts:

    * **Delivery order.** Every receiver (an agent instance or an observer) has one mailbox and
      gets the messages it subscribed to in publish order; an agent with
      ``max_concurrent_handlers > 1`` *starts* them in that order. ``publish`` never blocks.
      Every observer sees every matching message exactly once, in publish order, so a stored
      log is exactly what was published.
    * **What an observer may do.** Read the message, keep state, publish, await (a store's
      write). It never runs inside a conversation's cancel scope: cancelling a conversation
      never cuts an observer short. A ``critical`` observer that raises stops the whole
      runtime (a store that cannot write must not be ignored); any other observer that raises
      is logged (``runtime.observer_detached``) and detached: it sees nothing more, and no
      conversation is cancelled because of it. An observer more than
      :data:`OBSERVER_BACKLOG` messages behind holds back the start of agents' ``async``
      handlers (never a synchronous handler, never ``publish``) until it is back under that
      mark, so a slow store bounds memory instead of queueing a whole campaign; an observer
      must therefore never wait for an agent's answer.
    * **What a failure cancels.** A handler, an agent factory or an ``on_start`` that raises
      cancels that message's conversation only (:meth:`cancel_conversation`: its running
      handlers are cancelled, its queued and later messages are dropped for agents) and is
      published as a :class:`HandlerFailed`; the other conversations and the runtime go on.
      Cancellation itself is never swallowed.

    Example:
        >>> import anyio
        >>> from mhsafeeval.framework import Agent, Message, Runtime, on
        >>> class Hello(Message, frozen=True, tag="doc.hello"):
        ...     text: str
        >>> class Printer(Agent):
        ...     @on(Hello)
        ...     def show(self, msg: Hello) -> None:
        ...         print(msg.text)
        >>> async def main() -> None:
        ...     async with Runtime() as rt:
        ...         rt.add(Printer())
        ...         rt.publish(Hello(text="hi"))
        ...         await rt.run_until_idle()
        >>> anyio.run(main)
        hi
    """

    def __init__(self, *, unique_ids: bool = False) -> None:
        """``unique_ids``: refuse a message published under an id already published (in an
        open conversation) with other content (:class:`MessageCollision`). Turn it on when the
        messages are stored (the engine does): a store keeps one message per id. Off, the
        runtime is a plain bus and ids mean nothing to it."""
        self._unique_ids = unique_ids
        self._subs: list[_Subscription] = []
        self._routes: dict[type[Message], list[_Subscription]] = {}
        self._tg: TaskGroup | None = None
        self._pending = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._cancelled: set[str] = set()
        self._scopes: defaultdict[str, set[anyio.CancelScope]] = defaultdict(set)
        self._event_cls: Callable[[], anyio.Event] = anyio.Event
        self._scope_cls: Callable[[], anyio.CancelScope] = anyio.CancelScope
        self._replay: _Replay | None = None
        self._last: dict[str, Message] = {}
        self._published_ids: dict[str, dict[str, int]] = {}  # per open conversation
        self._interceptors: list[tuple[str, tuple[type[Message], ...], Interceptor]] = []
        self._observers: list[_Mailbox] = []  # whose backlogs hold agents back
        self._caught_up: anyio.Event | None = None  # set when a backlogged observer drains
        self._parked: list[_Parked] = []  # idle mailbox tasks (asyncio only)
        self._reuse = False  # hand new mailboxes to parked tasks: on asyncio
        self._closing = False
        self.backlog_waits = 0
        """How many times an agent's async handler waited for a backlogged observer."""
        self.tasks_started = 0
        """Mailbox tasks started (parked ones handed a new mailbox are not counted)."""
        self.published = 0
        self.dropped = 0
        self.failures = 0

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        # The backend's Event class, looked up once: anyio.Event() dispatches on every call.
        self._event_cls = type(anyio.Event())
        self._scope_cls = type(anyio.CancelScope())
        self._reuse = _on_asyncio()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        if exc is None:
            self._close_all()  # agents finish what is queued, then stop
        else:
            self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    def _close_all(self) -> None:
        self._closing = True
        for mbox in self._mailboxes():
            mbox.closed = True
            if mbox.wake is not None:
                mbox.wake.set()
        parked, self._parked = self._parked, []
        for task in parked:  # handed no job: they end
            task.wake.set()

    def _mailboxes(self) -> list[_Mailbox]:
        out = [s.mailbox for s in self._subs if s.mailbox is not None]
        for s in self._subs:
            out.extend(s.instances.values())
        return out

    # -- registration --------------------------------------------------------------------------

    def add(self, agent: Agent, *, name: str | None = None, topic: str | None = None) -> AgentId:
        """Start one agent instance that receives every message its handlers declare."""
        agent.id = AgentId(name or type(agent).__name__)
        self._check_name(agent.id.type)
        agent._runtime = self
        mbox = _Mailbox(str(agent.id), agent, None, critical=False)
        self._add_sub(_Subscription(agent.id.type, agent.handled_types(), topic, mailbox=mbox))
        self._start(mbox)
        return agent.id

    def register(
        self,
        name: str,
        factory: type[Agent] | Callable[[AgentId], Agent],
        *,
        scope: Scope = "conversation",
        types: tuple[type[Message], ...] | None = None,
        topic: str | None = None,
    ) -> None:
        """Register an agent type whose instances are created on demand.

        Args:
            name: the agent type's name (unique in this runtime).
            factory: an Agent subclass (called with no arguments) or ``factory(agent_id)``.
            scope: ``"conversation"``: one instance per conversation id; ``"global"``: one.
            types: message types to receive; defaults to the class's ``@on`` types.
            topic: receive only messages published on this topic (None: any topic).
        """
        self._check_name(name)
        if types is None:
            if not (isinstance(factory, type) and issubclass(factory, Agent)):
                raise TypeError("register(): pass types=... when the factory is not an Agent class")
            types = factory.handled_types()
        make: Callable[[AgentId], Agent]
        if isinstance(factory, type):
            cls: type[Agent] = factory
            make = lambda _: cls()  # noqa: E731 - an Agent class is built with no arguments
        else:
            make = factory
        self._add_sub(_Subscription(name, types, topic, factory=make, scope=scope))

    def subscribe(
        self,
        callback: Observer,
        *,
        name: str,
        types: tuple[type[Message], ...] = (Message,),
        topic: str | None = None,
        critical: bool = False,
        replay: bool = False,
    ) -> None:
        """Attach an observer: a function called with each matching message, in order.

        The callback runs in its own task (one mailbox), so a slow observer delays only itself.
        ``replay``: also receive the stored messages a resumed run replays (:meth:`replay`);
        the event store must not (it has them), a progress display should. An observer with
        a ``replay(msg)`` method gets them through it, at once, instead of its callback.
        """
        self._check_name(name)
        mbox = _Mailbox(name, None, callback, critical)
        self._add_sub(_Subscription(name, types, topic, mailbox=mbox, replay=replay))
        self._observers.append(mbox)
        self._start(mbox)

    def intercept(
        self, interceptor: Interceptor, *, name: str, types: tuple[type[Message], ...] = (Message,)
    ) -> None:
        """Put ``interceptor`` between publishers and everyone else for messages of ``types``.

        It is called in :meth:`publish`, in the publisher's task, before any agent or
        observer gets the message. Returning the message passes it on; returning another
        message puts that one on the bus instead (keep the original's coordinates and
        publisher, ``msgspec.structs.replace(msg, text=...)``, so it answers what the original
        answered); returning None drops it. Each drop or rewrite is published first as an
        :class:`Intercepted` record (stored with the rest), and a resumed run takes the
        decision from there instead of asking again. Interceptors run in the order they were
        added, each on what the previous one let through; one that raises fails the
        publishing handler's conversation, like a handler that raises. Records and
        ``HandlerFailed`` are never intercepted.
        """
        self._check_name(name)
        self._interceptors.append((name, types, interceptor))
        self._subs.append(_Subscription(name, (), None))  # holds the name

    def _intercepted(self, msg: Message) -> Message | None:
        for name, types, interceptor in self._interceptors:
            if not isinstance(msg, types):
                continue
            out = interceptor(msg)
            if out is msg:
                continue
            if out is not None and not isinstance(out, Message):
                raise TypeError(
                    f"interceptor {name!r} returned {type(out).__name__}: return the message, "
                    "another Message, or None"
                )
            self._publish(Intercepted.of(msg, name, out), "")
            if out is None:
                return None
            msg = out
        return msg

    def _check_name(self, name: str) -> None:
        if any(s.name == name for s in self._subs):
            raise ValueError(f"an agent or observer named {name!r} is already registered")

    def _add_sub(self, sub: _Subscription) -> None:
        self._subs.append(sub)
        self._routes.clear()

    def _start(self, mbox: _Mailbox) -> None:
        if self._tg is None:
            raise RuntimeError("the runtime is not running: use `async with Runtime() as rt`")
        mbox.drainers = 1
        self._hand(self._drain, mbox)

    def _add_drainer(self, mbox: _Mailbox) -> None:
        """One more task for a mailbox whose drainers are all busy (an agent with concurrent
        handlers): messages wait for a free one instead of each getting a task of its own."""
        mbox.drainers += 1
        self._hand(self._drain_more, mbox)

    def _hand(self, job: Callable[[_Mailbox], Awaitable[None]], mbox: _Mailbox) -> None:
        """Run ``job(mbox)`` in a mailbox task: a parked one if there is one (asyncio), else a
        new one. Starting a task (anyio's task group bookkeeping, the task, its end) costs
        about as much as a model call's HTTP exchange, and a campaign starts several per
        conversation; a task whose mailbox closed parks instead of ending, up to ``_PARKED``
        of them. Trio keeps a task per mailbox (it shuffles tasks it wakes; new ones keep
        mailbox order, as the trio tests check)."""
        if self._parked:
            task = self._parked.pop()
            task.job = (job, mbox)
            task.wake.set()
            return
        assert self._tg is not None
        self.tasks_started += 1
        self._tg.start_soon(self._mailbox_task, job, mbox, name=f"mailbox:{mbox.name}")

    async def _mailbox_task(
        self, job: Callable[[_Mailbox], Awaitable[None]], mbox: _Mailbox
    ) -> None:
        work: tuple[Callable[[_Mailbox], Awaitable[None]], _Mailbox] | None = (job, mbox)
        del job, mbox  # a parked task must not keep its last (ended) agent alive
        while work is not None:
            await work[0](work[1])
            work = None
            if not self._reuse or self._closing or len(self._parked) >= _PARKED:
                return
            parked = _Parked(self._event_cls())
            self._parked.append(parked)
            await parked.wake.wait()
            work, parked.job = parked.job, None
            if work is None:  # the runtime is closing
                return
            task = asyncio.current_task()
            if task is not None:
                task.set_name(f"mailbox:{work[1].name}")

    # -- publishing ----------------------------------------------------------------------------

    def publish(self, msg: Message, *, topic: str = "") -> None:
        """Queue a message for every matching subscriber. Never blocks; safe from any task.

        While :meth:`begin_replay` is in force, a message whose id is already stored is
        dropped (it happened before) and any other is held until :meth:`end_replay`.

        Raises:
            MessageCollision: with ``unique_ids``, a different message was published under
                the same id in this conversation (while it is open): a store would lose one.
        """
        if self._replay is not None:
            if msg.id in self._replay.known or (
                msg.publisher and _unpublished_id(msg) in self._replay.known
            ):
                self._replay.suppressed += 1
            else:
                self._replay.fresh.append((msg, topic))
            return
        if self._interceptors and not msg.record and type(msg) is not HandlerFailed:
            out = self._intercepted(msg)
            if out is None:
                return
            msg = out
        self._publish(msg, topic)

    def _publish(self, msg: Message, topic: str) -> None:
        conv = msg.conversation
        if self._unique_ids:
            ids = self._published_ids.get(conv)
            if ids is None:
                ids = self._published_ids[conv] = {}
            content = fingerprint(msg)
            if ids.setdefault(msg.id, content) != content:
                raise MessageCollision(msg)
        self.published += 1
        routes = self._route(msg)
        self._last[conv] = msg
        for sub in routes:  # _receivers() and _queue() inlined: this is the hot path
            if sub.topic is not None and sub.topic != topic:
                continue
            mbox = sub.mailbox
            if mbox is None or mbox.agent is not None:
                if conv in self._cancelled:
                    self.dropped += 1
                    continue
                if mbox is None:
                    key = conv if sub.scope == "conversation" else ""
                    mbox = sub.instances.get(key) or self._spawn(sub, key, msg)
            if self._pending == 0:
                self._idle = anyio.Event()
            self._pending += 1
            mbox.queue.append(msg)
            if mbox.wake is not None:
                mbox.wake.set()
            elif mbox.busy >= mbox.drainers < mbox.width and not mbox.closed:
                self._add_drainer(mbox)

    def _route(self, msg: Message) -> list[_Subscription]:
        routes = self._routes.get(type(msg))
        if routes is None:
            mro = type(msg).__mro__
            routes = [s for s in self._subs if any(t in mro for t in s.types)]
            self._routes[type(msg)] = routes
        return routes

    def _receivers(self, msg: Message, topic: str) -> Iterator[tuple[_Subscription, _Mailbox]]:
        """Each subscription ``msg`` goes to on ``topic``, with the mailbox it lands in: the
        observer's, or the agent instance's (spawned if needed)."""
        for sub in self._route(msg):
            if sub.topic is not None and sub.topic != topic:
                continue
            mbox = sub.mailbox
            if mbox is None:
                key = msg.conversation if sub.scope == "conversation" else ""
                mbox = sub.instances.get(key) or self._spawn(sub, key, msg)
            yield sub, mbox

    def _queue(self, mbox: _Mailbox, entry: Message | _Redo) -> None:
        if self._pending == 0:
            self._idle = anyio.Event()
        self._pending += 1
        mbox.queue.append(entry)
        if mbox.wake is not None:
            mbox.wake.set()
        elif mbox.busy >= mbox.drainers < mbox.width and not mbox.closed:
            self._add_drainer(mbox)

    # -- resuming from stored messages ---------------------------------------------------------

    def begin_replay(self, known: Container[str]) -> None:
        """Start replaying stored messages (ids in ``known``): see :meth:`replay`."""
        if self._replay is not None:
            raise RuntimeError("a replay is already in progress")
        self._replay = _Replay(known)

    def replay(self, msg: Message, *, topic: str = "") -> None:
        """Bring every agent up to a stored message without doing its work again.

        The message goes, now and in order, to the *synchronous* handlers of every matching
        agent (where agents keep their state; instances are created as usual) and is queued
        for observers subscribed with ``replay=True``. Async handlers (model calls) are not
        run: :meth:`redo` re-delivers what was left unanswered. What agents publish meanwhile
        is filtered as :meth:`publish` says. Replay stored messages in stored order: that is
        the order every mailbox first saw them, so each agent makes the same decisions again.
        """
        if self._replay is None:
            raise RuntimeError("call begin_replay() first")
        if isinstance(msg, Intercepted):
            self._replay.intercepted.add(msg.message_id)
            if msg.replacement and msg.replacement_id not in self._replay.known:
                self._replay.replacements[msg.replacement_id] = msg.replacement
        self._last[msg.conversation] = msg
        for sub, mbox in self._receivers(msg, topic):
            agent = mbox.agent
            if agent is None:  # an observer
                if sub.replay:
                    hook = getattr(mbox.callback, "replay", None)
                    if callable(hook):
                        hook(msg)  # the observer tells replayed messages from live ones
                    else:
                        self._queue(mbox, msg)
                continue
            for handler, is_async in agent.dispatch(type(msg)):
                if not is_async:
                    getattr(agent, handler)(msg)

    def end_replay(self) -> tuple[int, list[Message]]:
        """Stop replaying; publish, in order, what agents published that was not stored (the
        decisions the stopped run made but had not recorded). A message an interceptor took
        before the stop (its :class:`Intercepted` record was replayed) is not published again:
        what it decided then stands. Returns (messages dropped as already stored or
        intercepted, messages published)."""
        state, self._replay = self._replay, None
        if state is None:
            raise RuntimeError("no replay in progress")
        for replacement in state.replacements.values():  # decided, then stopped before stored
            self._publish(decode_message(replacement), "")
        fresh = [(m, t) for m, t in state.fresh if m.id not in state.intercepted]
        for msg, topic in fresh:
            self.publish(msg, topic=topic)
        return state.suppressed + len(state.fresh) - len(fresh), [msg for msg, _ in fresh]

    def redo(self, msg: Message, children: Iterable[Message], *, topic: str = "") -> list[str]:
        """Re-deliver a stored message to the async handlers of each agent that has not
        :meth:`Agent.answered` it (given the stored messages it caused); returns their names.
        Synchronous handlers are not run again (:meth:`replay` ran them)."""
        done = list(children)
        names: list[str] = []
        if msg.conversation in self._cancelled:
            return names
        for _, mbox in self._receivers(msg, topic):
            agent = mbox.agent
            if agent is None:  # an observer
                continue
            if (
                any(a for _, a in agent.dispatch(type(msg)))
                and not agent.answered(msg, done)
                and not _answer_intercepted(agent, done)
            ):
                self._queue(mbox, _Redo(msg))
                names.append(mbox.name)
        return names

    def _spawn(self, sub: _Subscription, key: str, msg: Message | None = None) -> _Mailbox:
        assert sub.factory is not None
        agent_id = AgentId(sub.name, key)
        try:
            agent = sub.factory(agent_id)
        except Exception as exc:
            # A factory that raises fails the conversation whose message asked for the agent,
            # like a handler that raises; a stand-in with no handlers takes its mailbox.
            agent = _Unbuilt()
            if msg is None:
                raise
            failed = _Mailbox(str(agent_id), agent, None, critical=False)
            self._handler_failed(failed, "factory", msg, exc)
        agent.id = agent_id
        agent._runtime = self
        mbox = _Mailbox(str(agent_id), agent, None, critical=False)
        if sub.scope == "conversation":
            mbox.conversation = key
        sub.instances[key] = mbox
        self._start(mbox)
        return mbox

    async def run_until_idle(self) -> None:
        """Return once every published message has been handled and nothing is queued.

        Like every async call of the runtime it is a checkpoint: a pending cancellation is raised
        here even when there was nothing to wait for.
        """
        while self._pending:
            await self._idle.wait()
        await anyio.lowlevel.checkpoint()

    async def observers_caught_up(self) -> None:
        """Return once every observer has taken every message queued for it so far (e.g. the
        event store has been handed everything), even while agents are still busy."""
        observers = [s.mailbox for s in self._subs if s.mailbox and s.mailbox.agent is None]
        # Observer queues have no event of their own; this polls, once, when a run stops.
        while any(mbox.queue for mbox in observers):  # noqa: ASYNC110
            await anyio.sleep(0.005)
        await anyio.lowlevel.checkpoint()

    @property
    def pending(self) -> int:
        """Messages queued or being handled."""
        return self._pending

    # -- conversations -------------------------------------------------------------------------

    def cancel_conversation(self, conversation: str) -> None:
        """Stop a conversation's work: cancel its running handlers, drop its queued messages.

        Observers still receive its messages (what happened is still recorded).
        """
        if not conversation:
            return
        self._cancelled.add(conversation)
        for scope in self._scopes.pop(conversation, ()):
            scope.cancel()

    def end_conversation(self, conversation: str) -> None:
        """Let the conversation's per-conversation agent instances finish their queue and stop."""
        self._last.pop(conversation, None)
        self._published_ids.pop(conversation, None)
        for sub in self._subs:
            mbox = sub.instances.pop(conversation, None)
            if mbox is not None:
                mbox.closed = True
                if mbox.wake is not None:
                    mbox.wake.set()

    def last_message(self, conversation: str) -> Message | None:
        """The last message published (or replayed) in an open conversation, if any: what a
        stalled conversation was waiting on."""
        return self._last.get(conversation)

    @property
    def cancelled_conversations(self) -> frozenset[str]:
        """Conversations stopped by a failed handler (or by :meth:`cancel_conversation`)."""
        return frozenset(self._cancelled)

    # -- the mailbox task ----------------------------------------------------------------------

    async def _drain(self, mbox: _Mailbox) -> None:
        bind_contextvars(agent=mbox.name)
        agent = mbox.agent
        if agent is not None and type(agent).on_start is not Agent.on_start:
            first = mbox.queue[0] if mbox.queue else None
            if first is not None:  # on_start logs with the message that made the agent
                _bind(first.msg if isinstance(first, _Redo) else first)
            try:
                await agent.on_start()
            except Exception as exc:
                # Contained like a handler failure: its conversation fails (the first message
                # queued for it names where), the others go on; the mailbox drains unhandled.
                entry = mbox.queue[0] if mbox.queue else None
                first = entry.msg if isinstance(entry, _Redo) else entry
                if first is not None:
                    self._handler_failed(mbox, "on_start", first, exc)
                else:
                    log.error("runtime.on_start_failed", agent=mbox.name, error=repr(exc))
                mbox.agent = _Unbuilt()
        try:
            await self._drain_in_order(mbox)
        finally:
            await self._drainer_done(mbox)

    async def _drain_more(self, mbox: _Mailbox) -> None:
        bind_contextvars(agent=mbox.name)  # the task was started from another agent's
        try:
            await self._drain_in_order(mbox)
        finally:
            await self._drainer_done(mbox)

    async def _drainer_done(self, mbox: _Mailbox) -> None:
        mbox.drainers -= 1
        agent = mbox.agent
        if mbox.drainers or agent is None or type(agent).on_stop is Agent.on_stop:
            return  # the last one out stops the agent (unless it has nothing to do then)
        with anyio.CancelScope(shield=True):
            await agent.on_stop()

    async def _next(self, mbox: _Mailbox) -> Message | _Redo | None:
        """The mailbox's next message, waiting for one; None once it is closed and empty."""
        while not mbox.queue:
            if mbox.closed:
                return None
            wake = mbox.wake
            if wake is None:  # the first idle drainer makes it; the others wait on it too
                mbox.wake = wake = self._event_cls()
            await wake.wait()
            if mbox.wake is wake:
                mbox.wake = None
        return mbox.queue.popleft()

    def _done_one(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._idle.set()

    async def _drain_in_order(self, mbox: _Mailbox) -> None:
        """Take the mailbox's messages one at a time and run their handlers in this task.

        An agent with ``max_concurrent_handlers = n > 1`` gets up to n such tasks: one more
        whenever a message is queued while all of them are busy. Each takes the next message
        when it is free, so handlers start in mailbox order, and a message whose handlers are
        all synchronous is handled before any later one starts (nothing yields in between),
        on every backend. A task per mailbox, not per message: spawning a task costs more than
        a small handler does.

        The mailbox of one conversation's agent instance drains inside one cancel scope that
        cancelling the conversation cancels (its handlers are cut short, as with a scope per
        handler, at less cost per message); the task then goes on taking the mailbox's
        messages, which are dropped. Other mailboxes get a scope per async handler.
        """
        conv = mbox.conversation
        if not conv:
            await self._drain_messages(mbox, scoped=False)
            return
        while True:
            with self._scope_cls() as scope:
                scopes = self._scopes[conv]
                scopes.add(scope)
                try:
                    await self._drain_messages(mbox, scoped=True)
                    return
                finally:
                    scopes.discard(scope)
                    if not scopes and self._scopes.get(conv) is scopes:
                        del self._scopes[conv]

    async def _drain_messages(self, mbox: _Mailbox, *, scoped: bool) -> None:
        queue = mbox.queue
        streak = 0
        bound: tuple[str, str, int, int] | None = None
        while True:
            if queue:
                entry = queue.popleft()
                if self._caught_up is not None and len(queue) <= OBSERVER_BACKLOG // 2:
                    self._wake_agents()  # agents wait on an observer: this one caught up
            else:
                streak = 0
                next_entry = await self._next(mbox)
                if next_entry is None:
                    return
                entry = next_entry
            mbox.busy += 1
            if queue and mbox.busy >= mbox.drainers < mbox.width:
                self._add_drainer(mbox)  # the next message would wait for this one
            try:
                msg = cast(Message, entry.msg if type(entry) is _Redo else entry)
                # Re-bind the log context only when it changes (it costs microseconds).
                where = (msg.campaign, msg.conversation, msg.turn, msg.attempt)
                if where != bound:
                    bound = where
                    _bind(msg)
                await self._deliver(mbox, msg, redo=msg is not entry, scoped=scoped)
            finally:
                mbox.busy -= 1
                self._done_one()
            streak += 1
            if streak >= _FAIRNESS:
                streak = 0
                await anyio.lowlevel.checkpoint()

    async def _deliver(
        self, mbox: _Mailbox, msg: Message, *, redo: bool = False, scoped: bool = False
    ) -> None:
        """Run ``msg``'s handlers; ``scoped``: the task already runs in the conversation's
        cancel scope (see :meth:`_drain_in_order`)."""
        agent = mbox.agent
        handler = "__call__"
        try:
            if agent is None:
                # Observers never run inside a conversation's cancel scope: cancelling a
                # conversation must not cut the store's append (the log stays exactly what
                # was published, in order).
                if mbox.detached:
                    return
                assert mbox.callback is not None
                result = mbox.callback(msg)
                if inspect.isawaitable(result):
                    await result
                return
            if msg.conversation in self._cancelled:
                self.dropped += 1
                return
            for handler, is_async in agent.dispatch(type(msg)):
                if is_async:
                    if self._backlogged():
                        await self._observers_drained()
                        if msg.conversation in self._cancelled:
                            break
                    if scoped:
                        await getattr(agent, handler)(msg)
                    else:
                        await self._cancellable(msg.conversation, getattr(agent, handler)(msg))
                elif not redo:
                    getattr(agent, handler)(msg)
                if msg.conversation in self._cancelled:
                    break
        except Exception as exc:
            if mbox.critical:
                raise
            if agent is None:
                self._detach(mbox, msg, exc)
            else:
                self._handler_failed(mbox, handler, msg, exc)

    def _backlogged(self) -> bool:
        return any(len(m.queue) > OBSERVER_BACKLOG for m in self._observers)

    async def _observers_drained(self) -> None:
        """Wait until no observer has more than OBSERVER_BACKLOG messages queued."""
        self.backlog_waits += 1
        while self._backlogged():
            if self._caught_up is None:
                self._caught_up = self._event_cls()
            await self._caught_up.wait()

    def _wake_agents(self) -> None:
        caught_up, self._caught_up = self._caught_up, None
        if caught_up is not None:
            caught_up.set()  # the waiters check again, and wait again if another lags

    def _detach(self, mbox: _Mailbox, msg: Message, exc: Exception) -> None:
        """A non-critical observer raised: log it and stop feeding it; nothing is cancelled."""
        self.failures += 1
        mbox.detached = mbox.closed = True  # its task ends once what is queued is skipped
        if mbox.wake is not None:
            mbox.wake.set()
        self._subs = [s for s in self._subs if s.mailbox is not mbox]
        self._observers = [m for m in self._observers if m is not mbox]
        self._routes.clear()
        self._wake_agents()
        log.error(
            "runtime.observer_detached",
            observer=mbox.name,
            message_type=msg.tag,
            message_id=msg.id,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )

    async def _cancellable(self, conv: str, work: Awaitable[Any]) -> None:
        """Await a handler inside a scope that cancelling its conversation cancels."""
        if not conv:
            await work
            return
        with self._scope_cls() as scope:
            scopes = self._scopes[conv]
            scopes.add(scope)
            try:
                await work
            finally:
                scopes.discard(scope)
                if not scopes and self._scopes.get(conv) is scopes:
                    del self._scopes[conv]

    def _handler_failed(self, mbox: _Mailbox, handler: str, msg: Message, exc: Exception) -> None:
        self.failures += 1
        log.error(
            "runtime.handler_failed",
            handler=handler,
            message_type=msg.tag,
            message_id=msg.id,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        if isinstance(msg, HandlerFailed):
            return  # a failure while handling a failure report: logged, never looped
        self.cancel_conversation(msg.conversation)
        self.publish(
            HandlerFailed(
                **msg.child_ids(key=f"{mbox.name}:{msg.id}"),
                agent=mbox.name,
                handler=handler,
                message_type=msg.tag,
                message_id=msg.id,
                error_type=type(exc).__name__,
                error=str(exc),
            )
        )
