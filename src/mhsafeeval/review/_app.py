"""The workbench as an ASGI application (Starlette): who may ask, and what each page does.

Security model, in the order a request meets it:

1. **Host**: only ``127.0.0.1:PORT`` or ``localhost:PORT`` (a page on another site that
   resolves its own name to 127.0.0.1, DNS rebinding, is refused).
2. **Access token**: a random token in the printed URL (``?token=``), as Jupyter does. The
   first request with it gets two cookies (``HttpOnly``, ``SameSite=Strict``): the token and a
   random session id, and is redirected to the same page without the token, so it stays out
   of the history and of any ``Referer`` (sent to this origin only). Without either, 403.
3. **CSRF**: every POST carries ``csrf``, an HMAC of the session id under a key that lives
   only in this process; a POST without it, or with another session's, is refused (403), and
   so is one whose ``Origin`` is not this server.
4. **Output**: every text is escaped (:func:`~mhsafeeval.review._html.text_html`); the
   Content-Security-Policy allows this server's own script and stylesheet only (no inline
   script or style, no other origin, no frames, forms post only here).
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, Collection
from importlib import resources
from typing import TypedDict
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from . import _html
from ._session import ReviewError, ReviewSession, check_person

__all__ = ["CSP", "ReviewApp", "create_app"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""The Content-Security-Policy of every response."""

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
MAX_BODY = 64 * 1024
STATIC = {"review.js": "text/javascript", "review.css": "text/css"}

Endpoint = Callable[[Request], Awaitable[Response]]


class ReviewApp:
    """The workbench's request handling around one :class:`ReviewSession`.

    Args:
        session: The campaign's review session.
        token: The access token (None: a fresh random one).
        hosts: The ``Host`` values accepted (``127.0.0.1:PORT`` and ``localhost:PORT``).
        cookie: A suffix for the cookie names (the port: browsers share cookies between the
            ports of one host).
    """

    def __init__(
        self,
        session: ReviewSession,
        *,
        token: str | None = None,
        hosts: Collection[str],
        cookie: str = "",
    ) -> None:
        self.session = session
        self.token = token or secrets.token_urlsafe(24)
        self._key = secrets.token_bytes(32)
        self.hosts = frozenset(h.lower() for h in hosts)
        self.origins = frozenset(f"http://{h}" for h in self.hosts)
        self.token_cookie = f"mhsafeeval_review_token_{cookie}"
        self.session_cookie = f"mhsafeeval_review_session_{cookie}"
        self.rater_cookie = f"mhsafeeval_review_rater_{cookie}"

    # -- the guard every request passes -----------------------------------------------------

    def csrf_for(self, session_id: str) -> str:
        """The CSRF token of a browser session."""
        return hmac.new(self._key, f"csrf:{session_id}".encode(), "sha256").hexdigest()

    def guarded(self, endpoint: Endpoint, *, write: bool = False) -> Endpoint:
        """``endpoint`` behind the host, token and (``write``) CSRF checks, with the security
        headers on whatever it answers."""

        async def handle(request: Request) -> Response:
            response = await self._check(request, endpoint, write)
            response.headers.update(HEADERS)
            return response

        return handle

    async def _check(self, request: Request, endpoint: Endpoint, write: bool) -> Response:
        host = request.headers.get("host", "").lower()
        if host not in self.hosts:
            return PlainTextResponse("forbidden: unknown host", status_code=403)
        given = request.query_params.get("token")
        cookie = request.cookies.get(self.token_cookie, "")
        if given is not None and not write:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return _forbidden()
            query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(query)}" if query else "")
            response = RedirectResponse(target, status_code=303)
            self._set(response, self.token_cookie, self.token)
            if not request.cookies.get(self.session_cookie):
                self._set(response, self.session_cookie, secrets.token_urlsafe(24))
            return response
        if not hmac.compare_digest(cookie.encode(), self.token.encode()):
            return _forbidden()
        session_id = request.cookies.get(self.session_cookie, "")
        if not session_id:
            return _forbidden()
        request.state.csrf = self.csrf_for(session_id)
        if write:
            origin = request.headers.get("origin")
            if origin is not None and origin.lower() not in self.origins:
                return PlainTextResponse("forbidden: cross-origin request", status_code=403)
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/x-www-form-urlencoded":
                return PlainTextResponse("expected a form", status_code=415)
            body = await _read_body(request)
            if body is None:
                return PlainTextResponse("request too large", status_code=413)
            form = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
            sent = form.get("csrf", "")
            if not hmac.compare_digest(sent.encode(), request.state.csrf.encode()):
                return PlainTextResponse("forbidden: missing or wrong CSRF token", status_code=403)
            request.state.form = form
        return await endpoint(request)

    def _set(self, response: Response, name: str, value: str) -> None:
        response.set_cookie(name, value, httponly=True, samesite="strict", path="/")

    def _rater(self, request: Request) -> str | None:
        name = request.cookies.get(self.rater_cookie)
        if not name:
            return None
        try:
            return check_person(name)
        except ReviewError:
            return None

    # -- pages ------------------------------------------------------------------------------

    def _status(self) -> str:
        p = self.session.state.progress(self.session.position)
        return (
            f"{self.session.campaign}: {p['rated']} of {p['items']} items rated by "
            f"{self.session.state.raters_per_item}, {p['to_adjudicate']} to adjudicate, "
            f"{p['decided']} decided"
        )

    async def home(self, request: Request) -> Response:
        """Where a rater resumes: their first item still short of raters."""
        rater = self._rater_from_url(request)
        if isinstance(rater, Response):
            return rater
        if rater is None:
            return RedirectResponse("/start", status_code=303)
        pos = self.session.state.resume(self.session.ids, rater)
        if pos is not None:
            return RedirectResponse(f"/item/{pos}", status_code=303)
        waiting = len(self.session.state.to_adjudicate(self.session.ids, rater))
        return HTMLResponse(
            _html.done_page(
                csrf=request.state.csrf, rater=rater, status=self._status(), adjudicate=waiting
            )
        )

    def _rater_from_url(self, request: Request) -> str | Response | None:
        """The rater named by ``?rater=`` (kept in the cookie from then on), else the cookie's."""
        named = request.query_params.get("rater")
        if named is None:
            return self._rater(request)
        try:
            rater = check_person(named)
        except ReviewError as exc:
            return HTMLResponse(_html.error_page(str(exc)), status_code=400)
        response = RedirectResponse(request.url.path, status_code=303)
        self._set(response, self.rater_cookie, rater)
        return response

    async def start(self, request: Request) -> Response:
        """Ask for the person's name."""
        page = _html.start_page(request.state.csrf, self.session.campaign)
        return HTMLResponse(page)

    async def start_post(self, request: Request) -> Response:
        """Keep the name in a cookie and go to the queue."""
        try:
            rater = check_person(request.state.form.get("rater", ""))
        except ReviewError as exc:
            page = _html.start_page(request.state.csrf, self.session.campaign, str(exc))
            return HTMLResponse(page, status_code=400)
        response = RedirectResponse("/", status_code=303)
        self._set(response, self.rater_cookie, rater)
        return response

    async def item(self, request: Request) -> Response:
        """A rater's page of one queued item."""
        rater = self._rater_from_url(request)
        if isinstance(rater, Response):
            return rater
        if rater is None:
            return RedirectResponse("/start", status_code=303)
        pos = int(request.path_params["pos"])
        if not 0 <= pos < len(self.session.queue):
            return HTMLResponse(_html.error_page("no such item"), status_code=404)
        item = self.session.queue[pos]
        state = self.session.state
        before, after = state.neighbours(self.session.ids, pos, rater)
        page = _html.item_page(
            csrf=request.state.csrf,
            rater=rater,
            item=item,
            position=pos,
            total=len(self.session.queue),
            previous=before,
            following=after,
            taxonomy=self.session.taxonomy,
            given=state.rating(item.id, rater),
            unblinded=(item.id, rater) in state.unblinded,
            status=self._status(),
        )
        return HTMLResponse(page)

    async def rate(self, request: Request) -> Response:
        """Store a rating, then go to the rater's next item."""
        rater = self._rater(request)
        if rater is None:
            return RedirectResponse("/start", status_code=303)
        form = request.state.form
        try:
            await self.session.rate(form.get("item", ""), rater, **_rating_fields(form))
        except ReviewError as exc:
            return HTMLResponse(_html.error_page(str(exc)), status_code=400)
        return RedirectResponse("/", status_code=303)

    async def unblind(self, request: Request) -> Response:
        """Record the unblinding and show the item with the judge's verdict."""
        rater = self._rater(request)
        if rater is None:
            return RedirectResponse("/start", status_code=303)
        item = request.state.form.get("item", "")
        try:
            await self.session.unblind(item, rater)
        except ReviewError as exc:
            return HTMLResponse(_html.error_page(str(exc)), status_code=400)
        return RedirectResponse(f"/item/{self.session.position[item]}", status_code=303)

    async def adjudicate(self, request: Request) -> Response:
        """The disputed items this person may decide."""
        person = self._rater(request)
        if person is None:
            return RedirectResponse("/start", status_code=303)
        positions = self.session.state.to_adjudicate(self.session.ids, person)
        page = _html.adjudication_list(
            csrf=request.state.csrf,
            person=person,
            items=[(p, self.session.queue[p]) for p in positions],
            status=self._status(),
        )
        return HTMLResponse(page)

    async def adjudicate_item(self, request: Request) -> Response:
        """One disputed item, its ratings side by side, and the decision form."""
        person = self._rater(request)
        if person is None:
            return RedirectResponse("/start", status_code=303)
        pos = int(request.path_params["pos"])
        state = self.session.state
        if not 0 <= pos < len(self.session.queue):
            return HTMLResponse(_html.error_page("no such item"), status_code=404)
        item = self.session.queue[pos]
        ratings = list(state.ratings.get(item.id, {}).values())
        if person in state.ratings.get(item.id, {}):
            message = "you rated this reply: a third person adjudicates it"
            return HTMLResponse(_html.error_page(message), status_code=403)
        if not state.disputed(item.id):
            return HTMLResponse(_html.error_page("its raters do not disagree"), status_code=404)
        page = _html.adjudication_page(
            csrf=request.state.csrf,
            person=person,
            item=item,
            position=pos,
            ratings=ratings,
            decision=state.decisions.get(item.id),
            taxonomy=self.session.taxonomy,
            status=self._status(),
        )
        return HTMLResponse(page)

    async def decide(self, request: Request) -> Response:
        """Store an adjudicator's decision, then back to the list."""
        person = self._rater(request)
        if person is None:
            return RedirectResponse("/start", status_code=303)
        form = request.state.form
        try:
            await self.session.decide(form.get("item", ""), person, **_rating_fields(form))
        except ReviewError as exc:
            return HTMLResponse(_html.error_page(str(exc)), status_code=400)
        return RedirectResponse("/adjudicate", status_code=303)

    async def static(self, request: Request) -> Response:
        """The page's one script and one stylesheet (package data)."""
        name = request.path_params["name"]
        kind = STATIC.get(name)
        if kind is None:
            return PlainTextResponse("not found", status_code=404)
        data = resources.files("mhsafeeval.review").joinpath("static", name).read_bytes()
        return Response(data, media_type=kind)

    def routes(self) -> list[Route]:
        """Every route, each behind :meth:`guarded`."""
        g = self.guarded
        return [
            Route("/", g(self.home), methods=["GET"]),
            Route("/start", g(self.start), methods=["GET"]),
            Route("/start", g(self.start_post, write=True), methods=["POST"]),
            Route("/item/{pos:int}", g(self.item), methods=["GET"]),
            Route("/rate", g(self.rate, write=True), methods=["POST"]),
            Route("/unblind", g(self.unblind, write=True), methods=["POST"]),
            Route("/adjudicate", g(self.adjudicate), methods=["GET"]),
            Route("/adjudicate/{pos:int}", g(self.adjudicate_item), methods=["GET"]),
            Route("/decide", g(self.decide, write=True), methods=["POST"]),
            Route("/static/{name}", g(self.static), methods=["GET"]),
            Route("/favicon.ico", g(self.no_icon), methods=["GET"]),
        ]

    async def no_icon(self, request: Request) -> Response:
        """No icon (the browser asks for one on every page)."""
        return Response(status_code=204)


def _forbidden() -> Response:
    return PlainTextResponse(
        "forbidden: open the URL that `mhsafeeval review` printed (it carries the access token)",
        status_code=403,
    )


async def _read_body(request: Request) -> str | None:
    """The request body as text, None when it is over :data:`MAX_BODY`."""
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_BODY:
        return None
    chunks = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


class RatingFields(TypedDict):
    """What a rating form carries, checked."""

    severity: int
    refused: bool
    understood: bool
    spans: list[tuple[int, int]]
    comment: str


def _rating_fields(form: dict[str, str]) -> RatingFields:
    """The rating a form carries (ReviewError: a field that is not one)."""
    try:
        severity = int(form.get("severity", ""))
        raw = json.loads(form.get("spans") or "[]")
        if not isinstance(raw, list) or not all(
            isinstance(s, list) and len(s) == 2 and all(type(x) is int for x in s) for s in raw
        ):
            raise ValueError(raw)
        spans = [(s, e) for s, e in raw]
    except (ValueError, TypeError):
        raise ReviewError(
            "a rating needs a severity of 1 to 5 and spans as [[start, end]]"
        ) from None
    return {
        "severity": severity,
        "refused": "refused" in form,
        "understood": "understood" in form,
        "spans": spans,
        "comment": form.get("comment", ""),
    }


def create_app(
    session: ReviewSession, *, port: int, token: str | None = None
) -> tuple[Starlette, ReviewApp]:
    """The workbench's ASGI application for a server on ``127.0.0.1:port``."""
    review = ReviewApp(
        session, token=token, hosts=(f"127.0.0.1:{port}", f"localhost:{port}"), cookie=str(port)
    )
    return Starlette(routes=review.routes()), review
