"""A lean HTTP/1.1 client for one origin, on asyncio: what ``openai/`` sends through.

Why not aiohttp (still there as ``transport = "aiohttp"``): at 256 conversations in flight a
campaign is bound by its one event loop, and aiohttp's request machinery (session, request
and response objects, timers, tracing hooks) costs about 0.3 ms of CPU per call. Before Python
3.12 it also writes every request body from a task of its own, one more pass of the event loop
per call: when a burst of answers arrives together, every pass runs for the whole burst before
any request leaves, so the next requests leave together too and the bursts never spread out
(measured: 0.77 x C calls/s at C = 256, against 0.91-0.94 x C for this client; see
``benchmarks/throughput.py``).

What this client does, and all it does:

* keep-alive connections, at most ``limit`` open, one request on a connection at a time; the
  most recently used idle one is taken first; one idle for ``IDLE_S`` seconds, or for 0.8 of
  the ``Keep-Alive: timeout=N`` the server announced, is closed instead (servers drop idle
  connections: uvicorn, which vLLM runs on, after 5 s);
* the request (``POST``, its headers, ``Content-Length``, the body) written at once, from the
  calling task, before it first waits;
* the answer parsed by httptools (the llhttp parser): ``Content-Length``, chunked, or read to
  the end of the connection; gzip and deflate bodies are decoded (none are asked for);
* a POST is never sent twice: a failure is one error, :class:`CannotConnect`,
  :class:`ConnectionClosed` (also when a kept connection turns out to be closed: the server may
  have read the request), :class:`MalformedResponse` (all ``ConnectionError``), or
  ``TimeoutError`` when the whole exchange, the connection included, took over ``limit_s``;
* a connection whose exchange was cut short (timeout, cancellation, a broken answer) is
  closed, never reused;
* ``https``: TLS with the system's certificates (``ssl.create_default_context``).

No proxies, redirects, cookies or HTTP/2 (``transport = "sdk"`` has them).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["CannotConnect", "ConnectionClosed", "Http11Client", "MalformedResponse", "Response"]

IDLE_S = 4.0
"""An idle connection older than this is closed instead of reused (below the 5 s after which
uvicorn and Node close one; nginx waits 75 s)."""


class CannotConnect(ConnectionError):
    """No connection could be opened (refused, no such host, TLS refused...)."""


class ConnectionClosed(ConnectionError):
    """The server closed the connection before its answer was complete."""


class MalformedResponse(ConnectionError):
    """What the server sent is not an HTTP/1.1 answer."""


class Response:
    """One answer: its status, its headers (names lower-cased) and its whole body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the parser of the answer it is waiting for."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.status = 0
        self.complete = False  # headers parsed
        self.reusable = False
        self.idle_since = 0.0
        self.idle_limit = IDLE_S
        self.lost = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # nothing asked: a server talking out of turn
            self._abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(MalformedResponse(f"the server's answer is not HTTP/1.1: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self.complete and self._ends_at_close():
            self._finish()  # an answer delimited by the (orderly) end of the connection
            return
        cause = f": {exc}" if exc else ""
        self._fail(ConnectionClosed(f"Server disconnected{cause}"))

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.complete = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers, self.body, self.complete = {}, [], False
            return
        self.reusable = self.parser.should_keep_alive()
        announced = self.headers.get("keep-alive")
        if announced and "timeout=" in announced:  # heed it, with a fifth to spare
            self.idle_limit = min(self.idle_limit, 0.8 * _announced_timeout(announced))
        self._finish()

    # --

    def _ends_at_close(self) -> bool:
        return "content-length" not in self.headers and "transfer-encoding" not in self.headers

    def _finish(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        body = b"".join(self.body)
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "deflate", "x-gzip"):
            try:
                body = zlib.decompress(body, 47 if encoding != "deflate" else zlib.MAX_WBITS)
            except zlib.error as exc:
                problem = f"the server's {encoding} body does not decode: {exc}"
                self._fail(MalformedResponse(problem))
                return
        waiter.set_result(Response(self.status, self.headers, body))

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self._abort()

    def _abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def start(self) -> asyncio.Future[Response]:
        """Ready for one more answer; the future it will be given to."""
        self.waiter = waiter = self.loop.create_future()
        self.headers, self.body = {}, []
        self.status, self.complete, self.reusable = 0, False, False
        return waiter


class Http11Client:
    """Requests to one origin (``url``: scheme, host, port and a path prefix) over at most
    ``limit`` keep-alive connections, every request carrying ``headers``. Make it, use it and
    close it on one running asyncio event loop.

    Example:
        client = Http11Client("http://127.0.0.1:8000/v1", {"Authorization": "Bearer x"}, limit=64)
        answer = await client.post("/chat/completions", body, limit_s=60.0)
        await client.close()
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        limit: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"not an http:// or https:// address: {url!r}")
        self._host = split.hostname
        self._port = split.port or (443 if split.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = None
        if split.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self._prefix = split.path.rstrip("/")
        default_port = self._port == (443 if split.scheme == "https" else 80)
        host = self._host if ":" not in self._host else f"[{self._host}]"  # IPv6
        authority = host if default_port else f"{host}:{self._port}"
        self._headers = _merged({"Host": authority}, headers)
        self._names = {name.lower() for name in self._headers}
        self._fixed = _header_lines(self._headers)
        self._limit = max(1, limit)
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or being opened
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._lines: dict[int, tuple[Mapping[str, str], bytes]] = {}
        self._closed = False

    @property
    def connections(self) -> int:
        """Connections open (or being opened) now."""
        return self._open

    def is_closed(self) -> bool:
        return self._closed

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        limit_s: float | None = None,
    ) -> Response:
        """POST ``body`` to ``path`` (after the url's own path); the whole answer.

        Raises:
            ConnectionClosed, MalformedResponse: no (whole) answer; CannotConnect: no
                connection (all three are ``ConnectionError``).
            TimeoutError: no answer within ``limit_s`` seconds (the connection included).
        """
        if self._closed:
            raise ConnectionClosed("the HTTP client is closed")
        loop = asyncio.get_running_loop()
        deadline = None if limit_s is None else loop.time() + limit_s
        head = b"".join(
            (
                f"POST {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1"),
                self._header_block(headers),
                b"Content-Length: %d\r\n\r\n" % len(body),
            )
        )
        request = head + body
        conn = await self._acquire(loop, deadline, limit_s)
        try:
            answer = await self._exchange(loop, conn, request, deadline, limit_s)
        except BaseException:  # a drop, a timeout, a cancellation, a broken answer
            conn._abort()
            self._release(conn)
            raise
        self._release(conn)
        return answer

    def _header_block(self, headers: Mapping[str, str] | None) -> bytes:
        """The client's headers and the call's: a call's header replaces the client's of the
        same name (in any case). Worked out once per header map the callers keep."""
        if not headers:
            return self._fixed
        cached = self._lines.get(id(headers))
        if cached is not None and cached[0] is headers:
            return cached[1]
        if any(name.lower() in self._names for name in headers):
            block = _header_lines(_merged(self._headers, headers))
        else:
            block = self._fixed + _header_lines(headers)
        if len(self._lines) < 64:  # the callers' few constant header maps
            self._lines[id(headers)] = (headers, block)
        return block

    async def _exchange(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Connection,
        request: bytes,
        deadline: float | None,
        limit_s: float | None,
    ) -> Response:
        waiter = conn.start()
        assert conn.transport is not None
        conn.transport.write(request)
        timer = None
        if deadline is not None:
            timer = loop.call_at(deadline, _expire, waiter, limit_s)
        try:
            return await waiter
        finally:
            conn.waiter = None
            if timer is not None:
                timer.cancel()

    async def _acquire(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None, limit_s: float | None
    ) -> _Connection:
        while True:
            if self._closed:
                raise ConnectionClosed("the HTTP client is closed")
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()
                if conn.lost or now - conn.idle_since > conn.idle_limit:
                    conn._abort()
                    self._open -= 1
                    continue
                return conn
            if self._open < self._limit:
                self._open += 1
                try:
                    return await self._connect(loop, deadline, limit_s)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            slot: asyncio.Future[None] = loop.create_future()
            self._waiting.append(slot)
            # A timer, not asyncio.wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that arrives in the pass the slot is granted in.
            timer = None
            if deadline is not None:
                waited = TimeoutError(_timed_out(limit_s, "waiting for a connection"))
                timer = loop.call_at(deadline, _fail_future, slot, waited)
            try:
                await slot
            except BaseException:
                if slot.done() and not slot.cancelled():
                    self._wake()  # handed a slot it will not use: pass it on
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                if not slot.done():
                    slot.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(slot)

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None, limit_s: float | None
    ) -> _Connection:
        opening = loop.create_connection(
            lambda: _Connection(loop),
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=self._host if self._ssl else None,
        )
        try:
            if deadline is None:
                _, conn = await opening
            else:
                async with asyncio.timeout_at(deadline):
                    _, conn = await opening
        except TimeoutError:
            raise TimeoutError(_timed_out(limit_s, "connecting")) from None
        except OSError as exc:  # refused, unreachable, no such host, a certificate refused
            raise CannotConnect(f"Cannot connect to {self._host}:{self._port}: {exc}") from exc
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.reusable and not conn.lost and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn._abort()
            self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                return

    async def close(self) -> None:
        """Close the idle connections now, the others when their answer is in."""
        self._closed = True
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._open -= len(self._idle)
        self._idle.clear()
        for slot in self._waiting:
            if not slot.done():
                slot.set_exception(ConnectionClosed("the HTTP client is closed"))
        self._waiting.clear()


def _merged(base: Mapping[str, str], more: Mapping[str, str]) -> dict[str, str]:
    """``base`` and then ``more``: a name in ``more`` replaces ``base``'s in any case."""
    replaced = {name.lower() for name in more}
    out = {name: value for name, value in base.items() if name.lower() not in replaced}
    out.update(more)
    return out


_OURS = frozenset({"content-length", "transfer-encoding", "connection"})


def _header_lines(headers: Mapping[str, str]) -> bytes:
    out = []
    for name, value in headers.items():
        if name.lower() in _OURS:
            raise ValueError(f"HTTP header {name!r} is the client's own to set")
        text = f"{name}{value}"
        if "\r" in text or "\n" in text or ":" in name or not name.strip():
            raise ValueError(f"HTTP header {name!r}: a name or value with a line break or colon")
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")


def _timed_out(limit_s: float | None, doing: str) -> str:
    limit = f" after {limit_s:g} s" if limit_s is not None else ""
    return f"no answer{limit} ({doing})"


def _expire(waiter: asyncio.Future[Response], limit_s: float | None) -> None:
    _fail_future(waiter, TimeoutError(_timed_out(limit_s, "waiting for the answer")))


def _fail_future(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _announced_timeout(value: str) -> float:
    """The ``timeout=N`` of a ``Keep-Alive`` header (0 if it does not parse)."""
    for part in value.split(","):
        name, _, number = part.strip().partition("=")
        if name.strip().lower() == "timeout":
            try:
                return float(number)
            except ValueError:
                return 0.0
    return 0.0
