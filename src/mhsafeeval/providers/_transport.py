"""The one HTTP stack of the providers that call servers: ``openai/`` and ``http/``.

A :class:`Session` sends one request and returns the whole answer (status, headers, body). On
asyncio it is an ``aiohttp.ClientSession``; under trio, where aiohttp cannot run, an
``httpx2.AsyncClient`` (httpx2: pydantic's maintained successor of httpx, the HTTP client of
openai's own SDK; httpx 0.29's pool scans all its connections for each of them on every
request, 6.5 ms of CPU per call at 64 in flight against httpx2's 0.5). An :class:`Endpoint`
makes the session when the first call needs it, on that call's event loop, with a connection
pool as wide as its models may have calls in flight.

What a session does, on either library (``tests/test_transport.py``):

* keep-alive connections, at most ``limit`` open; one idle for :data:`IDLE_S` seconds is closed
  rather than reused (servers drop idle connections: uvicorn, which vLLM runs on, after 5 s);
* a request is sent once: a connection that closes before the whole answer is in is
  :class:`NoAnswer`, never a second request (the server may have read the first); retrying is
  the caller's decision (:class:`~mhsafeeval.providers.ResilientClient`). A body cut
  short is :class:`NoAnswer` when the answer gave its length (``Content-Length`` or chunked,
  as every OpenAI-compatible server does); one that runs to the connection's end (HTTP/1.0
  style) ends where the connection does, reset or not, on aiohttp: JSON cut short then fails
  to decode, which the providers sort as transient;
* ``limit_s`` bounds the whole exchange, waiting for a free connection included;
* a connection whose exchange was cut short (timeout, cancellation, a broken answer) is closed;
* redirects are not followed (a 3xx comes back as it is) and no cookies are kept (an app's
  session cookie would tie every conversation to one session);
* a proxy from ``HTTPS_PROXY`` / ``HTTP_PROXY`` unless ``NO_PROXY`` exempts the host, read when
  the session is made (aiohttp's ``trust_env`` would read the environment, and netrc, in a
  worker thread on every request);
* once :meth:`Session.aclose` is called no new request is taken; those already made finish.

Its failures: :class:`NoAnswer` (a ``ConnectionError``: refused, dropped, reset, not HTTP),
``TimeoutError``, and :class:`CannotSend` (a ``ValueError``: a URL or header the library will
not send). :func:`transport_failure` sorts them: the first two are worth another attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio

from ._types import PermanentProviderError, TransientProviderError

__all__ = [
    "IDLE_S",
    "Answer",
    "CannotSend",
    "Endpoint",
    "NoAnswer",
    "Session",
    "open_session",
    "transport_failure",
]

IDLE_S = 4.0
"""An idle connection older than this is closed instead of reused (below the 5 s after which
uvicorn and Node close one; nginx waits 75 s)."""


class NoAnswer(ConnectionError):
    """No whole answer came back: no connection, a connection dropped or reset, not HTTP."""


class CannotSend(ValueError):
    """The request cannot be sent as asked (a URL or a header value the library refuses)."""


class Answer:
    """One answer: its status, its headers (a case-insensitive mapping) and its whole body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def transport_failure(
    exc: BaseException, message: str
) -> TransientProviderError | PermanentProviderError:
    """The provider error for a session's failure ``exc``, worded ``message``: transient for
    :class:`NoAnswer` and timeouts, permanent for :class:`CannotSend` and anything else."""
    if isinstance(exc, NoAnswer | TimeoutError):
        return TransientProviderError(message)
    if isinstance(exc, CannotSend | PermanentProviderError):
        return PermanentProviderError(message)
    return PermanentProviderError(f"unexpected {message}")


def timed_out(limit_s: float | None) -> str:
    return "request timed out" + (f" after {limit_s:g} s" if limit_s is not None else "")


class Session:
    """Requests to one server over a pool of keep-alive connections (see the module
    docstring). Made by :func:`open_session` on the event loop it serves."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._closing = False
        self._shut = False

    def is_closed(self) -> bool:
        """Whether :meth:`aclose` was called (requests made before may still be finishing)."""
        return self._closing

    async def send(
        self,
        method: str,
        url: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        limit_s: float | None = None,
    ) -> Answer:
        """Send ``body`` to ``url``; the whole answer, whatever its status. ``headers`` are
        added to the session's (one of the same name replaces the session's).

        Raises:
            NoAnswer: no whole answer (also when the session is closed).
            TimeoutError: no answer within ``limit_s`` seconds (the wait for a connection
                included).
            CannotSend: a URL or header the library refuses.
        """
        if self.is_closed():
            raise NoAnswer("the HTTP session is closed")
        self._in_flight += 1
        try:
            return await self._send(method, url, body, headers, limit_s)
        finally:
            self._in_flight -= 1
            if self._closing and not self._in_flight:
                await self._shut_down()

    async def aclose(self) -> None:
        """Take no new request; close the connections once the requests made are answered."""
        self._closing = True
        if not self._in_flight:
            await self._shut_down()

    async def _shut_down(self) -> None:
        if self._shut:
            return
        self._shut = True
        with anyio.CancelScope(shield=True):
            await self._close()

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        limit_s: float | None,
    ) -> Answer:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError


class _AiohttpSession(Session):
    def __init__(self, limit: int, headers: Mapping[str, str], proxy: str | None) -> None:
        super().__init__()
        import aiohttp

        self._aiohttp = aiohttp
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=limit, limit_per_host=limit, keepalive_timeout=IDLE_S
            ),
            headers=dict(headers),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        # aiohttp sends a request of an idempotent method (PUT, say) again when a kept
        # connection drops it; a chat call is never idempotent (tests/test_transport.py).
        if hasattr(self._session, "_retry_connection"):
            self._session._retry_connection = False
        self._proxy: Any = None
        self._proxy_auth: Any = None
        if proxy is not None:
            from yarl import URL

            self._proxy = URL(proxy)
            self._proxy_auth = aiohttp.BasicAuth.from_url(self._proxy)
            if self._proxy_auth is not None:
                self._proxy = self._proxy.with_user(None)
        self._timeouts: dict[float | None, Any] = {}

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        limit_s: float | None,
    ) -> Answer:
        aiohttp = self._aiohttp
        timeout = self._timeouts.get(limit_s)
        if timeout is None:
            timeout = self._timeouts[limit_s] = aiohttp.ClientTimeout(total=limit_s)
        try:
            async with self._session.request(
                method,
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
            ) as response:
                return Answer(response.status, response.headers, await response.read())
        except TimeoutError:  # aiohttp's timeouts are TimeoutErrors (and ClientErrors)
            raise TimeoutError(timed_out(limit_s)) from None
        except aiohttp.InvalidURL as exc:  # a ClientError and a ValueError
            raise CannotSend(f"not a URL aiohttp can send to: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise NoAnswer(_reason(exc)) from exc
        except ValueError as exc:  # a header value with a line break, say
            raise CannotSend(str(exc)) from None

    async def _close(self) -> None:
        await self._session.close()


class _Httpx2Session(Session):
    def __init__(self, limit: int, headers: Mapping[str, str]) -> None:
        super().__init__()
        import httpx2

        self._httpx2 = httpx2
        refuse_all = http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
        self._client = httpx2.AsyncClient(
            headers=dict(headers),
            cookies=http.cookiejar.CookieJar(refuse_all),
            timeout=None,  # the whole exchange is bounded below, as aiohttp's total timeout
            follow_redirects=False,
            limits=httpx2.Limits(
                max_connections=limit, max_keepalive_connections=limit, keepalive_expiry=IDLE_S
            ),
        )

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        limit_s: float | None,
    ) -> Answer:
        httpx2 = self._httpx2
        try:
            with anyio.fail_after(limit_s):
                response = await self._client.request(method, url, content=body, headers=headers)
        except (TimeoutError, httpx2.TimeoutException):
            raise TimeoutError(timed_out(limit_s)) from None
        except (httpx2.UnsupportedProtocol, httpx2.LocalProtocolError, httpx2.InvalidURL) as exc:
            raise CannotSend(str(exc)) from None
        except (httpx2.TransportError, httpx2.DecodingError) as exc:
            raise NoAnswer(_reason(exc)) from exc
        return Answer(response.status_code, response.headers, response.content)

    async def _close(self) -> None:
        await self._client.aclose()


def _reason(exc: BaseException) -> str:
    """The first words found down ``exc``'s causes (httpx2's ConnectError has none of its own
    when a certificate is refused: its cause says so)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def open_session(*, limit: int, headers: Mapping[str, str], url: str) -> Session:
    """A session for the running event loop (aiohttp on asyncio, httpx2 otherwise) with at
    most ``limit`` connections, every request carrying ``headers``; ``url`` is where it will
    send (its proxy is worked out from it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio: httpx2, which reads the proxy variables itself
        return _Httpx2Session(max(1, limit), headers)
    return _AiohttpSession(max(1, limit), headers, _env_proxy(url))


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``NO_PROXY`` heeded), or None."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy is None or not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    return proxy


def _event_loop() -> object:
    """The running event loop: asyncio's, or trio's root task (cheaper than sniffio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    import trio

    return trio.lowlevel.current_root_task()


class Endpoint:
    """The connection pool of one server, shared by the models that call it.

    Its session holds as many connections as its models may have calls in flight: for each
    connection key (one limit, see :class:`~mhsafeeval.providers.Connections`) the
    largest ``max_concurrency``, added up over the keys. A model that joins later and widens
    that gets a new session at its first call (the old one closes once its requests are
    answered); so does a call on another event loop (a model used across two ``anyio.run``).

    Args:
        url: where the models send (for the proxy).
        headers: sent with every request.
    """

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        self._url = url
        self._headers = dict(headers)
        self._users: dict[int, tuple[str, int]] = {}
        self._width: int | None = None
        self._session: Session | None = None
        self._size = 0
        self._loop: object = None  # the event loop the session was made on

    @property
    def width(self) -> int:
        """The connections the models may use at once (worked out when a model joins or
        leaves, not per request)."""
        if self._width is None:
            widest: dict[str, int] = {}
            for connection, size in self._users.values():
                widest[connection] = max(size, widest.get(connection, 0))
            self._width = max(1, sum(widest.values()))
        return self._width

    @property
    def pool_size(self) -> int:
        """The connection limit of the current session (0: none made yet)."""
        return self._size

    @property
    def session(self) -> Session | None:
        """The session calls go to now (``None`` before the first call)."""
        return self._session

    def join(self, user: object, connection: str, size: int) -> None:
        """``user`` calls with up to ``size`` calls in flight under the limit ``connection``."""
        self._users[id(user)] = (connection, size)
        self._width = None

    def leave(self, user: object) -> bool:
        """Forget ``user``; True when no model is left."""
        self._users.pop(id(user), None)
        self._width = None
        return not self._users

    async def take(self) -> Session:
        """The session for one request, made or widened first when needed."""
        session = self._session
        loop = _event_loop()
        if session is not None and loop is not self._loop:
            # Made on another event loop: its connections belong to that loop, so it can
            # neither serve this one nor be closed from here.
            session = self._session = None
        width = self.width
        if session is None or self._size < width:
            retired = session
            session = open_session(limit=width, headers=self._headers, url=self._url)
            self._session, self._size, self._loop = session, width, loop
            if retired is not None:
                await retired.aclose()  # closes once its requests are answered
        return session

    async def aclose(self) -> None:
        """Close the session (once its requests are answered). Never raises."""
        session, self._session, self._size = self._session, None, 0
        if session is None:
            return
        with contextlib.suppress(RuntimeError):  # no event loop running: nothing to close on
            if _event_loop() is not self._loop:
                return  # made on another event loop: left to it
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await session.aclose()
