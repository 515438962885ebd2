"""Reports kept in the database (issue 35's speed at scale): a report of an unchanged campaign
reads the figures ``run`` or the last ``report`` kept instead of folding every event; any
stored event, or other code, makes it fold again; the figures are those of a fold."""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import stat
from pathlib import Path

import anyio
import msgspec
import pytest

import mhsafeeval.reports.kept as kept_module
from mhsafeeval.cli import main
from mhsafeeval.framework.store._protocol import StorageError
from mhsafeeval.messages import ConversationFinished
from mhsafeeval.reports.kept import HTML_KIND, KIND, keep, load_kept, log_position
from mhsafeeval.reports.text import CampaignReport, render_text
from mhsafeeval.storage import MemoryEventStore, SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = "demo-campaign"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A campaign run by ``run`` (scripted models): the database as the run left it."""
    db = tmp_path_factory.mktemp("kept") / "run.db"
    assert main(["run", str(ROOT / "examples" / "campaign.toml"), "--db", str(db), "--quiet"]) == 0
    return db


def _copy(db: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy.db"
    with sqlite3.connect(db) as src, sqlite3.connect(out) as dst:
        src.backup(dst)
    return out


def _summaries(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT kind, key FROM summaries").fetchall())


async def _position(db: Path, campaign: str) -> str:
    async with SqliteEventStore(db, read_only=True) as store:
        return await log_position(store, campaign)


def _campaign(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT id FROM campaigns").fetchone()[0])


def _refuse_folding(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("folded the events although a report was kept")

    monkeypatch.setattr(kept_module, "load_reports_and_logs", refuse)


def test_run_keeps_the_report_it_printed_and_report_reads_it(
    stored: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = _copy(stored, tmp_path)
    name = _campaign(db)
    assert _summaries(db) == {KIND: anyio.run(_position, db, name)}
    assert main(["report", str(db), "--refold"]) == 0
    folded = capsys.readouterr().out
    _refuse_folding(monkeypatch)
    assert main(["report", str(db)]) == 0
    assert capsys.readouterr().out == folded
    assert main(["report", str(db), "--json"]) == 0
    monkeypatch.undo()
    kept_json = capsys.readouterr().out
    assert main(["report", str(db), "--json", "--refold"]) == 0
    assert capsys.readouterr().out == kept_json


def test_a_report_kept_for_another_log_or_other_code_is_never_shown(
    stored: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _copy(stored, tmp_path)
    name = _campaign(db)

    async def kept_and_fresh() -> tuple[CampaignReport, dict[str, tuple[str, bytes]]]:
        async with SqliteEventStore(db, read_only=True) as store:
            [report], fresh = await load_kept(store, name)
        return report, fresh

    async def plant(report: CampaignReport) -> None:  # a report no fold gives, kept as if
        async with SqliteEventStore(db) as store:
            body = msgspec.msgpack.encode(report)
            await keep(store, KIND, {name: (await log_position(store, name), body)})

    report, fresh = anyio.run(kept_and_fresh)
    assert fresh == {}  # `run` kept it
    planted = msgspec.structs.replace(report, events=123_456_789)
    anyio.run(plant, planted)
    assert anyio.run(kept_and_fresh)[0].events == 123_456_789  # read, not folded

    monkeypatch.setattr(kept_module, "code_fingerprint", lambda: "other code")
    again, fresh = anyio.run(kept_and_fresh)
    assert again.events == report.events and name in fresh
    monkeypatch.undo()

    async def append() -> None:  # any event stored since: another position
        async with SqliteEventStore(db) as store:
            await store.append(ConversationFinished(campaign=name, conversation="late", turns=0))

    anyio.run(append)
    again, fresh = anyio.run(kept_and_fresh)
    assert again.events == report.events + 1 and name in fresh


def test_a_kept_body_that_does_not_decode_is_folded_again(stored: Path, tmp_path: Path) -> None:
    db = _copy(stored, tmp_path)
    name = _campaign(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE summaries SET body = ? WHERE kind = ?", (b"\xc1 not msgpack", KIND))

    async def load() -> tuple[list[CampaignReport], dict[str, tuple[str, bytes]]]:
        async with SqliteEventStore(db, read_only=True) as store:
            return await load_kept(store, name)

    [report], fresh = anyio.run(load)
    assert name in fresh and report.events > 0


def test_report_keeps_what_it_folded_unless_it_cannot_write(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(stored, tmp_path)
    name = _campaign(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM summaries")
    assert main(["report", str(db), "--refold"]) == 0
    assert _summaries(db) == {}  # --refold keeps nothing
    capsys.readouterr()
    # A campaign running on the file holds its lock: the report is printed, nothing is kept.
    fd = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["report", str(db)]) == 0
        assert _summaries(db) == {}
    finally:
        os.close(fd)
    before = capsys.readouterr().out
    assert main(["report", str(db)]) == 0
    assert _summaries(db) == {KIND: anyio.run(_position, db, name)}
    assert capsys.readouterr().out == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_database_is_reported_and_left_as_it_was(
    stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(stored, tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM summaries")
    db.chmod(stat.S_IRUSR)
    assert main(["report", str(db)]) == 0
    assert "ASR" in capsys.readouterr().out
    db.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert _summaries(db) == {}


def test_the_html_report_is_kept_with_its_pages(
    stored: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mhsafeeval.reports.html as html

    db = _copy(stored, tmp_path)
    name = _campaign(db)

    async def write(
        stem: str, fresh: dict[str, tuple[str, bytes]] | None, per_page: int = 4
    ) -> None:
        async with SqliteEventStore(db) as store:  # pages of transcripts, as a large one's
            out = tmp_path / f"{stem}.html"
            await html.write_html(
                store, name, out, inline_attempts=5, page_attempts=per_page, fresh=fresh
            )
            if fresh:
                await keep(store, HTML_KIND, fresh)

    anyio.run(write, "folded", None)
    assert HTML_KIND not in _summaries(db)
    fresh: dict[str, tuple[str, bytes]] = {}
    anyio.run(write, "first", fresh)
    assert name in fresh and HTML_KIND in _summaries(db)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("read the events although the report was kept")

    monkeypatch.setattr(html, "_read_campaign", refuse)
    fresh = {}
    anyio.run(write, "kept", fresh)
    assert fresh == {}

    def document(stem: str) -> tuple[str, dict[str, str]]:
        text = (tmp_path / f"{stem}.html").read_text()
        [run] = list((tmp_path / f"{stem}_files").iterdir())
        pages = {p.name: p.read_text() for p in run.iterdir()}
        return re.sub(rf"{stem}_files/[^/\"]+/", "PAGES/", text), pages

    folded, kept = document("folded"), document("kept")
    assert len(folded[1]) > 2 and kept == folded
    assert _summaries(db)[HTML_KIND].startswith(anyio.run(_position, db, name))
    with pytest.raises(AssertionError, match="although"):  # other page sizes: read again
        anyio.run(write, "other", {}, 6)


def test_report_html_keeps_it_and_an_event_stored_since_reads_the_events_again(
    stored: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mhsafeeval.reports.html as html

    db = _copy(stored, tmp_path)
    name = _campaign(db)
    assert main(["report", str(db), "--html", str(tmp_path / "a.html"), "--refold"]) == 0
    assert HTML_KIND not in _summaries(db)
    assert main(["report", str(db), "--html", str(tmp_path / "a.html")]) == 0
    first = _summaries(db)[HTML_KIND]
    with monkeypatch.context() as patch:
        patch.setattr(html, "_read_campaign", lambda *a, **k: pytest.fail("read the events"))
        assert main(["report", str(db), "--html", str(tmp_path / "b.html")]) == 0
    assert (tmp_path / "b.html").read_text() == (tmp_path / "a.html").read_text()

    async def append() -> None:
        async with SqliteEventStore(db) as store:
            await store.append(ConversationFinished(campaign=name, conversation="late", turns=0))

    anyio.run(append)
    assert main(["report", str(db), "--html", str(tmp_path / "c.html")]) == 0
    assert _summaries(db)[HTML_KIND] != first


async def _store_contract(store: MemoryEventStore | SqliteEventStore) -> None:
    assert await store.summary("c", KIND) is None and await store.last_seq("c") == 0
    await store.append(ConversationFinished(campaign="c", conversation="x", turns=1))
    await store.append(ConversationFinished(campaign="c", conversation="y", turns=1))
    await store.flush()
    assert await store.last_seq("c") == 2
    await store.put_summary("c", KIND, "k1", b"one")
    await store.put_summary("c", KIND, "k2", b"two")  # replaced
    got = await store.summary("c", KIND)
    assert got is not None and (got.key, got.body) == ("k2", b"two")
    assert await store.summary("c", HTML_KIND) is None
    assert [e.type async for e in store.events("c")] == ["conversation.finished"] * 2


def test_stores_keep_summaries_beside_the_events_never_among_them(tmp_path: Path) -> None:
    async def both() -> None:
        async with MemoryEventStore() as memory:
            await _store_contract(memory)
        async with SqliteEventStore(tmp_path / "s.db") as sqlite:
            await _store_contract(sqlite)
        async with SqliteEventStore(tmp_path / "s.db", read_only=True) as reader:
            got = await reader.summary("c", KIND)
            assert got is not None and got.body == b"two"
            with pytest.raises(StorageError, match="read-only"):
                await reader.put_summary("c", KIND, "k3", b"three")

    anyio.run(both, backend="asyncio")


def test_a_file_from_before_summaries_reads_and_gets_the_table_when_written(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"

    async def write() -> None:
        async with SqliteEventStore(db) as store:
            await store.append(ConversationFinished(campaign="c", conversation="x", turns=1))

    anyio.run(write, backend="asyncio")
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE summaries")

    async def read_then_keep() -> bytes | None:
        async with SqliteEventStore(db, read_only=True) as store:
            assert await store.summary("c", KIND) is None
        async with SqliteEventStore(db) as store:
            await store.put_summary("c", KIND, "k", b"body")
            got = await store.summary("c", KIND)
        return None if got is None else got.body

    assert anyio.run(read_then_keep, backend="asyncio") == b"body"


def test_the_kept_report_renders_as_the_folded_one(stored: Path) -> None:
    name = _campaign(stored)

    async def both() -> tuple[str, str]:
        async with SqliteEventStore(stored, read_only=True) as store:
            [kept], fresh = await load_kept(store, name)
            assert fresh == {}
            [folded], _ = await load_kept(store, name, refold=True)
        return render_text(kept), render_text(folded)

    kept_text, folded_text = anyio.run(both, backend="asyncio")
    assert kept_text == folded_text
