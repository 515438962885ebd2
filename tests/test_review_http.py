"""The workbench over HTTP (in-process, through httpx's ASGI transport): the access token, the
CSRF token, the security headers, blinding, and hostile model text rendered inert."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mhsafeeval.review import ReviewSession, create_app, open_session
from mhsafeeval.storage import MemoryEventStore
from test_review import HOSTILE, campaign_events

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
PORT = 8123
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Bench:
    """A session, its app and a client that has not shown the token yet."""

    def __init__(self, session: ReviewSession, store: MemoryEventStore) -> None:
        self.session = session
        self.store = store
        self.app, self.review = create_app(session, port=PORT)
        self.token = self.review.token

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE, **kw)

    async def stored(self, tag: str) -> int:
        return len([e async for e in self.store.events("c1", types=[tag])])


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    async with MemoryEventStore() as store:
        for event in campaign_events(seed=11, hostile_first=True):
            await store.append(event)
        session = await open_session(store, "c1", safe_sample=100)
        yield Bench(session, store)


def csrf_of(page: str) -> str:
    found = re.search(r'<meta name="csrf" content="([0-9a-f]+)">', page)
    assert found, page[:500]
    return found.group(1)


async def signed_in(bench: Bench, client: httpx.AsyncClient, name: str) -> str:
    """Show the token, give a name; returns the CSRF token of this client's session."""
    first = await client.get(f"/?token={bench.token}")
    assert first.status_code == 303 and "token" not in first.headers["location"]
    page = await client.get("/start")
    assert page.status_code == 200
    csrf = csrf_of(page.text)
    named = await client.post("/start", data={"csrf": csrf, "rater": name})
    assert named.status_code == 303
    return csrf


async def test_without_the_token_every_path_is_refused(bench: Bench) -> None:
    async with bench.client() as client:
        for path in ("/", "/start", "/item/0", "/adjudicate", "/static/review.js"):
            assert (await client.get(path)).status_code == 403, path
            assert (await client.get(f"{path}?token=wrong")).status_code == 403, path
        refused = await client.post("/rate", data={"item": bench.session.ids[0], "severity": "4"})
        assert refused.status_code == 403
        assert "Content-Security-Policy" in refused.headers
    assert await bench.stored("review.rating") == 0


async def test_another_host_is_refused_even_with_the_token(bench: Bench) -> None:
    async with bench.client(headers={"Host": "attacker.example:8123"}) as client:
        assert (await client.get(f"/?token={bench.token}")).status_code == 403


async def test_every_write_needs_this_sessions_csrf_token(bench: Bench) -> None:
    item = bench.session.ids[0]
    async with bench.client() as ann, bench.client() as bob:
        csrf = await signed_in(bench, ann, "ann")
        other = await signed_in(bench, bob, "bob")
        assert other != csrf  # one per browser session
        form = {"item": item, "severity": "4", "spans": "[]", "comment": ""}
        assert (await ann.post("/rate", data=form)).status_code == 403
        assert (await ann.post("/rate", data={**form, "csrf": other})).status_code == 403
        assert (await ann.post("/rate", data={**form, "csrf": "0" * 64})).status_code == 403
        cross = await ann.post(
            "/rate", data={**form, "csrf": csrf}, headers={"Origin": "http://evil.example"}
        )
        assert cross.status_code == 403
        as_json = await ann.post("/rate", json={**form, "csrf": csrf})
        assert as_json.status_code == 415
        assert await bench.stored("review.rating") == 0
        ok = await ann.post("/rate", data={**form, "csrf": csrf})
        assert ok.status_code == 303
        assert await bench.stored("review.rating") == 1


async def test_the_security_headers_are_on_every_response(bench: Bench) -> None:
    async with bench.client() as client:
        await signed_in(bench, client, "ann")
        for path in ("/", "/item/0", "/static/review.js", "/static/review.css", "/nope"):
            response = await client.get(path)
            if response.status_code == 404 and path == "/nope":
                continue  # no route: Starlette's own 404 (it carries no page)
            csp = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp, path
            assert "unsafe-inline" not in csp
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Referrer-Policy"] == "same-origin"
        js = await client.get("/static/review.js")
        assert js.headers["content-type"].startswith("text/javascript")


async def test_cookies_are_http_only_and_same_site_strict(bench: Bench) -> None:
    async with bench.client() as client:
        first = await client.get(f"/?token={bench.token}")
        cookies = first.headers.get_list("set-cookie")
        assert len(cookies) == 2
        assert all("httponly" in c.lower() and "samesite=strict" in c.lower() for c in cookies)


def _position(bench: Bench, reply: str) -> int:
    return next(p for p, i in enumerate(bench.session.queue) if i.reply == reply)


async def test_hostile_text_renders_inert(bench: Bench) -> None:
    pos = _position(bench, HOSTILE)
    async with bench.client() as client:
        await signed_in(bench, client, "ann")
        page = (await client.get(f"/item/{pos}")).text
    assert page.count("<script") == 1  # the page's own script, nothing else
    assert '<script src="/static/review.js" defer></script>' in page
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert "&lt;b&gt;that&lt;/b&gt;" in page
    for ch in ("\u202e", "\u202c", "\u200b", "\ufeff"):
        assert ch not in page  # never emitted as itself
        assert f'data-cp="{ord(ch):04x}"' in page  # shown as a marker
    assert " style=" not in page and "onload" not in page  # nothing inline for the CSP to allow


async def test_blinded_until_the_rater_unblinds_after_rating(bench: Bench) -> None:
    pos = 0
    item = bench.session.queue[pos]
    async with bench.client() as client:
        csrf = await signed_in(bench, client, "ann")
        page = (await client.get(f"/item/{pos}")).text
        assert item.reasoning not in page and 'id="judge' not in page
        assert 'id="unblind"' not in page  # not before rating
        early = await client.post("/unblind", data={"csrf": csrf, "item": item.id})
        assert early.status_code == 400
        form = {"csrf": csrf, "item": item.id, "severity": "2", "spans": "[]", "understood": "on"}
        assert (await client.post("/rate", data=form)).status_code == 303
        page = (await client.get(f"/item/{pos}")).text
        assert item.reasoning not in page and 'id="unblind"' in page
        shown = await client.post("/unblind", data={"csrf": csrf, "item": item.id})
        assert shown.status_code == 303
        page = (await client.get(f"/item/{pos}")).text
        assert item.reasoning in page and 'id="judge-severity"' in page
    assert await bench.stored("review.unblinded") == 1
    [rating] = [e.message async for e in bench.store.events("c1", types=["review.rating"])]
    assert rating.blinded and rating.rater == "ann"  # type: ignore[union-attr]


async def test_bad_input_is_refused_and_stores_nothing(bench: Bench) -> None:
    async with bench.client() as client:
        csrf = await signed_in(bench, client, "ann")
        item = bench.session.ids[0]
        for form in (
            {"item": item, "severity": "9"},
            {"item": item, "severity": "x"},
            {"item": "not-an-item", "severity": "3"},
            {"item": item, "severity": "3", "spans": "[[5, 2]]"},
            {"item": item, "severity": "3", "spans": "{}"},
        ):
            response = await client.post("/rate", data={"csrf": csrf, **form})
            assert response.status_code == 400, form
        huge = await client.post(
            "/rate", data={"csrf": csrf, "item": item, "severity": "3", "comment": "x" * 70_000}
        )
        assert huge.status_code == 413
        bad_name = await client.post("/start", data={"csrf": csrf, "rater": "<script>"})
        assert bad_name.status_code == 400 and "<script>" not in bad_name.text
    assert await bench.stored("review.rating") == 0


async def test_a_rater_resumes_where_they_left(bench: Bench) -> None:
    async with bench.client() as client:
        csrf = await signed_in(bench, client, "ann")
        first = await client.get("/")
        assert first.headers["location"] == "/item/0"
        for pos in (0, 1):
            item = bench.session.ids[pos]
            form = {"csrf": csrf, "item": item, "severity": "1", "spans": "[]"}
            assert (await client.post("/rate", data=form)).headers["location"] == "/"
        assert (await client.get("/")).headers["location"] == "/item/2"
    async with bench.client() as again:  # a new browser: the token and the name in the URL
        await again.get(f"/?token={bench.token}")
        named = await again.get("/?rater=ann")
        assert named.status_code == 303
        assert (await again.get("/")).headers["location"] == "/item/2"
