"""``litellm/<model>``: any model litellm reaches (hosted APIs, vLLM, Ollama).

One :meth:`LiteLLMModel.complete` is one raw HTTP attempt: litellm's retries and the OpenAI
SDK's are switched off, because :class:`~mhsafeeval.providers.ResilientClient` owns
retries, backoff and deadlines. litellm is imported when the first such model is opened,
never by ``import mhsafeeval`` (it costs seconds and ~200 MB).

How litellm failures are sorted (see :func:`classify_error`):

=====================================================================  =========
litellm / openai exception                                             becomes
=====================================================================  =========
RateLimitError (429)                                                   transient
InternalServerError, ServiceUnavailableError, BadGatewayError (5xx)    transient
APIConnectionError, Timeout (408/504), APIResponseValidationError      transient
TimeoutError, ConnectionError raised below litellm                     transient
APIError / APIStatusError with 408, 409, 425, 429 or >= 500            transient
AuthenticationError, PermissionDeniedError, NotFoundError              permanent
BadRequestError and its kinds (ContextWindowExceeded,
ContentPolicyViolation, UnsupportedParams), UnprocessableEntityError   permanent
BudgetExceededError, any other APIError status, anything else          permanent
"Missing credentials": the OpenAI SDK refused to send (no API key);
litellm says InternalServerError (500), but no retry adds a key        permanent
A 4xx/5xx naming ``response_format``, ``json_schema``, ``schema`` or
``grammar``, to a request that sent ``response_format`` (llama.cpp's
server answers 500 to a json_schema it cannot use)                     see below
=====================================================================  =========

Structured output (``options.structured_output``) has three modes, tried in this order:

* ``json_schema``: ``response_format = {"type": "json_schema", ...}``, the server constrains
  the answer to the schema (OpenAI, vLLM, recent Ollama);
* ``json_object``: ``response_format = {"type": "json_object"}`` with the schema written into
  the system prompt: the server constrains the answer to JSON (llama.cpp's server, which
  answers HTTP 500 to ``json_schema``);
* ``prompt``: no ``response_format``; the prompt describes the answer and decoding is strict.

``auto`` (the default) starts at ``json_schema`` unless litellm's model map knows the model
and says it has no schema support (then ``prompt``). A server that rejects the mode in use is
never retried: the model steps down one mode (logged as ``provider.structured_output_mode``),
remembers it for every later call, and sends the same call again at once. The caller
validates the answer's text in every mode
(:func:`~mhsafeeval.providers.complete_structured`).

Transient errors carry the provider's wait (``retry-after-ms``, or ``Retry-After`` in seconds
or as an HTTP date). No message built here contains the API key's value.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import structlog

from mhsafeeval.framework import register_secret

from ._openai_compat import _NEXT_MODE as _NEXT_MODE
from ._openai_compat import _SCHEMA_WORDS as _SCHEMA_WORDS
from ._openai_compat import _UNSUPPORTED_IN_STRICT as _UNSUPPORTED_IN_STRICT
from ._openai_compat import MAX_MESSAGE_CHARS as MAX_MESSAGE_CHARS
from ._openai_compat import TRANSIENT_STATUS as TRANSIENT_STATUS
from ._openai_compat import (
    Mode,
    SchemaRejectedError,
    StructuredOutput,
    _names_response_format,
    chat_fields,
    completion_from,
    env_headers,
    error_text,
    parse_retry_after,
    retry_after_in,
    step_down,
    strict_subset,
    transient_status,
)
from ._openai_compat import _number as _number
from ._openai_compat import _scrub as _scrub
from ._openai_compat import _with_schema as _with_schema
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

# The `NAME as NAME` imports above keep names that moved to _openai_compat importable here.

__all__ = [
    "LiteLLMModel",
    "LiteLLMOptions",
    "SchemaRejectedError",
    "classify_error",
    "litellm_factory",
    "litellm_prices",
    "parse_retry_after",
    "strict_subset",
    "token_price",
]

# Options the adapter reads itself; the rest of ``settings.options`` goes to litellm.acompletion.
OWN_OPTIONS = frozenset({"supports_json_schema", "structured_output", "extra_headers_env"})
# Besides the named parameters of litellm.acompletion (its documented signature), the
# keyword arguments of litellm's own that an options table may pass. Anything else is refused
# (a typo such as "temprature" would otherwise be sent, or silently dropped, on every call);
# a provider-specific parameter goes into options.extra_body.
LITELLM_EXTRA_OPTIONS = frozenset(
    {"extra_body", "mock_response", "metadata", "drop_params", "additional_drop_params"}
)
# Set by the adapter from ModelSettings; an option may not override them (an options.num_retries
# would bring back hidden retries under ours, an options.stream would break response parsing).
RESERVED_OPTIONS = frozenset(
    {
        "model",
        "messages",
        "api_base",
        "base_url",
        "api_key",
        "timeout",
        "num_retries",
        "max_retries",
        "stream",
        "fallbacks",
    }
)
log = structlog.get_logger("mhsafeeval.providers")

LOGGING_FLUSH_S = 5.0  # how long aclose lets litellm's queued logging callbacks run


class LiteLLMOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The ``options`` of a ``litellm/...`` model that mhsafeeval reads itself; every other key
    must be a parameter of ``litellm.acompletion`` (or one of :data:`LITELLM_EXTRA_OPTIONS`)
    and is passed to it as it is."""

    structured_output: StructuredOutput = "auto"
    """The structured-output mode to start from (see the module docstring); a rejection
    still steps down from it."""
    supports_json_schema: bool | None = None
    """The older switch: True starts at ``json_schema``, False at ``prompt`` (used only when
    ``structured_output`` is ``auto``)."""
    extra_headers: dict[str, str] = {}
    """Extra HTTP headers, sent as written: never a credential (``check`` refuses those)."""
    extra_headers_env: dict[str, str] = {}
    """Header name -> the NAME of an environment variable holding its value, read at each
    call: ``{ Authorization = "MY_PROXY_AUTH" }``. The value is never stored or logged."""
    # litellm's own keyword arguments (LITELLM_EXTRA_OPTIONS), typed here because
    # litellm.acompletion's signature does not name them: passed on as written.
    extra_body: dict[str, Any] | None = None
    """Provider-specific request fields, merged into the request body."""
    metadata: dict[str, Any] | None = None
    """Passed to litellm's logging callbacks."""
    drop_params: bool | None = None
    """Let litellm drop parameters the provider does not take."""
    additional_drop_params: list[str] | None = None
    """Parameters litellm should drop from every request."""
    mock_response: str | None = None
    """litellm answers this text without calling anything (or raises it:
    ``"litellm.RateLimitError"``); for tests and dry runs."""


def check_litellm_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """Options litellm would not take, and a model whose provider litellm cannot tell
    (``opnai/gpt-4o-mini``), found offline with litellm's own provider lookup."""
    ll = import_litellm(f"litellm/{model}")
    problems = _option_problems(settings, ll)
    try:
        resolved, _, _, _ = ll.get_llm_provider(model=model, api_base=settings.api_base)
    except Exception:  # litellm raises BadRequestError ("LLM Provider NOT provided")
        problems.append(
            (
                "provider",
                f"litellm knows no provider for {model!r}: begin the model with one of "
                "litellm's providers (openai/, anthropic/, hosted_vllm/, ollama/, ...; "
                "https://docs.litellm.ai/docs/providers)",
            )
        )
    else:
        if not str(resolved).strip():
            problems.append(("provider", f"no model after 'litellm/{model}'"))
    return problems


def _option_problems(settings: ModelSettings, ll: Any) -> list[tuple[str, str]]:
    problems = []
    accepted = _accepted_options(ll)
    typed = _option_types(ll)
    for key, value in settings.options.items():
        if key in RESERVED_OPTIONS:
            reason = "set by mhsafeeval from the model settings, not an option"
        elif key in OWN_OPTIONS:
            continue
        elif key in accepted:
            wrong = _wrong_type(value, typed.get(key))
            if wrong is None:
                continue
            reason = f"not a value litellm.acompletion takes for {key}: {wrong}"
        else:
            reason = (
                "not an option litellm.acompletion accepts (provider-specific parameters go "
                "into options.extra_body)"
            )
        problems.append((f"options.{key}", reason))
    return problems


@functools.cache
def _accepted_options(ll: Any) -> frozenset[str]:
    named = {
        name
        for name, p in inspect.signature(ll.acompletion).parameters.items()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    return frozenset(named | LITELLM_EXTRA_OPTIONS) - RESERVED_OPTIONS


@functools.cache
def _option_types(ll: Any) -> dict[str, Any]:
    """The annotated type of each parameter of ``litellm.acompletion`` (where it has one)."""
    return {
        name: p.annotation
        for name, p in inspect.signature(ll.acompletion).parameters.items()
        if p.annotation is not inspect.Parameter.empty and p.annotation is not object
    }


def _wrong_type(value: Any, annotation: Any) -> str | None:
    """Why ``value`` does not fit ``annotation`` (msgspec's words), or None: it fits, or the
    type is one msgspec cannot check (litellm's own classes), and litellm will judge it."""
    if annotation is None:
        return None
    try:
        msgspec.convert(value, annotation)
    except msgspec.ValidationError as exc:
        return str(exc)
    except Exception:  # a type msgspec does not support: not checked here
        return None
    return None


def token_price(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD of these tokens of ``model`` (a litellm model string; a ``litellm/`` prefix is
    dropped) from litellm's bundled price map (no network), or ``None`` if it has no price or
    litellm (an optional dependency) is not installed.

    Example:
        >>> token_price("no-such-model-anywhere", 10, 10) is None
        True
    """
    if not (prompt_tokens or completion_tokens):
        return 0.0
    try:
        ll = import_litellm(model)
    except ProviderUnavailable:  # no price map without litellm: the price is unknown
        return None
    try:
        prompt, completion = ll.cost_per_token(
            model=model.removeprefix("litellm/"),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
    except Exception:  # litellm raises plain Exceptions for unknown models
        return None
    return float(prompt) + float(completion)


def import_litellm(address: str = "litellm/ models") -> Any:
    """Import litellm the way this adapter needs it (offline, quiet).

    Raises:
        ProviderUnavailable: litellm is not installed (it is an optional dependency): one line
            naming ``address`` and the command that installs it.
    """
    # Without this, importing litellm fetches the model cost map over the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:
        if exc.name != "litellm":  # installed, but something it imports is not
            raise ProviderUnavailable(f"{address}: litellm does not import: {exc}") from exc
        raise ProviderUnavailable(
            f"{address} needs litellm, an optional dependency that is not installed: "
            "pip install 'mhsafeeval[litellm]'"
        ) from None
    # Otherwise litellm prints a "Give Feedback / Get Help" banner to stdout on every error.
    litellm.suppress_debug_info = True
    return litellm


class LiteLLMModel:
    """One model behind litellm; see the module docstring for what each call does.

    Args:
        model: the litellm model string, e.g. ``openai/gpt-4o-mini`` or ``hosted_vllm/my-model``.
        settings: the model's settings (``api_base``, ``timeout``, ``options``...).
        api_key: the key read from ``settings.api_key_env``; ``None`` lets litellm find its own
            (e.g. ``OPENAI_API_KEY``).
        litellm: the imported litellm module.
    """

    # litellm caches HTTP clients process-wide (per event loop), not per model, so they are
    # closed when the last open model closes, not under another model still in use.
    _open_models = 0

    def __init__(
        self, model: str, settings: ModelSettings, *, api_key: str | None, litellm: Any
    ) -> None:
        self.name = f"litellm/{model}"
        self.model = model
        self._settings = settings
        self._api_key = api_key
        self._litellm = litellm
        self._extra = {k: v for k, v in settings.options.items() if k not in OWN_OPTIONS}
        options = typed_options(settings, LiteLLMOptions)
        self._headers_env = options.extra_headers_env
        self.mode: Mode = self._first_mode(options)
        self._closed = False
        LiteLLMModel._open_models += 1

    def _first_mode(self, options: LiteLLMOptions) -> Mode:
        if options.structured_output != "auto":
            return options.structured_output
        if isinstance(options.supports_json_schema, bool):  # the older switch
            return "json_schema" if options.supports_json_schema else "prompt"
        try:
            self._litellm.get_model_info(model=self.model)
        except Exception:  # unknown to litellm's map (a self-hosted server): try, step down
            return "json_schema"
        try:
            known = bool(self._litellm.supports_response_schema(model=self.model))
        except Exception:
            known = False
        return "json_schema" if known else "prompt"

    @property
    def supports_json_schema(self) -> bool:
        """Whether the server constrains answers to the schema (mode ``json_schema``)."""
        return self.mode == "json_schema"

    sampling = CallParams()  # the table's sampling is applied by open_model's wrapper

    @property
    def connection_key(self) -> str:
        """The model at its server (``api_base``, else the hosted provider's own), with the
        variable holding its key: tables that differ only in sampling, timeouts or retries
        share one limit; two accounts do not."""
        base = (self._settings.api_base or "").rstrip("/")
        key = f"{self.model}@{base}" if base else self.model
        env = self._settings.api_key_env
        return f"{key}#{env}" if env else key

    def should_retry(self, error: Exception) -> bool:
        """What :func:`classify_error` sorted as transient (timeouts included)."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """litellm's price map for the model that answered, else for the configured one (a
        provider may answer with a dated variant the map lacks)."""
        cost = token_price(completion.model, completion.prompt_tokens, completion.completion_tokens)
        if cost is None and completion.model != self.model:
            cost = token_price(self.model, completion.prompt_tokens, completion.completion_tokens)
        return cost

    def request(self, messages: Sequence[ChatMessage], params: CallParams) -> dict[str, Any]:
        """The keyword arguments of ``litellm.acompletion`` for one call (API key included)."""
        s = self._settings
        kwargs: dict[str, Any] = {
            **self._extra,
            **chat_fields(self.model, messages, params, self.mode),
            "timeout": s.timeout,
            # One attempt: num_retries=0 turns off litellm's wrapper retries and makes the
            # OpenAI SDK client use max_retries=0 (otherwise it sends 3 requests per call).
            "num_retries": 0,
            "max_retries": 0,
        }
        if s.api_base is not None:
            kwargs["api_base"] = s.api_base
        if self._api_key is not None:
            kwargs["api_key"] = self._api_key
        if self._headers_env:
            headers = env_headers(self.name, self._headers_env)
            kwargs["extra_headers"] = {**self._extra.get("extra_headers", {}), **headers}
        return kwargs

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Make one request.

        A reply withheld by the provider's content filter (no content, finish reason
        ``content_filter``) is returned as an answer with empty text: a refusal is a result
        to judge, not a failure to retry.

        Raises:
            TransientProviderError: worth retrying (see the module docstring).
            PermanentProviderError: retrying will not help.
        """
        call = params or CallParams()
        while True:
            try:
                response = await self._send(self.request(messages, call))
                break
            except SchemaRejectedError as exc:
                # Never retried as transient: this server will not take this mode. Step down
                # for good (this call and every later one) and send the call again at once.
                self.mode = step_down(self.name, self.mode, exc)
        return completion_from(self.name, self.model, response)

    async def _send(self, kwargs: dict[str, Any]) -> Any:
        try:
            return await self._litellm.acompletion(**kwargs)
        except Exception as exc:  # cancellation is a BaseException and passes through
            error = classify_error(
                exc,
                self._litellm,
                secret=self._api_key,
                response_format="response_format" in kwargs,
            )
            # Keep litellm's exception as the cause unless its text would leak the key.
            key = self._api_key
            raise error from (None if key and key in str(exc) else exc)

    async def aclose(self) -> None:
        """Close litellm's cached HTTP clients once no litellm model is left open. Idempotent.

        Never raises: shutdown must not hide the error that caused it.
        """
        if self._closed:
            return
        self._closed = True
        LiteLLMModel._open_models -= 1
        if LiteLLMModel._open_models > 0:
            return
        await _shut_down_litellm(self._litellm)


async def _shut_down_litellm(ll: Any) -> None:
    """Close what litellm opened on this event loop: HTTP clients and its logging worker."""
    with contextlib.suppress(Exception):  # best effort: this provider is shutting down
        await ll.close_litellm_async_clients()
    # close_litellm_async_clients leaves the closed clients cached: without this, the next
    # call on this event loop fails with "Cannot send a request, as the client has been closed".
    cache = getattr(ll, "in_memory_llm_clients_cache", None)
    if cache is not None:
        with contextlib.suppress(Exception):
            cache.flush_cache()
    # litellm runs its success/failure callbacks in a background task it starts on our loop;
    # let it finish what is queued (bounded), then stop it, so nothing of ours outlives aclose.
    try:
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER as worker
    except ImportError:
        return
    with contextlib.suppress(Exception):
        with anyio.move_on_after(LOGGING_FLUSH_S):
            await worker.flush()
        await worker.stop()


def classify_error(
    exc: BaseException, litellm: Any, *, secret: str | None = None, response_format: bool = False
) -> TransientProviderError | PermanentProviderError:
    """Sort a litellm failure into transient or permanent (table in the module docstring).

    ``secret`` (the API key) is scrubbed from the message. ``response_format``: the request
    sent one, so a rejection naming it is a :class:`SchemaRejectedError`.
    """
    status = _status(exc)
    message = error_text(exc, secret)
    permanent = tuple(
        getattr(litellm, n)
        for n in (
            "AuthenticationError",
            "PermissionDeniedError",
            "NotFoundError",
            "BadRequestError",
            "UnprocessableEntityError",
            "BudgetExceededError",
        )
        if hasattr(litellm, n)
    )  # ContextWindowExceeded, ContentPolicyViolation, UnsupportedParams subclass BadRequestError
    transient = tuple(
        getattr(litellm, n)
        for n in (
            "RateLimitError",
            "InternalServerError",
            "ServiceUnavailableError",
            "BadGatewayError",
            "APIConnectionError",
            "Timeout",
            "APIResponseValidationError",
        )
        if hasattr(litellm, n)
    )
    transient += (TimeoutError, ConnectionError)
    if response_format and _names_response_format(exc, status):
        return SchemaRejectedError(message, status=status)
    if isinstance(exc, permanent) or _refused_to_send(exc):
        return PermanentProviderError(message, status=status)
    if isinstance(exc, transient) or (status is not None and transient_status(status)):
        return TransientProviderError(message, status=status, retry_after=_retry_after(exc))
    if status is not None:
        return PermanentProviderError(message, status=status)
    return PermanentProviderError(f"unexpected {message}", status=None)


def _refused_to_send(exc: BaseException) -> bool:
    """The OpenAI SDK refused before any request (e.g. no API key: "Missing credentials").

    litellm wraps that as a 500; the SDK's own exception, a bare ``OpenAIError`` (not an
    ``APIError``, which every answer or connection failure is), stays in the chain.
    """
    try:
        import openai
    except ImportError:  # litellm depends on it; without it, read litellm's text
        return "missing credentials" in str(exc).lower()
    seen: BaseException | None = exc
    for _ in range(8):  # a bounded walk down __cause__/__context__
        if seen is None:
            break
        if isinstance(seen, openai.OpenAIError) and not isinstance(seen, openai.APIError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "missing credentials" in str(exc).lower()


def _status(exc: BaseException) -> int | None:
    # litellm's InternalServerError always says 500; the upstream status, when known, is here.
    for attr in ("provider_status_code", "status_code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _retry_after(exc: BaseException) -> float | None:
    # litellm copies the upstream headers to litellm_response_headers; RateLimitError keeps
    # them on .response; .headers holds proxy-supplied ones.
    return retry_after_in(
        (
            getattr(exc, "litellm_response_headers", None),
            getattr(getattr(exc, "response", None), "headers", None),
            getattr(exc, "headers", None),
        )
    )


def litellm_prices(model: str, settings: ModelSettings) -> bool:
    """Whether litellm's price map has the model."""
    return token_price(model, 1000, 1000) is not None


@provider("litellm", options=LiteLLMOptions, check=check_litellm_settings, prices=litellm_prices)
def litellm_factory(model: str, settings: ModelSettings) -> LiteLLMModel:
    """Any model litellm reaches (hosted APIs, vLLM, Ollama)."""
    api_key: str | None = None
    if settings.api_key_env:
        api_key = os.environ.get(settings.api_key_env) or None
        register_secret(api_key)  # scrubbed from every log line from now on
        if api_key is None:
            raise ProviderUnavailable(
                f"litellm/{model}: the environment variable {settings.api_key_env} "
                "(api_key_env) is not set or empty"
            )
    ll = import_litellm(f"litellm/{model}")
    for field, reason in _option_problems(settings, ll):
        raise SettingsError(f"litellm/{model}", field, reason)
    return LiteLLMModel(model, settings, api_key=api_key, litellm=ll)
