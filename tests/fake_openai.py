"""A small OpenAI-compatible chat server on loopback, for provider tests.

It serves ``POST /v1/chat/completions`` (and ``/chat/completions``) from a scripted queue of
:class:`Reply` values, records every request, and runs in a background thread so it works from
plain synchronous fixtures, whatever event loop the test itself uses.

Example:
    from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401

    def test_retry_after(fake_openai: FakeOpenAI) -> None:
        fake_openai.script(Reply.error(429, headers={"Retry-After": "7"}), Reply.chat("hi"))
        ...  # point a client at f"{fake_openai.url}/v1"
        assert len(fake_openai.requests) == 2

Bounded on purpose: it binds 127.0.0.1 only, every read has a socket timeout, delayed replies
end as soon as the server stops, and :meth:`FakeOpenAI.stop` joins every handler thread.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

import pytest

__all__ = ["FakeOpenAI", "RecordedRequest", "Reply", "fake_openai_fixture"]

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})

Kind = Literal["chat", "error", "drop", "malformed"]


@dataclass(frozen=True)
class Reply:
    """What the server does with one chat request. Build one with the class methods.

    Attributes:
        kind: ``chat`` (a completion), ``error`` (an HTTP error status), ``drop`` (close the
            connection without answering) or ``malformed`` (200 with a body that is not JSON).
        text: the assistant's content; ``None`` sends ``"content": null``.
        echo: answer with the last user message instead of ``text``.
        finish_reason: the choice's ``finish_reason``.
        empty_choices: send ``"choices": []``.
        status: HTTP status of an ``error`` reply.
        headers: extra response headers (e.g. ``Retry-After``).
        delay: seconds to wait before answering (cut short when the server stops).
        held: wait for :meth:`FakeOpenAI.release` before answering, so a test can act while
            a request is in flight without sleeping.
        usage: ``(prompt_tokens, completion_tokens)``.
        answer: compute the text from the request body (see :meth:`computed`).
        echo_key: an ``error`` whose message quotes the request's ``Authorization`` header,
            as some providers do ("Incorrect API key provided: ..."): tests use it to check
            that clients scrub the key from what they report.
        message: an ``error``'s message (default ``fake error STATUS``).
    """

    kind: Kind = "chat"
    text: str | None = None
    echo: bool = False
    finish_reason: str = "stop"
    empty_choices: bool = False
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    held: bool = False
    usage: tuple[int, int] = (11, 7)
    echo_key: bool = False
    answer: Callable[[Any], str] | None = None
    message: str = ""

    @classmethod
    def chat(
        cls,
        text: str | None = None,
        *,
        finish_reason: str = "stop",
        usage: tuple[int, int] = (11, 7),
    ) -> Reply:
        """A normal completion; without ``text`` it echoes the last user message."""
        return cls(text=text, echo=text is None, finish_reason=finish_reason, usage=usage)

    @classmethod
    def error(
        cls,
        status: int,
        *,
        headers: Mapping[str, str] | None = None,
        echo_key: bool = False,
        message: str = "",
    ) -> Reply:
        """An HTTP error with an OpenAI-style error body (``message``: its text)."""
        return cls(
            kind="error",
            status=status,
            headers=dict(headers or {}),
            echo_key=echo_key,
            message=message,
        )

    @classmethod
    def computed(cls, answer: Callable[[Any], str]) -> Reply:
        """A completion whose text is ``answer(request_body)``: a stand-in model behind HTTP
        (e.g. one of the ``scripted/demo-*`` personas), so a whole campaign can run through a
        real provider path."""
        return cls(answer=answer)

    @classmethod
    def drop(cls) -> Reply:
        """Read the request, then close the connection without a response."""
        return cls(kind="drop")

    @classmethod
    def malformed(cls) -> Reply:
        """A 200 response whose JSON body is cut off."""
        return cls(kind="malformed")

    @classmethod
    def no_choices(cls) -> Reply:
        """A 200 completion with an empty ``choices`` list."""
        return cls(empty_choices=True)

    @classmethod
    def content_filter(cls) -> Reply:
        """The provider's safety filter withheld the answer: null content."""
        return cls(text=None, finish_reason="content_filter")

    def after(self, delay: float) -> Reply:
        """This reply, sent only after ``delay`` seconds."""
        return replace(self, delay=delay)

    def hold(self) -> Reply:
        """This reply, sent only once the test calls :meth:`FakeOpenAI.release`."""
        return replace(self, held=True)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it. Header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes


class FakeOpenAI:
    """The server. Use the :func:`fake_openai` fixture, or ``with FakeOpenAI() as server:``.

    Replies are taken from the queue filled by :meth:`script`; when it is empty,
    :attr:`default` answers (an echo unless changed, e.g. ``server.default = Reply.error(503)``).
    :meth:`always` makes every request for one model (the body's ``model``) get one reply
    before the queue is looked at: "the judge model is down" while the others answer.
    """

    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply.chat()
        self._queue: collections.deque[Reply] = collections.deque()
        self._always: dict[str, Reply] = {}
        self._structured: Reply | None = None
        self._rejected_kinds: tuple[str, ...] = ()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._released = threading.Event()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (add ``/v1`` for an OpenAI ``api_base``)."""
        if self._httpd is None:
            raise RuntimeError("the fake server is not running")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every chat request received so far, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        with self._lock:
            self._queue.extend(replies)

    def always(self, model: str, reply: Reply | None) -> None:
        """Answer every request whose body names ``model`` with ``reply`` (None: stop doing so).

        Model names arrive as the provider sends them (``litellm/openai/judge-x`` sends
        ``judge-x``)."""
        with self._lock:
            if reply is None:
                self._always.pop(model, None)
            else:
                self._always[model] = reply

    def reject_response_format(
        self, reply: Reply | None, *, kinds: tuple[str, ...] = ("json_schema", "json_object")
    ) -> None:
        """Answer every request whose ``response_format`` type is one of ``kinds`` with
        ``reply`` (None: stop), before :meth:`always` and the queue, as a server without that
        structured output does (llama.cpp's answers 500 to ``json_schema`` only)."""
        with self._lock:
            self._structured = reply
            self._rejected_kinds = kinds

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> None:
        """Block until ``count`` chat requests have arrived (from async code: run it in a
        worker thread, e.g. ``anyio.to_thread.run_sync``)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} requests arrived")

    def release(self) -> None:
        """Let every held reply (:meth:`Reply.hold`) go out, now and from now on."""
        self._released.set()

    def start(self) -> FakeOpenAI:
        """Bind a free loopback port and serve in a background thread."""
        self._httpd = _Server(("127.0.0.1", 0), _Handler, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="fake-openai",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end delayed replies at once, and join every thread."""
        self._stopping.set()
        self._released.set()  # held replies end too (unanswered)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()  # joins the handler threads (block_on_close)
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Used by the handler threads.

    def _take(self, request: RecordedRequest) -> tuple[Reply, int]:
        with self._lock:
            self._requests.append(request)
            self._arrived.notify_all()
            model = request.body.get("model") if isinstance(request.body, dict) else None
            fixed = self._always.get(model) if isinstance(model, str) else None
            body = request.body if isinstance(request.body, dict) else {}
            kind = (body.get("response_format") or {}).get("type")
            structured = kind is not None and kind in self._rejected_kinds
            if structured and self._structured is not None:
                reply = self._structured
            elif fixed is not None:
                reply = fixed
            else:
                reply = self._queue.popleft() if self._queue else self.default
            return reply, next(self._ids)

    def _wait(self, reply: Reply) -> bool:
        """Wait as ``reply`` asks; False when the server is stopping (then: do not answer)."""
        if reply.delay > 0:
            self._stopping.wait(reply.delay)
        if reply.held:
            self._released.wait()  # stop() sets it too
        return not self._stopping.is_set()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler], fake: FakeOpenAI) -> None:
        super().__init__(address, handler)
        self.fake = fake

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (its timeout) closes the socket under a delayed reply: expected.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers in a pool
    timeout = 10.0  # socket timeout, so a stuck client can never hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path not in CHAT_PATHS:
            self._send_json(
                404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            )
            return
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake = self.server.fake
        reply, number = fake._take(RecordedRequest("POST", self.path, headers, body, raw))
        if not fake._wait(reply):
            self._drop()
            return
        if reply.kind == "drop":
            self._drop()
        elif reply.kind == "malformed":
            self._send_bytes(200, b'{"id": "chatcmpl-broken", "choices": [{"index": 0, ', {})
        elif reply.kind == "error":
            message = reply.message or f"fake error {reply.status}"
            if reply.echo_key:
                message += f"; Incorrect API key provided: {headers.get('authorization', '')}"
            payload = {
                "error": {"message": message, "type": "fake_error", "code": str(reply.status)}
            }
            self._send_json(reply.status, payload, reply.headers)
        else:
            self._send_json(200, _completion(reply, body, number), reply.headers)

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may be gone already
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        self._send_bytes(status, json.dumps(payload).encode(), headers or {})

    def _send_bytes(self, status: int, data: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _completion(reply: Reply, body: Any, number: int) -> dict[str, Any]:
    request = body if isinstance(body, dict) else {}
    text = reply.text
    if reply.answer is not None:
        text = reply.answer(request)
    elif reply.echo:
        users = [m.get("content") for m in request.get("messages", []) if m.get("role") == "user"]
        text = str(users[-1]) if users else ""
    prompt_tokens, completion_tokens = reply.usage
    choices = (
        []
        if reply.empty_choices
        else [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": reply.finish_reason,
                "logprobs": None,
            }
        ]
    )
    return {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": 1_700_000_000 + number,
        "model": str(request.get("model", "fake-model")),
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


@pytest.fixture(name="fake_openai")
def fake_openai_fixture() -> Iterator[FakeOpenAI]:
    """``fake_openai``: a running :class:`FakeOpenAI`, stopped (threads joined) at teardown.

    Import it into a test module (``from fake_openai import fake_openai_fixture``) to use it.
    """
    with FakeOpenAI() as server:
        yield server
