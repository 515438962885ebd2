"""The SQLite event store: one file in WAL mode, one batching writer task. asyncio only."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.metadata
import os
import sqlite3
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from mhsafeeval.errors import InputError
from mhsafeeval.framework._message import Message, encode_message, message_decoder
from mhsafeeval.framework._resource import AsyncResource

from ._protocol import (
    SCHEMA_VERSION,
    CampaignInfo,
    StorageError,
    StoredEvent,
    StoreStats,
    Summary,
    WriteCounts,
)

__all__ = ["SqliteEventStore"]

Row = tuple[str, str, str, int, int, str, str, float, bytes]

_SUMMARIES = """CREATE TABLE IF NOT EXISTS summaries (
    campaign TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, written_at REAL NOT NULL,
    body BLOB NOT NULL, PRIMARY KEY (campaign, kind))"""
# What readers derived from a campaign's events and kept (a report's figures): never events;
# added in place by the first put_summary on an older file; readers tolerate its absence.
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS campaigns (
        id TEXT PRIMARY KEY, created_at REAL NOT NULL, config TEXT NOT NULL,
        schema_version INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
        campaign TEXT NOT NULL REFERENCES campaigns(id), conversation TEXT NOT NULL,
        turn INTEGER NOT NULL, attempt INTEGER NOT NULL, branch TEXT NOT NULL,
        type TEXT NOT NULL, recorded_at REAL NOT NULL, body BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS events_campaign_seq ON events (campaign, seq)",
    # Added in place (older files get it when next opened for writing; readers tolerate its
    # absence): events a resumed run moved aside to retry a failed turn, never deleted.
    """CREATE TABLE IF NOT EXISTS superseded (
        seq INTEGER NOT NULL, id TEXT NOT NULL, campaign TEXT NOT NULL, type TEXT NOT NULL,
        recorded_at REAL NOT NULL, superseded_at REAL NOT NULL, body BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS events_campaign_type ON events (campaign, type)",
    _SUMMARIES,
)
_INSERT_EVENT = """INSERT OR IGNORE INTO events
    (id, campaign, conversation, turn, attempt, branch, type, recorded_at, body)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_AUTO_CAMPAIGN = """INSERT OR IGNORE INTO campaigns (id, created_at, config, schema_version)
    VALUES (?, ?, '', ?)"""
_REGISTER_CAMPAIGN = """INSERT INTO campaigns (id, created_at, config, schema_version)
    VALUES (?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET config = excluded.config WHERE campaigns.config = ''"""
_SELECT_CAMPAIGNS = """SELECT c.id, c.created_at, c.config, c.schema_version,
    (SELECT COUNT(*) FROM events AS e WHERE e.campaign = c.id) FROM campaigns AS c"""


class SqliteEventStore(AsyncResource):
    """An :class:`~mhsafeeval.storage.EventStore` in one SQLite file (asyncio backend only).

    One writer connection (WAL, ``synchronous=NORMAL``) is fed by a writer task that commits
    up to ``batch_size`` events, or whatever arrived within ``flush_interval``, per
    transaction. Each write+commit is shielded from cancellation, so a batch is stored whole
    or not at all. Reads go through a second, read-only connection: under WAL it sees only
    committed transactions (never the half-written batch on the writer connection) and runs
    on its own thread, so a long listing does not hold up commits.

    aiosqlite runs on asyncio only; on trio use :class:`~mhsafeeval.storage.MemoryEventStore`.
    New database files are created readable by their owner only (mode ``0o600``). A store
    object opens once (make a new one to reopen the file); ``open`` and ``aclose`` must run in
    the same task, since the writer's task group lives between them. One process should write
    a file at a time (others may read it); a second writer waits up to 5 s for the lock.

    Args:
        path: The database file (created unless ``read_only``).
        batch_size: Most events per transaction.
        flush_interval: Seconds the writer waits for a batch to fill before committing it.
        read_only: Open for reading only; the file must exist. Needs no write access to the
            file or its folder.
        max_pending: Queued events at which :meth:`append` waits for the writer.
        page_size: Rows fetched per query by :meth:`events` and :meth:`event_ids`.
        clock: Source of ``recorded_at``/``created_at`` (Unix seconds).

    Example:
        >>> import tempfile, anyio
        >>> from pathlib import Path
        >>> from mhsafeeval.messages import ConversationFinished
        >>> async def main(db: Path) -> int:
        ...     async with SqliteEventStore(db) as store:
        ...         await store.append(ConversationFinished(campaign="c", turns=2))
        ...     async with SqliteEventStore(db, read_only=True) as store:  # stored for good
        ...         return await store.count("c")
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     anyio.run(main, Path(folder) / "run.db", backend="asyncio")
        1
    """

    what = "the event store"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int = 256,
        flush_interval: float = 0.05,
        read_only: bool = False,
        max_pending: int = 10_000,
        page_size: int = 500,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min(batch_size, max_pending, page_size) < 1 or flush_interval < 0:
            raise ValueError("batch_size, max_pending and page_size must be positive")
        self.path = Path(path)
        self.read_only = read_only
        self._file_lock: int | None = None
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._max_pending = max(max_pending, batch_size)
        self._page_size = page_size
        self._clock = clock
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()  # one transaction at a time on the writer connection
        self._pending: deque[Row] = deque()
        self._wake = anyio.Event()  # the writer waits on it; appenders and flushers set it
        self._progress = anyio.Event()  # set (and replaced) after every batch or failure
        self._done = self._flush_target = 0
        self._counts = WriteCounts()
        self._failure: Exception | None = None  # why the writer stopped
        self._reported = False
        self._state = "new"  # new -> open -> closed

    @property
    def stats(self) -> StoreStats:
        """Write counters since the store was opened."""
        return self._counts.snapshot(pending=len(self._pending))

    # -- life cycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the database, creating file and schema if needed, and start the writer.

        Raises:
            InputError: Not a SQLite database, not an event store, a newer schema, or a
                missing file opened read-only.
            StorageError: Not on asyncio, or opened twice.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise StorageError(
                "SqliteEventStore needs the asyncio backend (aiosqlite is asyncio-only); "
                "use MemoryEventStore on trio"
            ) from None
        if self._state != "new":
            raise StorageError(f"event store {self.path} was already opened")
        self._state = "open"
        try:
            if not self.read_only:
                self._file_lock = _lock_for_writing(self.path)
                self._writer = await _connect(self.path, create=True)
                await _check_schema(self._writer, self.path, create=True)
            elif not self.path.is_file():
                raise InputError(self.path, None, "no such event store")
            self._reader = await _connect(self.path, create=False)
            if self.read_only:
                await _check_schema(self._reader, self.path, create=False)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._close_connections()
            _unlock(self._file_lock)
            self._file_lock = None
            self._state = "closed"
            if isinstance(exc, sqlite3.DatabaseError):
                raise InputError(self.path, None, _reason(exc)) from exc
            raise
        if not self.read_only:
            # Entered here and exited in aclose(): both must run in the same task.
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            self._tg.start_soon(self._run_writer, name=f"event store writer {self.path}")

    async def aclose(self) -> None:
        """Commit what is queued, stop the writer and close both connections.

        Raises:
            StorageError: A write failed and no caller has been told yet.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        self._wake.set()
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                await tg.__aexit__(None, None, None)  # the writer drains the queue, then ends
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    while self._pending and self._failure is None:  # the writer was cancelled
                        await self._write_batch()
                finally:
                    await self._close_connections()
                    _unlock(self._file_lock)
                    self._file_lock = None
        if not self._reported:
            self._raise_failure()

    async def _close_connections(self) -> None:
        # An unclosed aiosqlite connection keeps a non-daemon thread alive: close each one.
        for name in ("_reader", "_writer"):  # writer last: it checkpoints the WAL
            conn: aiosqlite.Connection | None = getattr(self, name)
            setattr(self, name, None)
            if conn is not None:
                with contextlib.suppress(Exception):  # aiosqlite stops its thread regardless
                    await conn.close()

    # -- writing ----------------------------------------------------------------------------

    async def register_campaign(self, campaign_id: str, config: str = "") -> CampaignInfo:
        """Create a campaign, or return it; the first non-empty config is kept."""
        writer = self._require_writer()
        params = (campaign_id, self._clock(), config, SCHEMA_VERSION)
        async with self._lock:  # not inside the writer's open transaction
            await writer.execute(_REGISTER_CAMPAIGN, params)
            sql = f"{_SELECT_CAMPAIGNS} WHERE c.id = ?"
            rows = list(await writer.execute_fetchall(sql, (campaign_id,)))
        return _campaign_info(rows[0])

    async def append(self, message: Message) -> None:
        """Queue a message; waits only while ``max_pending`` events are queued."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._require_writer()
        while len(self._pending) >= self._max_pending:
            self._wake.set()
            await self._progress.wait()
            self._require_writer()
        row: Row = (
            message.id, message.campaign, message.conversation, message.turn, message.attempt,
            message.branch, message.tag, self._clock(), encode_message(message),
        )  # fmt: skip
        self._pending.append(row)
        self._counts.appended += 1
        self._wake.set()

    async def flush(self) -> None:
        """Return once everything appended before this call is committed."""
        if self.read_only and self._state == "open":
            await anyio.lowlevel.checkpoint()  # nothing can have been appended
            return
        self._require_writer()
        target = self._counts.appended
        self._flush_target = max(self._flush_target, target)
        self._wake.set()
        while self._done < target:
            await self._progress.wait()
            self._raise_failure()
        await anyio.lowlevel.checkpoint()

    def _require_writer(self) -> aiosqlite.Connection:
        self._raise_failure()
        if self.read_only:
            raise StorageError(f"event store {self.path} is open read-only")
        if self._state != "open" or self._writer is None:
            raise StorageError(f"event store {self.path} is not open")
        return self._writer

    def _raise_failure(self) -> None:
        if self._failure is not None:
            self._reported = True
            failure = self._failure
            raise StorageError(f"writing events to {self.path} failed: {failure}") from failure

    async def _run_writer(self) -> None:
        while self._failure is None:
            await self._wait_for(lambda: bool(self._pending) or self._state == "closed")
            if not self._pending:
                return
            with anyio.move_on_after(self._flush_interval):
                await self._wait_for(self._batch_ready)
            await self._write_batch()

    def _batch_ready(self) -> bool:
        return (
            len(self._pending) >= self._batch_size
            or self._flush_target > self._done
            or self._state == "closed"
        )

    async def _wait_for(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._wake = anyio.Event()
            await self._wake.wait()

    async def _write_batch(self) -> None:
        """Commit the next batch in one transaction, or record why it failed."""
        writer = self._writer
        assert writer is not None
        n = min(self._batch_size, len(self._pending))
        batch = [self._pending.popleft() for _ in range(n)]
        campaigns: dict[str, float] = {}
        for row in batch:
            campaigns.setdefault(row[1], row[7])
        try:
            with anyio.CancelScope(shield=True):  # never leave a transaction half done
                async with self._lock:
                    await writer.execute("BEGIN IMMEDIATE")
                    try:
                        auto = [(c, t, SCHEMA_VERSION) for c, t in campaigns.items()]
                        await writer.executemany(_AUTO_CAMPAIGN, auto)  # foreign key of events
                        inserted = await self._insert(writer, batch)
                        await writer.execute("COMMIT")
                    except BaseException:
                        with contextlib.suppress(Exception):
                            await writer.execute("ROLLBACK")
                        raise
        except Exception as exc:  # the writer stops; append/flush/aclose raise it
            self._failure = exc
            self._progress.set()
            return
        self._counts.written += inserted
        self._counts.duplicates += n - inserted
        self._counts.commits += 1
        self._done += n
        self._progress.set()
        self._progress = anyio.Event()

    async def _insert(self, writer: aiosqlite.Connection, batch: list[Row]) -> int:
        """Insert a batch inside the open transaction; return how many rows were new."""
        cursor = await writer.executemany(_INSERT_EVENT, batch)
        return cursor.rowcount

    # -- reading ----------------------------------------------------------------------------

    def _require_reader(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise StorageError(f"event store {self.path} is not open")
        return self._reader

    async def list_campaigns(self) -> list[CampaignInfo]:
        """Every campaign, oldest first, with its committed event count."""
        sql = f"{_SELECT_CAMPAIGNS} ORDER BY c.created_at, c.id"
        return [_campaign_info(row) for row in await self._require_reader().execute_fetchall(sql)]

    async def events(
        self,
        campaign: str,
        *,
        types: Collection[str] | None = None,
        after_seq: int = 0,
        raw: bool = False,
    ) -> AsyncIterator[StoredEvent]:
        """Committed events of a campaign in append order, ``page_size`` rows per query."""
        self._require_reader()
        wanted = () if types is None else tuple(sorted(set(types)))
        if types is not None and not wanted:
            return
        sql = "SELECT seq, id, type, recorded_at, body FROM events WHERE campaign = ? AND seq > ?"
        if types is not None:
            sql += f" AND type IN ({', '.join('?' * len(wanted))})"
        sql += " ORDER BY seq LIMIT ?"
        decoder = None if raw else message_decoder()  # taken per call: sees late imports
        last = after_seq
        while True:
            params = (campaign, last, *wanted, self._page_size)
            rows = list(await self._require_reader().execute_fetchall(sql, params))
            for seq, id_, type_, recorded_at, body in rows:
                last = seq
                if decoder is None:
                    # A row written by another tool may hold its body as TEXT.
                    message = None
                    body = body.encode() if isinstance(body, str) else bytes(body)
                else:
                    try:
                        message, body = decoder.decode(body), b""
                    except msgspec.MsgspecError as exc:
                        raise InputError(
                            self.path, f"events[seq={seq}]",
                            f"cannot decode a {type_!r} event ({exc}); import the module that "
                            "defines it, or read with raw=True",
                        ) from exc  # fmt: skip
                yield StoredEvent(
                    seq=seq, id=id_, type=type_, recorded_at=recorded_at, message=message, body=body
                )  # fmt: skip
            if len(rows) < self._page_size:
                return

    async def supersede(self, campaign: str, ids: Collection[str]) -> int:
        """Move events to the ``superseded`` table in one shielded transaction."""
        await self.flush()
        writer = self._require_writer()
        chosen = sorted(set(ids))
        moved = 0
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await writer.execute("BEGIN IMMEDIATE")
                try:
                    now = self._clock()
                    for start in range(0, len(chosen), 500):
                        part = chosen[start : start + 500]
                        marks = ",".join("?" * len(part))
                        await writer.execute(
                            "INSERT INTO superseded (seq, id, campaign, type, recorded_at, "
                            "superseded_at, body) SELECT seq, id, campaign, type, recorded_at, "
                            f"?, body FROM events WHERE campaign = ? AND id IN ({marks})",
                            (now, campaign, *part),
                        )
                        cursor = await writer.execute(
                            f"DELETE FROM events WHERE campaign = ? AND id IN ({marks})",
                            (campaign, *part),
                        )
                        moved += cursor.rowcount
                    await writer.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(Exception):
                        await writer.execute("ROLLBACK")
                    raise
        return moved

    async def superseded(self, campaign: str) -> int:
        """How many events of a campaign were superseded."""
        reader = self._require_reader()
        try:
            rows = list(
                await reader.execute_fetchall(
                    "SELECT COUNT(*) FROM superseded WHERE campaign = ?", (campaign,)
                )
            )
        except sqlite3.OperationalError:  # a file from before the table existed
            return 0
        return int(rows[0][0])

    async def event_ids(self, campaign: str) -> set[str]:
        """Ids of every committed event of a campaign."""
        reader = self._require_reader()
        sql = "SELECT seq, id FROM events WHERE campaign = ? AND seq > ? ORDER BY seq LIMIT ?"
        ids: set[str] = set()
        last = 0
        while True:
            rows = list(await reader.execute_fetchall(sql, (campaign, last, self._page_size)))
            ids.update(row[1] for row in rows)
            if len(rows) < self._page_size:
                return ids
            last = rows[-1][0]

    async def count(self, campaign: str) -> int:
        """Number of committed events of a campaign."""
        sql = "SELECT COUNT(*) FROM events WHERE campaign = ?"
        rows = list(await self._require_reader().execute_fetchall(sql, (campaign,)))
        return int(rows[0][0])

    async def last_seq(self, campaign: str) -> int:
        """The seq of a campaign's newest committed event (0: none)."""
        sql = "SELECT MAX(seq) FROM events WHERE campaign = ?"
        rows = list(await self._require_reader().execute_fetchall(sql, (campaign,)))
        return int(rows[0][0] or 0)

    async def summary(self, campaign: str, kind: str) -> Summary | None:
        """A campaign's stored summary of ``kind`` (see the protocol)."""
        sql = "SELECT key, body, written_at FROM summaries WHERE campaign = ? AND kind = ?"
        try:
            rows = list(await self._require_reader().execute_fetchall(sql, (campaign, kind)))
        except sqlite3.OperationalError:  # a file from before the table existed
            return None
        if not rows:
            return None
        key, body, written_at = rows[0]
        body = body.encode() if isinstance(body, str) else bytes(body)
        return Summary(key=str(key), body=body, written_at=float(written_at))

    async def put_summary(self, campaign: str, kind: str, key: str, body: bytes) -> None:
        """Store a campaign's summary of ``kind`` in one shielded transaction (see the
        protocol); the events queued before it are committed first."""
        await self.flush()
        writer = self._require_writer()
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await writer.execute("BEGIN IMMEDIATE")
                try:
                    await writer.execute(_SUMMARIES)  # an older file: added in place
                    await writer.execute(
                        "INSERT OR REPLACE INTO summaries (campaign, kind, key, written_at, body)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (campaign, kind, key, self._clock(), bytes(body)),
                    )
                    await writer.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(Exception):
                        await writer.execute("ROLLBACK")
                    raise


def _campaign_info(row: sqlite3.Row) -> CampaignInfo:
    id_, created_at, config, schema_version, event_count = row
    return CampaignInfo(
        id=id_,
        created_at=created_at,
        config=config,
        schema_version=schema_version,
        event_count=event_count,
    )


def _reason(exc: sqlite3.DatabaseError) -> str:
    if "file is not a database" in str(exc):
        return "not a SQLite database"
    return f"cannot open as a SQLite database ({exc})"


def _version() -> str:
    try:
        return importlib.metadata.version("mhsafeeval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _lock_for_writing(path: Path) -> int:
    """One writing process per event store: an exclusive lock on ``<db>.lock``.

    Raises:
        InputError: another process (its pid is in the message) is writing to it.
    """
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise InputError(
            path,
            None,
            f"another process (pid {holder}) is running a campaign on this database; "
            "wait for it to finish or use another --db",
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


async def _shielded_connect(database: str | Path, **kwargs: Any) -> aiosqlite.Connection:
    """``aiosqlite.connect``, never cancelled half-way: a connection whose opening is cancelled
    is never returned, so nobody closes it, and its worker thread later calls back into a
    closed event loop (a traceback after SIGTERM). Opening a local file is quick."""
    with anyio.CancelScope(shield=True):
        conn = await aiosqlite.connect(database, **kwargs)
    return conn


async def _connect(path: Path, *, create: bool) -> aiosqlite.Connection:
    """The writer connection (creating the file, 0o600) or a read-only reader connection."""
    if create:
        try:  # O_EXCL: only a file we create gets our mode; an existing one keeps its own
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise InputError(path, None, f"cannot create the event store ({exc})") from exc
    old_umask = os.umask(0o077)  # -wal/-shm files, created on first use, are owner-only too
    try:
        if create:
            conn = await _shielded_connect(path, isolation_level=None)
        else:
            conn = await _connect_reader(path)
    finally:
        os.umask(old_umask)
    try:
        await conn.execute("PRAGMA busy_timeout = 5000")
        if create:
            rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
            if str(rows[0][0]).lower() != "wal":
                raise InputError(path, None, f"cannot use WAL journaling (got {rows[0][0]!r})")
            await conn.execute("PRAGMA synchronous = NORMAL")
            await conn.execute("PRAGMA foreign_keys = ON")
        else:
            await conn.execute("PRAGMA query_only = ON")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await conn.close()
        raise
    return conn


async def _connect_reader(path: Path) -> aiosqlite.Connection:
    """A connection that only reads: ``mode=ro`` needs no write access to the file or its folder.

    SQLite reads a WAL database through its ``-shm`` index; when that file is absent and the
    folder cannot hold it (a read-only folder or mount), ``mode=ro`` fails. If there is no
    ``-wal`` content either, everything committed is in the main file and SQLite's
    ``immutable=1`` reads it without the index or any lock (SQLite's "Read-Only Databases"
    rule for WAL mode). With ``-wal`` content, ``immutable`` would silently miss those
    commits: that is refused instead.

    A closed database (no ``-wal`` file: its writer checkpointed and removed it; no rollback
    ``-journal``) is opened ``mode=rw`` instead, kept from writing by ``query_only``
    (:func:`_connect`): a ``mode=ro`` connection creates ``-wal`` and ``-shm`` files that it
    cannot remove, while the last read-write connection to close removes them, as the writer
    does, under SQLite's own locks (never while another connection, such as a writer that
    started meanwhile, uses them). The folder is left as it was found.
    """
    uri = Path(os.path.abspath(path)).as_uri()  # noqa: ASYNC240 - no I/O
    journals = [path.with_name(path.name + end) for end in ("-wal", "-journal")]
    if os.access(path, os.W_OK) and not any(j.exists() for j in journals):
        conn = await _shielded_connect(f"{uri}?mode=rw", uri=True)
        try:
            await conn.execute_fetchall("SELECT COUNT(*) FROM sqlite_master")
            return conn
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if not isinstance(exc, sqlite3.OperationalError):
                raise  # a file that is no database: named by the caller
        # Otherwise a folder that cannot hold the -wal file: read as below.
    conn = await _shielded_connect(f"{uri}?mode=ro", uri=True)
    try:
        await conn.execute_fetchall("SELECT COUNT(*) FROM sqlite_master")  # maps the -shm
        return conn
    except sqlite3.OperationalError as exc:
        with anyio.CancelScope(shield=True):
            await conn.close()
        if exc.sqlite_errorname not in ("SQLITE_READONLY_DIRECTORY", "SQLITE_CANTOPEN"):
            raise
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise InputError(
                path,
                None,
                f"cannot read: {wal.name} holds commits not yet merged into the file and "
                f"the folder is read-only ({exc}); open it once where the folder is writable, "
                "or copy both files somewhere writable",
            ) from exc
    except BaseException:
        with anyio.CancelScope(shield=True):
            await conn.close()
        raise
    return await _shielded_connect(f"{uri}?mode=ro&immutable=1", uri=True)


async def _check_schema(conn: aiosqlite.Connection, path: Path, *, create: bool) -> None:
    """Refuse foreign or newer databases; create the schema in an empty one."""
    sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    tables = {row[0] for row in await conn.execute_fetchall(sql)}
    if "meta" not in tables:
        if tables - {"sqlite_sequence"}:
            raise InputError(path, None, "a SQLite database, but not an mhsafeeval event store")
        if not create:
            raise InputError(path, None, "an empty database, not an mhsafeeval event store")
        meta = [("schema_version", str(SCHEMA_VERSION)), ("created_by", f"mhsafeeval {_version()}")]
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                await conn.execute(statement)
            await conn.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", meta)
            await conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.execute("ROLLBACK")
            raise
        return
    rows = await conn.execute_fetchall("SELECT value FROM meta WHERE key = 'schema_version'")
    try:
        version = int(next(iter(rows))[0])
    except (StopIteration, ValueError):
        raise InputError(path, "schema_version", "missing or not a number") from None
    if version > SCHEMA_VERSION:
        raise InputError(
            path,
            "schema_version",
            f"written by a newer mhsafeeval (schema {version}, this version reads up to "
            f"{SCHEMA_VERSION}); upgrade mhsafeeval",
        )
    if version < 1:
        raise InputError(path, "schema_version", f"invalid schema version {version}")
