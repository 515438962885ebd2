"""Serving the workbench: one uvicorn server on 127.0.0.1 around one campaign's session."""

from __future__ import annotations

import contextlib
import errno
import socket
import webbrowser
from collections.abc import Callable
from pathlib import Path

import anyio

from mhsafeeval.errors import InputError
from mhsafeeval.taxonomy import Taxonomy

from ._session import ReviewSession, open_session, pick_campaign

__all__ = ["ReviewServer", "serve"]


class ReviewServer:
    """A running workbench: its URL (with the access token) and a way to stop it."""

    def __init__(self, url: str, server: object, session: ReviewSession) -> None:
        self.url = url
        self.session = session
        self.campaign = session.campaign
        self._server = server

    def stop(self) -> None:
        """Ask the server to finish (from any thread): it stops taking requests, answers those
        in flight, and :func:`serve` returns once the store is flushed and closed."""
        self._server.should_exit = True  # type: ignore[attr-defined]


def _bind(port: int) -> socket.socket:
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # whose proto says TCP, and accepted sockets inherit this one's. With proto 0 every answer
    # with a body waited ~40 ms on a kept-alive connection (Nagle against delayed ACKs).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind(("127.0.0.1", port))
    except (OSError, OverflowError) as exc:
        sock.close()
        busy = isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
        why = "is in use" if busy else f"cannot be used ({exc})"
        raise InputError(None, "--port", f"port {port} on 127.0.0.1 {why}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(
    db: Path,
    *,
    campaign: str | None = None,
    port: int = 0,
    open_browser: bool = True,
    raters_per_item: int = 2,
    safe_sample: int = 50,
    seed: int = 0,
    taxonomy: Taxonomy | None = None,
    token: str | None = None,
    started: Callable[[ReviewServer], None] | None = None,
) -> None:
    """Serve the review workbench of a campaign in ``db`` on ``127.0.0.1:port`` (0: a free
    port) until stopped; ``started`` is called with the running server (its URL holds the
    access token). The store is open for writing the whole time: this process is its one
    writer.

    Raises:
        InputError: ``db`` is not an event store, another process writes to it, the campaign
            is unknown or has nothing to review, or the port cannot be had.
    """
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - dependencies of the package since it had review
        raise InputError(
            None, "review", "needs starlette and uvicorn: pip install starlette uvicorn"
        ) from None
    from mhsafeeval.storage import SqliteEventStore

    from ._app import create_app

    if not await anyio.Path(db).is_file():
        raise InputError(db, None, "no such event store")
    sock = _bind(port)
    with contextlib.closing(sock):
        bound = sock.getsockname()[1]
        async with SqliteEventStore(db) as store:
            name = await pick_campaign(store, campaign, db)
            session = await open_session(
                store,
                name,
                seed=seed,
                safe_sample=safe_sample,
                raters_per_item=raters_per_item,
                taxonomy=taxonomy,
                source=db,
            )
            app, review = create_app(session, port=bound, token=token)
            config = uvicorn.Config(
                app,
                log_level="warning",
                lifespan="off",
                access_log=False,
                timeout_graceful_shutdown=3,
            )
            server = uvicorn.Server(config)
            handle = ReviewServer(
                f"http://127.0.0.1:{bound}/?token={review.token}", server, session
            )
            if started is not None:
                started(handle)
            if open_browser:
                webbrowser.open(handle.url)
            await server.serve(sockets=[sock])
