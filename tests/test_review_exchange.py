"""Ratings between copies of a database (`review DB --export-ratings / --import-ratings`), and
a campaign's settled ratings as `calibrate`'s labels (`calibrate --labels-from DB`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from mhsafeeval.cli import main
from mhsafeeval.providers import CallParams, ChatMessage
from mhsafeeval.review import (
    REVIEW_EVENTS,
    ReviewSession,
    ReviewState,
    open_session,
)
from mhsafeeval.storage import SqliteEventStore
from mhsafeeval.testing import register_script
from test_calibrate import _reply_of, _verdict
from test_review import campaign_events, read_back, write_campaign

pytestmark = pytest.mark.timeout(180)


def review_in(db: Path, work: Callable[[ReviewSession], Any]) -> None:
    """Open a review session on ``db`` (2 raters per item, 10 safe replies) and run ``work``."""

    async def go() -> None:
        async with SqliteEventStore(db) as store:
            session = await open_session(store, "c1", safe_sample=10)
            await work(session)

    anyio.run(go, backend="asyncio")


async def rate(session: ReviewSession, pos: int, rater: str, severity: int, **kw: Any) -> None:
    await session.rate(
        session.ids[pos], rater, severity=severity, refused=False, understood=True, **kw
    )


def review_events(db: Path) -> dict[str, bytes]:
    from mhsafeeval.framework import encode_message

    return {e.id: encode_message(e) for e in read_back(db) if e.tag in REVIEW_EVENTS}


@pytest.fixture
def two_copies(tmp_path: Path) -> tuple[Path, Path]:
    """One campaign in two database files, rated by different people on each."""
    a, b = tmp_path / "site-a.db", tmp_path / "site-b.db"
    write_campaign(a, campaign_events(seed=5, conversations=5))
    shutil.copy(a, b)

    async def on_a(s: ReviewSession) -> None:
        await rate(s, 0, "ann", 3, spans=[(0, 5)], comment="blames the client")
        await rate(s, 0, "bob", 4)
        await rate(s, 1, "ann", 1)
        await s.unblind(s.ids[1], "ann")

    async def on_b(s: ReviewSession) -> None:
        await rate(s, 1, "cy", 5)
        await rate(s, 2, "dan", 2)
        await rate(s, 0, "cy", 2)

    review_in(a, on_a)
    review_in(b, on_b)
    return a, b


def test_export_then_import_merges_two_copies_and_twice_stores_nothing(
    two_copies: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_copies
    out = tmp_path / "b.jsonl"
    assert main(["review", str(b), "--export-ratings", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(review_events(b)) == 4  # 3 ratings and the queue
    first = next(x for x in lines if x["event"]["type"] == "review.rating")
    assert first["format"] == "mhsafeeval-review/1" and first["database"] == "site-b.db"
    assert first["seq"] > 0 and first["recorded_at"] > 0 and first["id"]
    assert first["event"]["rater"] == "cy" and first["event"]["blinded"] is True
    assert "reply" in first["event"]["shown"] and first["event"]["at"] > 0

    before = review_events(a)
    assert main(["review", str(a), "--import-ratings", str(out)]) == 0
    assert "3 review event(s) stored, 1 already present" in capsys.readouterr().err
    after = review_events(a)
    assert set(before) < set(after) and len(after) == len(before) + 3
    assert all(after[k] == v for k, v in review_events(b).items())  # the same events, unchanged

    assert main(["review", str(a), "--import-ratings", str(out)]) == 0
    assert "0 review event(s) stored, 4 already present" in capsys.readouterr().err
    assert review_events(a) == after

    # And back: both copies then hold the same review.
    back = tmp_path / "a.jsonl"
    assert main(["review", str(a), "--export-ratings", str(back)]) == 0
    assert main(["review", str(b), "--import-ratings", str(back)]) == 0
    assert review_events(a) == review_events(b)
    state = ReviewState()
    for event in read_back(b):
        state.add(event)
    assert sum(len(r) for r in state.ratings.values()) == 6
    assert [rater for _, rater in state.unblinded] == ["ann"]  # her unblinding came along


def _tamper(path: Path, number: int, change: Callable[[dict[str, Any]], object]) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[number - 1])
    change(record)
    lines[number - 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def _set(keys: Sequence[str], value: object) -> Callable[[dict[str, Any]], object]:
    def change(record: dict[str, Any]) -> None:
        target = record
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        (_set(["event", "severity"], 7), "line 2: event.severity", "expected int <= 5"),
        (_set(["event", "severity"], "high"), "line 2: event.severity", "expected int"),
        (_set(["format"], "other/1"), "line 2: format", ""),
        (_set(["surprise"], 1), "line 2: surprise", "unknown field"),
        (_set(["event", "type"], "review.nope"), "line 2: event", ""),
        (_set(["event", "item"], "f00d"), "line 2: event.item", "no reply"),
        (_set(["event", "campaign"], "other"), "line 2: event.campaign", "not the campaign"),
        (_set(["event", "spans"], [[0, 9999]]), "line 2: event.spans[0]", "past the reply"),
        (_set(["event", "rater"], "<script>"), "line 2: event.rater", "a name is"),
        (_set(["event", "comment"], "edited"), "line 2: event", "another event under its id"),
        (_set(["id"], "0" * 16), "line 2: id", "not the id"),
    ],
)
def test_a_bad_ratings_file_is_one_error_naming_file_line_and_field_and_stores_nothing(
    two_copies: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: Callable[[dict[str, Any]], object],
    field: str,
    reason: str,
) -> None:
    a, _ = two_copies
    out = tmp_path / "a.jsonl"
    assert main(["review", str(a), "--export-ratings", str(out)]) == 0
    # line 1 is the queue, line 2 ann's first rating; a new line 6 would be stored if allowed
    extra = json.loads(out.read_text().splitlines()[1])
    extra["event"]["key"] = "ann:another"
    extra.pop("id")
    with out.open("a") as f:
        f.write(json.dumps(extra) + "\n")
    _tamper(out, 2, change)
    before = review_events(a)
    capsys.readouterr()
    assert main(["review", str(a), "--import-ratings", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}: {field}" in err and reason in err
    assert len(err.strip().splitlines()) == 1
    assert review_events(a) == before


def test_a_file_that_is_not_json_is_an_input_error(
    two_copies: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_copies
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "mhsafeeval-review/1"\n')
    assert main(["review", str(a), "--import-ratings", str(bad)]) == 2
    assert f"{bad}: line 1: invalid JSON" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    assert main(["review", str(a), "--import-ratings", str(missing)]) == 2
    assert main(["review", str(tmp_path / "nope.db"), "--export-ratings", str(bad)]) == 2


# --- calibrate --labels-from -----------------------------------------------------------------

JUDGED: list[str] = []


def _always_three(messages: Sequence[ChatMessage], params: CallParams) -> str:
    reply = _reply_of(messages)
    JUDGED.append(reply)
    return _verdict(3, reply)


register_script("review-labels-three", _always_three)


def _settled_review(db: Path) -> list[str]:
    """Ratings worked out by hand: item 0 agreed at 3 (3 and 4), item 1 adjudicated at 4
    (1 and 4), item 2 short of raters, item 3 agreed at 1; returns the queue's replies."""
    replies: list[str] = []

    async def work(s: ReviewSession) -> None:
        await rate(s, 0, "ann", 3)
        await rate(s, 0, "bob", 4)
        await rate(s, 1, "ann", 1)
        await rate(s, 1, "bob", 4)
        await s.decide(s.ids[1], "cy", severity=4, refused=False, understood=True)
        await rate(s, 2, "ann", 2)
        await rate(s, 3, "ann", 1)
        await rate(s, 3, "bob", 1)
        replies.extend(item.reply for item in s.queue)

    review_in(db, work)
    return replies


def test_calibrate_takes_the_settled_ratings_as_its_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "campaign.db"
    write_campaign(db, campaign_events(seed=9, conversations=4, threshold=3))
    replies = _settled_review(db)
    JUDGED.clear()
    cache = tmp_path / "cal.db"
    args = ["calibrate", "--judge", "scripted/review-labels-three", "--db", str(cache)]
    assert main([*args, "--labels-from", str(db), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "3 reviewed replies of campaign 'c1' as labels, 1 still waiting" in captured.err
    assert out["items"] == out["judged"] == 3
    assert sorted(JUDGED) == sorted([replies[0], replies[1], replies[3]])
    assert out["threshold"] == 3  # the campaign's
    # Settled 3, 4 and 1; the judge said 3 every time.
    assert [row[2] for row in out["confusion"]] == [1, 0, 1, 1, 0]
    assert out["exact_agreement"] == pytest.approx(1 / 3)
    assert "reviewed replies of c1" in out["labels"]

    # The same labels written as a file give the same figures (from the cache: no new call).
    from mhsafeeval.review import reviewed_labels

    async def labels() -> list[dict[str, Any]]:
        async with SqliteEventStore(db, read_only=True) as store:
            found = await reviewed_labels(store, source=db)
        return [
            {
                f: getattr(x, f)
                for f in ("id", "category", "role", "severity", "refused", "understood", "note")
            }
            | {"client": x.client, "counselor": x.counselor}
            for x in found.labels
        ]

    records = anyio.run(labels, backend="asyncio")
    assert sorted(r["severity"] for r in records) == [1, 3, 4]
    assert any(r["note"].startswith("adjudicated") for r in records)
    file = tmp_path / "labels.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in records))
    JUDGED.clear()
    assert main([*args, "--labels", str(file), "--threshold", "3", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert JUDGED == []
    for key in ("items", "confusion", "exact_agreement", "false_negative_rate", "cells"):
        assert again[key] == out[key]


def test_calibrate_labels_from_a_campaign_nobody_settled_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "campaign.db"
    write_campaign(db, campaign_events(seed=9, conversations=2))
    args = ["calibrate", "--judge", "scripted/review-labels-three", "--db", str(tmp_path / "c")]
    assert main([*args, "--labels-from", str(db)]) == 2
    assert "no reply settled by its raters yet" in capsys.readouterr().err
    assert main([*args, "--campaign", "c1"]) == 2
    assert "--campaign" in capsys.readouterr().err
    assert main([*args, "--labels-from", str(db), "--campaign", "zz"]) == 2
    assert not (tmp_path / "c").exists()


def test_export_writes_the_ratings_as_review_does(
    two_copies: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mhsafeeval export DB --ratings --out F``: the same file as ``review DB
    --export-ratings F``; without ``--out`` (or with csv) one clear error, exit 2."""
    _, b = two_copies
    by_review, by_export = tmp_path / "review.jsonl", tmp_path / "export.jsonl"
    assert main(["review", str(b), "--export-ratings", str(by_review)]) == 0
    assert main(["export", str(b), "--ratings", "--out", str(by_export)]) == 0
    assert "wrote 4 review event(s)" in capsys.readouterr().err
    assert by_export.read_text() == by_review.read_text()
    assert main(["export", str(b), "--ratings"]) == 2
    assert "--ratings: writes JSONL to a file: give --out FILE" in capsys.readouterr().err
    assert main(["export", str(b), "--ratings", "--format", "csv", "--out", str(by_export)]) == 2
