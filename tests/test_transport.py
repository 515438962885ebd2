"""The one HTTP stack of the providers (``_transport.py``): aiohttp on asyncio, httpx on trio.

Every test runs on both backends against a small threaded HTTP/1.1 server on loopback that
answers each request as the test scripts it: keep-alive, ``Connection: close``, chunked, gzip,
read-to-the-end, a dropped or reset connection, garbage, or no answer at all. It counts
connections and requests, so a test can say which connection each request used and that none
was sent twice.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from mhsafeeval.providers import PermanentProviderError, TransientProviderError, _transport
from mhsafeeval.providers._transport import (
    CannotSend,
    NoAnswer,
    Session,
    open_session,
    transport_failure,
)
from needs import need_command

pytestmark = pytest.mark.anyio


@dataclass
class Seen:
    connection: int  # 0, 1, ... in order of acceptance
    index: int  # the request's place on its connection
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    names: list[str] = field(default_factory=list)  # every header line's name, lower-cased


Answer = bytes | None  # None: close the connection without answering
Script = Callable[[Seen], Answer]


def ok(body: bytes = b'{"ok": true}', *, extra: str = "", status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


@dataclass
class Server:
    script: Script
    tls: ssl.SSLContext | None = None
    delay: float = 0.0
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    closed_by_client: int = 0
    _socks: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Event = field(default_factory=threading.Event)  # a request was read
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Server:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/v1"
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                number = self.connections
                self.connections += 1
                self.open_now += 1
                self.most_open = max(self.most_open, self.open_now)
                self._socks.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock, number), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, raw: socket.socket, number: int) -> None:
        sock: socket.socket = raw
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(raw, server_side=True)
            sock.settimeout(0.05)
            buffer = b""
            index = 0
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buffer:
                    chunk = self._recv(sock)
                    if chunk is None:
                        continue
                    if not chunk:
                        with self._lock:
                            self.closed_by_client += 1
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                size = int(headers.get("content-length", 0))
                while len(buffer) < size:
                    chunk = self._recv(sock)
                    if chunk == b"":
                        return
                    buffer += chunk or b""
                body, buffer = buffer[:size], buffer[size:]
                names = [line.partition(":")[0].strip().lower() for line in lines[1:]]
                request = Seen(number, index, method, path, headers, body, names)
                index += 1
                with self._lock:
                    self.seen.append(request)
                self.arrived.set()
                answer = self.script(request)
                if self.delay and self._stop.wait(self.delay):
                    return
                if answer is None:
                    return
                if answer == b"hold":
                    self._stop.wait(30)
                    return
                if answer.startswith(b"reset:"):  # part of an answer, then a TCP reset
                    sock.sendall(answer[len(b"reset:") :])
                    time.sleep(0.05)
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                sock.sendall(answer)
                if b"connection: close" in answer.lower() or b"HTTP/1.0" in answer[:9]:
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            with self._lock:
                self.open_now -= 1
                if raw in self._socks:
                    self._socks.remove(raw)
            with contextlib.suppress(OSError):
                sock.close()

    def _recv(self, sock: socket.socket) -> bytes | None:
        try:
            return sock.recv(65536)
        except TimeoutError:
            return None if not self._stop.is_set() else b""


@contextlib.contextmanager
def serving(script: Script, **kwargs: object) -> Iterator[Server]:
    server = Server(script, **kwargs).start()  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def session_for(server: Server, limit: int = 4, **headers: str) -> Session:
    return open_session(
        limit=limit, headers={"Authorization": "Bearer k", **headers}, url=server.url
    )


async def post(session: Session, server: Server, **kwargs: object) -> _transport.Answer:
    return await session.send("POST", f"{server.url}/x", b"{}", **kwargs)  # type: ignore[arg-type]


def always(answer: bytes) -> Script:
    return lambda _: answer


def hold_the_first_connection(seen: Seen) -> Answer:
    """Never answer on the first connection; answer on every later one."""
    return b"hold" if seen.connection == 0 else ok()


async def arrived(server: Server) -> None:
    """Wait until the server has read a request (bounded: 5 s)."""
    assert await anyio.to_thread.run_sync(server.arrived.wait, 5.0)


# -- the request ------------------------------------------------------------------------------


async def test_a_request_is_sent_as_written() -> None:
    with serving(always(ok())) as server:
        session = session_for(server)
        url = f"{server.url}/chat/completions"
        got = await session.send("POST", url, b'{"a": 1}', headers={"X-Team": "s"})
        await session.aclose()
    assert (got.status, json.loads(got.body)) == (200, {"ok": True})
    assert got.headers["content-type"] == got.headers["Content-Type"] == "application/json"
    (seen,) = server.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/chat/completions", b'{"a": 1}')
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"
    assert seen.headers["authorization"] == "Bearer k"
    assert seen.headers["x-team"] == "s"
    assert seen.headers["content-length"] == "8"
    assert "cookie" not in seen.headers


async def test_a_calls_header_replaces_the_sessions_of_the_same_name() -> None:
    with serving(always(ok())) as server:
        session = session_for(server, limit=1, Accept="text/plain", **{"X-Team": "a"})
        await post(session, server, headers={"accept": "application/json"})
        await post(session, server)
        await session.aclose()
    first, second = server.seen
    assert first.names.count("accept") == second.names.count("accept") == 1
    assert (first.headers["accept"], first.headers["x-team"]) == ("application/json", "a")
    assert (second.headers["accept"], second.headers["x-team"]) == ("text/plain", "a")


async def test_a_header_with_a_line_break_is_never_sent() -> None:
    with serving(always(ok())) as server:
        session = session_for(server)
        with pytest.raises(CannotSend):
            await post(session, server, headers={"X-Bad": "a\r\nInjected: yes"})
        await session.aclose()
    assert [s for s in server.seen if "injected" in s.headers] == []


async def test_a_redirect_comes_back_as_it_is() -> None:
    answer = ok(status="307 Temporary Redirect", extra="Location: /v1/elsewhere\r\n")
    with serving(always(answer)) as server:
        session = session_for(server)
        got = await post(session, server)
        await session.aclose()
    assert (got.status, got.headers["location"]) == (307, "/v1/elsewhere")
    assert [s.path for s in server.seen] == ["/v1/x"]


async def test_cookies_are_not_kept() -> None:
    """An app's session cookie would tie every conversation to one session."""
    with serving(always(ok(extra="Set-Cookie: session=abc; Path=/\r\n"))) as server:
        session = session_for(server)
        await post(session, server)
        await post(session, server)
        await session.aclose()
    assert ["cookie" in s.headers for s in server.seen] == [False, False]


# -- connections ------------------------------------------------------------------------------


async def test_one_kept_alive_connection_serves_requests_one_after_another() -> None:
    with serving(always(ok())) as server:
        session = session_for(server)
        for _ in range(5):
            assert (await post(session, server)).status == 200
        await session.aclose()
    assert server.connections == 1
    assert [s.index for s in server.seen] == [0, 1, 2, 3, 4]


async def test_at_most_limit_connections_and_every_request_answered() -> None:
    statuses: list[int] = []

    async def one(session: Session, server: Server) -> None:
        statuses.append((await post(session, server)).status)

    with serving(always(ok()), delay=0.1) as server:
        session = session_for(server, limit=2)
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one, session, server)
        await session.aclose()
    assert statuses == [200] * 6
    assert server.most_open <= 2
    assert server.connections == 2


async def test_connection_close_is_honoured() -> None:
    with serving(always(ok(extra="Connection: close\r\n"))) as server:
        session = session_for(server)
        for _ in range(3):
            assert (await post(session, server)).status == 200
        await session.aclose()
    assert server.connections == 3


async def test_an_http10_answer_read_to_the_end_of_the_connection() -> None:
    answer = b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"to": "the end"}'
    with serving(always(answer)) as server:
        session = session_for(server)
        first = await post(session, server)
        second = await post(session, server)
        await session.aclose()
    assert json.loads(first.body) == json.loads(second.body) == {"to": "the end"}
    assert server.connections == 2


async def test_a_chunked_answer() -> None:
    body = b'{"chunked": "yes, in three parts"}'
    parts = [body[:5], body[5:20], body[20:]]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    with serving(always(answer)) as server:
        session = session_for(server)
        got = [await post(session, server) for _ in range(2)]
        await session.aclose()
    assert [g.body for g in got] == [body, body]
    assert server.connections == 1  # the connection was kept


async def test_a_gzip_answer_is_decoded() -> None:
    packed = gzip.compress(b'{"zipped": true}')
    with serving(always(ok(packed, extra="Content-Encoding: gzip\r\n"))) as server:
        session = session_for(server)
        got = await post(session, server)
        await session.aclose()
    assert json.loads(got.body) == {"zipped": True}


async def test_an_error_status_comes_back_with_its_headers() -> None:
    answer = ok(
        b'{"error": "slow down"}', status="429 Too Many Requests", extra="Retry-After: 7\r\n"
    )
    with serving(always(answer)) as server:
        session = session_for(server)
        got = await post(session, server)
        await session.aclose()
    assert (got.status, got.headers["retry-after"], got.body) == (
        429,
        "7",
        b'{"error": "slow down"}',
    )


async def test_an_idle_connection_past_its_limit_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_transport, "IDLE_S", 0.2)
    with serving(always(ok())) as server:
        session = session_for(server)
        await post(session, server)
        await post(session, server)  # at once: the same connection
        await anyio.sleep(0.5)
        await post(session, server)  # idle too long: a new one
        await session.aclose()
    assert [(s.connection, s.index) for s in server.seen] == [(0, 0), (0, 1), (1, 0)]


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_a_kept_connection_that_drops_a_request_is_an_error_never_a_second_request(
    method: str,
) -> None:
    """The server may have read (and worked on) the request before it closed: sending it again
    could make a model call twice, whatever HTTP says of PUT. The caller's retry policy decides
    (ResilientClient)."""

    def script(seen: Seen) -> Answer:
        return None if (seen.connection, seen.index) == (0, 1) else ok()

    with serving(script) as server:
        session = session_for(server)
        url = f"{server.url}/x"
        assert (await session.send(method, url, b"{}")).status == 200
        with pytest.raises(NoAnswer):
            await session.send(method, url, b"{}")
        assert (await session.send(method, url, b"{}")).status == 200  # on a new connection
        await session.aclose()
    assert [(s.connection, s.index) for s in server.seen] == [(0, 0), (0, 1), (1, 0)]


async def test_a_body_cut_short_by_a_reset_is_an_error_not_a_short_body() -> None:
    with serving(always(b"reset:" + ok()[:-3])) as server:
        session = session_for(server)
        with pytest.raises(NoAnswer):
            await post(session, server)
        await session.aclose()


async def test_a_new_connection_dropped_is_an_error_not_a_retry() -> None:
    with serving(lambda _: None) as server:
        session = session_for(server)
        with pytest.raises(NoAnswer):
            await post(session, server)
        await session.aclose()
    assert len(server.seen) == 1


async def test_garbage_is_no_answer() -> None:
    with serving(always(b"SMTP ready, not HTTP at all\r\n\r\n")) as server:
        session = session_for(server)
        with pytest.raises(NoAnswer):
            await post(session, server)
        await session.aclose()


async def test_no_server_is_no_answer() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    session = open_session(limit=1, headers={}, url=url)
    with pytest.raises(NoAnswer):
        await session.send("POST", f"{url}/x", b"{}")
    await session.aclose()


async def test_a_timeout_closes_the_connection_and_the_next_request_gets_a_new_one() -> None:
    with serving(hold_the_first_connection) as server:
        session = session_for(server, limit=1)
        with pytest.raises(TimeoutError, match=r"timed out after 0\.2 s"):
            await post(session, server, limit_s=0.2)
        assert (await post(session, server, limit_s=5)).status == 200
        await session.aclose()
    assert server.connections == 2


async def test_a_cancelled_request_frees_its_slot_and_its_connection_is_not_reused() -> None:
    with serving(hold_the_first_connection) as server:
        session = session_for(server, limit=1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, session, server)
            await arrived(server)
            tg.cancel_scope.cancel()
        assert (await post(session, server, limit_s=5)).status == 200
        await session.aclose()
    assert server.connections == 2


async def test_waiting_for_a_connection_counts_in_the_timeout() -> None:
    with serving(hold_the_first_connection) as server:
        session = session_for(server, limit=1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, session, server)  # holds the one connection
            await arrived(server)
            with pytest.raises(TimeoutError, match=r"after 0\.2 s"):
                await post(session, server, limit_s=0.2)
            tg.cancel_scope.cancel()
        await session.aclose()
    assert len(server.seen) == 1  # the second request never left


async def test_no_request_after_close_and_the_ones_made_before_finish() -> None:
    answers: list[int] = []

    async def one(session: Session, server: Server) -> None:
        answers.append((await post(session, server)).status)

    with serving(always(ok()), delay=0.2) as server:
        session = session_for(server)
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, session, server)
            await arrived(server)
            await session.aclose()
            assert session.is_closed()
            with pytest.raises(NoAnswer, match="closed"):
                await post(session, server)
    assert answers == [200]
    assert len(server.seen) == 1


# -- proxies ----------------------------------------------------------------------------------


async def test_a_proxy_from_the_environment_and_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(always(ok())) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        target = "http://counselor-app.invalid/v1"
        session = open_session(limit=1, headers={}, url=target)
        await session.send("POST", f"{target}/x", b"{}")
        await session.aclose()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        direct = open_session(limit=1, headers={}, url=proxy.url)
        await direct.send("POST", f"{proxy.url}/y", b"{}")
        await direct.aclose()
    assert [s.path for s in proxy.seen] == ["http://counselor-app.invalid/v1/x", "/v1/y"]


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    need_command("openssl", "apt-get install openssl")  # to make a certificate
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return key, cert


async def test_a_certificate_nobody_trusts_is_refused(certificate: tuple[Path, Path]) -> None:
    key, cert = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with serving(always(ok()), tls=tls) as server:
        session = session_for(server)
        with pytest.raises(NoAnswer, match=r"(?i)certificate"):
            await post(session, server)
        await session.aclose()
    assert server.seen == []


# -- sorting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (NoAnswer("Server disconnected"), TransientProviderError),
        (TimeoutError("request timed out after 1 s"), TransientProviderError),
        (CannotSend("bad header"), PermanentProviderError),
        (RuntimeError("surprise"), PermanentProviderError),
    ],
)
def test_failures_are_sorted(error: Exception, kind: type[Exception]) -> None:
    sorted_ = transport_failure(error, f"m: {error}")
    assert type(sorted_) is kind
    assert str(sorted_).endswith(str(error))
