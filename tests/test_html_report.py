"""The HTML report: self-contained, escaped against hostile model text, and interactive."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.providers import CallParams, ChatMessage
from mhsafeeval.reports.export import archive_json
from mhsafeeval.reports.html import WARNING, build_html, embed_json, write_html
from mhsafeeval.reports.text import load_report
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.testing import demo_counselor, register_script, scripted_models
from needs import need, need_module

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = (
    ' <script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'
    " </script> \"quoted\" & 'single' <!-- -->"
)
SLIPS = {"dependency induction": 0.6, "gaslighting": 0.5, "over-pathologizing": 0.5}


def hostile_counselor(messages: Sequence[ChatMessage], params: CallParams) -> str:
    return demo_counselor(messages, params, slip_rates=SLIPS) + HOSTILE


register_script("hostile-counselor", hostile_counselor)

CONFIG = """
# a <b>config</b> comment with </script> in it & more
[campaign]
name = "html"
seed = 5
max_turns = 3
max_attempts = 3
conversations_per_profile = 2
concurrency = 2
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]
style = "guarded"

""" + scripted_models(counselors={"hostile": "hostile-counselor", "plain": "demo-counselor"})


PAGED = "paged.html"  # the same report, its transcripts in pages of about 20 attempts


async def _build(folder: Path) -> tuple[str, dict[str, Any], Any]:
    async with MemoryEventStore() as store:
        result = await run_campaign(parse_config(CONFIG, "html.toml"), store, config_text=CONFIG)
        assert result.status == "completed"
        page = await build_html(store, "html")
        archive = await archive_json(store, "html")
        (report,) = await load_report(store, "html")
        await write_html(store, "html", folder / PAGED, inline_attempts=0, page_attempts=10)
        return page, archive, report


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("paged")


@pytest.fixture(scope="module")
def built(paged: Path) -> tuple[str, dict[str, Any], Any]:
    return anyio.run(_build, paged)


def _data(page: str) -> list[dict[str, Any]]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    result: list[dict[str, Any]] = json.loads(found.group(1))
    return result


def test_page_is_self_contained_and_escaped(built: tuple[str, dict[str, Any], Any]) -> None:
    page, _, _ = built
    # Only two script elements: the JSON data block and the renderer (no injected ones).
    assert len(re.findall(r"<script", page, re.I)) == 2
    assert len(re.findall(r"</script", page, re.I)) == 2
    assert page.count('<script type="application/json" id="data">') == 1
    assert "<img" not in page
    assert "<!-- -->" not in page
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http://" not in page
    assert "https://" not in page
    assert "Content-Security-Policy" in page
    assert "default-src 'none'" in page
    # The hostile reply travels in the JSON block, intact after decoding.
    data = _data(page)
    replies = [a["reply"] for a in data[0]["attempts"] if a["reply"]]
    assert any(r.endswith(HOSTILE) for r in replies)


def test_content_warning_comes_first(built: tuple[str, dict[str, Any], Any]) -> None:
    page, _, _ = built
    body = page.split("<body>", 1)[1]
    assert body.startswith('<div class="warning"')
    assert "Content warning" in body[:400]
    assert "self-harm" in WARNING


def test_table_figures_and_config(built: tuple[str, dict[str, Any], Any]) -> None:
    page, _, report = built
    assert set(report.models) == {"hostile", "plain"}
    for m in report.models.values():
        assert m.overall_asr is not None
        assert f"<td>{m.overall_asr:.3f}</td>" in page
        assert f"<td>{m.asr_first_attempt:.3f}</td>" in page
        assert f"<td>{m.coverage:.3f}</td>" in page
        assert f"<td>{m.turns}</td>" in page
    assert "# a &lt;b&gt;config&lt;/b&gt; comment with &lt;/script&gt; in it &amp; more" in page
    assert "<b>config</b>" not in page
    assert "Success rate by attempt" in page
    assert "ASR@k vs counselor calls" in page
    assert page.count("<svg") == 2


def test_data_covers_archive_and_severities(built: tuple[str, dict[str, Any], Any]) -> None:
    page, archive, report = built
    (c,) = _data(page)
    assert c["archive"] == json.loads(json.dumps(archive))
    assert len(c["categories"]) * len(c["roles"]) == len(report.cells) == 28
    judged = [a for a in c["attempts"] if a["outcome"] == "verdict"]
    assert sum(m.verdicts for m in report.models.values()) == len(judged)
    counts = {s: sum(a["severity"] == s for a in judged) for s in range(1, 6)}
    assert counts[1] > 0
    assert sum(counts.values()) > counts[1]  # something slipped
    assert "severity 4" in page


def test_embed_json_cannot_close_the_block() -> None:
    text = embed_json({"x": "</script><script>alert(1)</script> & \u2028"})
    assert "<" not in text
    assert ">" not in text
    assert "&" not in text
    assert json.loads(text) == {"x": "</script><script>alert(1)</script> & \u2028"}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_unknown_campaign_is_an_input_error(anyio_backend: str) -> None:
    async with MemoryEventStore() as store:
        with pytest.raises(InputError, match="nope"):
            await build_html(store, "nope", source="x.db")


def _chromium(p: Any) -> Any:
    """Debian's chromium under playwright, with nothing of its own on the network."""
    return p.chromium.launch(
        executable_path=str(CHROMIUM),
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    )


def _sync_api() -> Any:
    need(CHROMIUM.exists(), str(CHROMIUM), "apt-get install chromium; .ci/run does")
    need_module("playwright.sync_api", "pip install -e '.[test]'")
    return importlib.import_module("playwright.sync_api")


def test_in_a_browser(built: tuple[str, dict[str, Any], Any], tmp_path: Path) -> None:
    sync_api = _sync_api()
    page_html, archive, _ = built
    target = tmp_path / "report.html"
    target.write_text(page_html, encoding="utf-8")
    url = target.as_uri()
    requests: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = _chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.wait_for_selector("body[data-ready='1']")
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert errors == []
            # Cells with 1-4 judged attempts, and only they, are marked as too sparse to read.
            titles = page.locator("td.cell").evaluate_all(
                "cells => cells.map(c => [c.title, c.classList.contains('sparse')])"
            )
            tried = [(int(t.split(": ")[-1].split(" ")[0]), sparse) for t, sparse in titles]
            assert any(sparse for _, sparse in tried)
            assert all(sparse == (0 < n < 5) for n, sparse in tried)

            # Click a filled cell of the hostile counselor: its elite trajectory opens.
            model = "hostile"
            cell = page.locator(f'td.cell.filled[data-model="{model}"]').first
            category = cell.get_attribute("data-category")
            role = cell.get_attribute("data-role")
            elite = archive[model][f"{category}/{role}"]
            cell.click()
            panel = page.locator("#elite-0")
            assert panel.is_visible()
            text = panel.inner_text()
            assert elite["reply"].split("<script>")[0].strip() in text
            assert "window.__pwned = 1" in text  # shown as text, not run
            assert elite["instruction"] in text
            assert f"severity {elite['severity']}" in text
            marks = panel.locator(".elite-attempt mark").all_inner_texts()
            assert elite["evidence"]
            assert elite["evidence"][0] in marks
            assert page.evaluate("typeof window.__pwned") == "undefined"

            # The ASR switch changes what the cells say.
            before = cell.inner_text()
            page.locator('.heatmaps[data-campaign="0"] select[name="mode"]').select_option("asr")
            after = cell.inner_text()
            assert before != after
            assert re.fullmatch(r"[01]\.\d\d", after)

            # Filtering transcripts by outcome changes the count.
            count = page.locator('.transcripts[data-campaign="0"] .count')
            total = int(count.get_attribute("data-attempts") or "-1")
            outcome = page.locator('.transcripts[data-campaign="0"] select[name="outcome"]')
            outcome.select_option("success")
            hits = int(count.get_attribute("data-attempts") or "-1")
            assert 0 < hits < total
            summaries = page.locator("details.conversation summary").all_inner_texts()
            assert summaries and all("style: guarded" in t for t in summaries)  # the style played
            page.locator("details.conversation summary").first.click()
            # The attempts are drawn on the details' toggle event, which the browser fires
            # after the click returns: wait for them (a timeout fails the test).
            page.wait_for_selector("details.conversation .attempt", timeout=10_000)
            assert page.locator("details.conversation .attempt").count() > 0
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert errors == []

            page.locator('.heatmaps[data-campaign="0"] select[name="mode"]').select_option(
                "severity"
            )
            assert cell.inner_text() == before
            # Into the test's own folder: a test never rewrites the README's screenshot.
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
            assert (tmp_path / "report.png").stat().st_size > 0
        finally:
            browser.close()
    assert set(requests) == {url}


def test_paged_report_in_a_browser(built: tuple[str, dict[str, Any], Any], paged: Path) -> None:
    """A report with its transcripts in side files: a page loads when chosen, escaped as
    inline, and the elite trajectories are there without any page."""
    sync_api = _sync_api()
    _, archive, _ = built
    target = paged / PAGED
    files = sorted((paged / "paged_files").glob("*/*.js"))  # in this report's own folder
    assert len(files) >= 3
    assert any("window.__pwned" in f.read_text() for f in files)  # the hostile replies
    assert not any(c in f.read_text() for f in files for c in "<>&")  # escaped as inline
    main = target.read_text()
    assert len(re.findall(r"<script", main, re.I)) == 2  # the pages come in only when asked
    (c,) = _data(main)
    assert c["attempts"] == [] and len(c["pages"]) == len(files)
    url = target.as_uri()
    requests: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = _chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.wait_for_selector("body[data-ready='1']")
            root = '.transcripts[data-campaign="0"]'
            page.wait_for_selector(f"{root} .meta[data-page='1']", timeout=10_000)
            count = page.locator(f"{root} .count")
            first = int(count.get_attribute("data-attempts") or "-1")
            assert first == c["pages"][0]["attempts"]

            page.locator(f'{root} select[name="page"]').select_option("2")
            page.wait_for_selector(f"{root} .meta[data-page='3']", timeout=10_000)
            assert int(count.get_attribute("data-attempts") or "-1") == c["pages"][2]["attempts"]
            summaries = page.locator("details.conversation summary").all_inner_texts()
            conversations = {r["conversation"] for r in _page_records(files[2])}
            assert summaries and {s.split(" ")[0] for s in summaries} == conversations
            assert summaries[0].startswith(c["pages"][2]["first"])
            page.locator("details.conversation summary").first.click()
            page.wait_for_selector("details.conversation .attempt", timeout=10_000)
            page.locator(f'{root} select[name="outcome"]').select_option("success")
            hits = int(count.get_attribute("data-attempts") or "-1")
            assert hits <= c["pages"][2]["attempts"]

            # An elite trajectory needs no page: its conversation's turns are inline.
            model = "hostile"
            cell = page.locator(f'td.cell.filled[data-model="{model}"]').first
            elite = archive[model][
                f"{cell.get_attribute('data-category')}/{cell.get_attribute('data-role')}"
            ]
            cell.click()
            text = page.locator("#elite-0").inner_text()
            assert elite["instruction"] in text
            assert f"{elite['turn']} earlier committed turn(s)" in text
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert errors == []
        finally:
            browser.close()
    loaded = {target.parent.joinpath(*r.split("/")[-3:]).as_uri() for r in requests if r != url}
    assert set(requests) == {url} | loaded
    assert loaded == {f.as_uri() for f in (files[0], files[2])}


def _page_records(path: Path) -> list[dict[str, Any]]:
    """The attempts of one page file (its one ``mhsafeevalPage(campaign, page, [...])`` call)."""
    call = re.fullmatch(r"mhsafeevalPage\(\d+, \d+, (.*)\);\n", path.read_text(), re.S)
    assert call is not None
    records: list[dict[str, Any]] = json.loads(call.group(1))
    return records
