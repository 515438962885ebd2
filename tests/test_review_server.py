"""The workbench as served: a real uvicorn server on 127.0.0.1 over a SQLite campaign, several
raters writing at once, and the ``mhsafeeval review`` command itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from helpers import cli
from mhsafeeval.review import ReviewDecision, ReviewQueueDrawn, ReviewRating
from test_review import campaign_events, read_back, running, write_campaign

pytestmark = pytest.mark.timeout(240)


def _sign_in(client: httpx.Client, url: str, name: str) -> str:
    assert client.get(url).status_code == 303
    csrf = re.search(r'name="csrf" content="([0-9a-f]+)"', client.get("/start").text)
    assert csrf
    assert client.post("/start", data={"csrf": csrf.group(1), "rater": name}).status_code == 303
    return csrf.group(1)


def test_several_raters_write_at_once_and_nothing_is_lost(tmp_path: Path) -> None:
    db = tmp_path / "campaign.db"
    write_campaign(db, campaign_events(conversations=8, seed=21))
    raters = [f"rater-{n}" for n in range(6)]
    per_rater = 8
    errors: list[BaseException] = []
    with running(db, raters_per_item=3, safe_sample=30) as server:
        base = server.url.split("/?")[0]
        ids = server.session.ids
        barrier = threading.Barrier(len(raters))

        def work(name: str, offset: int) -> None:
            try:
                with httpx.Client(base_url=base, timeout=60) as client:
                    csrf = _sign_in(client, server.url, name)
                    barrier.wait(timeout=60)  # every rater writes at the same moment
                    for k in range(per_rater):
                        item = ids[(offset + k) % len(ids)]
                        form = {"csrf": csrf, "item": item, "severity": str(1 + k % 5)}
                        response = client.post("/rate", data=form)
                        assert response.status_code == 303, response.text
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(r, n)) for n, r in enumerate(raters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        served = sum(len(v) for v in server.session.state.ratings.values())
    stored = [e for e in read_back(db) if isinstance(e, ReviewRating)]
    assert len(stored) == len(raters) * per_rater
    assert len({e.id for e in stored}) == len(stored)
    assert {e.rater for e in stored} == set(raters)
    assert served == len({(e.item, e.rater) for e in stored})
    # Restarted on the same file, the review resumes every rating.
    with running(db, raters_per_item=3, safe_sample=30) as again:
        assert {(i, r) for i, by in again.session.state.ratings.items() for r in by} == {
            (e.item, e.rater) for e in stored
        }
    assert sum(isinstance(e, ReviewQueueDrawn) for e in read_back(db)) == 1


def _start(db: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "mhsafeeval.cli", "review", str(db), "--no-browser", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    return process, url


def test_the_command_prints_a_tokened_url_and_serves_it(tmp_path: Path) -> None:
    db = tmp_path / "campaign.db"
    write_campaign(db, campaign_events(seed=22))
    process, url = _start(db, "--safe-sample", "5", "--raters-per-item", "2")
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{20,}", url), url
        base = url.split("/?")[0]
        assert httpx.get(base + "/", timeout=30).status_code == 403
        with httpx.Client(base_url=base, timeout=30) as client:
            csrf = _sign_in(client, url, "ann")
            page = client.get("/", follow_redirects=True)
            assert page.status_code == 200 and 'id="reply"' in page.text
            item = re.search(r'name="item" value="([0-9a-f]+)"', page.text)
            assert item
            form = {"csrf": csrf, "item": item.group(1), "severity": "3"}
            assert client.post("/rate", data=form).status_code == 303
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "reviewing campaign c1" in err
    ratings = [e for e in read_back(db) if isinstance(e, ReviewRating)]
    assert [(r.rater, r.severity) for r in ratings] == [("ann", 3)]


def test_bad_database_or_campaign_is_exit_2(tmp_path: Path) -> None:
    missing = cli("review", str(tmp_path / "none.db"), "--no-browser", timeout=120)
    assert missing.returncode == 2, missing.stderr
    assert "no such event store" in missing.stderr
    assert not (tmp_path / "none.db").exists()  # never created by asking
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    assert cli("review", str(text), "--no-browser", timeout=120).returncode == 2
    db = tmp_path / "campaign.db"
    write_campaign(db, campaign_events(seed=23))
    unknown = cli("review", str(db), "--campaign", "nope", "--no-browser", timeout=120)
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    port = cli("review", str(db), "--port", "70000", "--no-browser", timeout=120)
    assert port.returncode == 2 and "--port" in port.stderr
    assert not any(isinstance(e, ReviewDecision | ReviewRating) for e in read_back(db))


def test_a_reviewed_campaign_reports_exactly_as_before(tmp_path: Path) -> None:
    """The review only adds events: report and export read the campaign as they did, and the
    report adds what people said (``review``) beside it."""
    plain, reviewed = tmp_path / "plain.db", tmp_path / "reviewed.db"
    events = campaign_events(seed=24)
    write_campaign(plain, events)
    write_campaign(reviewed, events)
    with running(reviewed, safe_sample=5) as server:
        base = server.url.split("/?")[0]
        with httpx.Client(base_url=base, timeout=30) as client:
            csrf = _sign_in(client, server.url, "ann")
            for item in server.session.ids[:3]:
                form = {"csrf": csrf, "item": item, "severity": "5", "spans": "[[0, 2]]"}
                assert client.post("/rate", data=form).status_code == 303
    assert sum(isinstance(e, ReviewRating) for e in read_back(reviewed)) == 3
    before = cli("report", str(plain), "--json", timeout=120)
    after = cli("report", str(reviewed), "--json", timeout=120)
    assert before.returncode == after.returncode == 0, after.stderr
    old, new = json.loads(before.stdout)["c1"], json.loads(after.stdout)["c1"]
    assert new.pop("events") == old.pop("events") + 4  # three ratings and the queue
    review = new.pop("review")
    assert new == old
    assert "review" not in old and review["raters"] == ["ann"]
    assert sum(m["ratings"] for m in review["models"]) == 3
    before = cli("export", str(plain), timeout=120)
    after = cli("export", str(reviewed), timeout=120)
    assert before.returncode == after.returncode == 0, after.stderr
    assert _untimed(after.stdout) == _untimed(before.stdout)  # the two files differ in times
    for db, shown in ((plain, False), (reviewed, True)):
        page = tmp_path / f"{db.stem}.html"
        assert cli("report", str(db), "--html", str(page), timeout=120).returncode == 0
        html = page.read_text()
        assert ("<h3>Review by people</h3>" in html) is shown
        assert ("Blinded ratings by 1 people, 2 per reply" in html) is shown


def _untimed(jsonl: str) -> list[dict[str, object]]:
    records = [json.loads(line) for line in jsonl.splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_at")} for r in records]


def test_the_server_socket_lets_asyncio_turn_nagle_off() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto is TCP; with proto 0 every page
    on a kept-alive connection waited ~40 ms for a delayed ACK (benchmarks/review_queue.py)."""
    import socket

    from mhsafeeval.review._serve import _bind

    listening = _bind(0)
    try:
        assert listening.proto == socket.IPPROTO_TCP
        client = socket.create_connection(listening.getsockname(), timeout=5)
        try:
            listening.setblocking(True)
            accepted, _ = listening.accept()
            with accepted:
                assert accepted.proto == socket.IPPROTO_TCP  # what asyncio checks
        finally:
            client.close()
    finally:
        listening.close()
