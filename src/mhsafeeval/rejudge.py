"""Rating judged replies with reporting judges: a campaign's ``[judges]`` panel and ``rejudge``.

Both share :class:`RatingPool`: it rates :class:`~mhsafeeval.judges.JudgedReply` items with
each :class:`Rater` not yet stored for them, a few at a time, storing each
:class:`~mhsafeeval.messages.Rating` (or, for a call that failed for good, a
``CallFailed(agent="panel")`` record: that is no rating, so the next run asks again) as soon as
it arrives. A rating's id is fixed by its reply and rater, so a rating stored twice is one.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TextIO

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from mhsafeeval.config import Config, stored_data
from mhsafeeval.errors import InputError
from mhsafeeval.judges import (
    JudgedReply,
    Rater,
    ReplyFold,
    RubricJudge,
    failed_rating,
    rate_reply,
    raters_for,
)
from mhsafeeval.messages import Message
from mhsafeeval.providers import (
    ModelCallError,
    ModelClient,
    ModelSettings,
)
from mhsafeeval.storage import EventStore
from mhsafeeval.taxonomy import Taxonomy, builtin_taxonomy, load_taxonomy

__all__ = [
    "CallLimit",
    "Rater",
    "RatingPool",
    "RatingStats",
    "RejudgeResult",
    "raters_for",
    "rejudge",
    "stored_campaign",
]

log = structlog.get_logger("mhsafeeval.panel")


class RatingStats(msgspec.Struct, kw_only=True):
    """What a :class:`RatingPool` did."""

    made: int = 0
    """Ratings made and stored (an answer still invalid after the re-asks included)."""
    present: int = 0
    """(reply, rater) pairs already rated: no call made."""
    failed: int = 0
    """Ratings whose call failed for good (stored as ``CallFailed``; asked again next run)."""
    left: int = 0
    """Ratings not started because the call limit was reached."""


class CallLimit:
    """At most ``calls`` judge model calls (re-asks included): a rating starts only once it
    has reserved all the asks it may need, and gives back what it did not use."""

    def __init__(self, calls: int) -> None:
        self.left = calls
        self.reached = False

    def reserve(self, calls: int) -> bool:
        """Take ``calls`` if there are that many left (else the limit counts as reached)."""
        if calls > self.left:
            self.reached = True
            return False
        self.left -= calls
        return True

    def release(self, calls: int) -> None:
        """Give back ``calls`` reserved but not made."""
        self.left += max(0, calls)


class RatingPool:
    """Rates judged replies with raters, ``workers`` ratings at a time, storing each result
    with ``write`` as soon as it arrives.

    Run :meth:`serve` in a task group, :meth:`submit` work, :meth:`join` to wait until it is
    all done, and :meth:`close` to let :meth:`serve` return. Cancelling :meth:`serve` drops
    what was not stored; the stored events tell a later run what is left.

    Args:
        fold: the campaign's folded events (what is already rated).
        raters: who rates every reply.
        write: stores one event (an event store's ``append``).
        source: the ratings' ``source`` (``"panel"`` or ``"rejudge"``).
        run: names this run in failure records (one per rater, reply and run).
        workers: ratings in flight at once.
        limit: a call limit (None: none).
    """

    def __init__(
        self,
        fold: ReplyFold,
        raters: Sequence[Rater],
        write: Callable[[Message], Awaitable[None]],
        *,
        source: str,
        run: str,
        workers: int = 4,
        limit: CallLimit | None = None,
    ) -> None:
        self.fold = fold
        self.raters = list(raters)
        self.write = write
        self.source = source
        self.run = run
        self.workers = max(1, workers)
        self.limit = limit
        self.stats = RatingStats()
        self._queue: deque[tuple[JudgedReply, Rater]] = deque()
        self._wake = anyio.Event()
        self._closed = False
        self._submitted: set[tuple[tuple[str, int, int, str], str]] = set()
        self._outstanding = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._writes: deque[Message] = deque()

    def record(self, ratings: Iterable[Message]) -> None:
        """Store ratings made elsewhere (a confirmation by the panel's raters) as this pool's,
        without a call; storing one already stored adds nothing."""
        for rating in ratings:
            if self._outstanding == 0:
                self._idle = anyio.Event()
            self._outstanding += 1
            self._writes.append(rating)
            self._wake.set()

    def submit(self, items: Iterable[JudgedReply]) -> None:
        """Queue a rating of each item by each rater that has none stored or queued."""
        for item in items:
            for rater in self.raters:
                key = (item.coords, rater.name)
                if key in self._submitted:
                    continue
                self._submitted.add(key)
                if self.fold.rated(item, rater.name):
                    self.stats.present += 1
                    continue
                if self._outstanding == 0:
                    self._idle = anyio.Event()
                self._outstanding += 1
                self._queue.append((item, rater))
                self._wake.set()

    @property
    def pending(self) -> int:
        """Ratings submitted and not done yet."""
        return self._outstanding

    async def join(self) -> None:
        """Return once everything submitted so far is stored (or failed, or left)."""
        await self._idle.wait()

    def close(self) -> None:
        """No more work: :meth:`serve` returns once the queue is empty."""
        self._closed = True
        self._wake.set()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the workers until :meth:`close` (and the queue is empty) or cancellation."""
        async with anyio.create_task_group() as tg:
            for _ in range(self.workers):
                tg.start_soon(self._work)
            task_status.started()

    async def _work(self) -> None:
        while True:
            if self._writes:
                try:
                    await self.write(self._writes.popleft())
                finally:
                    self._outstanding -= 1
                    if self._outstanding == 0:
                        self._idle.set()
                continue
            if not self._queue:
                if self._closed:
                    return
                if self._wake.is_set():  # every idle worker waits on the same event
                    self._wake = anyio.Event()
                await self._wake.wait()
                continue
            item, rater = self._queue.popleft()
            try:
                await self._rate(item, rater)
            finally:
                self._outstanding -= 1
                if self._outstanding == 0:
                    self._idle.set()

    async def _rate(self, item: JudgedReply, rater: Rater) -> None:
        asks = rater.judge.max_asks
        if self.limit is not None and not self.limit.reserve(asks):
            self.stats.left += 1
            return
        used = asks
        cell = {"rater": rater.name, "category": item.reply.category, "role": item.reply.role}
        try:
            try:
                rating = await rate_reply(
                    rater.judge, item, rater.name, source=self.source, address=rater.address
                )
            except ModelCallError as exc:
                used = len(exc.completions) + 1  # the asks answered, and the one that failed
                log.warning("panel.call_failed", error=exc.reason, model=exc.model, **cell)
                await self.write(failed_rating(item, rater.name, exc, self.run))
                self.stats.failed += 1
                return
            used = rating.asks
        finally:
            if self.limit is not None:
                self.limit.release(asks - used)
        log.info("panel.rating", severity=rating.severity, asks=rating.asks, **cell)
        await self.write(rating)
        self.stats.made += 1


def stored_campaign(text: str, source: str | Path, campaign: str) -> Config:
    """The configuration a campaign was stored with (its canonical JSON).

    Raises:
        InputError: the campaign was not stored by ``mhsafeeval run`` (no readable config).
    """
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        data.pop("inputs", None)
        return msgspec.convert(stored_data(data), Config)  # an earlier version's keys too
    except (ValueError, msgspec.ValidationError) as exc:
        raise InputError(
            source,
            "campaign",
            f"campaign {campaign!r} has no configuration mhsafeeval can read ({exc}); only a "
            "campaign stored by `mhsafeeval run` can be rejudged",
        ) from None


class RejudgeResult(msgspec.Struct, kw_only=True):
    """What :func:`rejudge` did: the pool's figures, the campaign and its replies."""

    campaign: str
    replies: int
    """Judged replies (each rated by every rater)."""
    unjudged: int
    """Replies the search's judge left unjudged: not rated."""
    stats: RatingStats
    limit_reached: bool = False


async def rejudge(
    store: EventStore,
    judges: Sequence[ModelSettings],
    *,
    source: str | Path,
    campaign: str | None = None,
    samples: int = 1,
    concurrency: int = 4,
    max_calls: int | None = None,
    taxonomy: Path | None = None,
    open_client: Callable[[ModelSettings], ModelClient] | None = None,
    progress: TextIO | None = None,
    progress_every: int = 10,
) -> RejudgeResult:
    """Rate a stored campaign's judged replies with ``judges`` (``samples`` ratings each),
    asking only for the (reply, rater) pairs with no stored rating, and store the Ratings
    (``source="rejudge"``) in the same campaign. Every judge is shown, for each reply, what
    the campaign's judge was shown (same prompt, context, threshold and re-asks).

    Raises:
        InputError: ``store`` holds no such campaign (or several and none was named), or the
            taxonomy the campaign used cannot be had.
    """
    from mhsafeeval.plan import taxonomy_fingerprint

    if open_client is None:
        from mhsafeeval.providers import open_model

        open_client = open_model
    infos = {c.id: c for c in await store.list_campaigns()}
    if not infos:
        raise InputError(source, None, "holds no campaign (is it a campaign database?)")
    known = ", ".join(map(repr, infos))
    if campaign is None:
        if len(infos) > 1:
            raise InputError(
                source, "campaign", f"holds {len(infos)} campaigns ({known}): name one"
            )
        campaign = next(iter(infos))
    if campaign not in infos:
        raise InputError(source, "campaign", f"no campaign {campaign!r} (stored: {known})")
    info = infos[campaign]
    config = stored_campaign(info.config, source, campaign)
    c = config.campaign
    tax = _taxonomy(c.taxonomy, taxonomy, source)
    wanted = _stored_fingerprint(info.config)
    if wanted and taxonomy_fingerprint(tax) != wanted:
        where = "the built-in taxonomy" if taxonomy is None else str(taxonomy)
        raise InputError(
            taxonomy or "--taxonomy",
            None,
            f"{where} is not the taxonomy campaign {campaign!r} was judged with (its ladders "
            "differ); pass the campaign's taxonomy file with --taxonomy",
        )
    fold = ReplyFold(c.judge_context)
    async for event in store.events(campaign):
        if event.message is not None:
            fold.add(event.message)
    items = fold.judged()
    limit = CallLimit(max_calls) if max_calls is not None else None
    models = [open_client(s) for s in judges]
    try:
        raters = [
            rater
            for settings, model in zip(judges, models, strict=True)
            for rater in raters_for(
                settings.provider,
                samples,
                RubricJudge(
                    model,
                    tax,
                    context_turns=c.judge_context,
                    max_asks=c.judge_max_asks,
                    threshold=c.threshold,
                ),
            )
        ]
        written, total = 0, 0

        async def write(msg: Message) -> None:
            nonlocal written
            await store.append(msg)
            written += 1
            if progress is not None and (written % progress_every == 0 or written == total):
                print(f"mhsafeeval: rejudge: {written}/{total} done", file=progress)

        pool = RatingPool(
            fold,
            raters,
            write,
            source="rejudge",
            run=f"rejudge{info.event_count}",
            workers=concurrency,
            limit=limit,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(pool.serve)
            pool.submit(items)
            total = pool.pending
            pool.close()
    finally:
        with anyio.CancelScope(shield=True):
            await store.flush()
            for model in models:
                await model.aclose()
    return RejudgeResult(
        campaign=campaign,
        replies=len(items),
        unjudged=len(fold.unjudged),
        stats=pool.stats,
        limit_reached=limit is not None and limit.reached,
    )


def _taxonomy(configured: str, given: Path | None, source: str | Path) -> Taxonomy:
    if given is not None:
        return load_taxonomy(given)
    if configured == "builtin":
        return builtin_taxonomy()
    raise InputError(
        source,
        "campaign.taxonomy",
        f"the campaign was judged with the taxonomy file {configured!r} (relative to its "
        "config file): pass it with --taxonomy",
    )


def _stored_fingerprint(text: str) -> str:
    data = json.loads(text)
    inputs = data.get("inputs") if isinstance(data, dict) else None
    value = inputs.get("taxonomy") if isinstance(inputs, dict) else None
    return value if isinstance(value, str) else ""
