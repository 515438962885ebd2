"""``openai/<model>``: OpenAI's API, or any server that speaks it (vLLM, llama.cpp, Ollama).

A lean path for when CPU per call matters (many conversations in flight): one HTTP request per
attempt through the providers' one HTTP stack (:mod:`~mhsafeeval.providers._transport`:
aiohttp on asyncio, httpx2 under trio), the body encoded and the answer decoded by msgspec; no
SDK. ``<model>`` is the model's name as the server knows it (``openai/gpt-4o-mini``,
``openai/Qwen/Qwen2.5-7B``).

* ``api_base``: the server, ``https://api.openai.com/v1`` by default.
* ``api_key_env``: the variable holding the key; by default ``OPENAI_API_KEY`` for OpenAI
  itself. A server of your own (``api_base`` set, no ``api_key_env``) gets a placeholder key,
  ``no-key-needed`` (some servers refuse a request without one).

Every model table on one endpoint (base URL, key variable, key and headers) shares one
:class:`~mhsafeeval.providers._transport.Endpoint` in the process: one connection pool,
sized to the calls the tables may have in flight and widened when a wider table joins, closed
when the last model using it closes. Nothing retries inside it: one
:meth:`OpenAIModel.complete` is one HTTP request, and
:class:`~mhsafeeval.providers.ResilientClient` owns retries, backoff and deadlines.

The request is what OpenAI's SDK sends (``POST {api_base}/chat/completions``,
``Authorization: Bearer``, the table's headers, a JSON body). ``options.transport`` is kept
for old configs: ``auto`` and ``aiohttp`` both mean this one stack; ``sdk`` (the SDK's own
``post``) was removed, and ``check`` says so.

How failures are sorted (error messages use the SDK's exception names):

=========================================================  ===========================
answer                                                     becomes
=========================================================  ===========================
status 408, 409, 425, 429 or >= 500                        transient (with Retry-After)
no whole answer, a timeout, a 2xx body not a completion    transient
any other status >= 300 (400, 401, 403, 404, 422, ...)     permanent
a 4xx/5xx refusing the ``response_format`` it was sent     step down (see below)
=========================================================  ===========================

Structured output uses the three modes of the ``litellm/`` path
(:mod:`~mhsafeeval.providers._openai_compat`): ``auto`` starts at ``json_schema``,
and a server that refuses a mode steps the model down once, for good. No message built here
contains the API key's value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec

from mhsafeeval import __version__ as _version
from mhsafeeval.framework import register_secret

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
from ._transport import Endpoint, transport_failure
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelSettings,
    PermanentProviderError,
    ProviderUnavailable,
    TransientProviderError,
)

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
"""The key sent to a server of your own that needs none (some refuse a request without one)."""
# Request fields set from the model table; options.extra_body may not set them.
_OWN_FIELDS = frozenset(
    {"model", "messages", "stream", "temperature", "max_tokens", "seed", "stop", "response_format"}
)

Price = Annotated[float, msgspec.Meta(ge=0)]


class OpenAIOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``options`` of an ``openai/...`` model table."""

    transport: Literal["auto", "aiohttp", "sdk"] = "auto"
    """Kept so that old configs still read: ``auto`` and ``aiohttp`` are the one HTTP stack;
    ``sdk`` was removed (``check`` refuses it)."""
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


def _key_env(settings: ModelSettings) -> str | None:
    """The variable holding the key: ``api_key_env``, else OPENAI_API_KEY for OpenAI itself."""
    if settings.api_key_env:
        return settings.api_key_env
    return "OPENAI_API_KEY" if _base(settings) == OPENAI_BASE else None


def _base(settings: ModelSettings) -> str:
    return (settings.api_base or OPENAI_BASE).rstrip("/")


def check_openai_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """What an ``openai/`` table gets wrong that its options Struct cannot tell: one price
    without the other, ``extra_body`` fields the table sets, the removed ``sdk`` transport."""
    try:
        options = msgspec.convert(settings.options, OpenAIOptions)
    except (msgspec.ValidationError, ValueError):
        return []  # reported from the options Struct already
    problems = []
    if options.transport == "sdk":
        problems.append(
            (
                "options.transport",
                '"sdk" was removed: every request goes through one HTTP stack (aiohttp, httpx2 '
                "under trio), which honours HTTPS_PROXY and NO_PROXY; delete the option",
            )
        )
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
    """An answer of status 300 or more; :attr:`kind` is the name of the SDK's exception for
    its status (``RateLimitError``), which error messages use, as users know them."""

    def __init__(self, status: int, body: str, headers: Mapping[str, str]) -> None:
        super().__init__(f"Error code: {status} - {body}")
        self.status_code = status
        self.body = body
        self.headers = headers
        self.kind = _SDK_NAMES.get(status) or (
            "InternalServerError" if status >= 500 else "APIStatusError"
        )


_endpoints: dict[tuple[Any, ...], Endpoint] = {}


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
        self._url = f"{base}/chat/completions"
        static = dict(options.extra_headers)
        self._key = (base, settings.api_key_env or "", api_key, tuple(sorted(static.items())))
        endpoint = _endpoints.get(self._key)
        if endpoint is None:
            headers = {
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "Content-Type": "application/json",  # the body is sent as bytes, encoded
                "User-Agent": _USER_AGENT,
                **static,
            }
            endpoint = _endpoints[self._key] = Endpoint(self._url, headers)
        self.endpoint = endpoint
        endpoint.join(self, self.connection_key, settings.max_concurrency)
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
        headers = None
        if self._options.extra_headers_env:
            headers = env_headers(self.name, self._options.extra_headers_env)
        try:
            session = await self.endpoint.take()
            answer = await session.send(
                "POST", self._url, _ENCODE(body), headers=headers, limit_s=self._settings.timeout
            )
            if answer.status >= 300:
                text = answer.body.decode("utf-8", "replace")
                raise HTTPStatusError(answer.status, text, answer.headers)
            return _DECODE(answer.body)
        except Exception as exc:  # cancellation is a BaseException and passes through
            error = classify_openai_error(
                exc, secret=self._api_key, response_format="response_format" in body
            )
            key = self._api_key
            raise error from (None if key and key in str(exc) else exc)

    async def aclose(self) -> None:
        """Leave the shared endpoint; the last model on it closes it. Idempotent; never
        raises."""
        if self._closed:
            return
        self._closed = True
        if self.endpoint.leave(self):
            if _endpoints.get(self._key) is self.endpoint:
                del _endpoints[self._key]
            await self.endpoint.aclose()


def classify_openai_error(
    exc: BaseException, *, secret: str | None = None, response_format: bool = False
) -> TransientProviderError | PermanentProviderError:
    """Sort a failure of one request into transient or permanent (module docstring's table).

    ``secret`` (the API key) is scrubbed from the message. ``response_format``: the request
    sent one, so an answer refusing it is a :class:`SchemaRejectedError`.
    """
    message = error_text(exc, secret)
    if isinstance(exc, HTTPStatusError):
        message = message.replace(type(exc).__name__, exc.kind, 1)
        if response_format and names_response_format(f"{exc} {exc.body}", exc.status_code):
            return SchemaRejectedError(message, status=exc.status_code)
        retry_after = retry_after_in((exc.headers,))
        return by_status(message, exc.status_code, retry_after=retry_after, response_format=False)
    if isinstance(exc, msgspec.DecodeError):  # a 2xx whose body is not a chat completion
        return TransientProviderError(message)
    return transport_failure(exc, message)


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
    """OpenAI's API or any OpenAI-compatible server (see the module docstring)."""
    import aiohttp  # noqa: F401 - here, so that the first call's latency is not the import's

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
