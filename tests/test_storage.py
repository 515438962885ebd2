"""The event store contract (both stores) and what only the SQLite store promises."""

from __future__ import annotations

import itertools
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import msgspec
import pytest

from mhsafeeval import storage
from mhsafeeval.errors import InputError
from mhsafeeval.framework._message import Message
from mhsafeeval.framework.store._protocol import SCHEMA_VERSION, StorageError, StoredEvent
from mhsafeeval.storage import EventStore, MemoryEventStore, SqliteEventStore


class Note(Message, frozen=True, tag="test.storage.note"):
    text: str


class Mark(Message, frozen=True, tag="test.storage.mark"):
    value: int = 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Contract tests run on both stores; the memory store also on trio (aiosqlite is asyncio-only).
contract = pytest.mark.parametrize(
    ("anyio_backend", "kind"),
    [
        pytest.param("asyncio", "memory", id="memory-asyncio"),
        pytest.param("trio", "memory", id="memory-trio"),
        pytest.param("asyncio", "sqlite", id="sqlite"),
    ],
)

MakeStore = Callable[..., EventStore]


@pytest.fixture
def make_store(kind: str, tmp_path: Path) -> MakeStore:
    def make(**options: Any) -> EventStore:
        if kind == "memory":
            return MemoryEventStore(**options)
        return SqliteEventStore(tmp_path / "events.db", **options)

    return make


def mixed(n: int, campaign: str = "c1") -> list[Message]:
    """n messages at distinct coordinates, alternating Note and Mark."""
    return [
        Note(campaign=campaign, conversation="conv", turn=i, text=f"note {i}")
        if i % 2 == 0
        else Mark(campaign=campaign, conversation="conv", turn=i, value=i)
        for i in range(n)
    ]


async def collect(store: EventStore, campaign: str, **options: Any) -> list[StoredEvent]:
    return [event async for event in store.events(campaign, **options)]


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]


def assert_threads_end(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive(), f"aiosqlite worker {thread.name} is still running"


def test_all_matches_public_names() -> None:
    # SqliteEventStore is imported on first use (it needs aiosqlite): the module's __getattr__.
    public = {name for name in vars(storage) if not name.startswith("_")} | {"SqliteEventStore"}
    assert set(storage.__all__) == public - {"annotations"}


# -- the contract -----------------------------------------------------------------------------


@contract
@pytest.mark.anyio
async def test_round_trip_in_order_and_decoded(make_store: MakeStore) -> None:
    messages = mixed(25)
    async with make_store(page_size=4) as store:
        assert isinstance(store, EventStore)
        for message in messages:
            await store.append(message)
        await store.flush()
        events = await collect(store, "c1")
        assert [e.message for e in events] == messages
        assert [type(e.message) for e in events] == [type(m) for m in messages]
        assert [e.id for e in events] == [m.id for m in messages]
        assert [e.type for e in events] == [m.tag for m in messages]
        assert all(a.seq < b.seq for a, b in itertools.pairwise(events))
        assert all(e.body == b"" for e in events)
        assert await store.count("c1") == 25
        assert await store.event_ids("c1") == {m.id for m in messages}
        assert await store.count("other") == 0
        assert await collect(store, "other") == []
        assert store.stats.written == 25
        assert store.stats.pending == 0


@contract
@pytest.mark.anyio
async def test_superseded_events_leave_the_log_but_are_kept_aside(make_store: MakeStore) -> None:
    messages = mixed(10)
    async with make_store() as store:
        for m in messages:
            await store.append(m)
        # supersede flushes first: events still queued are moved too
        moved = await store.supersede("c1", {messages[3].id, messages[7].id, "no-such-id"})
        assert moved == 2
        await store.flush()
        left = [e.id for e in await collect(store, "c1")]
        assert left == [m.id for i, m in enumerate(messages) if i not in (3, 7)]
        assert await store.superseded("c1") == 2 and await store.superseded("other") == 0
        assert await store.count("c1") == 8
        await store.append(messages[3])  # the retry may store an event with the same id
        await store.flush()
        assert await store.count("c1") == 9 and store.stats.duplicates == 0
        assert await store.supersede("c1", set()) == 0


@pytest.mark.anyio
async def test_an_older_file_without_the_superseded_table_reads_as_none(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "old.db"
    async with SqliteEventStore(db) as store:
        await store.append(Note(campaign="c1", text="x"))
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE superseded")
    async with SqliteEventStore(db, read_only=True) as old:
        assert await old.superseded("c1") == 0
        assert await old.count("c1") == 1


@contract
@pytest.mark.anyio
async def test_duplicate_ids_are_ignored_and_counted(make_store: MakeStore) -> None:
    first = Note(campaign="c1", turn=3, text="first")
    same_id = Note(campaign="c1", turn=3, text="other payload, same coordinates")
    assert first.id == same_id.id
    async with make_store() as store:
        await store.append(first)
        await store.append(first)
        await store.flush()
        await store.append(same_id)  # a duplicate of an already committed event
        await store.flush()
        assert [e.message for e in await collect(store, "c1")] == [first]
        stats = store.stats
        assert (stats.appended, stats.written, stats.duplicates) == (3, 1, 2)
        assert stats.commits >= 1


@contract
@pytest.mark.anyio
async def test_register_campaign_is_idempotent_and_listed_with_counts(
    make_store: MakeStore,
) -> None:
    ticks = itertools.count(1000)
    async with make_store(clock=lambda: float(next(ticks))) as store:
        a = await store.register_campaign("a", config='{"seed": 1}')
        assert (a.id, a.config, a.event_count, a.schema_version) == ("a", '{"seed": 1}', 0, 1)
        again = await store.register_campaign("a", config='{"seed": 2}')
        assert again == a  # the first config is kept; nothing else changes
        b = await store.register_campaign("b")
        assert b.config == ""
        b = await store.register_campaign("b", config="late")
        assert b.config == "late"  # the first non-empty config
        for message in [*mixed(3, "a"), *mixed(5, "c")]:  # "c" was never registered
            await store.append(message)
        await store.flush()
        listed = await store.list_campaigns()
        assert [(c.id, c.event_count) for c in listed] == [("a", 3), ("b", 0), ("c", 5)]
        assert listed[0].config == '{"seed": 1}'
        assert listed[0].created_at < listed[1].created_at < listed[2].created_at
        assert (await store.register_campaign("c", config="x")).event_count == 5


@contract
@pytest.mark.anyio
async def test_types_filter_and_after_seq_page_across_boundaries(make_store: MakeStore) -> None:
    messages = mixed(11)
    async with make_store(page_size=3) as store:
        for message in messages:
            await store.append(message)
        await store.flush()
        everything = await collect(store, "c1")
        marks = await collect(store, "c1", types={"test.storage.mark"})
        assert [e.message for e in marks] == [m for m in messages if isinstance(m, Mark)]
        both = await collect(store, "c1", types=["test.storage.mark", "test.storage.note"])
        assert both == everything
        assert await collect(store, "c1", types=()) == []
        for cut in range(len(everything)):
            after = await collect(store, "c1", after_seq=everything[cut].seq)
            assert after == everything[cut + 1 :]
        notes_late = await collect(
            store, "c1", types={"test.storage.note"}, after_seq=everything[4].seq
        )
        assert [e.message for e in notes_late] == [m for m in messages[5:] if isinstance(m, Note)]


@contract
@pytest.mark.anyio
async def test_raw_events_carry_the_body_and_no_message(make_store: MakeStore) -> None:
    async with make_store(page_size=2) as store:
        for message in mixed(5):
            await store.append(message)
        await store.flush()
        typed = await collect(store, "c1")
        raw = await collect(store, "c1", raw=True)
        assert [(e.seq, e.id, e.type) for e in raw] == [(e.seq, e.id, e.type) for e in typed]
        assert all(e.message is None for e in raw)
        decoded = [msgspec.json.decode(e.body) for e in raw]
        assert [d["type"] for d in decoded] == [e.type for e in typed]
        assert decoded[1]["value"] == 1


@contract
@pytest.mark.anyio
async def test_a_closed_store_refuses_appends(make_store: MakeStore) -> None:
    store = make_store()
    async with store:
        await store.append(Note(campaign="c1", text="x"))
    with pytest.raises(StorageError):
        await store.append(Note(campaign="c1", turn=1, text="y"))


# -- SQLite only ------------------------------------------------------------------------------


class PausingStore(SqliteEventStore):
    """Pauses inside the shielded write, after the rows are inserted, before the commit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inserted = anyio.Event()
        self.release = anyio.Event()

    async def _insert(self, writer: aiosqlite.Connection, batch: list[Any]) -> int:
        count = await super()._insert(writer, batch)
        self.inserted.set()
        await self.release.wait()
        return count


class FailingStore(SqliteEventStore):
    """Inserts the rows, then fails before the commit (a disk error, say)."""

    async def _insert(self, writer: aiosqlite.Connection, batch: list[Any]) -> int:
        await super()._insert(writer, batch)
        raise sqlite3.OperationalError("disk I/O error (injected)")


def sql(path: Path, query: str, *params: Any) -> list[Any]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(query, params).fetchall()
    conn.close()
    return rows


@pytest.mark.anyio
async def test_reopen_reads_back_and_read_only_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    messages = mixed(30)
    async with SqliteEventStore(path, batch_size=7) as store:
        await store.register_campaign("c1", config="cfg")
        for message in messages:
            await store.append(message)
        # no flush: closing commits what is queued
    async with SqliteEventStore(path) as store:
        assert [e.message for e in await collect(store, "c1")] == messages
        await store.append(Note(campaign="c1", turn=99, text="later"))
    async with SqliteEventStore(path, read_only=True) as store:
        await store.flush()  # nothing to commit: a no-op
        assert await store.count("c1") == 31
        assert [(c.id, c.config) for c in await store.list_campaigns()] == [("c1", "cfg")]
        with pytest.raises(StorageError, match="read-only"):
            await store.append(Note(campaign="c1", turn=100, text="no"))
        with pytest.raises(StorageError, match="read-only"):
            await store.register_campaign("c2")
    meta = dict(sql(path, "SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["created_by"].startswith("mhsafeeval ")


@pytest.mark.anyio
async def test_wal_mode_and_owner_only_files(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventStore(path) as store:
        await store.append(Note(campaign="c1", text="x"))
        await store.flush()
        assert sql(path, "PRAGMA journal_mode") == [("wal",)]
        for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert stat.S_IMODE(os.stat(file).st_mode) == 0o600, file


@pytest.mark.anyio
async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventStore(path):
        pass
    sql(path, "UPDATE meta SET value = ? WHERE key = 'schema_version'", str(SCHEMA_VERSION + 1))
    for read_only in (False, True):
        with pytest.raises(InputError) as caught:
            await SqliteEventStore(path, read_only=read_only).open()
        assert caught.value.source == str(path)
        assert caught.value.field == "schema_version"
        assert "newer mhsafeeval" in caught.value.reason
        assert f"schema {SCHEMA_VERSION + 1}" in caught.value.reason
    assert_threads_end(worker_threads())


@pytest.mark.anyio
async def test_files_that_are_not_event_stores_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("this is not a database\n" * 100)
    with pytest.raises(InputError, match="not a SQLite database") as caught:
        await SqliteEventStore(text).open()
    assert caught.value.source == str(text)
    foreign = tmp_path / "foreign.db"
    sql(foreign, "CREATE TABLE things (x)")
    with pytest.raises(InputError, match="not an mhsafeeval event store"):
        await SqliteEventStore(foreign).open()
    missing = tmp_path / "missing.db"
    with pytest.raises(InputError, match="no such event store"):
        await SqliteEventStore(missing, read_only=True).open()
    assert not missing.exists()
    assert_threads_end(worker_threads())


@pytest.mark.anyio
async def test_unknown_types_fail_the_typed_path_but_not_the_raw_one(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventStore(path) as store:
        await store.append(Note(campaign="c1", text="known"))
    body = b'{"type":"test.storage.gone","campaign":"c1"}'
    columns = "id, campaign, conversation, turn, attempt, branch, type, recorded_at, body"
    values = "'x', 'c1', '', 1, 0, '', 'test.storage.gone', 0, ?"
    sql(path, f"INSERT INTO events ({columns}) VALUES ({values})", body)
    async with SqliteEventStore(path, read_only=True) as store:
        with pytest.raises(InputError, match=r"test\.storage\.gone.*raw=True") as caught:
            await collect(store, "c1")
        assert caught.value.field == "events[seq=2]"
        raw = await collect(store, "c1", raw=True)
        assert [(e.type, e.body) for e in raw][1] == ("test.storage.gone", body)


@pytest.mark.anyio
async def test_a_write_cancelled_mid_commit_is_stored_whole(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    messages = mixed(40)
    store = PausingStore(path, batch_size=1000, flush_interval=3600)
    with anyio.fail_after(30), anyio.CancelScope() as scope:
        async with store:
            for message in messages:
                await store.append(message)

            async def cancel_mid_write() -> None:
                await store.inserted.wait()  # rows inserted, transaction still open
                scope.cancel()
                store.release.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_mid_write)
                await store.flush()
    assert scope.cancelled_caught
    assert store.stats.commits == 1
    async with SqliteEventStore(path, read_only=True) as reopened:
        assert [e.message for e in await collect(reopened, "c1")] == messages


@pytest.mark.anyio
async def test_leaving_a_cancelled_block_still_commits_the_queue(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    messages = mixed(12)
    with anyio.fail_after(30), anyio.CancelScope() as scope:
        async with SqliteEventStore(path, flush_interval=3600) as store:
            for message in messages:
                await store.append(message)
            assert store.stats.pending == len(messages)
            scope.cancel()
            await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    async with SqliteEventStore(path, read_only=True) as reopened:
        assert [e.message for e in await collect(reopened, "c1")] == messages


@pytest.mark.anyio
async def test_a_failed_write_is_rolled_back_and_raised(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with FailingStore(path) as store:
        for message in mixed(5):
            await store.append(message)
        with pytest.raises(StorageError, match="injected") as caught:
            await store.flush()
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(StorageError):
            await store.append(Note(campaign="c1", turn=50, text="after"))
        # rolled back at once: the write lock is free while the store is still open
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        other.close()
    # told once already: leaving the block does not raise again
    async with SqliteEventStore(path, read_only=True) as store:
        assert await store.count("c1") == 0  # rolled back, not half stored


@pytest.mark.anyio
async def test_a_failure_nobody_saw_is_raised_on_close(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="injected"):
        async with FailingStore(tmp_path / "a.db") as store:
            await store.append(Note(campaign="c1", text="x"))

    async def fail_in_body() -> None:
        async with FailingStore(tmp_path / "b.db") as store:
            await store.append(Note(campaign="c1", text="x"))
            raise ValueError("body")

    with pytest.raises(ValueError, match="body") as caught:
        await fail_in_body()
    assert any("event store failed" in note for note in caught.value.__notes__)


@pytest.mark.anyio
async def test_an_error_inside_the_block_still_closes_every_connection(tmp_path: Path) -> None:
    threads: list[threading.Thread] = []

    async def fail_in_body() -> None:
        async with SqliteEventStore(tmp_path / "events.db") as store:
            threads.extend(worker_threads())
            assert len(threads) == 2  # the writer and the reader connection
            await store.append(Note(campaign="c1", text="x"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fail_in_body()
    assert_threads_end(threads)
    async with SqliteEventStore(tmp_path / "events.db", read_only=True) as store:
        assert await store.count("c1") == 1  # queued before the error: still committed


@pytest.mark.anyio
async def test_a_half_failed_open_closes_what_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventStore(path):
        pass
    sql(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    store = SqliteEventStore(path)
    with pytest.raises(InputError):
        await store.open()  # the writer connection was open when the check failed
    await store.aclose()
    await store.aclose()
    assert_threads_end(worker_threads())


@pytest.mark.anyio
async def test_appends_wait_for_the_writer_when_far_behind(tmp_path: Path) -> None:
    pending: list[int] = []
    with anyio.fail_after(30):  # flush must not wait for the hour-long interval
        async with SqliteEventStore(
            tmp_path / "events.db", batch_size=3, max_pending=5, flush_interval=3600
        ) as store:
            for message in mixed(50):
                await store.append(message)
                pending.append(store.stats.pending)
            await store.flush()
            assert await store.count("c1") == 50
    assert max(pending) <= 5
    assert store.stats.commits >= 50 // 3


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
async def test_the_sqlite_store_says_it_needs_asyncio(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="asyncio"):
        await SqliteEventStore(tmp_path / "events.db").open()
    assert not (tmp_path / "events.db").exists()


@pytest.fixture(autouse=True)
def no_leaked_worker_threads() -> Iterator[None]:
    yield
    assert_threads_end(worker_threads())


@pytest.mark.anyio
async def test_a_second_writer_is_refused_and_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventStore(path):
        with pytest.raises(InputError, match=r"another process \(pid \d+\) is running a campaign"):
            async with SqliteEventStore(path):
                pass
        async with SqliteEventStore(path, read_only=True) as reader:  # readers are welcome
            assert await reader.list_campaigns() == []
    async with SqliteEventStore(path):  # released on close
        pass


_HOLD_THE_LOCK = """
import sys, anyio
from mhsafeeval.storage import SqliteEventStore

async def hold() -> None:
    async with SqliteEventStore(sys.argv[1]):
        print("locked", flush=True)
        await anyio.sleep_forever()

anyio.run(hold)
"""


def test_a_lock_left_by_a_killed_process_never_blocks_a_rerun(tmp_path: Path) -> None:
    """A campaign killed with SIGKILL (or a segfault) leaves ``<db>.lock`` behind: the lock
    is the kernel's (flock), released with the process, so the same command continues."""
    import signal
    import subprocess
    import sys

    from helpers import cli

    db = tmp_path / "c.db"
    config = Path(__file__).resolve().parents[1] / "examples" / "campaign.toml"
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_LOCK, str(db)], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "locked\n"
            held = cli("run", str(config), "--db", str(db), "--quiet", timeout=120)
            assert held.returncode == 2 and f"pid {child.pid}" in held.stderr, held.stderr
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
    assert Path(f"{db}.lock").read_text() == str(child.pid)  # left behind by the dead process
    done = cli("run", str(config), "--db", str(db), "--quiet", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "3/3 conversations finished (0 failed)" in done.stderr
