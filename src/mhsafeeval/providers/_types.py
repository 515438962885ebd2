"""The provider seam: what every model client speaks, and the errors it raises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import msgspec

from mhsafeeval.errors import MhSafeEvalError
from mhsafeeval.framework import redact

__all__ = [
    "CallParams",
    "ChatMessage",
    "Completion",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "PermanentProviderError",
    "ProviderError",
    "ProviderUnavailable",
    "TransientProviderError",
]

Role = Literal["system", "user", "assistant"]


class ChatMessage(msgspec.Struct, frozen=True):
    """One chat turn sent to a model.

    Example:
        >>> [ChatMessage("system", "Be brief."), ChatMessage("user", "hello")][1].role
        'user'
    """

    role: Role
    content: str


class CallParams(msgspec.Struct, frozen=True, kw_only=True):
    """Sampling parameters of one call. ``None`` means "use the model's settings".

    ``json_schema`` asks for output constrained to that JSON schema (providers that cannot
    constrain output say so through :attr:`ModelClient.supports_json_schema`; callers must then
    validate the text themselves, which they should do anyway). ``session_id`` tells a stateful
    target which conversation a call continues.

    Example:
        >>> greedy = CallParams(temperature=0.0, max_tokens=200, seed=7)
        >>> greedy.temperature, CallParams().temperature  # None: the model's own setting
        (0.0, None)
    """

    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    json_schema: dict[str, Any] | None = None
    schema_name: str = "output"
    session_id: str | None = None
    """The conversation this call belongs to, as a stable opaque id (the same for every call of
    one conversation, in every run of a campaign), for targets that keep their own state per
    session (``http/`` and ``python/`` apps). Models ignore it; ``None``: no conversation."""


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """A model's answer to one call, with what it cost.

    Example:
        >>> done = Completion(
        ...     text="Hi.", finish_reason="stop", prompt_tokens=12, completion_tokens=2
        ... )
        >>> done.prompt_tokens + done.completion_tokens
        14
    """

    text: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    model: str = ""
    provider_id: str = ""
    attempts: int = 1
    usd: float | None = None
    """What the call cost, as its client priced it when it was made (:meth:`ModelClient.price`,
    stamped by :func:`open_model`'s wrapper); None: unknown (a model without a price)."""


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-model settings, as written in a campaign config's ``[models.NAME]`` table.

    The API key is never stored: ``api_key_env`` names the environment variable to read it from
    when the client is opened.

    Example:
        >>> import msgspec
        >>> judge = msgspec.convert(
        ...     {"provider": "litellm/openai/gpt-4o-mini", "api_key_env": "OPENAI_API_KEY",
        ...      "temperature": 0.0, "max_concurrency": 4},
        ...     ModelSettings,
        ... )
        >>> judge.provider.partition("/")[0], judge.max_concurrency
        ('litellm', 4)
    """

    provider: str
    """The model's address, ``PREFIX/MODEL``: ``litellm/...``, ``openai/...``, ``local/...``,
    ``vllm/...``, ``http/NAME``, ``python/MODULE:FUNCTION`` or ``scripted/NAME``."""
    api_base: str | None = None
    """The endpoint's base URL (an OpenAI-compatible server, vLLM, a proxy): http(s), with no
    credential in it."""
    api_key_env: str | None = None
    """The NAME of the environment variable that holds the API key; the key is never stored or
    logged."""
    timeout: float = 60.0
    """Seconds per attempt: a deadline on every attempt."""
    max_concurrency: int = 4
    """Calls in flight to this model's endpoint (tables on one endpoint share the largest); the
    adaptive limit's ceiling."""
    adaptive_concurrency: bool = True
    """Narrow the endpoint's concurrency limit when it says it is overloaded (HTTP 429, 503 or
    529), at most by half per round of calls, and widen it again by one per round of calls that
    succeed, never above ``max_concurrency`` nor below ``min_concurrency``. ``false``: a fixed
    limit of ``max_concurrency``. Tables sharing one endpoint share one limit, which is fixed if
    any of them says ``false``."""
    min_concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 1
    """The narrowest the adaptive limit gets (at most ``max_concurrency``)."""
    temperature: float | None = None
    """Sampling temperature; unset: the provider's default."""
    max_tokens: int | None = None
    """The most tokens of an answer; unset: the provider's default."""
    seed: int | None = None
    """The sampling seed sent with each call; unset: none."""
    stop: tuple[str, ...] = ()
    """Stop sequences for this model's free-text answers (never for structured ones): the
    answer ends where one first appears, without it. At most 4 (OpenAI's limit)."""
    max_attempts: int = 5
    """Attempts per call: transient failures (429, 5xx, timeouts, dropped connections) are
    retried; errors that retrying cannot fix are tried once."""
    backoff_initial: float = 1.0
    """Seconds before the first retry; the wait grows exponentially, with jitter, and honours
    ``Retry-After``."""
    backoff_max: float = 60.0
    """The longest wait between two attempts, in seconds."""
    max_retry_after: float = 300.0
    """The longest ``Retry-After`` (seconds) a provider may ask for and be waited for."""
    breaker_threshold: int = 5
    """After this many calls in a row failed transiently (after their retries), pause the model
    (0: never pause)."""
    breaker_cooldown: float = 60.0
    """Seconds a paused model's calls fail at once before one call is let through."""
    options: dict[str, Any] = {}
    """The provider's own options, checked against its options Struct by ``check``."""

    def __post_init__(self) -> None:
        checks = (
            (self.timeout > 0, "timeout", "must be > 0 seconds"),
            (self.max_concurrency >= 1, "max_concurrency", "must be >= 1"),
            (
                self.min_concurrency <= self.max_concurrency,
                "min_concurrency",
                "must be <= max_concurrency",
            ),
            (self.max_attempts >= 1, "max_attempts", "must be >= 1"),
            (len(self.stop) <= 4, "stop", "at most 4 stop sequences"),
            (all(self.stop), "stop", "a stop sequence must not be empty"),
            (self.backoff_initial >= 0, "backoff_initial", "must be >= 0"),
            (self.backoff_max >= self.backoff_initial, "backoff_max", "must be >= backoff_initial"),
            (self.max_retry_after >= 0, "max_retry_after", "must be >= 0"),
            (self.breaker_threshold >= 0, "breaker_threshold", "must be >= 0 (0: never pause)"),
            (self.breaker_cooldown >= 0, "breaker_cooldown", "must be >= 0"),
            (
                "/" in self.provider,
                "provider",
                "must look like 'PREFIX/MODEL', e.g. 'scripted/echo'",
            ),
        )
        for ok, field, reason in checks:
            if not ok:
                raise ValueError(f"{reason} - at `$.{field}`")

    @property
    def sampling(self) -> CallParams:
        """This table's sampling parameters (``None`` where it sets none)."""
        return CallParams(
            temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed, stop=self.stop
        )


class ProviderError(MhSafeEvalError):
    """Base class of provider failures.

    Its message passes :func:`~mhsafeeval.framework._redact.redact`: provider error text quotes
    what came back (an app's error page may echo the request's ``Authorization`` header), and
    it ends up stored (``CallFailed.error``), logged and shown.
    """

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(redact(message), *args)


class TransientProviderError(ProviderError):
    """A failure worth retrying: rate limit, server error, timeout, dropped connection.

    Args:
        message: what happened.
        status: HTTP status when there was one.
        retry_after: seconds the provider asked us to wait (Retry-After), if it said.
    """

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class PermanentProviderError(ProviderError):
    """A failure that retrying will not fix: bad request, authentication, unknown model."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ModelCallError(ProviderError):
    """A model call that finally failed, after ``attempts`` tries.

    Callers record it (a ``CallFailed`` event); it is never turned into an empty answer.
    ``retryable`` is the provider's word: False for a failure that retrying cannot fix (bad
    request, credentials, unknown model), which was therefore tried once.
    ``completions`` are answers already received, and paid for, on the way to this failure
    (a structured answer's asks that failed validation): their tokens are counted, never lost.

    Example:
        >>> err = ModelCallError("litellm/openai/gpt-4o-mini", 3, "HTTP 503", retryable=True)
        >>> str(err)
        'litellm/openai/gpt-4o-mini: call failed after 3 attempt(s): HTTP 503'
    """

    def __init__(
        self,
        model: str,
        attempts: int,
        reason: str,
        *,
        retryable: bool,
        status: int | None = None,
        completions: Sequence[Completion] = (),
    ) -> None:
        reason = redact(reason)
        super().__init__(f"{model}: call failed after {attempts} attempt(s): {reason}")
        self.model = model
        self.attempts = attempts
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.completions = tuple(completions)

    def having_spent(self, completions: Sequence[Completion]) -> ModelCallError:
        """This failure, after ``completions`` were spent before it (they come first)."""
        return ModelCallError(
            self.model,
            self.attempts,
            self.reason,
            retryable=self.retryable,
            status=self.status,
            completions=(*completions, *self.completions),
        )


class ProviderUnavailable(MhSafeEvalError):
    """No provider for an address, or its optional dependency is not installed."""


@runtime_checkable
class ModelClient(Protocol):
    """An LLM behind one address, e.g. ``litellm/openai/gpt-4o-mini`` or ``scripted/echo``.

    Implementations only translate: they make one call and raise
    :class:`TransientProviderError` (worth retrying) or :class:`PermanentProviderError`.
    :func:`mhsafeeval.providers.open_model` wraps them with what every model needs:
    one concurrency limit per connection, a deadline on every attempt, and bounded retries
    with backoff that honours Retry-After. The wrapped client raises :class:`ModelCallError`
    when a call finally fails.

    Besides calling, a client answers what its callers decide by, so that no caller reaches
    into a concrete wrapper: the sampling it applies (:attr:`sampling`), what an answer cost
    (:meth:`price`), whether a failure is worth another attempt (:meth:`should_retry`) and
    which endpoint it talks to (:attr:`connection_key`: clients on one endpoint share a limit).

    Example:
        >>> import anyio
        >>> from mhsafeeval.providers import ModelSettings, open_model
        >>> async def main() -> str:
        ...     async with open_model(ModelSettings(provider="scripted/echo")) as model:
        ...         done = await model.complete([ChatMessage("user", "hello")])
        ...         return done.text
        >>> anyio.run(main)
        'hello'
        >>> model = open_model(ModelSettings(provider="scripted/echo", temperature=0.7))
        >>> model.sampling.temperature, model.connection_key
        (0.7, 'echo')
    """

    name: str

    @property
    def supports_json_schema(self) -> bool:
        """Whether the model constrains answers to ``CallParams.json_schema`` (read-only: a
        provider that learns its server refuses schemas changes it itself)."""
        ...

    @property
    def sampling(self) -> CallParams:
        """The sampling this client applies to a call that leaves a parameter ``None``: the
        model table's ``temperature``, ``max_tokens``, ``seed`` and ``stop`` once opened with
        :func:`~mhsafeeval.providers.open_model`; ``None`` where nothing was configured
        (a caller may then choose, e.g. a judge samples greedily)."""
        ...

    @property
    def connection_key(self) -> str:
        """The endpoint this client calls, e.g. a server's URL and model, or a model file.
        Clients of one provider with the same key share one concurrency limit when opened with
        the same :class:`~mhsafeeval.providers.Connections`; the key only needs to tell
        apart the endpoints of its own provider (the provider prefix is added to it)."""
        ...

    def should_retry(self, error: Exception) -> bool:
        """Whether another attempt may succeed where this one raised ``error`` (the provider's
        word: built-in providers say yes to :class:`TransientProviderError` only)."""
        ...

    def price(self, completion: Completion) -> float | None:
        """Estimated USD of ``completion``'s tokens at this model's prices: 0 for models that
        cost nothing (scripted, local), ``None`` when no price is known."""
        ...

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Answer one chat. ``params`` override the model's settings for this call."""
        ...

    async def aclose(self) -> None:
        """Release connections and clients. Idempotent."""
        ...
