"""Campaign budgets: limits on counselor calls, tokens and estimated USD (``[budget]``).

A :class:`Budget` starts from what the stored part of a campaign already spent (so a resumed
run counts everything; calls and tokens by the rules of :class:`~mhsafeeval.storage.CampaignLog`,
the same the report applies) and sits in front of every model call through :class:`BudgetedModel`:
a call starts only while every limit has room (a counselor call reserves its place, so at most
``counselor_calls`` counselor calls are ever made); tokens and cost are added as answers come
back, so those two limits may be overshot by the calls in flight when they are reached. Once a
limit is reached no call starts again: calls wait, the campaign stops cleanly and says which
limit stopped it. Calls already paid for are finished first: the calls in flight complete and
are stored, and at the counselor-call limit the *raters* (the search judge, the confirming
and the panel judges: ``BudgetedModel(rater=True)``) still judge the replies that were paid
for (:meth:`Budget.drained` waits until nothing but calls that may not start is left), so the
last replies are judged, confirmed and counted, and a resumed run never asks for them again.
A live answer is priced by its client (:meth:`~mhsafeeval.providers.ModelClient.price`),
stored ones from litellm's price map (:mod:`mhsafeeval.costs`, the same map); local and
scripted models cost 0, and a USD limit with a model the map cannot price is refused before
the run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import anyio

from mhsafeeval.config import BudgetSection, Config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import CampaignStarted, Message, Usage
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelClient,
    provider_info,
)
from mhsafeeval.providers._wrapper import ClientWrapper
from mhsafeeval.storage import CampaignLog

__all__ = ["Budget", "BudgetedModel", "StoredSpending", "check_prices"]


def _cost(model: str, prompt: int, completion: int, fallback: str = "") -> float:
    """USD of these tokens; a model name the price map lacks (a provider may answer with a
    dated variant) is priced as ``fallback``, the configured model."""
    from mhsafeeval.costs import model_cost

    cost = model_cost(model, prompt, completion)
    if cost is None and fallback:
        cost = model_cost(fallback, prompt, completion)
    return cost or 0.0


def check_prices(config: Config, source: str | Path) -> None:
    """A USD limit needs a price for every model: raise InputError naming one without."""
    if config.budget.usd is None:
        return
    from mhsafeeval.costs import model_cost

    for where, model in config.model_tables():
        prefix, _, name = model.provider.partition("/")
        prices = provider_info(prefix).prices
        if prices is not None and not prices(name, model):
            reason = "its calls get no price (see the provider's price options)"
        elif prices is None and model_cost(model.provider, 1000, 1000) is None:
            reason = "it has no price in litellm's price map"
        else:
            continue
        raise InputError(
            source,
            "budget.usd",
            f"{model.provider} ({where}): {reason}, so a USD limit cannot be enforced; "
            "limit calls or tokens instead",
        )


class StoredSpending:
    """What the stored part of a campaign spent, folded one stored message at a time (a resumed
    run streams them past it: nothing is kept but the totals).

    Calls and tokens are counted by the rules of :class:`~mhsafeeval.storage.CampaignLog`, the
    same the report applies. USD: each answer at the price stamped on it when it was made; an
    answer stored before calls were priced, from litellm's price map, once per model at the
    end; ``configured(msg)`` names the configured model that answered ``msg``, to price one
    whose model name the map lacks.

    Example:
        >>> spending = StoredSpending()
        >>> spending.counselor_calls, spending.tokens, spending.usd
        (0, 0, 0.0)
    """

    def __init__(self, configured: Callable[[Message], str] | None = None) -> None:
        self.configured = configured
        self._log = CampaignLog(retain=False)  # totals only
        self._usd = 0.0
        self._unpriced: dict[tuple[str, str], list[int]] = {}  # priced once per model
        self._priced = False  # the run that stored what follows priced its calls

    def add(self, msg: Message) -> None:
        """Fold in one stored message (in stored order)."""
        self._log.add(msg)
        if isinstance(msg, CampaignStarted):
            self._priced = msg.priced_calls
        usage: Usage | None = getattr(msg, "usage", None)
        if usage is not None and usage.usd is not None:
            self._usd += usage.usd  # what it was priced at when it was made
        elif usage is not None and not self._priced:  # stored before calls were priced
            fallback = self.configured(msg) if self.configured is not None else ""
            tally = self._unpriced.setdefault((usage.model, fallback), [0, 0])
            tally[0] += usage.prompt_tokens
            tally[1] += usage.completion_tokens

    @property
    def tokens(self) -> int:
        """Tokens of the stored calls."""
        return sum(u.tokens for u in self._log.spent().values())

    @property
    def counselor_calls(self) -> int:
        """Stored counselor calls."""
        totals = self._log.spent()
        return totals["counselor"].calls if "counselor" in totals else 0

    @property
    def usd(self) -> float:
        """Estimated USD of the stored calls."""
        priced = self._unpriced.items()
        return self._usd + sum(_cost(m, p, c, fallback) for (m, fallback), (p, c) in priced)


class Budget:
    """What a campaign may still spend, shared by every model call of the run."""

    def __init__(
        self,
        limits: BudgetSection,
        history: Iterable[Message] | StoredSpending = (),
        configured: Callable[[Message], str] | None = None,
    ) -> None:
        """``history``: the stored part of the campaign, or what it spent (a
        :class:`StoredSpending` a resumed run folded as it read the store); ``configured(msg)``:
        the configured model that answered ``msg``, to price a stored answer whose model name
        the price map lacks."""
        self.limits = limits
        self.in_flight = 0
        self.reached: str | None = None
        """Which limit stopped the campaign (None: none yet)."""
        self.stop = anyio.Event()
        self.admitted = 0
        """Calls admitted by this run so far (a drain waits until it stops growing)."""
        self._idle: anyio.Event | None = None
        if isinstance(history, StoredSpending):
            spent = history
        else:
            spent = StoredSpending(configured)
            for msg in history:
                spent.add(msg)
        self.counselor_calls = spent.counselor_calls
        self.tokens = spent.tokens
        self.usd = spent.usd
        self._check()

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        b = self.limits
        return b.counselor_calls is not None or b.tokens is not None or b.usd is not None

    def spent(self) -> str:
        """What was spent so far, against the limits, in one line."""
        b = self.limits
        parts = [
            f"{self.counselor_calls} counselor calls"
            + (f" of {b.counselor_calls}" if b.counselor_calls is not None else ""),
            f"{self.tokens:,} tokens" + (f" of {b.tokens:,}" if b.tokens is not None else ""),
            f"${self.usd:.4f}" + (f" of ${b.usd:.4f}" if b.usd is not None else ""),
        ]
        return ", ".join(parts)

    def _check(self) -> None:
        if self.reached is not None:
            return
        b = self.limits
        if b.counselor_calls is not None and self.counselor_calls >= b.counselor_calls:
            self.reached = "budget.counselor_calls"
        elif b.tokens is not None and self.tokens >= b.tokens:
            self.reached = "budget.tokens"
        elif b.usd is not None and self.usd >= b.usd:
            self.reached = "budget.usd"
        if self.reached is not None:
            self.stop.set()

    async def admit(self, counselor: bool, *, rater: bool = False) -> None:
        """Wait for room to start a call: returns at once while no limit is reached, never
        after (the campaign cancels the waiting calls when it stops), except for a ``rater``
        (a judge of a reply already paid for) at the counselor-call limit."""
        if not self.reserve(counselor, rater=rater):
            await anyio.sleep_forever()

    def reserve(self, counselor: bool, *, rater: bool = False) -> bool:
        """Take a place for one call now if no limit is reached (False: none is left); what
        :meth:`admit` does without waiting, for a budget shared by several processes
        (:mod:`mhsafeeval.distributed` keeps one for all its workers). A ``rater`` call judges
        a reply already paid for: the counselor-call limit does not stop it (tokens and USD
        do)."""
        finishing = rater and not counselor and self.reached == "budget.counselor_calls"
        if self.reached is not None and not finishing:
            return False
        self.admitted += 1
        if counselor:
            self.counselor_calls += 1  # reserved now: concurrent calls cannot overshoot
            b = self.limits
            if b.counselor_calls is not None and self.counselor_calls >= b.counselor_calls:
                self.reached = "budget.counselor_calls"  # this call is the last one allowed
                self.stop.set()
        self.in_flight += 1
        return True

    def settle(
        self, completion: Completion | None, model: str = "", *, usd: float | None = None
    ) -> None:
        """Count a call's answer (None: it failed or was cancelled) from ``model``.

        ``usd``: what the answer cost, as its client priced it; ``None``: priced here from
        the price map by the answering model's name, else ``model``'s (0 when unpriced).
        """
        self.in_flight -= 1
        if not self.in_flight and self._idle is not None:
            self._idle.set()
        if completion is not None:
            if usd is None:
                usd = _cost(
                    completion.model, completion.prompt_tokens, completion.completion_tokens, model
                )
            self.add(completion.prompt_tokens + completion.completion_tokens, usd)
        self._check()

    def add(self, tokens: int, usd: float) -> None:
        """Count what an answer spent (:meth:`settle` does it for the calls it admitted)."""
        self.tokens += tokens
        self.usd += usd
        self._check()

    async def drained(self) -> None:
        """Return once no admitted call is still running and none will start: every task of
        the run is waiting (:func:`anyio.wait_all_tasks_blocked`) with nothing in flight, so
        what is left waits for a place no limit gives (the raters of the replies paid for,
        admitted at the counselor-call limit, have finished)."""
        while True:
            while self.in_flight:
                self._idle = anyio.Event()
                await self._idle.wait()
            admitted = self.admitted
            await anyio.wait_all_tasks_blocked()
            if not self.in_flight and self.admitted == admitted:
                return


class BudgetedModel(ClientWrapper):
    """A model client whose calls go through a :class:`Budget` (same interface otherwise:
    everything but :meth:`complete` is the inner client's)."""

    def __init__(
        self, inner: ModelClient, budget: Budget, *, counselor: bool, rater: bool = False
    ) -> None:
        super().__init__(inner)
        self.budget = budget
        self.counselor = counselor
        self.rater = rater
        """It judges replies already paid for (see :meth:`Budget.reserve`)."""

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Call the inner model once the budget admits it; its answer is priced by it."""
        if self.rater:
            await self.budget.admit(self.counselor, rater=True)
        else:
            await self.budget.admit(self.counselor)
        done: Completion | None = None
        try:
            done = await self.inner.complete(messages, params)
            return done
        finally:
            if done is None:
                usd = None
            else:  # the price stamped on it when it was made, else the client's now
                usd = done.usd if done.usd is not None else (self.inner.price(done) or 0.0)
            self.budget.settle(done, self.name, usd=usd)

    async def aclose(self) -> None:
        """The inner client is closed by whoever opened it."""
