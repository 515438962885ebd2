"""``openai/<model>``: OpenAI's API, or any server that speaks it (vLLM, llama.cpp, Ollama).

A lean path on the official ``openai`` SDK, for when CPU per call matters (many
conversations in flight): about 1.3 ms of CPU per call at 64 in flight, a fraction of what
``litellm/`` costs. ``<model>`` is the
model's name as the server knows it (``openai/gpt-4o-mini``, ``openai/Qwen/Qwen2.5-7B``).

* ``api_base``: the server, ``https://api.openai.com/v1`` by default.
* ``api_key_env``: the variable holding the key; by default ``OPENAI_API_KEY`` for OpenAI
  itself. A server of your own (``api_base`` set, no ``api_key_env``) gets a placeholder key,
  ``no-key-needed``, because the SDK always sends one.

Every model table on one endpoint (base URL, key variable and headers) shares one
``AsyncOpenAI`` client in the process. Its connection pool is sized when the first call is
made, to the calls the tables opened by then may have in flight, and grows (a new client,
the old one closed once its requests are answered) when a wider table joins. The client
is closed when the last model using it closes. The SDK's retries are off: one
:meth:`OpenAIModel.complete` is one HTTP request, and
:class:`~mhsafeeval.runtime.providers.ResilientClient` owns retries, backoff and deadlines.

Each call goes through the SDK's plain ``post`` (the way its README gives for any endpoint),
with the body encoded and the answer decoded by msgspec: the typed ``chat.completions.create``
path (and its ``with_raw_response``) transforms and validates the request parameters, which
doubles the CPU of a call. On
asyncio the HTTP transport is aiohttp (the SDK's ``DefaultAioHttpClient``), which costs half
the CPU of httpx2's pool at 64 connections; other event loops (trio) use httpx2.

How failures are sorted:

=========================================================  ===========================
openai exception                                           becomes
=========================================================  ===========================
RateLimitError, status 408, 409, 425, 429 or >= 500        transient (with Retry-After)
APIConnectionError, APITimeoutError, a body not JSON       transient
Any other status (400, 401, 403, 404, 422, ...)            permanent
A 4xx/5xx refusing the ``response_format`` it was sent     step down (see below)
OpenAIError that is no APIError (the SDK refused to send)  permanent
=========================================================  ===========================

Structured output uses the three modes of the ``litellm/`` path
(:mod:`~mhsafeeval.runtime.providers._openai_compat`): ``auto`` starts at ``json_schema``,
and a server that refuses a mode steps the model down once, for good. No message built here
contains the API key's value.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import msgspec

from .._logging import register_secret
from ._openai_compat import (
    Mode,
    SchemaRejectedError,
    StructuredOutput,
    by_status,
    chat_fields,
    completion_from,
    env_headers,
    error_text,
    names_response_format,
    retry_after_in,
    step_down,
)
from ._registry import SettingsError, provider, typed_options
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelSettings,
    PermanentProviderError,
    ProviderUnavailable,
    TransientProviderError,
)

if TYPE_CHECKING:
    import openai

__all__ = [
    "NO_KEY",
    "OPENAI_BASE",
    "OpenAIModel",
    "OpenAIOptions",
    "openai_environment",
    "openai_factory",
    "openai_prices",
]

OPENAI_BASE = "https://api.openai.com/v1"
"""The ``api_base`` of an ``openai/`` model table that sets none."""
NO_KEY = "no-key-needed"
"""The key sent to a server of your own that needs none (the SDK always sends one)."""
# Request fields set from the model table; options.extra_body may not set them.
_OWN_FIELDS = frozenset(
    {"model", "messages", "stream", "temperature", "max_tokens", "seed", "stop", "response_format"}
)

Price = Annotated[float, msgspec.Meta(ge=0)]


class OpenAIOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``options`` of an ``openai/...`` model table."""

    structured_output: StructuredOutput = "auto"
    """The structured-output mode to start from; ``auto``: ``json_schema``. A server that
    refuses a mode still steps down from it."""
    extra_headers: dict[str, str] = {}
    """Extra HTTP headers, sent as written: never a credential (the config refuses those)."""
    extra_headers_env: dict[str, str] = {}
    """Header name -> the NAME of an environment variable holding its value, read at each
    call: ``{ Authorization = "MY_PROXY_AUTH" }``. The value is never stored or logged."""
    extra_body: dict[str, Any] = {}
    """Server-specific request fields, merged into every request body
    (``{ top_k = 20 }`` for vLLM); not the ones the table sets (model, sampling...)."""
    usd_per_million_prompt_tokens: Price | None = None
    """USD per million prompt tokens; with the completion price, calls are priced
    (unset: unpriced, the report shows no cost)."""
    usd_per_million_completion_tokens: Price | None = None
    """USD per million completion tokens (set both prices, or neither)."""


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0


class _Reply(msgspec.Struct):
    """The part of a chat completion that a :class:`Completion` needs (the rest is skipped)."""

    id: str | None = None
    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder(_Reply).decode
_JSON = {"Content-Type": "application/json"}  # the body is sent as bytes, already encoded


def _key_env(settings: ModelSettings) -> str | None:
    """The variable holding the key: ``api_key_env``, else OPENAI_API_KEY for OpenAI itself."""
    if settings.api_key_env:
        return settings.api_key_env
    return "OPENAI_API_KEY" if _base(settings) == OPENAI_BASE else None


def _base(settings: ModelSettings) -> str:
    return (settings.api_base or OPENAI_BASE).rstrip("/")


def check_openai_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """What an ``openai/`` table gets wrong that its options Struct cannot tell: one price
    without the other, ``extra_body`` fields the table sets."""
    try:
        options = msgspec.convert(settings.options, OpenAIOptions)
    except (msgspec.ValidationError, ValueError):
        return []  # reported from the options Struct already
    problems = []
    prices = (options.usd_per_million_prompt_tokens, options.usd_per_million_completion_tokens)
    if (prices[0] is None) != (prices[1] is None):
        missing = "completion" if prices[1] is None else "prompt"
        problems.append(
            (
                f"options.usd_per_million_{missing}_tokens",
                "set both prices or neither (0 for tokens that cost nothing)",
            )
        )
    for field in sorted(_OWN_FIELDS & set(options.extra_body)):
        problems.append(
            (f"options.extra_body.{field}", "set by mhsafeeval from the model table, not here")
        )
    return problems


def openai_environment(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """OpenAI itself (no ``api_base``, no ``api_key_env``) is called with the key in
    ``OPENAI_API_KEY``: ``check`` warns when it is unset, ``run`` refuses to start."""
    if settings.api_key_env or _key_env(settings) is None:
        return []
    return [("api_key_env", "OPENAI_API_KEY")]


class _Endpoint:
    """One ``AsyncOpenAI`` client shared by every open model on one endpoint.

    Its pool holds as many connections as the models may have calls in flight: for each
    connection key (one limit, see :class:`~mhsafeeval.runtime.providers.Connections`) the
    largest ``max_concurrency``, added up over the keys.
    """

    def __init__(self, key: tuple[Any, ...], base: str, api_key: str, headers: dict[str, str]):
        self.key = key
        self._base = base
        self._api_key = api_key
        self._headers = headers
        self._users: dict[int, tuple[str, int]] = {}
        self._client: openai.AsyncOpenAI | None = None
        self._size = 0
        self._in_flight: dict[int, int] = {}  # id(client) -> requests in flight
        self._retired: dict[int, openai.AsyncOpenAI] = {}  # replaced, closed once idle
        self._loop: object = None  # the event loop the client was made on

    @property
    def width(self) -> int:
        """The connections the open models may use at once."""
        widest: dict[str, int] = {}
        for connection, size in self._users.values():
            widest[connection] = max(size, widest.get(connection, 0))
        return max(1, sum(widest.values()))

    @property
    def pool_size(self) -> int:
        """The connection limit of the current client (0: none made yet)."""
        return self._size

    @property
    def client(self) -> openai.AsyncOpenAI | None:
        """The client calls go to now (``None`` before the first call)."""
        return self._client

    def join(self, user: object, connection: str, size: int) -> None:
        self._users[id(user)] = (connection, size)

    def leave(self, user: object) -> bool:
        """Forget ``user``; True when no model is left."""
        self._users.pop(id(user), None)
        return not self._users

    @contextlib.asynccontextmanager
    async def using(self) -> AsyncIterator[openai.AsyncOpenAI]:
        """The client for one request, counted as in flight while it is used."""
        width = self.width
        client = self._client
        loop = _event_loop()
        if client is not None and loop is not self._loop:
            # Made on another event loop (a model used across two anyio.run): its connections
            # belong to that loop, so it cannot serve this one, nor be closed from here.
            self._in_flight.pop(id(client), None)
            client = self._client = None
        if client is None or self._size < width:
            self._loop = loop
            old, client = client, _new_client(self._base, self._api_key, self._headers, width)
            self._client, self._size = client, width
            if old is not None:
                self._retired[id(old)] = old  # closed once its last request is answered
        self._in_flight[id(client)] = self._in_flight.get(id(client), 0) + 1
        try:
            for idle in [c for i, c in self._retired.items() if not self._in_flight.get(i)]:
                del self._retired[id(idle)]
                await _close(idle)
            yield client
        finally:
            left = self._in_flight[id(client)] = self._in_flight[id(client)] - 1
            if not left:
                del self._in_flight[id(client)]
                if self._retired.pop(id(client), None) is not None:
                    await _close(client)

    async def aclose(self) -> None:
        """Close every client of this endpoint (its models are all closed)."""
        clients = list(self._retired.values())
        if self._client is not None:
            clients.append(self._client)
        self._client, self._size = None, 0
        self._retired.clear()
        for client in clients:
            await _close(client)


def _new_client(base: str, api_key: str, headers: dict[str, str], width: int) -> Any:
    import httpx2
    import openai

    limits = httpx2.Limits(max_connections=width, max_keepalive_connections=width)
    http_client: Any
    if _async_library() == "asyncio" and importlib.util.find_spec("aiohttp") is not None:
        http_client = openai.DefaultAioHttpClient(limits=limits)
    else:
        http_client = openai.DefaultAsyncHttpxClient(limits=limits)
    return openai.AsyncOpenAI(
        base_url=base,
        api_key=api_key,
        max_retries=0,  # ResilientClient retries; the SDK would send 3 requests per attempt
        default_headers=headers or None,
        http_client=http_client,
    )


def _async_library() -> str:
    import sniffio  # the SDK's dependency: here, so that a missing SDK gets the clear error

    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:  # pragma: no cover - called from async code
        return "asyncio"


def _event_loop() -> object:
    if _async_library() == "asyncio":
        return asyncio.get_running_loop()
    import trio

    return trio.lowlevel.current_root_task()


async def _close(client: Any) -> None:
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await client.close()


_endpoints: dict[tuple[Any, ...], _Endpoint] = {}


class OpenAIModel:
    """One model on an OpenAI-compatible endpoint; see the module docstring.

    Args:
        model: the model's name as the server knows it.
        settings: the model table (``api_base``, ``timeout``, ``max_concurrency``, options).
        api_key: the key (or :data:`NO_KEY`), sent as a bearer token.
    """

    sampling = CallParams()  # the table's sampling is applied by open_model's wrapper

    def __init__(self, model: str, settings: ModelSettings, *, api_key: str) -> None:
        options = typed_options(settings, OpenAIOptions)
        self.name = f"openai/{model}"
        self.model = model
        self._settings = settings
        self._api_key = api_key
        self._options = options
        self._extra_body = options.extra_body
        self.mode: Mode = (
            "json_schema" if options.structured_output == "auto" else options.structured_output
        )
        base = _base(settings)
        env = settings.api_key_env or ""
        static = dict(options.extra_headers)
        key = (base, env, api_key, tuple(sorted(static.items())))
        endpoint = _endpoints.get(key)
        if endpoint is None:
            endpoint = _endpoints[key] = _Endpoint(key, base, api_key, static)
        self.endpoint = endpoint
        endpoint.join(self, self.connection_key, settings.max_concurrency)
        self._request_options: openai.RequestOptions = {
            "timeout": settings.timeout,
            "headers": _JSON,
        }
        self._closed = False

    @property
    def supports_json_schema(self) -> bool:
        """Whether the server constrains answers to the schema (mode ``json_schema``)."""
        return self.mode == "json_schema"

    @property
    def connection_key(self) -> str:
        """The model at its server, with the variable holding its key."""
        key = f"{self.model}@{_base(self._settings)}"
        env = self._settings.api_key_env
        return f"{key}#{env}" if env else key

    def should_retry(self, error: Exception) -> bool:
        """What the table in the module docstring sorts as transient."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """USD at the table's ``usd_per_million_*_tokens``; ``None`` when they are unset."""
        prompt = self._options.usd_per_million_prompt_tokens
        answer = self._options.usd_per_million_completion_tokens
        if prompt is None or answer is None:
            return None
        return (completion.prompt_tokens * prompt + completion.completion_tokens * answer) / 1e6

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Make one request (a refused structured-output mode: one more, a mode down).

        Raises:
            TransientProviderError: worth retrying (see the module docstring).
            PermanentProviderError: retrying will not help.
        """
        call = params or CallParams()
        while True:
            body = {**self._extra_body, **chat_fields(self.model, messages, call, self.mode)}
            try:
                reply = await self._send(body)
                break
            except SchemaRejectedError as exc:
                self.mode = step_down(self.name, self.mode, exc)
        return completion_from(self.name, self.model, reply)

    async def _send(self, body: dict[str, Any]) -> _Reply:
        if self._closed:
            raise PermanentProviderError(f"{self.name}: the model is closed")
        import httpx2

        options = self._request_options
        if self._options.extra_headers_env:
            headers = env_headers(self.name, self._options.extra_headers_env)
            options = {"timeout": self._settings.timeout, "headers": {**_JSON, **headers}}
        try:
            async with self.endpoint.using() as client:
                response = await client.post(
                    "/chat/completions",
                    cast_to=httpx2.Response,
                    content=_ENCODE(body),
                    options=options,
                )
            return _DECODE(response.content)
        except Exception as exc:  # cancellation is a BaseException and passes through
            error = classify_openai_error(
                exc, secret=self._api_key, response_format="response_format" in body
            )
            key = self._api_key
            raise error from (None if key and key in str(exc) else exc)

    async def aclose(self) -> None:
        """Leave the shared client; the last model on the endpoint closes it. Idempotent;
        never raises."""
        if self._closed:
            return
        self._closed = True
        if self.endpoint.leave(self):
            if _endpoints.get(self.endpoint.key) is self.endpoint:
                del _endpoints[self.endpoint.key]
            await self.endpoint.aclose()


def classify_openai_error(
    exc: BaseException, *, secret: str | None = None, response_format: bool = False
) -> TransientProviderError | PermanentProviderError:
    """Sort a failure of one request into transient or permanent (module docstring's table).

    ``secret`` (the API key) is scrubbed from the message, which names the innermost cause
    (aiohttp's "Server disconnected", say). ``response_format``: the request sent one, so an
    answer refusing it is a :class:`SchemaRejectedError`.
    """
    import openai

    message = error_text(exc, secret)
    cause = _innermost(exc)
    if cause is not exc and str(cause):
        message = f"{message} ({error_text(cause, secret)})"
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if response_format and names_response_format(f"{exc} {exc.body}", status):
            return SchemaRejectedError(message, status=status)
        retry_after = retry_after_in((exc.response.headers,))
        return by_status(message, status, retry_after=retry_after, response_format=False)
    transient = (
        openai.APIConnectionError,  # APITimeoutError too
        openai.APIResponseValidationError,
        msgspec.DecodeError,  # a 200 whose body is not a chat completion
        TimeoutError,
        ConnectionError,
    )
    if isinstance(exc, transient):
        return TransientProviderError(message)
    if isinstance(exc, (openai.OpenAIError, PermanentProviderError)):
        return PermanentProviderError(message)
    return PermanentProviderError(f"unexpected {message}")


def _innermost(exc: BaseException) -> BaseException:
    seen = exc
    for _ in range(8):  # a bounded walk down __cause__
        if seen.__cause__ is None:
            break
        seen = seen.__cause__
    return seen


def openai_prices(model: str, settings: ModelSettings) -> bool:
    """Whether the table sets its prices (both ``usd_per_million_*_tokens``): no price map is
    consulted for ``openai/`` models."""
    try:
        options = typed_options(settings, OpenAIOptions)
    except SettingsError:
        return False
    return None not in (
        options.usd_per_million_prompt_tokens,
        options.usd_per_million_completion_tokens,
    )


@provider(
    "openai",
    options=OpenAIOptions,
    check=check_openai_settings,
    prices=openai_prices,
    environment=openai_environment,
)
def openai_factory(model: str, settings: ModelSettings) -> OpenAIModel:
    """OpenAI's API or any OpenAI-compatible server, on the official openai SDK."""
    try:  # here, not at the first call, so that its latency does not include the import
        import httpx2  # noqa: F401 - the SDK's HTTP client
        import openai  # noqa: F401
    except ImportError as exc:
        raise ProviderUnavailable(
            "the openai provider needs the openai package: pip install openai"
        ) from exc
    env = _key_env(settings)
    api_key = NO_KEY
    if env is not None:
        found = os.environ.get(env)
        if not found:
            raise ProviderUnavailable(
                f"openai/{model}: the environment variable {env} (api_key_env) is not set or empty"
            )
        register_secret(found)  # scrubbed from every log line from now on
        api_key = found
    return OpenAIModel(model, settings, api_key=api_key)
