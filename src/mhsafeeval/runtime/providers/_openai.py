"""``openai/<model>``: OpenAI's API, or any server that speaks it (vLLM, llama.cpp, Ollama).

A lean path for when CPU per call matters (many conversations in flight): about 0.15 ms of CPU
per HTTP exchange at 64 in flight on asyncio (``benchmarks/provider_cpu.py``), a small
fraction of what ``litellm/`` costs. ``<model>`` is the model's name as the server knows it
(``openai/gpt-4o-mini``, ``openai/Qwen/Qwen2.5-7B``).

* ``api_base``: the server, ``https://api.openai.com/v1`` by default.
* ``api_key_env``: the variable holding the key; by default ``OPENAI_API_KEY`` for OpenAI
  itself. A server of your own (``api_base`` set, no ``api_key_env``) gets a placeholder key,
  ``no-key-needed``, because the SDK always sends one.

Every model table on one endpoint (base URL, key variable, headers and transport) shares one
HTTP client in the process (below). Its
connection pool is sized when the first call is made, to the calls the tables opened by then
may have in flight, and grows (a new client, the old one closed once its requests are
answered) when a wider table joins. The client
is closed when the last model using it closes. Nothing retries inside it (the SDK's own
retries are off): one
:meth:`OpenAIModel.complete` is one HTTP request, and
:class:`~mhsafeeval.runtime.providers.ResilientClient` owns retries, backoff and deadlines.

How a request is sent (``options.transport``):

* ``auto`` (the default): on asyncio, through the lean HTTP/1.1 client of
  :mod:`~mhsafeeval.runtime.providers._http11` (keep-alive connections, the answer parsed by
  httptools), the body encoded and the answer decoded by msgspec. Its request is written from
  the calling task before it first waits, and an exchange costs about a third of aiohttp's CPU:
  at 256 conversations in flight this is what lets a campaign keep up with its calls (that
  module says why). Other event loops (trio) use the SDK, as ``sdk`` does.
* ``aiohttp``: on asyncio, straight through aiohttp, the HTTP library the SDK itself uses there
  (its ``DefaultAioHttpClient``): one ``aiohttp.ClientSession`` per endpoint, msgspec as above.
  The SDK's own request machinery (option and header merging, URL building, its httpx2 request
  and response objects over aiohttp) costs about 0.8 ms of CPU per call more, three times what
  the HTTP exchange itself costs; neither of these two paths imports the SDK.
* ``sdk``: every request through the SDK's plain ``post`` (the way its README gives for any
  endpoint), with the body encoded and the answer decoded by msgspec, on aiohttp under asyncio
  and httpx2 otherwise; the one to use behind an HTTP proxy (``HTTPS_PROXY``) or over HTTP/2.
  The typed ``chat.completions.create`` path (and its ``with_raw_response``) is not used: it
  transforms and validates the request parameters, which doubles the CPU of a call again.

All three send the same request (method, path, body, ``Authorization: Bearer``, the table's
headers) and sort the same answers the same way.

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

On the ``auto`` and ``aiohttp`` paths the same statuses sort the same way, and connection
errors and timeouts are transient, as the SDK's are.

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
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
import msgspec

from ... import __version__ as _version
from .._redact import register_secret
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

    transport: Literal["auto", "aiohttp", "sdk"] = "auto"
    """How requests are sent: ``auto``, a lean HTTP/1.1 client on asyncio (the SDK elsewhere);
    ``aiohttp``, aiohttp directly on asyncio; ``sdk``, always through the SDK's ``post`` (see
    the module docstring)."""
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


_USER_AGENT = f"mhsafeeval/{_version} (openai-compatible)"
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

    def __init__(
        self,
        key: tuple[Any, ...],
        base: str,
        api_key: str,
        headers: dict[str, str],
        transport: str = "auto",
    ):
        self.key = key
        self.transport = transport
        self._base = base
        self._api_key = api_key
        self._headers = headers
        self._users: dict[int, tuple[str, int]] = {}
        self._width: int | None = None
        self._client: _Client | None = None
        self._size = 0
        self._in_flight: dict[int, int] = {}  # id(client) -> requests in flight
        self._retired: dict[int, _Client] = {}  # replaced, closed once idle
        self._loop: object = None  # the event loop the client was made on

    @property
    def width(self) -> int:
        """The connections the open models may use at once (worked out when a model joins or
        leaves, not per request)."""
        if self._width is None:
            widest: dict[str, int] = {}
            for connection, size in self._users.values():
                widest[connection] = max(size, widest.get(connection, 0))
            self._width = max(1, sum(widest.values()))
        return self._width

    @property
    def pool_size(self) -> int:
        """The connection limit of the current client (0: none made yet)."""
        return self._size

    @property
    def client(self) -> _Client | None:
        """The client calls go to now (``None`` before the first call)."""
        return self._client

    def join(self, user: object, connection: str, size: int) -> None:
        self._users[id(user)] = (connection, size)
        self._width = None

    def leave(self, user: object) -> bool:
        """Forget ``user``; True when no model is left."""
        self._users.pop(id(user), None)
        self._width = None
        return not self._users

    async def take(self) -> _Client:
        """The client for one request, counted as in flight until :meth:`done` (a plain pair,
        not a context manager: this runs once per call)."""
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
            old = client
            client = _new_client(self._base, self._api_key, self._headers, width, self.transport)
            self._client, self._size = client, width
            if old is not None:
                self._retired[id(old)] = old  # closed once its last request is answered
        self._in_flight[id(client)] = self._in_flight.get(id(client), 0) + 1
        if self._retired:
            try:
                for idle in [c for i, c in self._retired.items() if not self._in_flight.get(i)]:
                    del self._retired[id(idle)]
                    await _close(idle)
            except BaseException:
                await self.done(client)
                raise
        return client

    async def done(self, client: _Client) -> None:
        """The request :meth:`take` was for is over."""
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


def _new_client(
    base: str, api_key: str, headers: dict[str, str], width: int, transport: str = "auto"
) -> _Client:
    has_aiohttp = importlib.util.find_spec("aiohttp") is not None
    on_asyncio = _async_library() == "asyncio"
    if transport == "auto" and on_asyncio:
        return _LeanClient(base, api_key, headers, width)
    if transport == "aiohttp" and on_asyncio and has_aiohttp:
        return _AiohttpClient(base, api_key, headers, width)
    import httpx2
    import openai

    limits = httpx2.Limits(max_connections=width, max_keepalive_connections=width)
    http_client: Any
    if on_asyncio and has_aiohttp:
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


_SDK_NAMES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}


class HTTPStatusError(Exception):
    """An HTTP error answer on the ``auto`` or ``aiohttp`` path (the SDK's ``APIStatusError``);
    :attr:`kind` is the name of the SDK's exception for its status, which error messages use.
    """

    def __init__(self, status: int, body: str, headers: Mapping[str, str]) -> None:
        super().__init__(f"Error code: {status} - {body}")
        self.status_code = status
        self.body = body
        self.headers = headers
        self.kind = _SDK_NAMES.get(status) or (
            "InternalServerError" if status >= 500 else "APIStatusError"
        )


class _AiohttpClient:
    """The HTTP exchange of one chat request, on one ``aiohttp.ClientSession`` per endpoint:
    what the SDK's ``post`` sends (``Authorization: Bearer``, the table's headers, a JSON body),
    without its request machinery (see the module docstring). Made on the event loop it serves.
    """

    def __init__(self, base: str, api_key: str, headers: dict[str, str], width: int) -> None:
        import aiohttp

        self._url = f"{base}/chat/completions"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=width, limit_per_host=width),
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": _USER_AGENT,
                **headers,
            },
        )
        self._timeouts: dict[float | None, Any] = {}

    async def chat(self, body: bytes, *, limit_s: float | None, headers: dict[str, str]) -> bytes:
        """POST ``body`` to ``/chat/completions``; the answer's bytes.

        Raises:
            HTTPStatusError: an answer of status 400 or more.
            aiohttp.ClientError, TimeoutError: no answer.
        """
        limit = self._timeouts.get(limit_s)
        if limit is None:
            import aiohttp

            limit = self._timeouts[limit_s] = aiohttp.ClientTimeout(total=limit_s)
        async with self._session.post(
            self._url, data=body, headers=headers, timeout=limit
        ) as response:
            content = await response.read()
            if response.status >= 400:
                text = content.decode("utf-8", "replace")
                raise HTTPStatusError(response.status, text, dict(response.headers))
            return content

    async def close(self) -> None:
        await self._session.close()

    def is_closed(self) -> bool:
        return bool(self._session.closed)


class _LeanClient:
    """The HTTP exchange of one chat request on the lean HTTP/1.1 client, one per endpoint."""

    def __init__(self, base: str, api_key: str, headers: dict[str, str], width: int) -> None:
        from ._http11 import Http11Client

        self._client = Http11Client(
            base,
            {
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": _USER_AGENT,
                **headers,
            },
            limit=width,
        )

    async def chat(self, body: bytes, *, limit_s: float | None, headers: dict[str, str]) -> bytes:
        """POST ``body`` to ``/chat/completions``; the answer's bytes.

        Raises:
            HTTPStatusError: an answer of status 400 or more.
            ConnectionError, TimeoutError: no answer.
        """
        answer = await self._client.post(
            "/chat/completions", body, headers=headers, limit_s=limit_s
        )
        if answer.status >= 400:
            text = answer.body.decode("utf-8", "replace")
            raise HTTPStatusError(answer.status, text, answer.headers)
        return answer.body

    async def close(self) -> None:
        await self._client.close()

    def is_closed(self) -> bool:
        return self._client.is_closed()


_DIRECT = (_LeanClient, _AiohttpClient)
"""The clients that take the encoded body themselves (no SDK)."""

if TYPE_CHECKING:
    _Client = openai.AsyncOpenAI | _LeanClient | _AiohttpClient


def _async_library() -> str:
    import sniffio  # the SDK's dependency: here, so that a missing SDK gets the clear error

    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:  # pragma: no cover - called from async code
        return "asyncio"


def _event_loop() -> object:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio: trio (sniffio would say so, at more cost per call)
        pass
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
        transport = options.transport
        key = (base, env, api_key, tuple(sorted(static.items())), transport)
        endpoint = _endpoints.get(key)
        if endpoint is None:
            endpoint = _endpoints[key] = _Endpoint(key, base, api_key, static, transport)
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
        headers = _JSON
        if self._options.extra_headers_env:
            headers = {**_JSON, **env_headers(self.name, self._options.extra_headers_env)}
        try:
            endpoint = self.endpoint
            client = await endpoint.take()
            try:
                if isinstance(client, _DIRECT):
                    content = await client.chat(
                        _ENCODE(body), limit_s=self._settings.timeout, headers=headers
                    )
                else:
                    content = await self._sdk_post(client, body, headers)
            finally:
                await endpoint.done(client)
            return _DECODE(content)
        except Exception as exc:  # cancellation is a BaseException and passes through
            error = classify_openai_error(
                exc,
                secret=self._api_key,
                response_format="response_format" in body,
                timeout=self._settings.timeout,
            )
            key = self._api_key
            raise error from (None if key and key in str(exc) else exc)

    async def _sdk_post(
        self, client: openai.AsyncOpenAI, body: dict[str, Any], headers: dict[str, str]
    ) -> bytes:
        import httpx2

        options = self._request_options
        if headers is not _JSON:
            options = {"timeout": self._settings.timeout, "headers": headers}
        response = await client.post(
            "/chat/completions", cast_to=httpx2.Response, content=_ENCODE(body), options=options
        )
        return bytes(response.content)

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
    exc: BaseException,
    *,
    secret: str | None = None,
    response_format: bool = False,
    timeout: float | None = None,
) -> TransientProviderError | PermanentProviderError:
    """Sort a failure of one request into transient or permanent (module docstring's table).

    ``secret`` (the API key) is scrubbed from the message, which names the innermost cause
    ("Server disconnected", say). ``response_format``: the request sent one, so an
    answer refusing it is a :class:`SchemaRejectedError`. ``timeout``: the request's, named
    when the ``auto`` or ``aiohttp`` path timed out.
    """
    # The SDK's exceptions exist only once it was imported: the auto and aiohttp paths never
    # import it.
    sdk: Any = sys.modules.get("openai")
    message = error_text(exc, secret)
    if isinstance(exc, HTTPStatusError):
        message = message.replace(type(exc).__name__, exc.kind, 1)
    cause = _innermost(exc)
    if cause is not exc and str(cause):
        message = f"{message} ({error_text(cause, secret)})"
    statuses: tuple[type[BaseException], ...] = (HTTPStatusError,)
    if sdk is not None:
        statuses += (sdk.APIStatusError,)
    if isinstance(exc, statuses):
        status = exc.status_code  # type: ignore[attr-defined]
        text = f"{exc} {exc.body}"  # type: ignore[attr-defined]
        if response_format and names_response_format(text, status):
            return SchemaRejectedError(message, status=status)
        if isinstance(exc, HTTPStatusError):
            headers: Any = exc.headers
        else:
            headers = exc.response.headers  # type: ignore[attr-defined]
        retry_after = retry_after_in((headers,))
        return by_status(message, status, retry_after=retry_after, response_format=False)
    if isinstance(exc, TimeoutError) and not (sdk is not None and isinstance(exc, sdk.OpenAIError)):
        # these timeouts (asyncio.TimeoutError, aiohttp's ServerTimeoutError) say little
        limit = f" after {timeout:g} s" if timeout is not None else ""
        return TransientProviderError(f"request timed out{limit}: {message}")
    transient: tuple[type[BaseException], ...] = (
        msgspec.DecodeError,  # a 200 whose body is not a chat completion
        ConnectionError,
        *_aiohttp_errors(),
    )
    permanent: tuple[type[BaseException], ...] = (PermanentProviderError,)
    if sdk is not None:
        transient += (sdk.APIConnectionError, sdk.APIResponseValidationError)  # timeouts too
        permanent += (sdk.OpenAIError,)
    if isinstance(exc, transient):
        return TransientProviderError(message)
    if isinstance(exc, permanent):
        return PermanentProviderError(message)
    return PermanentProviderError(f"unexpected {message}")


def _aiohttp_errors() -> tuple[type[BaseException], ...]:
    """aiohttp's errors of a request that got no answer (connection, payload, redirects...);
    none when aiohttp was never imported (then none of its errors can have been raised)."""
    aiohttp: Any = sys.modules.get("aiohttp")
    return () if aiohttp is None else (aiohttp.ClientError,)


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
    transport = typed_options(settings, OpenAIOptions).transport
    try:  # here, not at the first call, so that its latency does not include the import
        if transport == "sdk":
            import httpx2  # noqa: F401 - the SDK's HTTP client
            import openai  # noqa: F401
        elif importlib.util.find_spec("openai") is None:
            raise ImportError("openai")
        elif transport == "aiohttp":
            import aiohttp  # noqa: F401
        else:  # the lean path on asyncio; the SDK is imported if it is used (trio)
            import httptools  # noqa: F401
    except ImportError as exc:
        missing = exc.name or "openai"
        raise ProviderUnavailable(
            f"the openai provider needs the {missing} package: "
            "pip install 'openai[aiohttp]' httptools"
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
