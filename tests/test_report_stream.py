"""Reports and exports fold the store as it streams: no transcripts held, records written as
they come, large HTML reports paged out to side files."""

from __future__ import annotations

import gc
import io
import json
import re
import types
from collections import Counter
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.export import AttemptRecord, export, records_of, stream_records
from mhsafeeval.html_report import build_html, write_html
from mhsafeeval.messages import (
    ClientUtterance,
    CounselorReply,
    Directive,
    Instruction,
    Message,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.report import load_reports_and_logs
from mhsafeeval.storage import CampaignLog, MemoryEventStore
from mhsafeeval.storage._protocol import StoredEvent
from mhsafeeval.testing import scripted_models

CONFIG = """
[campaign]
name = "stream"
seed = 3
max_turns = 3
max_attempts = 3
conversations_per_profile = {n}
concurrency = 4
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]
""" + scripted_models()


class Watched(MemoryEventStore):
    """A memory store that tells, at any moment, how far its open reads have got."""

    def __init__(self) -> None:
        super().__init__(page_size=50)
        self.open_reads = 0
        self.yielded = 0

    async def events(
        self,
        campaign: str,
        *,
        types: Collection[str] | None = None,
        after_seq: int = 0,
        raw: bool = False,
    ) -> AsyncIterator[StoredEvent]:
        self.open_reads += 1
        self.yielded = 0
        try:
            async for event in super().events(campaign, types=types, after_seq=after_seq, raw=raw):
                self.yielded += 1
                yield event
        finally:
            self.open_reads -= 1


async def _campaign(store: MemoryEventStore, n: int) -> list[Message]:
    text = CONFIG.format(n=n)
    result = await run_campaign(parse_config(text, "stream.toml"), store, config_text=text)
    assert result.status == "completed"
    return [e.message async for e in store.events("stream") if e.message is not None]


def _texts(events: list[Message]) -> set[str]:
    """Every transcript text of the events (long enough not to be a name or a label)."""
    out: set[str] = set()
    for e in events:
        if isinstance(e, Instruction | ClientUtterance | CounselorReply):
            out.add(e.text)
        elif isinstance(e, Verdict):
            out.add(e.reasoning)
        elif isinstance(e, TurnCommitted):
            out |= {e.client_text, e.counselor_text}
        elif isinstance(e, Directive) and e.instruction:
            out.add(e.instruction)
    return {t for t in out if len(t) > 20}


def _reachable_strings(root: object, skip: Collection[object] = ()) -> list[str]:
    """The str objects reachable from ``root`` (not through classes, modules or ``skip``)."""
    seen = {id(s) for s in skip}
    stack, found = [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            found.append(obj)
            continue
        stack.extend(gc.get_referents(obj))
    return found


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_the_report_holds_no_transcript_beyond_the_elites(anyio_backend: str) -> None:
    async with MemoryEventStore() as store:
        events = await _campaign(store, 3)
        [(report, log)] = await load_reports_and_logs(store, "stream")
    texts = _texts(events)
    assert len(texts) > 10
    held = [s for s in _reachable_strings(log, skip=[log.archive]) if s in texts]
    assert held == []  # the elites (one per cell and model) are all the report shows
    assert report.events == len(events) == log.events
    assert len(log.attempts) == sum(isinstance(e, Directive) for e in events)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_export_writes_each_record_while_the_store_is_read(anyio_backend: str) -> None:
    async with Watched() as store:
        events = await _campaign(store, 3)
        seen: list[tuple[int, int]] = []

        class Out(io.StringIO):
            def write(self, text: str) -> int:
                seen.append((store.open_reads, store.yielded))
                return super().write(text)

        out = Out()
        count = await export(store, "stream", "jsonl", out)
    texts = sum(
        isinstance(e, Directive | Instruction | ClientUtterance | CounselorReply | Verdict)
        for e in events
    )
    assert count == len(seen) == sum(isinstance(e, Directive) for e in events)
    reads, got = seen[0]
    assert reads == 1 and 0 < got < texts  # the first record before the read reached its end
    assert all(r == 1 for r, _ in seen[: count // 2])  # and so do most of them


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_streamed_records_are_the_one_pass_fold(anyio_backend: str) -> None:
    async with MemoryEventStore() as store:
        events = await _campaign(store, 3)
        streamed = [r async for r in stream_records(store, "stream")]
        one_pass = CampaignLog(keep_text=True)  # every text kept as the events are folded
        async for stored in store.events("stream"):
            assert stored.message is not None
            one_pass.add(stored.message, stored.recorded_at)
    whole = records_of(one_pass, "stream")
    assert [msgspec.to_builtins(r) for r in streamed] == [msgspec.to_builtins(r) for r in whole]
    assert sum(r.reply is not None for r in streamed) == sum(
        isinstance(e, CounselorReply) for e in events
    )
    assert all(isinstance(r, AttemptRecord) for r in streamed)


def _pages(folder: Path) -> list[tuple[int, int, list[dict[str, Any]]]]:
    out = []
    for path in sorted(folder.glob("*.js")):
        call = re.fullmatch(r"mhsafeevalPage\((\d+), (\d+), (.*)\);\n", path.read_text(), re.S)
        assert call is not None, path
        out.append((int(call.group(1)), int(call.group(2)), json.loads(call.group(3))))
    return out


def _data(page: str) -> list[dict[str, Any]]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    data: list[dict[str, Any]] = json.loads(found.group(1))
    return data


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_large_html_pages_its_transcripts(anyio_backend: str, tmp_path: Path) -> None:
    out = tmp_path / "big.html"
    folder = tmp_path / "big_files"
    folder.mkdir()
    (folder / "c0-p0999.js").write_text("stale")  # from an earlier, larger report
    async with MemoryEventStore() as store:
        events = await _campaign(store, 3)
        inline = await build_html(store, "stream")
        written = await write_html(store, "stream", out, inline_attempts=0, page_attempts=10)
    main = out.read_text()
    pages = _pages(folder)
    assert [folder / f"c0-p{i + 1:04d}.js" for i in range(len(pages))] == written
    assert len(pages) > 2 and not (folder / "c0-p0999.js").exists()
    assert [(c, p) for c, p, _ in pages] == [(0, i) for i in range(len(pages))]
    records = [r for _, _, batch in pages for r in batch]
    keys = [(r["conversation"], r["turn"], r["attempt"], r["branch"]) for r in records]
    directives = [(d.conversation, d.turn, d.attempt, d.branch) for d in events if
                  isinstance(d, Directive)]  # fmt: skip
    assert sorted(keys) == sorted(directives)  # every attempt once
    on_page = {r["conversation"]: p for _, p, batch in pages for r in batch}
    assert Counter(on_page.values()) == Counter(
        p for _, p, batch in pages for _ in {r["conversation"] for r in batch}
    )  # each conversation on one page only
    assert all(len(batch) < 10 + 9 for _, _, batch in pages)  # whole conversations
    (c,) = _data(main)
    assert c["attempts"] == [] and c["total"] == len(directives)
    assert [p["attempts"] for p in c["pages"]] == [len(b) for _, _, b in pages]
    assert [p["src"] for p in c["pages"]] == [f"big_files/{p.name}" for p in written]
    (whole,) = _data(inline)
    assert not whole["pages"]
    assert sorted(records, key=json.dumps) == sorted(whole["attempts"], key=json.dumps)
    # Each elite's trajectory stays inline: its conversation's committed turns.
    for cells in c["archive"].values():
        for elite in cells.values():
            mine = [r for r in records if r["conversation"] == elite["conversation"]]
            turns = [
                {k: r[k] for k in ("turn", "utterance", "reply")} for r in mine if r["committed"]
            ]
            assert c["context"][elite["conversation"]] == turns
    assert "'self'" in main and "'self'" not in inline


def test_a_small_report_writes_no_side_files(tmp_path: Path) -> None:
    async def main() -> list[Path]:
        async with MemoryEventStore() as store:
            await _campaign(store, 1)
            return await write_html(store, "stream", tmp_path / "r.html")

    assert anyio.run(main) == []
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
