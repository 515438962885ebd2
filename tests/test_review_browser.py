"""The workbench in a real browser (Debian's chromium under Playwright): rate with the keys,
comment, mark spans (across invisible characters), reload and resume, unblind, and adjudicate
as a third person; hostile model text stays inert throughout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mhsafeeval.review import ReviewRating
from test_html_report import _chromium, _sync_api
from test_review import HOSTILE, campaign_events, read_back, running, write_campaign

pytestmark = pytest.mark.timeout(300)

SELECT = """([startText, startAt, endText, endAt, whole]) => {
  const reply = document.getElementById('reply');
  const walker = document.createTreeWalker(reply, NodeFilter.SHOW_TEXT);
  const nodes = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.parentElement.closest('.ctl')) nodes.push(n);
  }
  const a = nodes.find((n) => n.data.includes(startText));
  const fits = (n) => (whole ? n.data === endText : n.data.includes(endText));
  const b = nodes.slice(nodes.indexOf(a)).find(fits);
  if (!a || !b) return false;
  const range = document.createRange();
  range.setStart(a, a.data.indexOf(startText) + startAt);
  range.setEnd(b, b.data.indexOf(endText) + endAt);
  const sel = window.getSelection();
  sel.removeAllRanges();
  sel.addRange(range);
  return true;
}"""


def _sign_in(page: Any, url: str, name: str) -> None:
    page.goto(url)
    page.wait_for_selector("#rater")
    page.fill("#rater", name)
    page.press("#rater", "Enter")
    page.wait_for_selector("body[data-ready='1'] #reply")


def test_rate_mark_resume_and_adjudicate_in_a_browser(tmp_path: Path) -> None:
    sync_api = _sync_api()
    db = tmp_path / "campaign.db"
    write_campaign(db, campaign_events(seed=31, hostile_first=True))
    errors: list[str] = []
    requests: list[str] = []
    with running(db, safe_sample=100) as server, sync_api.sync_playwright() as p:
        base = server.url.split("/?")[0]
        queue = server.session.queue
        hostile = next(pos for pos, item in enumerate(queue) if item.reply == HOSTILE)
        item = queue[hostile]
        browser = _chromium(p)
        try:

            def new_page() -> Any:
                page = browser.new_context().new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("request", lambda r: requests.append(r.url))
                return page

            ann = new_page()
            _sign_in(ann, server.url, "ann")
            assert "token=" not in ann.url  # the token leaves the address bar at once
            ann.goto(f"{base}/item/{hostile}")
            ann.wait_for_selector("body[data-ready='1']")
            reply = ann.locator("#reply")
            text = reply.inner_text()
            assert "<script>window.__pwned = 1</script>" in text  # shown as text, not run
            assert "U+202E" in text and "U+200B" in text and "U+FEFF" in text
            assert ann.evaluate("typeof window.__pwned") == "undefined"
            assert item.reasoning not in ann.content()  # blinded
            assert ann.locator("#judge").count() == 0

            ann.keyboard.press("4")
            ann.keyboard.press("r")
            assert ann.evaluate(SELECT, ["trust only me", 0, "trust only me", 13, False])
            ann.keyboard.press("m")
            # From "Re" to the lone "d" between the zero-width characters: across markers.
            assert ann.evaluate(SELECT, ["Re", 0, "d", 1, True])
            ann.keyboard.press("m")
            spans = json.loads(ann.input_value("#spans"))
            first = HOSTILE.index("trust only me")
            second = (HOSTILE.index("Re\u202e"), HOSTILE.index("d\ufeff") + 1)
            assert spans == [[first, first + 13], list(second)]
            assert reply.locator("mark").count() == 2
            ann.keyboard.press("t")
            ann.keyboard.type("Pulls the client away from others.")
            ann.keyboard.press("Escape")
            ann.keyboard.press("Enter")
            ann.wait_for_url(lambda u: f"/item/{hostile}" not in u)
            rating = server.session.state.rating(item.id, "ann")
            assert rating is not None
            assert (rating.severity, rating.refused, rating.understood) == (4, True, True)
            assert [(s.start, s.end) for s in rating.spans] == [(first, first + 13), second]
            assert rating.comment == "Pulls the client away from others."
            assert rating.blinded

            # Reload: the rater resumes at their first unrated item, and finds their rating.
            ann.reload()
            ann.goto(base + "/")
            ann.wait_for_selector("body[data-ready='1'] #reply")
            resumed = int(ann.get_attribute(".position", "data-position") or "-1")
            assert resumed == server.session.state.resume(server.session.ids, "ann")
            assert resumed != hostile
            ann.goto(f"{base}/item/{hostile}")
            ann.wait_for_selector("body[data-ready='1']")
            assert ann.is_checked("#severity-4") and ann.is_checked("#refused")
            assert ann.input_value("#comment") == "Pulls the client away from others."
            assert ann.locator("#reply mark").count() == 2
            assert "trust only me" in ann.inner_text("#span-list")

            # Unblinding, after rating, is recorded and shows the judge's verdict.
            ann.keyboard.press("b")
            ann.wait_for_selector("#judge")
            assert item.reasoning in ann.inner_text("#judge")
            assert (item.id, "ann") in server.session.state.unblinded

            # A second rater disagrees (4 against 1): the item goes to adjudication.
            bob = new_page()
            _sign_in(bob, server.url, "bob")
            bob.goto(f"{base}/item/{hostile}")
            bob.wait_for_selector("body[data-ready='1']")
            bob.keyboard.press("1")
            bob.keyboard.press("Enter")
            bob.wait_for_url(lambda u: f"/item/{hostile}" not in u)
            assert server.session.state.needs_adjudication(item.id)
            bob.goto(f"{base}/adjudicate")
            assert bob.locator("#no-disputes").count() == 1  # never a rater's own item

            cy = new_page()
            _sign_in(cy, server.url, "cy")
            cy.keyboard.press("a")
            cy.wait_for_selector("#disputes")
            cy.click(f'a[href="/adjudicate/{hostile}"]')
            cy.wait_for_selector("body[data-ready='1'] #ratings")
            severities = cy.locator("#ratings td.sev").all_inner_texts()
            assert sorted(severities) == ["1", "4"]
            assert "Pulls the client away from others." in cy.inner_text("#ratings")
            assert item.reasoning not in cy.content()  # the judge stays hidden here too
            cy.keyboard.press("2")
            cy.keyboard.press("Enter")
            cy.wait_for_selector("#no-disputes")
            decision = server.session.state.decisions[item.id]
            assert (decision.adjudicator, decision.severity) == ("cy", 2)
            assert set(decision.ratings) == {
                r.id for r in server.session.state.ratings[item.id].values()
            }
            for page in (ann, bob, cy):
                assert page.evaluate("typeof window.__pwned") == "undefined"
            ann.screenshot(path=str(tmp_path / "review.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert all(u.startswith(base + "/") for u in requests), requests
    stored = [e for e in read_back(db) if isinstance(e, ReviewRating)]
    assert sorted((e.rater, e.severity) for e in stored) == [("ann", 4), ("bob", 1)]
