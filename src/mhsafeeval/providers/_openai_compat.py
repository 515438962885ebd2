"""What the ``litellm/`` and ``openai/`` providers share: both speak OpenAI's chat API.

Pure helpers only (no SDK is imported here): the request fields of one call, the three
structured-output modes and the step down between them, the retry policy by HTTP status,
``Retry-After`` parsing, scrubbing the key from error text, and reading an answer.

Structured output has three modes, tried in this order:

* ``json_schema``: ``response_format = {"type": "json_schema", ...}``, the server constrains
  the answer to the schema (OpenAI, vLLM, recent Ollama);
* ``json_object``: ``response_format = {"type": "json_object"}`` with the schema written into
  the system prompt: the server constrains the answer to JSON (llama.cpp's server, which
  answers HTTP 500 to ``json_schema``);
* ``prompt``: no ``response_format``; the prompt describes the answer and decoding is strict.

A server that rejects the mode in use (:class:`SchemaRejectedError`) is never retried: the
model steps down one mode (:func:`step_down`, logged as ``provider.structured_output_mode``),
remembers it for every later call, and sends the same call again at once.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
import structlog

from mhsafeeval.framework import redact, register_secret

from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    PermanentProviderError,
    TransientProviderError,
)

__all__ = [
    "MAX_MESSAGE_CHARS",
    "TRANSIENT_STATUS",
    "Mode",
    "SchemaRejectedError",
    "StructuredOutput",
    "by_status",
    "chat_fields",
    "completion_from",
    "env_headers",
    "error_text",
    "parse_retry_after",
    "retry_after_in",
    "step_down",
    "strict_subset",
    "transient_status",
]

log = structlog.get_logger("mhsafeeval.providers")

Mode = Literal["json_schema", "json_object", "prompt"]
"""A structured-output mode (see the module docstring)."""
StructuredOutput = Literal["auto", "json_schema", "json_object", "prompt"]
"""The ``options.structured_output`` values: a mode, or ``auto`` (the provider chooses)."""
_NEXT_MODE: dict[str, Mode] = {"json_schema": "json_object", "json_object": "prompt"}

# Same policy as the OpenAI SDK's own retry decision.
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
MAX_MESSAGE_CHARS = 1000  # error pages can be whole HTML documents

# Keywords that hosted strict modes reject (OpenAI refuses maxLength, for one) or ignore. The
# caller validates the answer itself, so dropping them loses no safety, only a generation hint.
_UNSUPPORTED_IN_STRICT = frozenset(
    {
        "maxLength",
        "minLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "uniqueItems",
    }
)

# What servers say when they refuse a structured-output request: OpenAI "Invalid schema for
# response_format ...", llama.cpp 'response_format type must be one of "text" or "json_object"'
# or a failed schema-to-grammar conversion, vLLM "... json_schema ...".
_SCHEMA_WORDS = ("response_format", "json_schema", "schema", "grammar")


def strict_subset(schema: Any) -> Any:
    """``schema`` without the keywords hosted strict structured-output modes reject.

    Example:
        >>> strict_subset({"type": "string", "maxLength": 5})
        {'type': 'string'}
    """
    if isinstance(schema, list):
        return [strict_subset(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _UNSUPPORTED_IN_STRICT:
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            # These map names to schemas: a property may well be called "format".
            out[key] = {name: strict_subset(sub) for name, sub in value.items()}
        else:
            out[key] = strict_subset(value)
    return out


_STRICT: dict[int, tuple[Any, Any]] = {}  # id(schema) -> (schema, its strict subset)


def _strict_schema(schema: Any) -> Any:
    """:func:`strict_subset` of ``schema``, computed once per schema object (an agent sends
    the same one with every call). The schema is held with its entry, so its id is not
    reused while the entry lives; the table is emptied when it reaches 256 schemas."""
    hit = _STRICT.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    if len(_STRICT) >= 256:
        _STRICT.clear()
    subset = strict_subset(schema)
    _STRICT[id(schema)] = (schema, subset)
    return subset


def _with_schema(messages: list[dict[str, Any]], schema: Any) -> list[dict[str, Any]]:
    """``messages`` with the JSON schema of the answer stated in the system prompt."""
    rule = (
        "Answer with one JSON object and nothing else. It must follow this JSON schema:\n"
        + msgspec.json.encode(schema).decode()
    )
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0].get('content', '')}\n\n{rule}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": rule}, *messages]


def chat_fields(
    model: str, messages: Sequence[ChatMessage], params: CallParams, mode: Mode
) -> dict[str, Any]:
    """The chat-completion request fields of one call: model, messages, the sampling that
    ``params`` sets, and the ``response_format`` of ``mode`` when it asks for a schema.

    Example:
        >>> fields = chat_fields("m", [ChatMessage("user", "hi")], CallParams(seed=3), "prompt")
        >>> fields["messages"], fields["seed"], "response_format" in fields
        ([{'role': 'user', 'content': 'hi'}], 3, False)
    """
    fields: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
    }
    if params.temperature is not None:
        fields["temperature"] = params.temperature
    if params.max_tokens is not None:
        fields["max_tokens"] = params.max_tokens
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.json_schema is None or mode == "prompt":
        return fields
    if mode == "json_schema":
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": params.schema_name,
                "schema": _strict_schema(params.json_schema),
                "strict": True,
            },
        }
    else:  # json_object: the server keeps the answer JSON, the prompt gives its shape
        fields["response_format"] = {"type": "json_object"}
        fields["messages"] = _with_schema(fields["messages"], params.json_schema)
    return fields


def step_down(name: str, mode: Mode, error: SchemaRejectedError) -> Mode:
    """The mode after ``mode``, which the server of model ``name`` just refused (logged)."""
    if mode == "prompt":  # pragma: no cover - prompt mode sends no response_format
        raise error
    now = _NEXT_MODE[mode]
    log.warning(
        "provider.structured_output_mode", model=name, rejected=mode, now=now, error=str(error)
    )
    return now


class SchemaRejectedError(PermanentProviderError):
    """The server refused the request's ``response_format`` (its structured-output mode)."""


def transient_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt (the OpenAI SDK's own policy).

    Example:
        >>> [transient_status(s) for s in (400, 401, 404, 408, 429, 500, 503)]
        [False, False, False, True, True, True, True]
    """
    return status in TRANSIENT_STATUS or status >= 500


def names_response_format(text: str, status: int | None) -> bool:
    """Whether an error answer (its ``text``) refuses the request's structured output."""
    if status is None or status in TRANSIENT_STATUS or status in (502, 503, 504):
        return False  # rate limits, gateways and outages are not about the request's content
    lowered = text.lower()
    return any(word in lowered for word in _SCHEMA_WORDS)


def _names_response_format(exc: BaseException, status: int | None) -> bool:
    return names_response_format(str(exc), status)


def by_status(
    message: str, status: int, *, retry_after: float | None, response_format: bool
) -> TransientProviderError | PermanentProviderError:
    """The error for an HTTP error answer: :class:`SchemaRejectedError` when the request sent
    a ``response_format`` and the answer refuses it, else transient or permanent by status."""
    if response_format and names_response_format(message, status):
        return SchemaRejectedError(message, status=status)
    if transient_status(status):
        return TransientProviderError(message, status=status, retry_after=retry_after)
    return PermanentProviderError(message, status=status)


def error_text(exc: BaseException, secret: str | None) -> str:
    """``"ExceptionName: message"``, the API key replaced, then every registered secret and
    key-shaped string masked (:func:`~mhsafeeval.framework._redact.redact`), and cut to
    :data:`MAX_MESSAGE_CHARS`.

    Example:
        >>> error_text(ValueError("key sk-123 refused"), "sk-123")
        'ValueError: key [api key] refused'
    """
    message = redact(_scrub(f"{type(exc).__name__}: {exc}", secret))
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return message


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "[api key]") if secret else text


def parse_retry_after(
    headers: Mapping[str, str], *, now: dt.datetime | None = None
) -> float | None:
    """Seconds a provider asked us to wait, from ``retry-after-ms`` or ``Retry-After``.

    ``Retry-After`` may be seconds or an HTTP date (``now`` is injectable for tests).
    Header names must be lower-case. Returns ``None`` when absent or unreadable.

    Example:
        >>> parse_retry_after({"retry-after-ms": "1500"}), parse_retry_after({})
        (1.5, None)
    """
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if not value:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" dates parse naive; HTTP dates are always GMT
        when = when.replace(tzinfo=dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    return max(0.0, (when - now).total_seconds())


def retry_after_in(sources: Iterable[Any]) -> float | None:
    """The first wait found in these header mappings (any case; ``None`` entries skipped)."""
    for source in sources:
        if source is None or not hasattr(source, "items"):
            continue
        headers = {str(k).lower(): str(v) for k, v in source.items()}
        seconds = parse_retry_after(headers)
        if seconds is not None:
            return seconds
    return None


def _number(value: str | None) -> float | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def env_headers(name: str, headers_env: Mapping[str, str]) -> dict[str, str]:
    """The ``options.extra_headers_env`` headers of model ``name``, read from the environment
    now (each value is registered as a secret, so logs never show it).

    Raises:
        PermanentProviderError: a variable is not set or empty.
    """
    headers = {}
    for header, variable in headers_env.items():
        value = os.environ.get(variable)
        if not value:
            raise PermanentProviderError(
                f"{name}: the environment variable {variable} "
                f"(options.extra_headers_env.{header}) is not set or empty"
            )
        register_secret(value)  # scrubbed from every log line from now on
        headers[header] = value
    return headers


def completion_from(name: str, model: str, response: Any) -> Completion:
    """A :class:`Completion` from a chat-completion answer read by attribute (an SDK object
    or a decoded Struct). ``model``: the configured one, used when the answer names none.

    A reply withheld by a content filter (no content, finish reason ``content_filter``) or cut
    by ``length`` before any text is an answer with empty text: a refusal is a result to judge.

    Raises:
        TransientProviderError: no choices, or no content for another reason (a broken reply).
    """
    choices = getattr(response, "choices", None) or []
    if not choices:
        raise TransientProviderError(f"{name}: empty choices")
    choice = choices[0]
    finish = str(getattr(choice, "finish_reason", None) or "unknown")
    content = getattr(getattr(choice, "message", None), "content", None)
    if content is None:
        if finish not in ("content_filter", "length"):
            raise TransientProviderError(f"{name}: reply has no content ({finish=})")
        content = ""
    usage = getattr(response, "usage", None)
    return Completion(
        text=str(content),
        finish_reason=finish,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        model=str(getattr(response, "model", None) or model),
        provider_id=str(getattr(response, "id", None) or ""),
    )
