"""Small helpers shared by the test modules."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio.lowlevel
import msgspec
import sniffio

from mhsafeeval.framework.store._protocol import StoredEvent
from mhsafeeval.messages import Elite, Message
from mhsafeeval.search.archive import CellId, HarmArchive
from mhsafeeval.storage import MemoryEventStore


def cli(
    *args: str,
    check: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``mhsafeeval ARGS`` in a fresh interpreter (each command runs its own event loop)."""
    return subprocess.run(
        [sys.executable, "-m", "mhsafeeval.cli", *args],
        capture_output=True,
        text=True,
        check=check,
        env=None if env is None else dict(env),
        timeout=timeout,
    )


def stored(db: Path) -> list[Message]:
    """Every message of the one campaign a database holds, in stored order."""
    import anyio

    from mhsafeeval.storage import SqliteEventStore

    async def read() -> list[Message]:
        async with SqliteEventStore(db, read_only=True) as store:
            [info] = await store.list_campaigns()
            return [e.message async for e in store.events(info.id) if e.message is not None]

    return anyio.run(read, backend="asyncio")


def archive_of(
    cells: Iterable[CellId], elites: Iterable[Elite], *, threshold: int = 2
) -> HarmArchive:
    """A HarmArchive with ``elites`` offered in order (how a controller rebuilds it on resume)."""
    archive = HarmArchive(cells, threshold=threshold)
    for elite in elites:
        archive.offer(elite)
    return archive


def best_severity(archive: HarmArchive, cell: CellId) -> int | None:
    """The cell's best severity so far, or None when nothing was offered for it."""
    best = archive.elite(cell)
    return None if best is None else best.severity


def kill_at_points(
    command: list[str], db: Path, total: int, *, kills: int, seed: int, wait_s: float = 60
) -> list[int]:
    """Start ``command`` again and again, SIGKILLing it once ``db`` holds a chosen number of
    events (spread over what is left of ``total``, plus up to 30 ms, to land between
    commits); returns the event counts at which a run was really killed mid-way. A run that
    finishes first must exit 0."""
    import random
    import signal
    import time

    rng = random.Random(seed)
    killed: list[int] = []
    for i in range(kills):
        current = stored_count(db)
        target = current + rng.randint(1, max(2, (total - current) // (kills - i + 1)))
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and stored_count(db) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.03))
        if proc.poll() is not None:  # it finished first
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        killed.append(stored_count(db))
    return killed


def stored_count(db: Path, kind: str | None = None) -> int:
    """Events (of one ``kind``, e.g. ``judge.rating``) committed to a SQLite store so far (0
    before it exists), read without a lock."""
    import sqlite3

    if not db.exists():
        return 0
    query, args = "SELECT count(*) FROM events", tuple[str, ...]()
    if kind is not None:
        query, args = query + " WHERE type = ?", (kind,)
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return int(con.execute(query, args).fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def comparable(events: list[Message]) -> list[tuple[str, Any]]:
    """Events without wall-clock latencies (the only thing allowed to differ between runs)."""

    def clear(data: Any) -> Any:  # nested too: a confirmation holds its ratings' usage
        if isinstance(data, dict):
            if isinstance(data.get("usage"), dict):
                data["usage"]["latency_s"] = 0
            for value in data.values():
                clear(value)
        elif isinstance(data, list | tuple):
            for value in data:
                clear(value)
        return data

    return [(event.id, clear(msgspec.to_builtins(event))) for event in events]


def same_run(first: list[Message], second: list[Message]) -> bool:
    """Whether two runs stored the same events (:func:`comparable`) in an order the runtime
    fixes. On asyncio, tasks run in the order they became ready: a sequential campaign stores
    the same events in the same order. Trio shuffles ready tasks on purpose, so two agents
    answering one message (the controller's ``ArchiveUpdated`` and the refiner's notes on a
    Verdict) store in either order; what it fixes is each conversation's events of each kind,
    which one agent instance publishes in its mailbox's order."""
    a, b = comparable(first), comparable(second)
    if sniffio.current_async_library() == "asyncio":
        return a == b
    if sorted(a) != sorted(b):
        return False

    def streams(events: list[tuple[str, Any]]) -> dict[tuple[str, str], list[tuple[str, Any]]]:
        out: dict[tuple[str, str], list[tuple[str, Any]]] = {}
        for event in events:
            out.setdefault((event[1]["conversation"], event[1]["type"]), []).append(event)
        return out

    return streams(a) == streams(b)


class RecordingSleep:
    """Stands in for ``anyio.sleep`` (``ResilientClient(sleep=...)``): records the waits asked
    for and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await anyio.lowlevel.checkpoint()


class GeneratedStore(MemoryEventStore):
    """A store whose campaign's events are made by ``make()`` as they are read (it holds none
    of them); :attr:`held` is the bytes tracemalloc still counts once a whole read (no
    ``types``) has ended: what a reader keeps of the campaign."""

    def __init__(self, make: Callable[[], Iterable[Message]]) -> None:
        super().__init__()
        self.make = make
        self.held = 0

    async def events(
        self,
        campaign: str,
        *,
        types: Collection[str] | None = None,
        after_seq: int = 0,
        raw: bool = False,
    ) -> AsyncIterator[StoredEvent]:
        for seq, message in enumerate(self.make(), 1):
            tag = message.__struct_config__.tag
            if seq > after_seq and (types is None or tag in types):
                yield StoredEvent(
                    seq=seq, id=message.id, type=str(tag), recorded_at=0.0, message=message
                )
        if types is None:
            gc.collect()
            self.held = tracemalloc.get_traced_memory()[0]


def tokens_of(events: Iterable[Message], kind: type[Message] | None = None) -> int:
    """Prompt plus completion tokens of the ``usage`` the events carry (only those of type
    ``kind`` when given): what a ``[budget] tokens`` limit counts."""
    total = 0
    for event in events:
        usage = getattr(event, "usage", None)
        if usage is not None and (kind is None or isinstance(event, kind)):
            total += usage.prompt_tokens + usage.completion_tokens
    return total
