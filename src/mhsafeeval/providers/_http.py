"""``http/<name>``: a counselor that is an application reached over HTTP.

``<name>`` is only a label (it names the model in results); the table's ``options`` say where
the app is and how to talk to it (:class:`HttpOptions`): the URL and method, the headers (a
credential only through ``extra_headers_env``, which names environment variables), a JSON body
template filled in with the conversation, and a JMESPath expression that finds the reply text
in the JSON answer. Every call is one HTTP request, sent through the providers' one HTTP stack
(:mod:`~mhsafeeval.providers._transport`: aiohttp on asyncio, httpx2 under trio; no
redirects followed, no cookies kept); :class:`~mhsafeeval.providers.ResilientClient`
owns retries, deadlines and the concurrency limit, as for any model.

The body template is any JSON value; a string that is exactly one of these placeholders is
replaced by its value (``$$`` starts a literal string beginning with ``$``):

============  ================================================================================
placeholder   value
============  ================================================================================
$messages     the chat in OpenAI's shape: ``[{"role": ..., "content": ...}, ...]``
$message      the client's latest message (a string)
$history      the chat before it, without the system message (OpenAI's shape)
$system       the system message's text, or ``null`` when none is sent
$session_id   one stable id per conversation (also allowed inside ``url``)
============  ================================================================================

How failures are sorted: connection errors, timeouts, statuses 408, 409, 425, 429 and >= 500
are transient (Retry-After is honoured), any other status from 300 up is permanent (a
redirect is not followed), and so is an answer without a reply text where ``reply_path``
points; an answer that is not JSON is transient.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import jmespath
import jmespath.exceptions
import msgspec

from mhsafeeval.framework import redact, register_secret

from ._openai_compat import by_status, env_headers, error_text, retry_after_in
from ._registry import provider, typed_options
from ._transport import CannotSend, Endpoint, NoAnswer, transport_failure
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
    "PLACEHOLDERS",
    "HttpApp",
    "HttpOptions",
    "app_values",
    "check_http_settings",
    "fill",
    "http_factory",
    "read_usage",
    "unused_sampling",
]

PLACEHOLDERS = ("messages", "message", "history", "system", "session_id")
"""The names a body template may use as ``$name`` (see the module docstring)."""
_PLACEHOLDER = re.compile(r"\$([A-Za-z_]+)")
_NEEDS_ONE = ("messages", "message")  # without either, the app never hears the client
_ENCODE = msgspec.json.Encoder().encode
_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


class HttpOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``options`` of an ``http/...`` counselor table."""

    url: str
    """The app's endpoint (``http`` or ``https``); ``$session_id`` in it is replaced by the
    conversation's session id, URL-quoted."""
    reply_path: str
    """A JMESPath expression finding the reply text in the JSON answer
    (``reply``, ``choices[0].message.content``, ``data.messages[-1].text``)."""
    method: Literal["POST", "PUT", "PATCH"] = "POST"
    """The HTTP method of each request."""
    body: dict[str, Any] = msgspec.field(default_factory=lambda: {"messages": "$messages"})
    """The JSON body, with placeholders (see the module docstring)."""
    usage_path: str | None = None
    """A JMESPath expression finding ``{"prompt_tokens": N, "completion_tokens": M}`` in the
    answer, when the app reports its token usage."""
    session_header: str | None = None
    """A header that carries the session id (``X-Session-Id``), for apps that read it there."""
    extra_headers: dict[str, str] = {}
    """Headers sent as written: never a credential (the config refuses those)."""
    extra_headers_env: dict[str, str] = {}
    """Header name -> the NAME of an environment variable holding its value, read when the model
    is opened: ``{ Authorization = "MY_APP_AUTH" }``. The value is never stored or logged."""


def fill(template: Any, values: Mapping[str, Any]) -> Any:
    """``template`` with every placeholder string replaced by its value.

    Example:
        >>> fill({"q": "$message", "n": 1, "raw": "$$message"}, {"message": "hi"})
        {'q': 'hi', 'n': 1, 'raw': '$message'}
    """
    if isinstance(template, str):
        if template.startswith("$$"):
            return template[1:]
        return values[template[1:]] if template.startswith("$") else template
    if isinstance(template, dict):
        return {key: fill(value, values) for key, value in template.items()}
    if isinstance(template, list):
        return [fill(value, values) for value in template]
    return template


def _placeholders(template: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(key path, placeholder name)`` for every placeholder string in ``template``."""
    if isinstance(template, str) and template.startswith("$") and not template.startswith("$$"):
        yield path, template[1:]
    elif isinstance(template, dict):
        for key, value in template.items():
            yield from _placeholders(value, f"{path}.{key}")
    elif isinstance(template, list):
        for index, value in enumerate(template):
            yield from _placeholders(value, f"{path}[{index}]")


def app_values(messages: Sequence[ChatMessage], session_id: str | None) -> dict[str, Any]:
    """What the placeholders stand for in one call (see the module docstring).

    Example:
        >>> chat = [ChatMessage("user", "hi"), ChatMessage("assistant", "hello"),
        ...         ChatMessage("user", "I feel low")]
        >>> values = app_values(chat, "s-1")
        >>> values["message"], len(values["history"]), values["system"], values["session_id"]
        ('I feel low', 2, None, 's-1')
    """
    chat = [{"role": m.role, "content": m.content} for m in messages]
    system = next((m.content for m in messages if m.role == "system"), None)
    turns = [m for m in chat if m["role"] != "system"]
    last = turns[-1]["content"] if turns and turns[-1]["role"] == "user" else ""
    return {
        "messages": chat,
        "message": last,
        "history": turns[:-1] if last else turns,
        "system": system,
        "session_id": session_id,
    }


def read_usage(value: Any, what: str) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` from an app's usage object (``what`` names it in
    the error); missing counts are 0.

    Raises:
        PermanentProviderError: not an object of non-negative whole numbers.

    Example:
        >>> read_usage({"prompt_tokens": 12, "completion_tokens": 3}, "usage")
        (12, 3)
    """
    if value is None:
        return 0, 0
    if not isinstance(value, dict):
        raise PermanentProviderError(f"{what}: expected an object, got {type(value).__name__}")
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        count = value.get(key, 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise PermanentProviderError(f"{what}.{key}: expected a whole number >= 0")
        counts.append(count)
    return counts[0], counts[1]


def unused_sampling(settings: ModelSettings) -> list[tuple[str, str]]:
    """The sampling keys an app table sets: an app samples as it likes, so they would be
    ignored (refused instead, so that nobody believes they apply)."""
    return [
        (key, "an app samples as it likes: this is never sent to it; delete the key")
        for key in ("temperature", "max_tokens", "seed", "stop")
        if getattr(settings, key) not in (None, ())
    ]


def check_http_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """What is wrong with an ``http/`` table, found without calling the app."""
    try:
        options = msgspec.convert(settings.options, HttpOptions)
    except (msgspec.ValidationError, ValueError):
        return []  # the options Struct check reports it
    problems = unused_sampling(settings)
    if settings.api_base is not None:
        problems.append(("api_base", "not used by http/ models: the app's URL is options.url"))
    url = options.url.replace("$session_id", "x")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        problems.append(("options.url", "must be an http(s) URL with a host"))
    elif parts.username or parts.password:
        problems.append(("options.url", "must not hold a user name or password"))
    for field in ("reply_path", "usage_path"):
        expression = getattr(options, field)
        if expression is None:
            continue
        try:
            jmespath.compile(expression)
        except jmespath.exceptions.JMESPathError as exc:
            where = getattr(exc, "lex_position", None)
            at = f" at character {where}" if isinstance(where, int) else ""
            reason = str(exc).splitlines()[0].removeprefix("Invalid jmespath expression: ")
            problems.append((f"options.{field}", f"not a JMESPath expression ({reason}{at})"))
    used = set()
    for path, name in _placeholders(options.body, "options.body"):
        used.add(name)
        if name not in PLACEHOLDERS:
            known = ", ".join(f"${p}" for p in PLACEHOLDERS)
            problems.append((path, f"unknown placeholder ${name} (known: {known}; $$ for a $)"))
    if not used & set(_NEEDS_ONE):
        problems.append(
            ("options.body", "never sends the client's words: use $messages or $message")
        )
    for name in _PLACEHOLDER.findall(options.url):
        if name != "session_id":
            problems.append(("options.url", f"only $session_id may appear in it, not ${name}"))
    return problems


class HttpApp:
    """One app behind one URL; see the module docstring."""

    supports_json_schema = False  # an app answers in its own words
    sampling = CallParams()  # an app samples as it likes

    def __init__(self, model: str, settings: ModelSettings, headers: dict[str, str]) -> None:
        self.name = f"http/{model}"
        self.options = typed_options(settings, HttpOptions)
        self._settings = settings
        self._reply = jmespath.compile(self.options.reply_path)
        self._usage = (
            None if self.options.usage_path is None else jmespath.compile(self.options.usage_path)
        )
        # One pool per app table, as wide as its max_concurrency.
        self._endpoint = Endpoint(
            self.options.url.replace("$session_id", "x"),
            {**_JSON, **self.options.extra_headers, **headers},
        )
        self._endpoint.join(self, self.connection_key, settings.max_concurrency)
        self._closed = False

    @property
    def connection_key(self) -> str:
        """The method and URL (before the session id goes in)."""
        return f"{self.options.method} {self.options.url}"

    def should_retry(self, error: Exception) -> bool:
        """Transient failures only (module docstring)."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """Unknown: an app's cost is its own business."""
        return None

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Send one request and read the reply where ``reply_path`` points.

        Raises:
            TransientProviderError: worth retrying (module docstring).
            PermanentProviderError: retrying will not help.
        """
        if self._closed:
            raise PermanentProviderError(f"{self.name}: the model is closed")
        session = (params or CallParams()).session_id
        url, headers = self.options.url, {}
        if "$session_id" in url or self.options.session_header:
            if session is None:
                raise PermanentProviderError(f"{self.name}: the app needs a session id")
            url = url.replace("$session_id", quote(session, safe=""))
            if self.options.session_header:
                headers[self.options.session_header] = session
        body = fill(self.options.body, app_values(messages, session))
        try:
            sender = await self._endpoint.take()
            response = await sender.send(
                self.options.method,
                url,
                _ENCODE(body),
                headers=headers,
                limit_s=self._settings.timeout,
            )
        except (NoAnswer, TimeoutError, CannotSend) as exc:
            raise transport_failure(exc, f"{self.name}: {error_text(exc, None)}") from exc
        if response.status >= 300:
            # Redacted before it is cut (a cut key would not be recognised): an error page
            # may echo the request's headers, the key among them.
            text = redact(response.body[:4000].decode("utf-8", "replace"))[:300]
            raise by_status(
                f"{self.name}: HTTP {response.status}: {text}",
                response.status,
                retry_after=retry_after_in((response.headers,)),
                response_format=False,
            )
        try:
            answer = msgspec.json.decode(response.body)
        except msgspec.DecodeError as exc:
            raise TransientProviderError(f"{self.name}: the answer is not JSON: {exc}") from exc
        return self._completion(answer)

    def _completion(self, answer: Any) -> Completion:
        text = self._reply.search(answer)
        if not isinstance(text, str):
            got = f"keys {sorted(answer)}" if isinstance(answer, dict) else type(answer).__name__
            found = "nothing" if text is None else f"a {type(text).__name__}"
            raise PermanentProviderError(
                f"{self.name}: options.reply_path {self.options.reply_path!r} found {found}, "
                f"not the reply text, in the answer ({got})"
            )
        prompt, completion = (0, 0)
        if self._usage is not None:
            prompt, completion = read_usage(
                self._usage.search(answer), f"{self.name}: options.usage_path"
            )
        return Completion(
            text=text,
            finish_reason="stop",
            prompt_tokens=prompt,
            completion_tokens=completion,
            model=self.name,
        )

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent; never raises."""
        self._closed = True
        await self._endpoint.aclose()


@provider(
    "http",
    options=HttpOptions,
    check=check_http_settings,
    prices=lambda model, settings: False,
    own_prompt=True,
)
def http_factory(model: str, settings: ModelSettings) -> HttpApp:
    """An app over HTTP (see the module docstring)."""
    options = typed_options(settings, HttpOptions)
    try:
        headers = env_headers(f"http/{model}", options.extra_headers_env)
    except PermanentProviderError as exc:
        raise ProviderUnavailable(str(exc)) from None
    if settings.api_key_env:
        key = _environment(settings.api_key_env, f"http/{model}")
        headers.setdefault("Authorization", f"Bearer {key}")
    return HttpApp(model, settings, headers)


def _environment(variable: str, name: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise ProviderUnavailable(
            f"{name}: the environment variable {variable} (api_key_env) is not set or empty"
        )
    register_secret(value)  # scrubbed from every log line from now on
    return value
