"""One worker of a distributed run: the ordinary engine on a shard of the conversations.

A :class:`ShardWorker` (a Ray actor, made by the driver) runs
:func:`~mhsafeeval.framework.engine.run_graph` on :func:`~mhsafeeval.campaign.campaign_graph`
restricted to its conversations, with its own runtime, agents, model clients and search controller.
Its store is a stand-in (:class:`ShardStore`): it holds the shard's stored messages (to resume from,
given by the driver) and queues what the run appends until the driver pulls it
(:meth:`ShardWorker.pull`); the driver is the only writer of the real store. The budget is
the run's one :class:`~mhsafeeval.distributed.BudgetLedger` (:class:`RemoteBudget`), and the
controller's archives take in the other workers' elites (and a UCT controller their learned
rates) from the :class:`~mhsafeeval.distributed.ArchiveHub` every ``sync_s`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.lowlevel
import msgspec

from mhsafeeval.budget import Budget, _cost
from mhsafeeval.config import BudgetSection, Config
from mhsafeeval.framework import AgentId, encode_message, message_decoder
from mhsafeeval.messages import ArchiveUpdated, ConversationStarted, Elite, Message
from mhsafeeval.plan import CampaignPlan
from mhsafeeval.providers import Completion
from mhsafeeval.search.archive import HarmArchive
from mhsafeeval.storage import MemoryEventStore

__all__ = ["RemoteBudget", "ShardStore", "ShardWorker"]


class ShardStore(MemoryEventStore):
    """The store a worker's run sees: the shard's stored messages (:meth:`preload`), then
    every message the run appends queued in :attr:`outbox` (ids only are kept, to drop a
    message stored twice as the real store does)."""

    def __init__(self) -> None:
        super().__init__()
        self.outbox: list[Message] = []
        self.wake = asyncio.Event()
        self._live = False

    async def preload(self, campaign: str, config: str, messages: Sequence[Message]) -> None:
        """Hold the shard's stored part (what the run resumes from); appends are queued after."""
        await self.register_campaign(campaign, config)
        for msg in messages:
            await super().append(msg)
        self._live = True

    async def append(self, message: Message) -> None:
        """Queue a message for the driver (a stored id is a counted no-op)."""
        if not self._live:
            await super().append(message)
            return
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._counts.appended += 1
        if message.id in self._ids:
            self._counts.duplicates += 1
            return
        self._ids.add(message.id)
        self._counts.written += 1
        self._counts.commits += 1
        self.outbox.append(message)
        self.wake.set()


class _Ledger(Protocol):
    """The budget actor's handle, as a worker calls it (``.remote(...)`` gives an ObjectRef)."""

    admit: Any
    settle: Any
    state: Any


class RemoteBudget(Budget):
    """A :class:`~mhsafeeval.budget.Budget` whose limits are the ledger's, shared by every
    worker: each call is reserved there before it starts and counted there after. What it
    shows (``reached``, ``spent()``) is the ledger's as of its last answer; ``in_flight`` and
    :meth:`drained` are this worker's own calls."""

    def __init__(self, limits: BudgetSection, ledger: _Ledger) -> None:
        super().__init__(limits)
        self._ledger = ledger
        self._seen = ""

    def _learn(self, reached: str | None, spent: tuple[int, int, float], shown: str = "") -> None:
        self.counselor_calls, self.tokens, self.usd = spent
        self._seen = shown
        if reached is not None and self.reached is None:
            self.reached = reached
            self.stop.set()

    async def admit(self, counselor: bool, *, rater: bool = False) -> None:
        """Wait for the ledger to reserve a place; never returns once a limit is reached
        (a ``rater``: except the counselor-call limit, see :meth:`Budget.reserve`)."""
        finishing = rater and not counselor and self.reached == "budget.counselor_calls"
        if self.reached is not None and not finishing:
            await anyio.sleep_forever()
        # In flight from the ask on: a stop waits for it (:meth:`drained`), so a place the
        # ledger reserved is a call made and stored, never one cancelled on its way.
        self.in_flight += 1
        try:
            admitted, reached, spent = await self._ledger.admit.remote(counselor, rater)
        except BaseException:
            self._done_one()
            raise
        self._learn(reached, spent)
        if not admitted:
            self._done_one()
            await anyio.sleep_forever()

    def _done_one(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self._idle is not None:
            self._idle.set()

    def settle(
        self, completion: Completion | None, model: str = "", *, usd: float | None = None
    ) -> None:
        """Count the answer at the ledger (sent, not waited for: calls from one worker reach
        the ledger in order)."""
        self._done_one()
        tokens, cost = 0, 0.0
        if completion is not None:
            tokens = completion.prompt_tokens + completion.completion_tokens
            cost = (
                usd
                if usd is not None
                else _cost(
                    completion.model, completion.prompt_tokens, completion.completion_tokens, model
                )
            )
        self._ledger.settle.remote(tokens, cost)

    async def poll(self) -> None:
        """Ask the ledger whether a limit was reached (a worker whose calls all wait on other
        work learns it here)."""
        self._learn(*await self._ledger.state.remote())

    def spent(self) -> str:
        return self._seen or super().spent()


@runtime_checkable
class _Archives(Protocol):
    """A controller that keeps a harm archive per counselor model (the shipped ones do)."""

    def archive(self, model: str) -> HarmArchive: ...


@runtime_checkable
class _Rates(Protocol):
    """A controller that learns per-cell rates and takes in others' (UCT)."""

    shared_levels: dict[str, dict[object, list[int]]]

    def learned(self) -> dict[str, dict[object, list[int]]]: ...


class ShardWorker:
    """Runs one shard of a campaign (made as a Ray actor by the driver; see the module).

    Args:
        config, plan: the campaign's, as the driver built them.
        starts: the shard's conversations (their start messages, in plan order).
        stored: the shard's stored messages, encoded, in stored order (resumed from).
        session_salt: the campaign's (:func:`~mhsafeeval.campaign.prepare_campaign`).
        concurrency: the shard's conversations in flight at once.
        ledger, hub: the run's budget and archive actors (ledger None: no limits).
        log_level: the worker's log level (its lines go to Ray's log files).
        shard: the shard's number (a replaced worker has its predecessor's).
        workers: how many shards the run has: each model table's ``max_concurrency`` (one
            endpoint's calls in flight) is shared among them.
    """

    def __init__(
        self,
        config: Config,
        plan: CampaignPlan,
        starts: list[ConversationStarted],
        stored: list[bytes],
        *,
        session_salt: str,
        config_text: str,
        concurrency: int,
        ledger: _Ledger | None,
        hub: Any,
        sync_s: float = 0.5,
        log_level: str = "warning",
        shard: int = 0,
        workers: int = 1,
    ) -> None:
        self.config, self.plan, self.starts = config, plan, starts
        self.stored = stored
        self.session_salt, self.config_text = session_salt, config_text
        self.concurrency = concurrency
        self.ledger, self.hub, self.sync_s = ledger, hub, sync_s
        self.log_level, self.shard, self.workers = log_level, shard, workers
        self.store = ShardStore()
        self.finished = False
        self._offers: list[Elite] = []

    async def run(self) -> dict[str, Any]:
        """Run the shard to its end (or a limit); returns its RunResult as builtins."""
        from mhsafeeval.campaign import (
            ROLES,
            ModelClients,
            agent_models,
            campaign_graph,
            confirm_raters,
        )
        from mhsafeeval.framework import configure_logging
        from mhsafeeval.framework.engine import run_graph
        from mhsafeeval.plan import stored_config

        # The driver's level: structlog's default logs every call (and costs CPU per call).
        configure_logging(self.log_level)
        config = self.config
        decode = message_decoder().decode
        await self.store.preload(
            config.campaign.name,
            stored_config(config, self.plan),
            [decode(data) for data in self.stored],
        )
        self.stored = []
        budget = (
            RemoteBudget(config.budget, self.ledger)
            if self.ledger is not None and Budget(config.budget).limited
            else None
        )
        client_for = ModelClients(budget, share=self.workers)
        clients = client_for.clients

        graph = campaign_graph(
            config,
            self.plan,
            self.starts,
            roles={r: client_for(config.model_for(r)) for r in ROLES},
            counselors={n: client_for(m, counselor=True) for n, m in config.counselors.items()},
            config_text=self.config_text,
            session_salt=self.session_salt,
            agent_models=agent_models(config, client_for),
            confirmers=confirm_raters(config, self.plan.taxonomy, client_for),
        )
        # The driver stores the campaign's opening; this shard runs its share of the
        # campaign's conversations in flight.
        graph = dataclasses.replace(graph, opening=None, concurrency=self.concurrency)
        shared = [n for n in graph.nodes if n.scope == "global"]
        controller = shared[0].make(AgentId(shared[0].name, "")) if shared else None
        since = await self._exchange(controller, 0)  # the archives as they stand, first
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sync, controller, budget, since)
                result = await run_graph(
                    graph,
                    self.store,
                    limits=budget,
                    observers=(self._observe,),
                    closing=tuple(clients.values()),
                )
                tg.cancel_scope.cancel()
        finally:
            self.finished = True
            self.store.wake.set()
        done: dict[str, Any] = msgspec.to_builtins(result)
        return done

    def _observe(self, msg: Message) -> None:
        if isinstance(msg, ArchiveUpdated):
            self._offers.append(msg.elite)

    async def _exchange(self, controller: object, since: int) -> int:
        """Offer this shard's new elites and take in the others' changes since version
        ``since`` (without publishing them: each was stored by the worker that found it);
        returns the hub's version now."""
        offers, self._offers = self._offers, []
        version: int
        version, changed = await self.hub.exchange.remote(offers, since)
        if isinstance(controller, _Archives):
            for elite in changed:
                controller.archive(elite.counselor_model).offer(elite)
        if isinstance(controller, _Rates):  # sent as they are now (serialised by the call)
            controller.shared_levels = await self.hub.share_rates.remote(
                self.shard, controller.learned()
            )
        return version

    async def _sync(self, controller: object, budget: RemoteBudget | None, since: int) -> None:
        """Every ``sync_s`` seconds: exchange elites, and ask the ledger about the limits."""
        while True:
            await anyio.sleep(self.sync_s)
            since = await self._exchange(controller, since)
            if budget is not None:
                await budget.poll()

    async def pull(
        self, most: int = 2000, wait_s: float = 1.0, linger_s: float = 0.05
    ) -> tuple[list[bytes], bool]:
        """The next messages the run appended (encoded, in order) and whether that was the
        last of them (the run ended). It waits up to ``wait_s`` for a first message, then
        ``linger_s`` for more (unless ``most`` are there): a call per batch, not per message."""
        store = self.store
        if not store.outbox and not self.finished:
            store.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.wake.wait(), wait_s)
        if store.outbox and len(store.outbox) < most and not self.finished:
            await asyncio.sleep(linger_s)
        batch = store.outbox[:most]
        del store.outbox[: len(batch)]
        return [encode_message(m) for m in batch], self.finished and not store.outbox

    def pid(self) -> int:
        """The worker's process id (a benchmark reads its CPU time)."""
        import os

        return os.getpid()
