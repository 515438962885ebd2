"""Running a graph: fresh or resumed, to the end, to a limit, or to a failure, always recorded."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import anyio
import anyio.lowlevel
import structlog

from mhsafeeval.framework import Message, Runtime
from mhsafeeval.framework.lifecycle import CampaignFinished, ConversationFinished
from mhsafeeval.framework.store import EventStore

from ._graph import Graph, Limits, RunResult, Service
from ._scheduler import Scheduler
from ._stored import Stored, load_stored, stored_messages

__all__ = ["resume_services", "run_graph"]

log = structlog.get_logger("mhsafeeval.framework.engine")

_PAGE = 1000
"""Stored messages handed to the services at a time while a resumed run streams them."""


class _Closable(Protocol):
    async def aclose(self) -> None: ...


class _NoLimits:
    """Limits that are never reached."""

    def __init__(self) -> None:
        self.stop = anyio.Event()
        self.reached: str | None = None

    async def drained(self) -> None:
        """Nothing is ever admitted, so nothing is in flight."""

    def spent(self) -> str:
        """No limits, nothing counted."""
        return ""


async def run_graph(
    graph: Graph,
    store: EventStore,
    *,
    limits: Limits | None = None,
    observers: Sequence[Callable[[Message], Any]] = (),
    closing: Sequence[_Closable] = (),
    stored: Stored | Literal["load"] | None = "load",
) -> RunResult:
    """Run ``graph``'s campaign to its end, storing every message in ``store`` (already open).

    If the store already holds this campaign, the run **resumes** it: the stored messages are
    streamed from the store and replayed, in stored order, into the agents' synchronous
    handlers (their state) without any model call; decisions the stopped run made but had not
    stored are published again; each stored message whose answer is missing (the calls in
    flight when it stopped) is handed to its agent again
    (:meth:`~mhsafeeval.framework.Agent.answered`); failed and stalled conversations pick up
    where they stopped. Finished conversations are left alone: their agents are ended once
    their end is replayed, and only the open conversations' messages are kept, so a resume
    holds the work left (and an index of a few hundred bytes per finished conversation), not
    the stored campaign. A campaign that already finished is returned as it is (after its
    services' pending work).

    What it guarantees, whatever happens: every conversation ends with one stored
    ``ConversationFinished`` (a handler that raises fails only its conversation; a
    conversation nothing moves any more is closed as ``stalled``); the run ends with a stored
    ``CampaignFinished`` saying how (``completed``, ``completed_with_failures``,
    ``stopped_budget``, ``interrupted``, ``failed``); at a limit, the calls in flight finish
    (with the calls the limits still admit to judge what was bought) and are stored before it
    stops; ``closing`` is closed and the store flushed last.

    Args:
        graph: what to run.
        store: where every message goes (a failed write stops the run).
        limits: what stops it early (``[budget]``); None: nothing.
        observers: called with every message, replayed ones included (a progress display).
        closing: closed when the run ends (the model clients).
        stored: what :func:`load_stored` returned for this graph, when the caller needed it
            first (its ``folds`` counted what the stored part spent); ``"load"``: load it here.

    Raises:
        InputError: the store holds this campaign with a configuration ``graph`` refuses
            (before any write).

    Example:
        >>> import anyio
        >>> from mhsafeeval.framework.engine import Graph, Node
        >>> from mhsafeeval.framework.lifecycle import ConversationFinished
        >>> from mhsafeeval.framework import Agent, on
        >>> from mhsafeeval.storage import MemoryEventStore
        >>> class Hello(Message, frozen=True, tag="doc.engine_hello"):
        ...     pass
        >>> class Greeter(Agent):
        ...     @on(Hello)
        ...     def greet(self, msg: Hello) -> None:
        ...         self.publish(ConversationFinished(**msg.child_ids(), turns=1))
        >>> graph = Graph(
        ...     campaign="doc",
        ...     nodes=[Node.of(Greeter)],
        ...     conversations=[Hello(campaign="doc", conversation=f"c{i}") for i in range(3)],
        ... )
        >>> async def main() -> RunResult:
        ...     async with MemoryEventStore() as store:
        ...         return await run_graph(graph, store)
        >>> result = anyio.run(main)
        >>> result.status, result.finished, result.failed
        ('completed', 3, 0)
    """
    limits = limits if limits is not None else _NoLimits()
    written = store.stats.written
    try:
        if stored == "load":
            stored = await load_stored(
                store,
                graph.campaign,
                {m.id for m in graph.conversations},
                accepts=graph.check_stored,
                settled=graph.settled,
                on_bus=graph.on_bus,
                owes=graph.owes,
            )
        result = await _resume_or_run(graph, store, stored, limits, observers)
    finally:
        with anyio.CancelScope(shield=True):
            for resource in closing:
                await resource.aclose()
            await store.flush()
    result.events_written = store.stats.written - written  # flushed: this run's, all counted
    return result


async def _resume_or_run(
    graph: Graph,
    store: EventStore,
    stored: Stored | None,
    limits: Limits,
    observers: Sequence[Callable[[Message], Any]],
) -> RunResult:
    resumed_from = stored.count if stored is not None else 0
    if stored is not None and stored.outcome is not None:
        log.info("campaign.already_finished", status=stored.outcome.status, events=resumed_from)
        if graph.services:  # what a service has to do for the stored part
            await resume_services(graph.services, store, graph.campaign, stored)
        if any(s.pending for s in graph.services):  # added later, or failed earlier
            async with anyio.create_task_group() as tg:
                for service in graph.services:
                    await tg.start(service.serve)
                await _until_served(graph.services, limits.stop)
                tg.cancel_scope.cancel()
        return _result(graph, stored.outcome.status, stored, store, resumed_from, limits)
    if limits.reached is not None and stored is None:
        return _result(graph, "stopped_budget", stored, store, resumed_from, limits)
    # The stored part may already have spent a limit: then nothing new starts, but what it paid
    # for and did not finish (a reply stored before a kill, never judged) is finished first.
    drain = limits.reached is not None
    return await _run(graph, store, stored, resumed_from, limits, observers, drain=drain)


async def resume_services(
    services: Sequence[Service], store: EventStore, campaign: str, stored: Stored
) -> None:
    """Hand the stored part to the services, page by page (nothing is replayed): what a
    resumed :func:`run_graph` does, for a composition root that runs a service itself."""
    page: list[Message] = []
    async for _, _, msg in stored_messages(store, campaign, upto=stored.last_seq):
        page.append(msg)
        if len(page) >= _PAGE:
            for service in services:
                service.resume(page)
            page = []
    if page:
        for service in services:
            service.resume(page)


def _result(
    graph: Graph,
    status: str,
    stored: Stored | None,
    store: EventStore,
    resumed_from: int,
    limits: Limits,
) -> RunResult:
    return RunResult(
        campaign=graph.campaign,
        status=status,
        conversations=len(graph.conversations),
        finished=len(stored.finished) if stored is not None else 0,
        failed=stored.failed if stored is not None else 0,
        events_written=store.stats.written,
        resumed_from=resumed_from,
        budget=limits.reached,
        spent=limits.spent(),
    )


class _LimitReached(Exception):
    """Raised inside the runtime to cancel what is in flight when a limit is reached."""


def _is_limit_stop(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):  # the runtime's task group wraps it
        return all(_is_limit_stop(e) for e in exc.exceptions)
    return isinstance(exc, _LimitReached)


async def _run(
    graph: Graph,
    store: EventStore,
    stored: Stored | None,
    resumed_from: int,
    limits: Limits,
    observers: Sequence[Callable[[Message], Any]],
    *,
    drain: bool = False,
) -> RunResult:
    """Run (or resume) the campaign; ``drain``: a limit was spent by the stored part, so only
    the work it owes that the limits still admit is done (no conversation starts), and the run
    stops at the limit as it did, recording nothing when that stored nothing."""
    await store.register_campaign(graph.campaign, graph.config)
    appended = store.stats.appended  # what this run stores is what comes after
    scheduler = Scheduler(graph.conversations, graph.campaign, graph.concurrency, stored)
    status = "interrupted"
    redone = 0
    try:
        async with Runtime(unique_ids=True) as rt, anyio.create_task_group() as service_tasks:
            rt.subscribe(store.append, name="store", critical=True)
            for i, service in enumerate(graph.services):
                rt.subscribe(service.observe, name=f"service{i}", types=service.types)
            for i, observer in enumerate(observers):
                rt.subscribe(observer, name=f"observer{i}", replay=True)
            for intercept in graph.interceptors:
                rt.intercept(intercept.interceptor, name=intercept.name, types=intercept.types)
            for node in graph.nodes:
                rt.register(
                    node.name, node.make, types=node.types, scope=node.scope, topic=node.topic
                )
            scheduler.attach(rt)
            if stored is not None:
                redone = await _resume(rt, graph, store, stored, scheduler)
            elif graph.opening is not None:
                rt.publish(graph.opening)
            for service in graph.services:  # after the stored part was handed to them
                await service_tasks.start(service.serve)
            if drain:
                with anyio.move_on_after(60):
                    await limits.drained()
                await rt.observers_caught_up()
                raise _LimitReached(limits.reached or "budget")
            scheduler.start()
            await _until_done(rt, scheduler, limits.stop)
            if not scheduler.done.is_set():
                # A limit was reached: no call starts any more, but what was paid for is
                # finished: the calls in flight, and what the limits still admit for them (the
                # judges of the replies bought, see Limits.drained), up to a minute; their
                # messages reach the store, then everything stops.
                with anyio.move_on_after(60):
                    await limits.drained()
                await rt.observers_caught_up()
                raise _LimitReached(limits.reached or "budget")
            await rt.run_until_idle()
            if not await _until_served(graph.services, limits.stop):
                raise _LimitReached(limits.reached or "budget")
            status = "completed" if scheduler.failed == 0 else "completed_with_failures"
            rt.publish(
                CampaignFinished(
                    campaign=graph.campaign,
                    key="finish",
                    status=status,
                    detail=f"{scheduler.failed} conversation(s) failed",
                )
            )
            await rt.run_until_idle()
            for service in graph.services:
                service.close()
            service_tasks.cancel_scope.cancel()
    except BaseException as exc:
        limit_stop = _is_limit_stop(exc)  # stopped cleanly at a limit: not an error
        if limit_stop:
            status, detail = "stopped_budget", f"{limits.reached} reached: {limits.spent()}"
        else:  # Ctrl-C or a crash: say so in the record
            status = "interrupted" if not isinstance(exc, Exception) else "failed"
            detail = f"{type(exc).__name__}: {exc}"[:500]
        quiet = drain and limit_stop and store.stats.appended == appended  # owed nothing
        with anyio.CancelScope(shield=True):
            if not quiet:
                await store.append(
                    CampaignFinished(
                        campaign=graph.campaign,
                        # Not "finish": a resumed run still records how it ends.
                        key=f"stopped:{resumed_from}+{store.stats.appended}",
                        status=status,
                        detail=detail,
                    )
                )
        if not limit_stop:
            raise
    return RunResult(
        campaign=graph.campaign,
        status=status,
        conversations=len(graph.conversations),
        finished=scheduler.finished,
        failed=scheduler.failed,
        events_written=store.stats.written,
        resumed_from=resumed_from,
        redone=redone,
        budget=limits.reached,
        spent=limits.spent(),
    )


async def _until_served(services: Sequence[Service], stop: anyio.Event) -> bool:
    """Wait until every service has done what it was given (True) or a limit is reached
    first (False: their calls would wait for ever)."""
    if not services:
        return True
    done = False
    async with anyio.create_task_group() as tg:

        async def served() -> None:
            nonlocal done
            for service in services:
                await service.join()
            done = True
            tg.cancel_scope.cancel()

        async def stopped() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(served)
        tg.start_soon(stopped)
    return done


async def _until_done(rt: Runtime, scheduler: Scheduler, stop: anyio.Event) -> None:
    """Return once every conversation has ended or ``stop`` (a limit) is set.

    A runtime that goes idle while conversations are open will never move them again: those
    conversations are closed as ``stalled`` (naming the last message each one got), never
    waited for forever.
    """
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while not scheduler.done.is_set():
                await rt.run_until_idle()
                if scheduler.done.is_set() or stop.is_set():
                    return
                if not scheduler.stall():
                    # Idle, not done, nothing to close: the scheduler itself stopped
                    # hearing ends (it failed and was detached). Never wait forever.
                    raise RuntimeError(
                        f"the runtime went idle with {len(scheduler.running)} conversation(s) "
                        "open that the scheduler had already closed"
                    )

        tg.start_soon(wait, scheduler.done)
        tg.start_soon(wait, stop)
        tg.start_soon(watch)


async def _resume(
    rt: Runtime, graph: Graph, store: EventStore, stored: Stored, scheduler: Scheduler
) -> int:
    """Bring the runtime's agents (and the services) up to the stored messages, streamed from
    the store, and restart unfinished work; returns how many stored messages were handed to an
    agent again.

    Only the messages of the conversations still open are kept (to find the work they owe);
    a finished conversation's agents are ended as soon as its end is replayed, as in a live
    run, so what stays of it is what the shared agents folded (the search's archive).
    """
    started = time.perf_counter()
    live = scheduler.running - set(stored.broken)
    kept: list[Message] = []  # the open conversations' messages, in stored order
    kept_ids: set[str] = set()
    children: dict[str, list[Message]] = {}
    ended: set[str] = set()
    page: list[Message] = []
    rt.begin_replay(stored.ids)
    async for _, message_id, msg in stored_messages(store, graph.campaign, upto=stored.last_seq):
        page.append(msg)
        if graph.on_bus(msg):
            rt.replay(msg)
            conversation = msg.conversation
            if conversation in live:
                kept.append(msg)
                kept_ids.add(message_id)
            elif conversation in ended or (
                isinstance(msg, ConversationFinished) and conversation in stored.finished
            ):
                rt.end_conversation(conversation)  # its agents stop (a late message: again)
                ended.add(sys.intern(conversation))  # the index's copy of the id, not another
                await anyio.lowlevel.checkpoint()  # their tasks end (or park) and free them now
            if msg.causation in kept_ids:
                children.setdefault(msg.causation, []).append(msg)
        if len(page) >= _PAGE:
            for service in graph.services:
                service.resume(page)
            page = []
    for service in graph.services if page else ():
        service.resume(page)
    suppressed, fresh = rt.end_replay()
    replay_s = time.perf_counter() - started
    redone = 0
    for msg in kept:
        redone += bool(rt.redo(msg, children.get(msg.id, ())))
    log.info(
        "campaign.resumed",
        stored=stored.count,
        finished=len(stored.finished),
        continuing=len(live),
        republished=len(fresh),
        redone=redone,
        replayed_decisions=suppressed,
        replay_s=round(replay_s, 2),
    )
    for conversation in scheduler.running & set(stored.broken):
        # A handler failed and the run stopped before the conversation was closed: close it.
        rt.cancel_conversation(conversation)
        scheduler.pending_failures.append(stored.broken[conversation])
    return redone
