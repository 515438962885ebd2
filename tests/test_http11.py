"""The lean HTTP/1.1 client behind ``openai/`` (``transport = "auto"`` on asyncio).

A small threaded HTTP/1.1 server on loopback answers each request as the test scripts it:
keep-alive, ``Connection: close``, chunked, gzip, read-to-the-end, interim 100, a dropped
connection, garbage, or no answer at all. It counts connections and requests, so the tests
can say which connection each request used.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import select
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mhsafeeval.runtime.providers._http11 import (
    CannotConnect,
    ConnectionClosed,
    Http11Client,
    MalformedResponse,
)
from needs import need_command

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client is asyncio's (trio calls go through the SDK)


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

    def pending(self) -> bool:
        """A request was read, or bytes of one wait unread on a connection."""
        with self._lock:
            if self.seen:
                return True
            socks = list(self._socks)
        readable, _, _ = select.select(socks, [], [], 0) if socks else ([], [], [])
        return bool(readable)

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


def client_for(server: Server, limit: int = 4, **kwargs: object) -> Http11Client:
    headers = {"Authorization": "Bearer k"}
    return Http11Client(server.url, headers, limit=limit, **kwargs)  # type: ignore[arg-type]


def always(answer: bytes) -> Script:
    return lambda _: answer


# -- the request ------------------------------------------------------------------------------


async def test_a_request_is_sent_as_written() -> None:
    with serving(always(ok())) as server:
        client = client_for(server)
        got = await client.post("/chat/completions", b'{"a": 1}', headers={"X-Team": "s"})
        await client.close()
    assert (got.status, json.loads(got.body)) == (200, {"ok": True})
    assert got.headers["content-type"] == "application/json"
    (seen,) = server.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/chat/completions", b'{"a": 1}')
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"
    assert seen.headers["authorization"] == "Bearer k"
    assert seen.headers["x-team"] == "s"
    assert seen.headers["content-length"] == "8"


async def test_the_request_leaves_before_the_caller_first_waits() -> None:
    """On a kept-alive connection the whole request is written in the calling task's own
    step: no other task or callback runs first (aiohttp before Python 3.12 writes the body
    from a task of its own, one more event-loop pass per call; see the module docstring)."""
    from mhsafeeval.runtime.providers._openai import _JSON, _LeanClient, _new_client

    with serving(always(ok())) as server:
        client = _new_client(server.url, "k", {}, 4, "auto")
        assert isinstance(client, _LeanClient)
        await client.chat(b"{}", limit_s=5.0, headers=_JSON)  # a connection to keep
        with server._lock:
            server.seen.clear()
        loop = asyncio.get_running_loop()
        probed: list[bool] = []
        task = loop.create_task(client.chat(b"{}", limit_s=5.0, headers=_JSON))
        loop.call_soon(lambda: probed.append(server.pending()))  # runs after the task's step
        await task
        await client.close()
    assert probed == [True]


def test_a_header_with_a_line_break_or_one_the_client_sets_is_refused() -> None:
    with pytest.raises(ValueError, match="X-Bad"):
        Http11Client("http://127.0.0.1:1/v1", {"X-Bad": "a\r\nInjected: yes"}, limit=1)
    with pytest.raises(ValueError, match="the client's own"):
        Http11Client("http://127.0.0.1:1/v1", {"content-length": "9"}, limit=1)


def test_only_http_and_https_addresses() -> None:
    with pytest.raises(ValueError, match="ftp://"):
        Http11Client("ftp://example.org/v1", {}, limit=1)


# -- connections ------------------------------------------------------------------------------


async def test_one_kept_alive_connection_serves_requests_one_after_another() -> None:
    with serving(always(ok())) as server:
        client = client_for(server)
        for _ in range(5):
            assert (await client.post("/x", b"{}")).status == 200
        assert client.connections == 1
        await client.close()
    assert server.connections == 1
    assert [s.index for s in server.seen] == [0, 1, 2, 3, 4]


async def test_at_most_limit_connections_and_every_request_answered() -> None:
    with serving(always(ok()), delay=0.1) as server:
        client = client_for(server, limit=2)
        answers = await asyncio.gather(*(client.post("/x", b"{}") for _ in range(6)))
        await client.close()
    assert [a.status for a in answers] == [200] * 6
    assert server.most_open <= 2
    assert server.connections == 2


async def test_connection_close_is_honoured() -> None:
    with serving(always(ok(extra="Connection: close\r\n"))) as server:
        client = client_for(server)
        for _ in range(3):
            assert (await client.post("/x", b"{}")).status == 200
        await client.close()
    assert server.connections == 3


async def test_an_http10_answer_read_to_the_end_of_the_connection() -> None:
    answer = b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"to": "the end"}'
    with serving(always(answer)) as server:
        client = client_for(server)
        first = await client.post("/x", b"{}")
        second = await client.post("/x", b"{}")
        await client.close()
    assert json.loads(first.body) == json.loads(second.body) == {"to": "the end"}
    assert server.connections == 2


async def test_a_chunked_answer() -> None:
    body = b'{"chunked": "yes, in three parts"}'
    parts = [body[:5], body[5:20], body[20:]]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    with serving(always(answer)) as server:
        client = client_for(server)
        got = [await client.post("/x", b"{}") for _ in range(2)]
        await client.close()
    assert [g.body for g in got] == [body, body]
    assert server.connections == 1  # the connection was kept


async def test_a_gzip_answer_is_decoded() -> None:
    packed = gzip.compress(b'{"zipped": true}')
    with serving(always(ok(packed, extra="Content-Encoding: gzip\r\n"))) as server:
        client = client_for(server)
        got = await client.post("/x", b"{}")
        await client.close()
    assert json.loads(got.body) == {"zipped": True}


async def test_an_interim_100_is_skipped() -> None:
    with serving(always(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b'{"n": 2}'))) as server:
        client = client_for(server)
        got = await client.post("/x", b"{}")
        await client.close()
    assert (got.status, got.body) == (200, b'{"n": 2}')


async def test_an_error_status_comes_back_with_its_headers() -> None:
    answer = ok(
        b'{"error": "slow down"}', status="429 Too Many Requests", extra="Retry-After: 7\r\n"
    )
    with serving(always(answer)) as server:
        client = client_for(server)
        got = await client.post("/x", b"{}")
        await client.close()
    assert (got.status, got.headers["retry-after"]) == (429, "7")


# -- failures ---------------------------------------------------------------------------------


async def test_a_kept_connection_that_drops_a_request_is_an_error_never_a_second_post() -> None:
    """The server may have read (and worked on) the request before it closed: resending a
    POST could make a model call twice. The caller's retry policy decides (ResilientClient)."""

    def script(seen: Seen) -> Answer:
        return None if (seen.connection, seen.index) == (0, 1) else ok()

    with serving(script) as server:
        client = client_for(server)
        assert (await client.post("/x", b"{}")).status == 200
        with pytest.raises(ConnectionClosed, match="Server disconnected"):
            await client.post("/x", b"{}")
        assert (await client.post("/x", b"{}")).status == 200  # on a new connection
        await client.close()
    assert [(s.connection, s.index) for s in server.seen] == [(0, 0), (0, 1), (1, 0)]


async def test_a_reset_in_a_read_to_the_end_answer_is_an_error_not_a_short_body() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    with serving(always(b"reset:" + head + b'{"choices": [')) as server:
        client = client_for(server)
        with pytest.raises(ConnectionClosed):
            await client.post("/x", b"{}")
        await client.close()


async def test_an_idle_connection_past_its_limit_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mhsafeeval.runtime.providers import _http11

    monkeypatch.setattr(_http11, "IDLE_S", 0.1)
    with serving(always(ok())) as server:
        client = client_for(server)
        await client.post("/x", b"{}")
        await client.post("/x", b"{}")  # at once: the same connection
        await asyncio.sleep(0.3)
        await client.post("/x", b"{}")  # idle too long: a new one
        await client.close()
    assert [(s.connection, s.index) for s in server.seen] == [(0, 0), (0, 1), (1, 0)]


async def test_the_servers_keep_alive_timeout_is_heeded() -> None:
    with serving(always(ok(extra="Keep-Alive: timeout=0.25\r\n"))) as server:
        client = client_for(server)
        await client.post("/x", b"{}")
        await client.post("/x", b"{}")
        await asyncio.sleep(0.4)  # past what the server said (less a margin): not reused
        await client.post("/x", b"{}")
        await client.close()
    assert [(s.connection, s.index) for s in server.seen] == [(0, 0), (0, 1), (1, 0)]


async def test_a_new_connection_dropped_is_an_error_not_a_retry() -> None:
    with serving(lambda _: None) as server:
        client = client_for(server)
        with pytest.raises(ConnectionClosed, match="Server disconnected"):
            await client.post("/x", b"{}")
        await client.close()
    assert len(server.seen) == 1


async def test_garbage_is_a_malformed_answer() -> None:
    with serving(always(b"SMTP ready, not HTTP at all\r\n\r\n")) as server:
        client = client_for(server)
        with pytest.raises(MalformedResponse, match=r"not HTTP/1\.1"):
            await client.post("/x", b"{}")
        await client.close()
    assert issubclass(MalformedResponse, ConnectionError)


async def test_no_server_cannot_connect() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Http11Client(f"http://127.0.0.1:{port}/v1", {}, limit=1)
    with pytest.raises(CannotConnect, match=re.escape(f"127.0.0.1:{port}")):
        await client.post("/x", b"{}")
    assert client.connections == 0
    await client.close()


def hold_the_first_connection(seen: Seen) -> Answer:
    """Never answer on the first connection; answer on every later one."""
    return b"hold" if seen.connection == 0 else ok()


async def test_a_timeout_closes_the_connection_and_the_next_request_gets_a_new_one() -> None:
    with serving(hold_the_first_connection) as server:
        client = client_for(server, limit=1)
        with pytest.raises(TimeoutError, match=r"after 0\.2 s"):
            await client.post("/x", b"{}", limit_s=0.2)
        assert (await client.post("/x", b"{}", limit_s=5)).status == 200
        await client.close()
    assert server.connections == 2


async def test_a_cancelled_request_frees_its_slot_and_its_connection_is_not_reused() -> None:
    with serving(hold_the_first_connection) as server:
        client = client_for(server, limit=1)
        task = asyncio.ensure_future(client.post("/x", b"{}"))
        for _ in range(200):
            if server.seen:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await client.post("/x", b"{}", limit_s=5)).status == 200
        await client.close()
    assert server.connections == 2


async def test_waiting_for_a_connection_counts_in_the_timeout() -> None:
    with serving(hold_the_first_connection) as server:
        client = client_for(server, limit=1)
        holder = asyncio.ensure_future(client.post("/x", b"{}"))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError, match="waiting for a connection"):
            await client.post("/x", b"{}", limit_s=0.2)
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
        await client.close()


async def test_a_request_granted_a_slot_as_the_client_closes_is_not_sent() -> None:
    with serving(always(ok()), delay=0.2) as server:
        client = client_for(server, limit=1)
        # Its first step runs once this task waits inside the first request, which has
        # taken the one slot by then: it queues for the slot.
        second = asyncio.ensure_future(client.post("/x", b"{}"))
        assert (await client.post("/x", b"{}")).status == 200  # hands the slot on...
        await client.close()  # ...to the second, which runs after this
        with pytest.raises(ConnectionClosed, match="closed"):
            await second
    assert len(server.seen) == 1


async def test_a_closed_client_refuses_requests() -> None:
    with serving(always(ok())) as server:
        client = client_for(server)
        await client.post("/x", b"{}")
        await client.close()
        assert client.is_closed() and client.connections == 0
        with pytest.raises(ConnectionClosed, match="closed"):
            await client.post("/x", b"{}")


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


async def test_https_with_a_trusted_certificate(certificate: tuple[Path, Path]) -> None:
    key, cert = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with serving(always(ok()), tls=tls) as server:
        trusted = ssl.create_default_context(cafile=str(cert))
        client = client_for(server, ssl_context=trusted)
        got = [await client.post("/x", b"{}") for _ in range(2)]
        await client.close()
        untrusting = client_for(server)  # the system's certificates only
        with pytest.raises(CannotConnect, match=r"(?i)certificate"):
            await untrusting.post("/x", b"{}")
        await untrusting.close()
    assert [g.status for g in got] == [200, 200]
    assert server.connections >= 2  # one kept for both requests, one refused


async def test_a_calls_header_replaces_the_clients_of_the_same_name() -> None:
    with serving(always(ok())) as server:
        headers = {"Accept": "text/plain", "X-Team": "a", "host": f"127.0.0.1:{server.port}"}
        client = Http11Client(server.url, headers, limit=1)
        await client.post("/x", b"{}", headers={"accept": "application/json"})
        await client.post("/x", b"{}")
        await client.close()
    first, second = server.seen
    assert first.names.count("accept") == second.names.count("accept") == 1
    assert first.names.count("host") == 1
    assert (first.headers["accept"], first.headers["x-team"]) == ("application/json", "a")
    assert (second.headers["accept"], second.headers["x-team"]) == ("text/plain", "a")
