"""The driver of a distributed run: plans, shards, pulls, and is the store's only writer."""

from __future__ import annotations

import logging
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog

from mhsafeeval.campaign import (
    CampaignResult,
    ModelClients,
    PanelService,
    campaign_graph,
    panel_service,
    prepare_campaign,
)
from mhsafeeval.config import Config
from mhsafeeval.errors import InputError
from mhsafeeval.framework import encode_message, message_decoder
from mhsafeeval.framework.engine import RunResult, Stored, resume_services, stored_messages
from mhsafeeval.messages import (
    ArchiveUpdated,
    CampaignFinished,
    ConversationFinished,
    ConversationStarted,
    Elite,
    Message,
)
from mhsafeeval.plan import CampaignPlan
from mhsafeeval.storage import EventStore

from ._shared import ArchiveHub, BudgetLedger

if TYPE_CHECKING:
    from mhsafeeval.providers import ResilientClient
from ._worker import RemoteBudget, ShardWorker

__all__ = ["connect", "run_distributed"]

log = structlog.get_logger("mhsafeeval.distributed")

REPLACEMENTS = 3
"""How many times one shard's lost worker is replaced before the run fails."""


def connect(address: str, source: str | Path = "<config>") -> tuple[ModuleType, bool]:
    """Ray, connected: to the cluster at ``address``, or a local one started now (``"local"``);
    an already initialised Ray is used as it is. Returns (ray, whether this call started it).

    Raises:
        InputError: Ray is not installed, or the cluster cannot be reached (exit 2).
    """
    try:
        import ray
    except ImportError:
        raise InputError(
            source,
            "--ray",
            "Ray is not installed; install it with: pip install 'mhsafeeval[ray]'",
        ) from None
    if ray.is_initialized():
        return ray, False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    # Ray installs its own SIGTERM handler (it dumps a stack and dies): the run's is put back,
    # so that SIGTERM stops the run as Ctrl-C does and its end is recorded.
    handlers = (
        {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        if threading.current_thread() is threading.main_thread()
        else {}
    )
    try:
        if address == "local":  # a new cluster, never one another process started
            ray.init(address="local", **options)
        else:
            _reachable(address)  # Ray itself waits minutes for a head node that is not there
            ray.init(address=address, **options)
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
    except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
        raise InputError(
            source,
            "--ray",
            f"cannot connect to the Ray cluster at {address!r} ({type(exc).__name__}: {exc}); "
            "give the head node's address (host:port, as `ray start --head` printed it) or "
            "`local` to start one here",
        ) from None
    return ray, True


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raise ConnectionError unless something listens at ``address`` (``host:port`` or
    ``ray://host:port``; other forms, ``auto`` say, are left to Ray)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port}: {exc}") from None


async def run_distributed(
    config: Config,
    store: EventStore,
    *,
    address: str = "local",
    workers: int | None = None,
    source: str | Path = "<config>",
    config_text: str = "",
    observers: tuple[Callable[[Message], Any], ...] = (),
    plan: CampaignPlan | None = None,
    log_level: str = "warning",
) -> CampaignResult:
    """Run a campaign as :func:`~mhsafeeval.campaign.run_campaign` does, its conversations
    sharded over ``workers`` Ray actors (None: the cluster's CPUs, at most one per open
    conversation); see :mod:`mhsafeeval.distributed`. ``log_level``: the workers' (their
    lines go to Ray's log files, ``/tmp/ray/session_latest/logs`` on each node).

    Raises:
        InputError: as :func:`~mhsafeeval.campaign.run_campaign`; no Ray or no cluster at
            ``address``; ``workers`` < 1.
    """
    if workers is not None and workers < 1:
        raise InputError(source, "--workers", f"needs at least one worker, got {workers}")
    ray, started = connect(address, source)
    try:
        return await _Driver(ray, config, store, config_text, observers, log_level).run(
            source, plan, workers
        )
    finally:
        if started:
            ray.shutdown()


class _BestElites:
    """The stored part's best elite per counselor model and cell (the archive hub's start)."""

    def __init__(self) -> None:
        self.best: dict[tuple[str, str, str], Elite] = {}

    def __call__(self, msg: Message) -> None:
        if isinstance(msg, ArchiveUpdated):
            e = msg.elite
            key = (msg.counselor_model, e.category, e.role)
            if key not in self.best or e.severity > self.best[key].severity:
                self.best[key] = e


class _Driver:
    def __init__(
        self,
        ray: ModuleType,
        config: Config,
        store: EventStore,
        config_text: str,
        observers: Sequence[Callable[[Message], Any]],
        log_level: str,
    ) -> None:
        self.ray, self.config, self.store = ray, config, store
        self.log_level = log_level
        self.config_text, self.observers = config_text, observers
        self.finished: dict[str, str] = {}
        self.results: list[RunResult] = []
        self.actors: dict[int, Any] = {}
        self.decode = message_decoder().decode
        self.lock = anyio.Lock()
        self.lost = 0
        self.spawned = 0
        self.token = secrets.token_hex(3)
        self.panel: PanelService | None = None

    async def run(
        self, source: str | Path, plan: CampaignPlan | None, workers: int | None
    ) -> CampaignResult:
        config, store, ray = self.config, self.store, self.ray
        name = config.campaign.name
        written = store.stats.written
        best = _BestElites()
        prepared = await prepare_campaign(config, store, source=source, plan=plan, folds=(best,))
        plan, starts, stored, budget = (
            prepared.plan,
            prepared.starts,
            prepared.stored,
            prepared.budget,
        )
        resumed_from = stored.count if stored is not None else 0

        def result(status: str, reached: str | None, spent: str) -> CampaignResult:
            failed = sum(s != "completed" for s in self.finished.values())
            return CampaignResult(
                campaign=name,
                status=status,
                conversations=len(starts),
                finished=len(self.finished),
                failed=failed,
                events_written=store.stats.written - written,
                resumed_from=resumed_from,
                redone=sum(r.redone for r in self.results),
                budget=reached,
                spent=spent,
                panel=self.panel.pool.stats if self.panel is not None else None,
            )

        if stored is not None:
            self.finished.update(stored.finished)
            if stored.outcome is not None:  # finished already: returned as it is
                return result(stored.outcome.status, budget.reached, budget.spent())
        if budget.reached is not None:  # the stored part spent a limit: start nothing
            return result("stopped_budget", budget.reached, budget.spent())
        open_starts = [s for s in starts if s.conversation not in self.finished]
        if stored is None:
            graph = campaign_graph(
                config, plan, starts, roles={}, counselors={}, config_text=self.config_text
            )
            assert graph.opening is not None
            await self._take([graph.opening])
        held = await self._stored_of(
            {s.conversation for s in open_starts} & (stored.started if stored else set()),
            replay=stored is not None,
        )
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        n = max(1, min(workers or cpus, len(open_starts)))
        shards = [open_starts[i::n] for i in range(n)] if open_starts else []
        ledger = None
        if budget.limited:
            so_far = (budget.counselor_calls, budget.tokens, budget.usd)
            ledger = ray.remote(BudgetLedger).options(num_cpus=0).remote(config.budget, so_far)
        hub = ray.remote(ArchiveHub).options(num_cpus=0).remote(list(best.best.values()))
        panel_budget = RemoteBudget(config.budget, ledger) if ledger is not None else None
        panel_clients = await self._open_panel(plan, panel_budget, resumed_from, stored)
        worker_class = ray.remote(ShardWorker)
        share = min(1.0, cpus / n)
        per = max(1, -(-config.campaign.concurrency // n))  # the campaign's in flight, shared

        def spawn(index: int, shard: list[ConversationStarted], part: list[bytes]) -> Any:
            self.spawned += 1
            # Named (in the driver's namespace, unique to the run): `ray list actors` tells
            # the shards and their replacements apart.
            actor = worker_class.options(
                name=f"mhsafeeval-{name}-{self.token}-shard{index}-{self.spawned}",
                num_cpus=share,
                max_restarts=0,
                max_concurrency=64,
            ).remote(
                config,
                plan,
                shard,
                part,
                session_salt=prepared.session_salt,
                config_text=self.config_text,
                concurrency=per,
                ledger=ledger,
                hub=hub,
                log_level=self.log_level,
                shard=index,
                workers=n,
            )
            self.actors[index] = actor
            return actor

        log.info("distributed.started", workers=n, conversations=len(open_starts), cpus=cpus)
        try:
            async with anyio.create_task_group() as serving:
                if self.panel is not None:  # rates the replies it reads from the batches
                    await serving.start(self.panel.serve)
                async with anyio.create_task_group() as tg:
                    for i, shard in enumerate(shards):
                        part = [m for s in shard for m in held.pop(s.conversation, [])]
                        tg.start_soon(self._drive, i, shard, part, spawn)
                if self.panel is not None:
                    await self._panel_done(panel_budget)
                serving.cancel_scope.cancel()
            reached, spent = budget.reached, budget.spent()
            if ledger is not None:
                reached, _, spent = await ledger.state.remote()
            stopped = any(r.status == "stopped_budget" for r in self.results) or (
                reached is not None and len(self.finished) < len(starts)
            )
            if stopped:
                status = "stopped_budget"
                end = CampaignFinished(
                    campaign=name,
                    key=f"stopped:{resumed_from}+{store.stats.appended}",
                    status=status,
                    detail=f"{reached} reached: {spent}",
                )
            else:
                missing = len(starts) - len(self.finished)
                if missing:
                    raise RuntimeError(f"{missing} conversation(s) ended without being finished")
                failed = sum(s != "completed" for s in self.finished.values())
                status = "completed" if failed == 0 else "completed_with_failures"
                end = CampaignFinished(
                    campaign=name,
                    key="finish",
                    status=status,
                    detail=f"{failed} conversation(s) failed",
                )
            await self._take([end])
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await store.append(
                    CampaignFinished(
                        campaign=name,
                        key=f"stopped:{resumed_from}+{store.stats.appended}",
                        status="interrupted" if not isinstance(exc, Exception) else "failed",
                        detail=f"{type(exc).__name__}: {exc}"[:500],
                    )
                )
            raise
        finally:
            with anyio.CancelScope(shield=True):
                for actor in self.actors.values():
                    ray.kill(actor)
                for client in panel_clients:
                    await client.aclose()
                for handle in (ledger, hub):
                    if handle is not None:
                        ray.kill(handle)
                await store.flush()
        return result(status, reached if stopped else None, spent)

    async def _open_panel(
        self,
        plan: CampaignPlan,
        budget: RemoteBudget | None,
        run: int,
        stored: Stored | None,
    ) -> list[ResilientClient]:
        """The ``[judges]`` panel, run here in the driver as a plain run runs it (it reads the
        judged replies from the workers' batches and stores its ratings; every call through
        the shared budget), given the stored part first; its model clients (to close)."""
        if not self.config.judges.panel:
            return []
        client_for = ModelClients(budget)
        self.panel = panel_service(self.config, plan.taxonomy, self.store, run, client_for)
        clients = list(client_for.clients.values())
        if self.panel is not None and stored is not None:  # what the stored part left unrated
            await resume_services([self.panel], self.store, self.config.campaign.name, stored)
        return clients

    async def _panel_done(self, budget: RemoteBudget | None) -> None:
        """Wait until the panel rated every reply it was given, or a limit was reached (its
        calls would wait for ever: a later run rates what is left)."""
        assert self.panel is not None
        self.panel.close()
        async with anyio.create_task_group() as tg:

            async def rated() -> None:
                assert self.panel is not None
                await self.panel.join()
                tg.cancel_scope.cancel()

            async def stopped() -> None:
                while budget is not None:
                    await budget.poll()
                    if budget.reached is not None:
                        tg.cancel_scope.cancel()
                    await anyio.sleep(0.25)
                await anyio.sleep_forever()

            tg.start_soon(rated)
            tg.start_soon(stopped)

    async def _drive(
        self,
        index: int,
        shard: list[ConversationStarted],
        part: list[bytes],
        spawn: Callable[[int, list[ConversationStarted], list[bytes]], Any],
    ) -> None:
        """Run one shard to its end, storing what its worker appends, batch by batch in the
        worker's order; a lost worker is replaced by one given the shard's open
        conversations, resumed from what the store holds of them."""
        from ray.exceptions import RayActorError

        lost = 0
        while True:
            actor = spawn(index, shard, part)
            part = []
            running = actor.run.remote()
            try:
                while True:
                    batch, last = await actor.pull.remote()
                    taken = [self.decode(data) for data in batch]
                    # How the shard's run ended is the driver's to record, for the campaign.
                    await self._take([m for m in taken if not isinstance(m, CampaignFinished)])
                    if last:
                        break
                self.results.append(msgspec.convert(await running, RunResult))
                return
            except RayActorError as exc:
                lost += 1
                self.lost += 1
                log.warning("distributed.worker_lost", shard=index, lost=lost, error=str(exc))
                if lost > REPLACEMENTS:
                    raise RuntimeError(
                        f"shard {index}'s worker was lost {lost} times: {exc}"
                    ) from None
                shard = [s for s in shard if s.conversation not in self.finished]
                if not shard:
                    return
                await self.store.flush()
                held = await self._stored_of({s.conversation for s in shard})
                part = [m for s in shard for m in held.get(s.conversation, [])]

    async def _take(self, messages: list[Message]) -> None:
        """Store messages (a batch stays together) and show them to the observers."""
        async with self.lock:
            panel = self.panel
            for msg in messages:
                await self.store.append(msg)
                if isinstance(msg, ConversationFinished):
                    self.finished[msg.conversation] = msg.status
                if panel is not None and isinstance(msg, panel.types):
                    panel.observe(msg)
                for observer in self.observers:
                    observer(msg)

    async def _stored_of(
        self, conversations: Collection[str], *, replay: bool = False
    ) -> dict[str, list[bytes]]:
        """The stored messages of ``conversations``, encoded, by conversation, in stored order
        (``replay``: the observers are shown every stored message, as a resumed run does)."""
        held: dict[str, list[bytes]] = {}
        if not conversations and not (replay and self.observers):
            return held
        async for _, _, msg in stored_messages(self.store, self.config.campaign.name):
            if msg.conversation in conversations:
                held.setdefault(msg.conversation, []).append(encode_message(msg))
            if replay:
                for observer in self.observers:
                    hook = getattr(observer, "replay", None)
                    (hook if callable(hook) else observer)(msg)
        return held
