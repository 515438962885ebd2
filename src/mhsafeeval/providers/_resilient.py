"""What every model gets around its provider: a concurrency limit, deadlines and retries."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel
import msgspec
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)

from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ModelSettings,
    PermanentProviderError,
    TransientProviderError,
)
from ._wrapper import ClientWrapper

__all__ = ["OVERLOAD_STATUS", "AdaptiveLimit", "CallStats", "Connections", "ResilientClient"]

log = structlog.get_logger("mhsafeeval.providers")

Sleep = Callable[[float], Awaitable[None]]

OVERLOAD_STATUS = frozenset({429, 503, 529})
"""HTTP statuses that ask for less load, so they narrow an adaptive limit: 429 (rate limited),
503 (the standard "overloaded, try later": OpenAI's "engine overloaded", Ollama's full queue)
and 529 (Anthropic's "overloaded"). Other transient failures (500, 502, 504, timeouts, dropped
connections) say nothing reliable about load and leave the limit alone."""

LOG_INTERVAL_S = 5.0
"""At most one ``provider.concurrency`` line per endpoint in this many seconds; the next one
says how many changes it covers."""


class CallStats(msgspec.Struct):
    """Running totals for one model (read by progress displays and reports)."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retry_wait_s: float = 0.0


class AdaptiveLimit:
    """How many calls one endpoint gets at once: a limit that narrows when the endpoint says it
    is overloaded and widens again while calls succeed (AIMD, as TCP's congestion window).

    * it starts at ``maximum``;
    * an answer with a status in :data:`OVERLOAD_STATUS` halves it (never below ``minimum``),
      at most once per round: a round ends with each decrease, and the answers (failures or
      successes) of calls that started before it are ignored, so a burst of calls in flight
      failing together narrows it once, not down to ``minimum`` at once;
    * it widens by one, up to ``maximum``, once as many calls as the limit allows (one round)
      have succeeded since its last change, counting only calls that started after the last
      decrease and found the limit in use (as many calls in flight as it allows: a success
      with slots to spare says nothing about a wider limit);
    * narrowing never cancels a call in flight: new calls wait until fewer than the limit are
      in flight. Waiting is cancellation-safe (an :class:`anyio.CapacityLimiter` underneath).

    With ``adaptive`` False it is a fixed limit of ``maximum``. Clients on one endpoint share
    one (see :class:`Connections`).

    Example:
        >>> limit = AdaptiveLimit(8, minimum=2, endpoint="litellm:http://localhost:8000/v1")
        >>> limit.total_tokens, limit.maximum, limit.borrowed_tokens
        (8, 8, 0)
    """

    def __init__(
        self, maximum: int, *, minimum: int = 1, adaptive: bool = True, endpoint: str = ""
    ) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"{endpoint or 'limit'}: need 1 <= minimum <= maximum")
        self.endpoint = endpoint
        self.maximum = maximum
        self.minimum = minimum
        self.adaptive = adaptive
        self._limiter = anyio.CapacityLimiter(maximum)
        self._round = 0  # decreases so far
        self._successes = 0  # counted towards the next increase
        self._logged_at: float | None = None
        self._logged_value = maximum
        self._unlogged = 0

    @property
    def total_tokens(self) -> int:
        """The current limit (as :attr:`anyio.CapacityLimiter.total_tokens`)."""
        return int(self._limiter.total_tokens)

    @property
    def borrowed_tokens(self) -> int:
        """Calls in flight now (may exceed :attr:`total_tokens` just after it narrowed)."""
        return self._limiter.borrowed_tokens

    def widen(self, maximum: int) -> None:
        """Raise the maximum to ``maximum`` if it is lower; a limit that had not narrowed
        widens with it."""
        if maximum > self.maximum:
            at_top = self.total_tokens == self.maximum
            self.maximum = maximum
            if at_top:
                self._limiter.total_tokens = maximum

    def include(self, settings: ModelSettings) -> None:
        """Take in one more model table on this endpoint: the widest ``max_concurrency``, the
        highest ``min_concurrency``; fixed at the maximum if it says
        ``adaptive_concurrency = false``."""
        self.widen(settings.max_concurrency)
        self.minimum = min(self.maximum, max(self.minimum, settings.min_concurrency))
        self.adaptive = self.adaptive and settings.adaptive_concurrency
        if not self.adaptive:
            self._limiter.total_tokens = self.maximum
        elif self.total_tokens < self.minimum:
            self._limiter.total_tokens = self.minimum

    async def take(self) -> int:
        """Take one slot for a call (give it back with :meth:`give_back`); the round it
        started in (for :meth:`succeeded` and :meth:`overloaded`).

        A free slot is taken without yielding to the event loop (anyio's ``acquire`` would,
        once per call: with many calls in flight each such yield waits behind every other
        ready task, which adds to each call's latency); a call that has to wait queues in
        order, as before. A cancellation pending here is raised before the slot is taken.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            self._limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self._limiter.acquire()
        return self._round

    def give_back(self) -> None:
        """Give back a slot :meth:`take` took."""
        self._limiter.release()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[int]:
        """:meth:`take` and :meth:`give_back` around a block; yields the round."""
        started = await self.take()
        try:
            yield started
        finally:
            self.give_back()

    def succeeded(self, started: int) -> None:
        """A call that started in round ``started`` succeeded (call it while holding the
        slot)."""
        current = self.total_tokens
        if not self.adaptive or started != self._round or current >= self.maximum:
            return
        if self.borrowed_tokens < current:
            return  # the limit was not in use
        self._successes += 1
        if self._successes >= current:
            self._change(current + 1, "calls succeed")

    def overloaded(self, started: int, status: int) -> None:
        """A call that started in round ``started`` was answered ``status`` (one of
        :data:`OVERLOAD_STATUS`)."""
        if not self.adaptive or started != self._round:
            return  # it was in flight before the last decrease: that one answered for it
        self._round += 1
        self._successes = 0
        current = self.total_tokens
        narrower = max(self.minimum, current // 2)
        if narrower < current:
            self._change(narrower, f"HTTP {status}")

    def _change(self, value: int, reason: str) -> None:
        self._limiter.total_tokens = value
        self._successes = 0
        now = anyio.current_time()
        self._unlogged += 1
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL_S:
            return  # a storm of changes is summed up by the next line
        log.info(
            "provider.concurrency",
            endpoint=self.endpoint,
            old=self._logged_value,
            new=value,
            maximum=self.maximum,
            reason=reason,
            changes=self._unlogged,
        )
        self._logged_at, self._logged_value, self._unlogged = now, value, 0


class Connections:
    """Concurrency limits shared by every client opened with it, one per endpoint.

    A composition root that opens many models makes one and passes it to each
    :func:`~mhsafeeval.providers.open_model`: clients whose providers report the same
    :attr:`~mhsafeeval.providers.ModelClient.connection_key` (two model tables on one
    server that differ only in temperature, say) share one :class:`AdaptiveLimit`.
    Each table's ``max_concurrency`` says how many calls its endpoint takes; the shared limit
    is at most the largest of them, and starts there.

    Example:
        >>> from mhsafeeval.providers import ModelSettings, open_model
        >>> shared = Connections()
        >>> a = open_model(ModelSettings(provider="scripted/echo"), connections=shared)
        >>> b = open_model(
        ...     ModelSettings(provider="scripted/echo", temperature=1.0, max_concurrency=8),
        ...     connections=shared,
        ... )
        >>> a.limiter is b.limiter, shared.limits()
        (True, {'scripted:echo': (8, 8)})
    """

    def __init__(self) -> None:
        self._limiters: dict[str, AdaptiveLimit] = {}

    def limiter(self, key: str, size: int) -> AdaptiveLimit:
        """The limit of endpoint ``key``, its maximum widened to ``size`` if it is narrower
        (the clients' :class:`ResilientClient` take in the rest of their tables)."""
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = AdaptiveLimit(size, endpoint=key)
        else:
            limiter.widen(size)
        return limiter

    def keys(self) -> list[str]:
        """The endpoints with a limit, in the order they were first opened."""
        return list(self._limiters)

    def limits(self) -> dict[str, tuple[int, int]]:
        """Each endpoint's ``(current limit, maximum)``, in the order they were first opened
        (for progress displays: a current limit below the maximum means it backed off)."""
        return {key: (lim.total_tokens, lim.maximum) for key, lim in self._limiters.items()}


class ResilientClient(ClientWrapper):
    """Wraps a provider's :class:`ModelClient` with the policies every call needs.

    * a concurrency limit (:class:`AdaptiveLimit`: its own, or one its endpoint shares
      through :class:`Connections`), held only while a request is in flight (not while
      backing off), so a rate-limited model does not block its own retries; answers with a
      status in :data:`OVERLOAD_STATUS` narrow it, successes widen it again
      (``settings.adaptive_concurrency``);
    * a deadline (``settings.timeout``) on every attempt;
    * up to ``settings.max_attempts`` attempts on the errors the provider says are worth
      retrying (:meth:`ModelClient.should_retry`; built-ins: :class:`TransientProviderError`,
      timeouts included), waiting full-jitter exponential backoff, or at least the provider's
      Retry-After (capped at ``settings.max_retry_after``);
    * a final failure raises :class:`ModelCallError`; cancellation always propagates;
    * a :class:`PermanentProviderError` (the provider's word that retrying cannot help) is
      never retried: one attempt, ``ModelCallError.retryable`` False; nor does it count
      towards the circuit breaker, which pauses a model after calls that failed transiently;
    * the answer's ``latency_s`` is the time the whole call took: every attempt (failed ones
      and timeouts included) and the backoff waits between them, not the wait for a
      concurrency slot. A provider that times its own answer (a local model) gives the
      successful attempt's part.

    ``sleep`` and ``rng`` are injectable so tests can check the waits without waiting.
    """

    def __init__(
        self,
        inner: ModelClient,
        settings: ModelSettings,
        *,
        limiter: AdaptiveLimit | None = None,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(inner)
        self.settings = settings
        if limiter is None:
            endpoint = f"{settings.provider.partition('/')[0]}:{inner.connection_key}"
            limiter = AdaptiveLimit(settings.max_concurrency, endpoint=endpoint)
        limiter.include(settings)
        self.limiter = limiter
        self.stats = CallStats()
        self._sleep: Sleep = sleep or anyio.sleep
        self._rng = rng or random.Random()
        self._closed = False
        self._consecutive_failures = 0
        self._open_until: float | None = None
        self._deadlines = _Deadlines(settings.timeout)

    @property
    def limit(self) -> tuple[int, int]:
        """The endpoint's ``(current concurrency limit, maximum)`` (for progress displays)."""
        return self.limiter.total_tokens, self.limiter.maximum

    @property
    def sampling(self) -> CallParams:
        """The model table's sampling parameters, applied where a call leaves them ``None``."""
        return self.settings.sampling

    def should_retry(self, error: Exception) -> bool:
        """A final :class:`ModelCallError` says itself; anything else, the provider."""
        if isinstance(error, ModelCallError):
            return error.retryable
        return self.inner.should_retry(error)

    def _retryable(self, error: BaseException) -> bool:
        return isinstance(error, Exception) and self.inner.should_retry(error)

    def _defaults(self, params: CallParams | None) -> CallParams:
        s = self.settings
        p = params or CallParams()
        return msgspec.structs.replace(
            p,
            temperature=s.temperature if p.temperature is None else p.temperature,
            max_tokens=s.max_tokens if p.max_tokens is None else p.max_tokens,
            seed=s.seed if p.seed is None else p.seed,
            # The model's stop sequences end free text; a structured answer ends with its JSON.
            stop=p.stop
            if p.json_schema is not None
            else (*p.stop, *(x for x in s.stop if x not in p.stop)),
        )

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        s = self.settings
        ceiling = min(s.backoff_max, s.backoff_initial * 2 ** (attempt - 1))
        wait = self._rng.uniform(0, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, s.max_retry_after))
        return wait

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = exc.retry_after if isinstance(exc, TransientProviderError) else None
        return self.backoff(state.attempt_number, retry_after)

    async def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.upcoming_sleep
        self.stats.retries += 1
        self.stats.retry_wait_s += wait
        log.warning(
            "provider.retry",
            model=self.name,
            attempt=state.attempt_number,
            wait_s=round(wait, 3),
            error=str(exc),
            status=getattr(exc, "status", None),
        )

    async def _attempt(
        self, messages: Sequence[ChatMessage], params: CallParams, took: list[float]
    ) -> Completion:
        """One attempt; appends its duration to ``took`` whatever the outcome."""
        self.stats.attempts += 1
        limiter = self.limiter
        started = await limiter.take()  # a plain pair, not a context manager: once per call
        try:
            start = anyio.current_time()
            try:
                done = await self._deadlines.within(self.inner.complete(messages, params))
            except TimeoutError as exc:
                raise TransientProviderError(
                    f"no answer within {self.settings.timeout:g}s (timeout)"
                ) from exc
            except TransientProviderError as exc:
                if exc.status in OVERLOAD_STATUS:
                    limiter.overloaded(started, exc.status)
                raise
            finally:
                took.append(anyio.current_time() - start)
            limiter.succeeded(started)
        finally:
            limiter.give_back()
        if done.latency_s:  # the provider timed its own answer
            took[-1] = done.latency_s
        return done

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Call the model; see the class docstring for the policies applied.

        Raises:
            ModelCallError: the call failed for good (the caller records it).
        """
        if self._closed:
            raise ModelCallError(self.name, 0, "client is closed", retryable=False)
        self._check_breaker()
        call_params = self._defaults(params)
        self.stats.calls += 1
        attempts = 1
        took: list[float] = []  # each attempt's duration
        waited = 0.0  # backoff between attempts
        first: Exception | None = None
        try:
            done = await self._attempt(messages, call_params, took)
        except Exception as exc:
            first = exc
        # Most calls succeed at once: tenacity (its bookkeeping costs about as much CPU as the
        # rest of this wrapper) takes over only after a failed first attempt, which it is
        # handed as its own attempt 1, so waits, logs and the attempt count are its own.
        try:
            if first is not None:
                retrying = AsyncRetrying(
                    stop=stop_after_attempt(self.settings.max_attempts),
                    wait=self._wait,
                    retry=retry_if_exception(self._retryable),
                    sleep=self._sleep,
                    before_sleep=self._before_sleep,
                    reraise=True,
                )
                replay = [first]
                async for attempt in retrying:
                    attempts = attempt.retry_state.attempt_number
                    waited = attempt.retry_state.idle_for
                    with attempt:
                        if replay:
                            raise replay.pop()
                        done = await self._attempt(messages, call_params, took)
        except Exception as exc:
            transient = isinstance(exc, TransientProviderError) or self._retryable(exc)
            if not transient and not isinstance(exc, PermanentProviderError):
                raise  # not a provider failure (a test's ScriptExhausted): the caller's bug
            self.stats.failures += 1
            if transient:
                # A permanent refusal is not counted by the breaker: it says nothing about an
                # outage, and a pause would record later calls as "paused" instead of their reason.
                self._failed()
            status = getattr(exc, "status", None)
            raise ModelCallError(
                self.name,
                attempts,
                str(exc),
                retryable=transient,
                status=status if isinstance(status, int) else None,
            ) from exc
        self._consecutive_failures = 0
        self._open_until = None
        self.stats.prompt_tokens += done.prompt_tokens
        self.stats.completion_tokens += done.completion_tokens
        usd = done.usd if done.usd is not None else self.inner.price(done)  # priced now, stored
        return msgspec.structs.replace(
            done, attempts=attempts, latency_s=sum(took) + waited, usd=usd
        )

    # -- the circuit breaker --------------------------------------------------------------------

    def _failed(self) -> None:
        self._consecutive_failures += 1
        threshold = self.settings.breaker_threshold
        if threshold and self._consecutive_failures >= threshold:
            if self._open_until is None or anyio.current_time() >= self._open_until:
                log.error(
                    "provider.circuit_open",
                    model=self.name,
                    failures=self._consecutive_failures,
                    paused_s=self.settings.breaker_cooldown,
                )
            self._open_until = anyio.current_time() + self.settings.breaker_cooldown

    def _check_breaker(self) -> None:
        """After ``breaker_threshold`` calls in a row failed for good on transient errors
        (permanent refusals do not count), calls fail at once for ``breaker_cooldown`` seconds
        (the model is paused, other models go on); then one call is let through, and a success
        closes the breaker."""
        if self._open_until is not None and anyio.current_time() < self._open_until:
            self.stats.failures += 1
            raise ModelCallError(
                self.name,
                0,
                f"paused: the last {self._consecutive_failures} calls failed; retrying after "
                f"{self._open_until - anyio.current_time():.0f} s",
                retryable=True,
            )

    async def aclose(self) -> None:
        """Close the provider's client. Idempotent; shielded, so that a cancelled caller (or
        ``async with`` body) never leaves it half-closed."""
        if not self._closed:
            self._closed = True
            with anyio.CancelScope(shield=True):
                await self.inner.aclose()


class _Deadlines:
    """The deadlines of one client's calls, each ``timeout`` seconds from its start.

    On asyncio one timer waits for the earliest deadline, instead of one timer per call
    (anyio's ``fail_after`` arms and cancels a timer per call, with a cancel scope and a
    generator around it: a few percent of a campaign's CPU at hundreds of calls a second).
    Every call lasts the same ``timeout``, so deadlines come in the order calls start: a queue
    whose head the timer waits for. A call that ends leaves its entry marked done; done entries
    leave the queue from its head. Elsewhere (trio) each call gets ``anyio.fail_after``.
    """

    __slots__ = ("_loop", "_queue", "_scope", "_timer", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_Deadline] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._scope: type[anyio.CancelScope] = anyio.CancelScope

    async def within(self, call: Awaitable[Completion]) -> Completion:
        """Await ``call``; cancel it and raise ``TimeoutError`` at its deadline."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio
            with anyio.fail_after(self.timeout):
                return await call
        if loop is not self._loop:  # the first call, or a client used on a new event loop
            self._loop, self._queue, self._timer = loop, deque(), None
            self._scope = type(anyio.CancelScope())  # the backend's class: no dispatch per call
        queue = self._queue
        with self._scope() as scope:
            entry = _Deadline(loop.time() + self.timeout, scope)
            queue.append(entry)
            if self._timer is None:
                self._timer = loop.call_at(entry.at, self._expire)
            try:
                done = await call
            finally:
                entry.scope = None
                while queue and queue[0].scope is None:
                    queue.popleft()
        if scope.cancelled_caught:
            raise TimeoutError
        return done

    def _expire(self) -> None:
        """The timer: cancel every call past its deadline, then wait for the next deadline."""
        loop, queue = self._loop, self._queue
        assert loop is not None
        now = loop.time()
        while queue and (queue[0].scope is None or queue[0].at <= now):
            scope = queue.popleft().scope
            if scope is not None:
                scope.cancel()
        self._timer = loop.call_at(queue[0].at, self._expire) if queue else None


class _Deadline:
    """One call's deadline (loop time) and its cancel scope (None once the call ended)."""

    __slots__ = ("at", "scope")

    def __init__(self, at: float, scope: anyio.CancelScope) -> None:
        self.at = at
        self.scope: anyio.CancelScope | None = scope
