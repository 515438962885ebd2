"""Reports and exports fold the store as it streams: no transcripts held, records written as
they come, large HTML reports paged out to side files."""

from __future__ import annotations

import gc
import io
import itertools
import json
import re
import tracemalloc
import types
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from helpers import GeneratedStore
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.framework.store._protocol import StoredEvent
from mhsafeeval.messages import (
    CampaignStarted,
    ClientUtterance,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Directive,
    Exchange,
    Instruction,
    Message,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
    lookahead_branch,
)
from mhsafeeval.reports.export import (
    AttemptRecord,
    campaign_log,
    export,
    records_of,
    stream_records,
)
from mhsafeeval.reports.html import build_html, write_html
from mhsafeeval.reports.text import load_report, load_reports_and_logs, report_json, report_of
from mhsafeeval.storage import (
    CampaignLog,
    CampaignTally,
    MemoryEventStore,
    compare_models,
    metrics_of,
)
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
    (folder / "c0-p0999.js").write_text("stale")  # from an earlier version's report
    async with MemoryEventStore() as store:
        events = await _campaign(store, 3)
        inline = await build_html(store, "stream")
        written = await write_html(store, "stream", out, inline_attempts=0, page_attempts=10)
    main = out.read_text()
    run = written[0].parent  # this report's pages, in a folder of their own
    assert [p.name for p in folder.iterdir()] == [run.name]  # the stale page is gone
    pages = _pages(run)
    assert [run / f"c0-p{i + 1:04d}.js" for i in range(len(pages))] == written
    assert len(pages) > 2
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
    assert [p["src"] for p in c["pages"]] == [f"big_files/{run.name}/{p.name}" for p in written]
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


# -- the report's fold holds some hundreds of bytes per conversation (issue 16) -----------------

TALLY_CELLS = (("blaming", "enabler"), ("gaslighting", "perpetrator"))


def _conversation(i: int) -> list[Message]:
    """One synthetic conversation of two turns of two attempts (every kind of attempt)."""
    model, profile = ("m", "n")[i % 2], f"p{i % 3}"
    conv = f"c/{model}/{profile}/{i}"
    usage = Usage(model="scripted/x", prompt_tokens=10, completion_tokens=5)
    out: list[Message] = [
        ConversationStarted(
            campaign="c", conversation=conv, counselor_model=model, profile_id=profile, index=i
        )
    ]
    for turn in range(2):
        category, role = TALLY_CELLS[(i + turn) % 2]
        plans = [(0, ""), (1, "")] + ([(1, lookahead_branch(1))] if turn == 0 else [])
        for attempt, branch in plans:
            cell: dict[str, Any] = dict(
                campaign="c", conversation=conv, turn=turn, attempt=attempt, branch=branch
            )
            cell.update(category=category, role=role)
            # a lookahead plays turn 1: on the committed history for even i, not for odd i
            ahead = (Exchange(f"u{i}.0", f"r{i}.0" if i % 2 == 0 else "other"),) if branch else ()
            severity = (3 * i + turn + attempt + len(branch)) % 5 + 1
            out += [
                Directive(**cell, controller="t"),
                ClientUtterance(**cell, text=f"u{i}.{turn}", usage=usage, lookahead=ahead),
                CounselorReply(**cell, text=f"r{i}.{turn}", usage=usage),
                Unjudged(**cell, reason="garbage", usage=usage)
                if (i + attempt) % 7 == 3
                else Verdict(
                    **cell,
                    severity=severity,
                    label="x",
                    reasoning="...",
                    refused=severity == 1,
                    understood=i % 4 != 0,
                    usage=usage,
                ),
            ]
        out.append(
            TurnCommitted(
                campaign="c",
                conversation=conv,
                turn=turn,
                committed_attempt=1,
                category=category,
                role=role,
                client_text=f"u{i}.{turn}",
                counselor_text=f"r{i}.{turn}",
            )
        )
    status = "failed" if i % 11 == 5 else "completed"
    out.append(ConversationFinished(campaign="c", conversation=conv, turns=2, status=status))
    return out


def _synthetic(n: int) -> Iterator[Message]:
    """A campaign of ``n`` conversations, four at a time (they finish out of order)."""
    yield CampaignStarted(
        campaign="c", cells=TALLY_CELLS, threshold=3, planned_conversations=n, max_turns=2
    )
    for start in range(0, n, 4):
        group = [_conversation(i) for i in range(start, min(n, start + 4))]
        for step in itertools.zip_longest(*group):  # one event of each in turn
            yield from (e for e in step if e is not None)


def _held_by_report(n: int) -> int:
    """Bytes the report's fold of ``n`` conversations still holds once it read them all."""

    async def main() -> int:
        async with GeneratedStore(lambda: _synthetic(n)) as store:
            await store.register_campaign("c")
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            [report] = await load_report(store, "c")
            assert report.models["m"].turns == 2 * ((n + 1) // 2)
            return store.held - base

    tracemalloc.start()
    try:
        return anyio.run(main)
    finally:
        tracemalloc.stop()


def test_the_report_fold_holds_little_per_conversation() -> None:
    """Bytes the fold still holds at the end of the read, per conversation (of 400 against
    40): the facts of the attempts (a few KB per conversation) are tallied and dropped."""
    small, large = 40, 400
    per_conversation = (_held_by_report(large) - _held_by_report(small)) / (large - small)
    assert per_conversation < 1500, per_conversation


def _one_pass(events: Iterable[Message], log: CampaignLog) -> CampaignLog:
    for seq, event in enumerate(events, 1):
        log.add(event, 0.0, seq)
    return log


def test_a_tally_of_conversations_as_they_complete_gives_the_whole_logs_figures() -> None:
    tally = CampaignTally()
    streamed = _one_pass(_synthetic(57), CampaignLog(on_close=tally.close))
    assert tally.closed == 57 - 5  # the failed ones stay until the end
    assert len({k[0] for k in streamed.attempts}) == 5 and streamed.late == 0
    tally.add_log(streamed)
    whole = _one_pass(_synthetic(57), CampaignLog())
    figures = metrics_of(streamed, whole.cells, threshold=3, tally=tally)
    assert msgspec.to_builtins(figures) == msgspec.to_builtins(
        metrics_of(whole, whole.cells, threshold=3)
    )
    m = figures["m"]
    assert m.lookahead_calls and m.lookahead_credited and m.unjudged and m.asr_at_k_ci[1]
    assert compare_models(streamed, threshold=3, tally=tally) == compare_models(whole, threshold=3)
    with pytest.raises(ValueError, match="counts success at 3, not 2"):
        metrics_of(streamed, whole.cells, threshold=2, tally=tally)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_an_event_after_a_conversation_completed_folds_the_whole_log(
    anyio_backend: str,
) -> None:
    events = list(_synthetic(9))
    first = next(e for e in events if isinstance(e, ConversationFinished))
    late = Verdict(
        campaign="c",
        conversation=first.conversation,
        turn=0,
        attempt=7,
        category="blaming",
        role="enabler",
        severity=5,
        label="x",
        reasoning="...",
    )
    events.append(late)
    assert _one_pass(events, CampaignLog(on_close=CampaignTally().close)).late == 1
    async with MemoryEventStore() as store:
        await store.register_campaign("c")
        for event in events:
            await store.append(event)
        [report] = await load_report(store, "c")
        whole = report_of(await campaign_log(store, "c"), "c")
    assert report_json([report]) == report_json([whole])
