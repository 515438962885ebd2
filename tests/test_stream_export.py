"""``export`` and ``report --html`` read the store once and give each conversation's records
as it completes (issue 16): the same records as the whole fold, grouped by conversation, and
what is held does not grow with the campaign's attempts."""

from __future__ import annotations

import csv
import gc
import hashlib
import io
import itertools
import json
import random
import re
import tracemalloc
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mhsafeeval.reports.export as export_module
from helpers import GeneratedStore, cli
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ClientUtterance,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Directive,
    Elite,
    Exchange,
    Message,
    Rating,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
    lookahead_branch,
)
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    ModelSettings,
    PermanentProviderError,
)
from mhsafeeval.rejudge import rejudge
from mhsafeeval.reports import html as html_report
from mhsafeeval.reports.export import AttemptRecord, RecordStream, export, records_of
from mhsafeeval.reports.html import build_html, write_html
from mhsafeeval.storage import CampaignLog, EventStore, MemoryEventStore, SqliteEventStore
from mhsafeeval.testing import demo_counselor, register_script, scripted_models
from mhsafeeval.testing._demo import demo_judge

SLIPS = {"dependency induction": 0.6, "gaslighting": 0.5, "over-pathologizing": 0.5}
BROKEN = [False]  # while True, the flaky counselor's adapter crashes on some calls


def _unit(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def flaky_counselor(messages: Sequence[ChatMessage], params: CallParams) -> str:
    """The demo counselor, except that some calls are refused for good (a failed attempt) and,
    while :data:`BROKEN`, some crash the adapter (the conversation fails; a rerun retries it)."""
    roll = _unit("\n".join(m.content for m in messages) + f"#{params.seed}#stream")
    if BROKEN[0] and roll < 0.12:
        raise RuntimeError("a bug in the counselor adapter")
    if roll > 0.88:
        raise PermanentProviderError("400 blocked by a content filter", status=400)
    return demo_counselor(messages, params, slip_rates=SLIPS)


def moody_judge(messages: Sequence[ChatMessage], params: CallParams) -> str:
    """The demo judge, except that it gives no verdict on some replies (unjudged). Which ones
    is decided by the prompt without its nonce (drawn from the reply's message id)."""
    prompt = re.sub(r"\b[0-9a-f]{16}\b", "", messages[-1].content if messages else "")
    return "hard to say, really" if _unit(prompt) < 0.2 else demo_judge(messages, params)


register_script("stream-flaky-counselor", flaky_counselor)
register_script("stream-moody-judge", moody_judge)

CONFIG = """
[campaign]
name = "flow"
seed = 7
threshold = 3
max_turns = 3
max_attempts = 2
conversations_per_profile = 3
concurrency = 3
judge_max_asks = 1
controller = "uct"
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]

[search]
simulations = 3
in_flight = 2

""" + scripted_models(
    judge="stream-moody-judge",
    counselors={"flaky": "stream-flaky-counselor", "plain": "demo-counselor"},
)


def _key(r: AttemptRecord | dict[str, Any]) -> tuple[str, int, int, str]:
    if isinstance(r, dict):
        return (r["conversation"], r["turn"], r["attempt"], r["branch"])
    return (r.conversation, r.turn, r.attempt, r.branch)


def _decoded(lines: str) -> list[AttemptRecord]:
    return [msgspec.json.decode(line, type=AttemptRecord) for line in lines.splitlines()]


def _plain(records: Sequence[AttemptRecord]) -> list[Any]:
    """The records as plain data, in a fixed order (to compare as multisets)."""
    return sorted((msgspec.to_builtins(r) for r in records), key=json.dumps)


async def _whole(store: EventStore, campaign: str) -> list[AttemptRecord]:
    """Every record of the campaign from one whole fold that keeps every text."""
    log = CampaignLog(keep_text=True)
    async for stored in store.events(campaign):
        assert stored.message is not None
        log.add(stored.message, stored.recorded_at, stored.seq)
    return records_of(log, campaign)


async def _resumed(store: MemoryEventStore) -> list[Message]:
    """The campaign run with a crashing adapter (some conversations fail), then run again
    with it mended: failed turns are moved aside and retried (some complete)."""
    config = parse_config(CONFIG, "flow.toml")
    BROKEN[0] = True
    try:
        first = await run_campaign(config, store, config_text=CONFIG)
    finally:
        BROKEN[0] = False
    failed = {e.conversation async for e in _ends(store) if e.status == "failed"}
    assert len(failed) == first.failed > 0
    again = await run_campaign(config, store, config_text=CONFIG)
    assert again.resumed_from > 0 and await store.superseded("flow") > 0
    retried = {e.conversation async for e in _ends(store) if e.status == "completed"} & failed
    assert retried and again.failed < first.failed  # retried, and completed this time
    return [e.message async for e in store.events("flow") if e.message is not None]


async def _ends(store: MemoryEventStore) -> AsyncIterator[ConversationFinished]:
    async for stored in store.events("flow"):
        if isinstance(stored.message, ConversationFinished):
            yield stored.message


def _conversations_in_order(records: Sequence[AttemptRecord | dict[str, Any]]) -> list[str]:
    """The conversations of records, each once, in order; a conversation split in two fails."""
    runs = [conversation for conversation, _ in itertools.groupby(_key(r)[0] for r in records)]
    assert len(runs) == len(set(runs)), "a conversation's records are not together"
    return runs


def _expected_order(events: list[Message], whole: list[AttemptRecord]) -> list[str]:
    """Conversations in order of completion, then the others in order of first attempt."""
    completed = [
        e.conversation
        for e in events
        if isinstance(e, ConversationFinished) and e.status == "completed"
    ]
    rest = dict.fromkeys(r.conversation for r in whole if r.conversation not in completed)
    return [c for c in completed if any(r.conversation == c for r in whole)] + list(rest)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_export_gives_the_whole_folds_records_a_conversation_at_a_time(
    anyio_backend: str,
) -> None:
    async with MemoryEventStore() as store:
        events = await _resumed(store)
        whole = await _whole(store, "flow")
        lines, table = io.StringIO(), io.StringIO()
        assert await export(store, "flow", "jsonl", lines) == len(whole)
        assert await export(store, "flow", "csv", table) == len(whole)
    # what the campaign holds: every outcome, the tree search's branches, a retried turn
    assert {r.outcome for r in whole} >= {"verdict", "unjudged", "failed", "incomplete"}
    assert {r.controller for r in whole} == {"uct"} and any(r.committed for r in whole)
    ends = [e for e in events if isinstance(e, ConversationFinished)]
    assert len(ends) == len({e.conversation for e in ends}) == 12

    exported = _decoded(lines.getvalue())
    assert _plain(exported) == _plain(whole)  # the same records, every field
    assert _conversations_in_order(exported) == _expected_order(events, whole)
    first_event = [_key(r) for r in whole]  # the whole fold's order: each attempt's first event
    for conversation in _conversations_in_order(exported):
        mine = [_key(r) for r in exported if r.conversation == conversation]
        assert mine == [k for k in first_event if k[0] == conversation]
    assert _conversations_in_order(exported) != list(dict.fromkeys(k[0] for k in first_event))
    rows = list(csv.DictReader(io.StringIO(table.getvalue(), newline="")))
    assert [(r["conversation"], int(r["turn"]), int(r["attempt"]), r["branch"]) for r in rows] == [
        _key(r) for r in exported
    ]


# -- a synthetic campaign: lookahead attempts, failed and unfinished conversations -------------

CELLS = (("blaming", "enabler"), ("gaslighting", "perpetrator"))


def _conversation(i: int) -> list[Message]:
    """One conversation of two turns: plain, unjudged and failed attempts, a lookahead played
    on the committed history (even ``i``) or off it (odd ``i``), an elite; it completes, or
    (a few of the first 40) fails or never ends."""
    model, profile = ("m", "n")[i % 2], f"p{i % 3}"
    conv = f"c/{model}/{profile}/{i}"
    usage = Usage(model="scripted/x", prompt_tokens=10, completion_tokens=5)
    out: list[Message] = [
        ConversationStarted(
            campaign="c", conversation=conv, counselor_model=model, profile_id=profile, index=i
        )
    ]
    for turn in range(2):
        category, role = CELLS[(i + turn) % 2]
        plans = [(0, ""), (1, "")] + ([(1, lookahead_branch(1))] if turn == 0 else [])
        for attempt, branch in plans:
            at: dict[str, Any] = dict(
                campaign="c", conversation=conv, turn=turn, attempt=attempt, branch=branch
            )
            cell: dict[str, Any] = dict(category=category, role=role)
            ahead = (Exchange(f"u{i}.0", f"r{i}.0" if i % 2 == 0 else "other"),) if branch else ()
            severity = (3 * i + turn + attempt + len(branch)) % 5 + 1
            out += [
                Directive(**at, **cell, controller="t", instruction=f"push {i}.{turn}.{attempt}"),
                ClientUtterance(**at, **cell, text=f"u{i}.{turn}", usage=usage, lookahead=ahead),
            ]
            if (i + attempt + turn) % 9 == 4:
                out.append(CallFailed(**at, agent="counselor", model="x", error="400 blocked"))
                continue
            out.append(CounselorReply(**at, **cell, text=f"r{i}.{turn}", usage=usage))
            if (i + attempt) % 7 == 3:
                out.append(Unjudged(**at, **cell, reason="garbage", usage=usage))
                continue
            verdict = Verdict(
                **at,
                **cell,
                severity=severity,
                label="x",
                reasoning=f"because {i}.{turn}.{attempt}",
                evidence=(f"r{i}",),
                refused=severity == 1,
                understood=i % 4 != 0,
                usage=usage,
            )
            out.append(verdict)
            if severity == 5 and i % 3 == 0:
                elite = Elite(
                    category=category,
                    role=role,
                    severity=5,
                    reply=f"r{i}.{turn}",
                    conversation=conv,
                    turn=turn,
                    attempt=attempt,
                    verdict_id=verdict.id,
                    counselor_model=model,
                )
                out.append(ArchiveUpdated(**at, counselor_model=model, elite=elite))
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
    if i % 13 != 7 or i > 40:  # a few conversations only, whatever the campaign's size
        status = "failed" if i % 11 == 5 and i < 40 else "completed"
        out.append(ConversationFinished(campaign="c", conversation=conv, turns=2, status=status))
    return out


def _synthetic(n: int, *, threshold: int = 3) -> Iterator[Message]:
    """A campaign of ``n`` conversations, five at a time (they finish out of order)."""
    yield CampaignStarted(
        campaign="c", cells=CELLS, threshold=threshold, planned_conversations=n, max_turns=2
    )
    for start in range(0, n, 5):
        group = [_conversation(i) for i in range(start, min(n, start + 5))]
        for step in itertools.zip_longest(*group):  # one event of each in turn
            yield from (e for e in step if e is not None)


async def _stored(events: Iterator[Message] | list[Message]) -> MemoryEventStore:
    store = MemoryEventStore()
    await store.open()
    await store.register_campaign("c")
    for event in events:
        await store.append(event)
    return store


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_lookahead_failed_and_unfinished_conversations_stream_as_the_whole_fold(
    anyio_backend: str,
) -> None:
    events = list(_synthetic(40))
    store = await _stored(events)
    try:
        whole = await _whole(store, "c")
        stream = RecordStream(store, "c")
        groups = [group async for group in stream]
        assert not stream.stale and stream.late_elites == 0
        out = io.StringIO()
        assert await export(store, "c", "jsonl", out) == len(whole)
    finally:
        await store.aclose()
    streamed = [r for group in groups for r in group]
    assert _plain(streamed) == _plain(whole)
    assert [g[0].conversation for g in groups] == _expected_order(events, whole)
    assert all(len({r.conversation for r in g}) == 1 for g in groups)
    assert out.getvalue() == "".join(msgspec.json.encode(r).decode() + "\n" for r in streamed)
    ahead = [r for r in streamed if r.branch]
    assert {r.committed for r in ahead} == {False} and ahead
    assert {r.outcome for r in streamed} == {"verdict", "unjudged", "failed"}
    ends = {e.conversation: e.status for e in events if isinstance(e, ConversationFinished)}
    never = {r.conversation for r in whole if ends.get(r.conversation) != "completed"}
    assert {ends.get(c) for c in never} == {"failed", None}  # failed, and never ended
    assert {g[0].conversation for g in groups[-len(never) :]} == never  # last


class Sink(io.StringIO):
    """An output that keeps nothing and cannot seek back (a pipe)."""

    def write(self, text: str) -> int:
        return len(text)

    def seekable(self) -> bool:
        return False


class Pipe(io.StringIO):
    """An output that keeps what is written and cannot seek back or cut (a pipe)."""

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        raise OSError("a pipe has no position")

    def seek(self, offset: int, whence: int = 0) -> int:
        raise OSError("a pipe cannot seek")

    def truncate(self, size: int | None = None) -> int:
        raise OSError("a pipe cannot be cut")


def _held_by(n: int, command: str, folder: Path) -> int:
    """Bytes that ``export`` (or ``build_html`` with pages) of ``n`` synthetic conversations
    still holds when its read of the store has ended, past what was held before."""

    def make() -> Iterator[Message]:  # rated: half the ratings right after the finish
        return _rated(_synthetic(n), 1) if command == "export-rated" else _synthetic(n)

    async def main() -> int:
        async with GeneratedStore(make) as store:
            await store.register_campaign("c")
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            if command == "html":
                pages = folder / f"p{n}"
                await build_html(store, "c", pages=pages, inline_attempts=100, page_attempts=20)
            else:
                await export(store, "c", "jsonl", Sink())
            return store.held - base

    tracemalloc.start()
    try:
        return anyio.run(main)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("command", ["export", "export-rated", "html"])
def test_what_is_held_grows_little_per_conversation(command: str, tmp_path: Path) -> None:
    """Bytes held at the end of the read, per conversation (400 against 40): the attempts'
    facts and texts (several KB per conversation) are given and dropped as each completes;
    what stays is the conversation's name and start, and the report's tally of it. A rated
    campaign (a panel: some ratings stored after their conversation completed) too."""
    small, large = 40, 400
    held = _held_by(large, command, tmp_path) - _held_by(small, command, tmp_path)
    per_conversation = held / (large - small)
    assert per_conversation < 1500, per_conversation


# -- the HTML report: figures of the tallied read, transcripts paged as conversations end ------


def _data(page: str) -> list[dict[str, Any]]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    data: list[dict[str, Any]] = json.loads(found.group(1))
    return data


def _pages(paths: list[Path]) -> list[list[dict[str, Any]]]:
    out = []
    for path in paths:
        call = re.fullmatch(r"mhsafeevalPage\(\d+, \d+, (.*)\);\n", path.read_text(), re.S)
        assert call is not None, path
        out.append(json.loads(call.group(1)))
    return out


class _StaleStream(RecordStream):
    """A stream that always says a late event came: the HTML report folds the campaign whole."""

    @property
    def stale(self) -> bool:
        return True


async def _no_whole_fold(*args: object, **kwargs: object) -> None:
    raise AssertionError("the campaign was folded whole")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_html_figures_are_the_whole_folds_and_pages_follow_completion(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MemoryEventStore() as store:
        events = await _resumed(store)
        whole_records = await _whole(store, "flow")
        inline = await build_html(store, "flow")
        paged = await write_html(
            store, "flow", tmp_path / "s.html", inline_attempts=0, page_attempts=15
        )
        with monkeypatch.context() as m:
            m.setattr(html_report, "RecordStream", _StaleStream)
            inline_whole = await build_html(store, "flow")
            paged_whole = await write_html(
                store, "flow", tmp_path / "w.html", inline_attempts=0, page_attempts=15
            )
    assert inline == inline_whole  # small reports: the same bytes
    main, main_whole = ((tmp_path / name).read_text() for name in ("s.html", "w.html"))
    cut = main.index('<script type="application/json"')
    assert main[:cut] == main_whole[:cut]  # every figure, table and chart
    (c,), (w,) = _data(main), _data(main_whole)
    assert {k: v for k, v in c.items() if k != "pages"} == {
        k: v for k, v in w.items() if k != "pages"
    }
    records, records_whole = _pages(paged), _pages(paged_whole)
    flat = [r for page in records for r in page]
    assert sorted(map(json.dumps, flat)) == sorted(
        json.dumps(r) for page in records_whole for r in page
    )
    assert [p["attempts"] for p in c["pages"]] == [len(page) for page in records]
    assert _conversations_in_order(flat) == _expected_order(events, whole_records)
    assert c["total"] == len(whole_records) == len(flat)
    # Each archived conversation's committed turns (none for one that failed before its first
    # commit: its elite was archived when confirmed, and its next attempt failed).
    committed = {m.conversation for m in events if isinstance(m, TurnCommitted)}
    assert len(c["context"]) > 0
    assert all(bool(turns) == (conv in committed) for conv, turns in c["context"].items())


# -- what a later event can still change: the whole fold is read instead -----------------------


def _late(events: list[Message]) -> list[Message]:
    """The synthetic events, plus a failed call stored for an attempt of a conversation after
    it completed (one attempt's ``failed_calls`` changes)."""
    done = next(
        e for e in events if isinstance(e, ConversationFinished) and e.status == "completed"
    )
    attempt = next(
        e for e in events if isinstance(e, Directive) and e.conversation == done.conversation
    )
    late = CallFailed(
        campaign="c",
        conversation=attempt.conversation,
        turn=attempt.turn,
        attempt=attempt.attempt,
        key="late",
        agent="refiner",
        model="x",
        error="boom",
    )
    return [*events, late]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_an_event_after_its_conversation_completed_reads_the_whole_fold(
    anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _late(list(_synthetic(15)))
    store = await _stored(events)
    try:
        whole = await _whole(store, "c")
        stream = RecordStream(store, "c")
        streamed = [r async for group in stream for r in group]
        assert stream.stale and _plain(streamed) != _plain(whole)  # what it gave was not final
        # a file is written again from the whole fold
        out = io.StringIO()
        out.write("before\n")
        assert await export(store, "c", "jsonl", out) == len(whole)
        lines = out.getvalue().split("\n")
        assert lines[0] == "before"
        assert [msgspec.json.decode(x, type=AttemptRecord) for x in lines[1:-1]] == whole
        # a pipe is told before anything is written: the whole fold, complete, in its order
        pipe, table = Pipe(), io.StringIO()
        assert await export(store, "c", "jsonl", pipe, source="x.db") == len(whole)
        assert _decoded(pipe.getvalue()) == whole
        pipe = Pipe()
        assert await export(store, "c", "csv", pipe) == await export(store, "c", "csv", table)
        assert pipe.getvalue() == table.getvalue()
        # the HTML report is the whole fold's, and no page of the first read is left
        written = await write_html(
            store, "c", tmp_path / "r.html", inline_attempts=0, page_attempts=7
        )
        folder = tmp_path / "r_files" / written[0].parent.name  # this report's pages
        assert sorted(folder.iterdir()) == sorted(written)
        with monkeypatch.context() as m:
            m.setattr(html_report, "RecordStream", _StaleStream)
            expected = await write_html(
                store, "c", tmp_path / "w.html", inline_attempts=0, page_attempts=7
            )
        w_run, r_run = f"w_files/{expected[0].parent.name}", f"r_files/{folder.name}"
        assert _data((tmp_path / "r.html").read_text())[0]["pages"] == [
            {**p, "src": p["src"].replace(w_run, r_run)}
            for p in _data((tmp_path / "w.html").read_text())[0]["pages"]
        ]
        assert _pages(written) == _pages(expected)
    finally:
        await store.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_late_threshold_elite_or_rating_reads_the_whole_fold(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = list(_synthetic(12, threshold=4))
    # the campaign's start stored after some conversations completed: it sets the threshold
    first_end = next(i for i, e in enumerate(events) if isinstance(e, ConversationFinished))
    moved = [*events[1 : first_end + 1], events[0], *events[first_end + 1 :]]
    # an elite of a conversation that had completed
    done = next(
        e for e in events if isinstance(e, ConversationFinished) and e.status == "completed"
    )
    model = "m" if "/m/" in done.conversation else "n"
    elite = Elite(
        category="blaming",
        role="enabler",
        severity=5,
        conversation=done.conversation,
        reply="late",
        counselor_model=model,
    )
    late_elite = ArchiveUpdated(
        campaign="c", conversation=done.conversation, key="late", counselor_model=model, elite=elite
    )
    # a reporting judge's rating (rejudge), after the campaign, of a completed conversation
    verdict = next(
        e for e in events if isinstance(e, Verdict) and e.conversation == done.conversation
    )
    rating = Rating(
        **{k: getattr(verdict, k) for k in ("campaign", "conversation", "turn", "attempt")},
        category=verdict.category,
        role=verdict.role,
        rater="other",
        severity=2,
        source="rejudge",
    )
    for case, stored in [
        ("threshold", moved),
        ("elite", [*events, late_elite]),
        ("rating", [*events, rating]),
    ]:
        store = await _stored(stored)
        try:
            whole = await _whole(store, "c")
            out = io.StringIO()
            assert await export(store, "c", "jsonl", out) == len(whole)
            exported = _decoded(out.getvalue())
            if case == "threshold":
                assert _plain(exported) == _plain(whole)
                assert {r.success for r in whole if r.severity == 3} == {False}  # 4, not 2
                stream = RecordStream(store, "c")
                _ = [group async for group in stream]
                assert stream.stale
                pipe = Pipe()  # the whole fold, as it is not given a conversation at a time
                assert await export(store, "c", "jsonl", pipe) == len(whole)
                assert _decoded(pipe.getvalue()) == whole
            elif case == "rating":  # read ahead: given with its conversation, not late
                assert _plain(exported) == _plain(whole)
                assert _conversations_in_order(exported) == _expected_order(events, whole)
                assert any(r.ratings for r in exported)
                # The HTML report shows no ratings: a late one goes to the tally, and the
                # report is the whole fold's without folding the campaign whole.
                with monkeypatch.context() as m:
                    m.setattr(html_report, "load_reports_and_logs", _no_whole_fold)
                    page = await build_html(store, "c")
                with monkeypatch.context() as m:
                    m.setattr(html_report, "RecordStream", _StaleStream)
                    assert page == await build_html(store, "c")
            else:  # the elite's conversation was given before it was one: its turns are read
                page = await build_html(store, "c")
                with monkeypatch.context() as m:
                    m.setattr(html_report, "RecordStream", _StaleStream)
                    assert page == await build_html(store, "c")
                (data,) = _data(page)
                assert data["context"][done.conversation]
        finally:
            await store.aclose()


# -- reporting judges' ratings stored after their conversation completed: read ahead ---------

RATERS = ("a", "a#2", "b")


def _rating_of(verdict: Verdict, rater: str, rng: random.Random) -> Message:
    """A reporting judge's rating of the verdict's reply, or (some) its failed call."""
    at: dict[str, Any] = {
        k: getattr(verdict, k) for k in ("campaign", "conversation", "turn", "attempt", "branch")
    }
    usage = Usage(
        model=f"scripted/{rater.split('#')[0]}",
        prompt_tokens=rng.randrange(5, 50),
        completion_tokens=rng.randrange(1, 9),
        usd=None if rng.random() < 0.5 else 0.001,
    )
    if rng.random() < 0.15:
        return CallFailed(
            **at,
            key=Rating.key_for(rater),
            agent="panel",
            model=usage.model,
            error="down",
            usage=usage if rng.random() < 0.5 else None,
        )
    return Rating(
        **at,
        key=Rating.key_for(rater),
        category=verdict.category,
        role=verdict.role,
        rater=rater,
        judge=usage.model,
        severity=None if rng.random() < 0.1 else rng.randint(1, 5),
        label="x",
        reasoning=f"the rater's reasoning about {verdict.reasoning}",
        evidence=("a quote",),
        refused=rng.random() < 0.3,
        understood=rng.random() < 0.8,
        source="panel",
        usage=usage,
    )


def _rated(
    events: Iterable[Message], seed: int, *, late: float = 0.5, after: bool = False
) -> Iterator[Message]:
    """The events, each verdict rated by every rater of :data:`RATERS`: a rating is stored
    right after the verdict or (``late`` of them) right after its conversation's finish, as
    a panel rates a conversation's last turn; with ``after``, every one after the campaign,
    as ``rejudge`` does. Ratings of conversations that never finished come at the end."""
    rng = random.Random(seed)
    held: dict[str, list[Message]] = {}
    tail: list[Message] = []
    for event in events:
        yield event
        if isinstance(event, Verdict):
            for rater in RATERS:
                rating = _rating_of(event, rater, rng)
                if after:
                    tail.append(rating)
                elif rng.random() < late:
                    held.setdefault(event.conversation, []).append(rating)
                else:
                    yield rating
        elif isinstance(event, ConversationFinished):
            yield from held.pop(event.conversation, [])
    for rest in held.values():
        yield from rest
    yield from tail


def _late_ratings(events: Sequence[Message]) -> int:
    """Reporting judges' events stored after their conversation completed."""
    ended: set[str] = set()
    count = 0
    for e in events:
        if isinstance(e, ConversationFinished) and e.status == "completed":
            ended.add(e.conversation)
        elif isinstance(e, Rating | CallFailed) and e.conversation in ended:
            count += isinstance(e, Rating) or e.agent == "panel"
    return count


async def _whole_log(store: EventStore, campaign: str) -> CampaignLog:
    log = CampaignLog()
    async for stored in store.events(campaign):
        assert stored.message is not None
        log.add(stored.message, stored.recorded_at, stored.seq)
    return log


def _spent(log: CampaignLog) -> Any:
    return msgspec.to_builtins(
        {
            "spent": log.spent(),
            "panel_failed": log.panel_failed,
            "failed": log.failed,
            "events": log.events,
        }
    )


def _twisted(events: list[Message], twist: str) -> list[Message]:
    """The events with one hand-made change (see the hypothesis test)."""
    ends = [
        (i, e)
        for i, e in enumerate(events)
        if isinstance(e, ConversationFinished) and e.status == "completed"
    ]
    if twist == "none" or not ends:
        return events
    at, done = ends[0]
    conv = done.conversation
    if twist == "late call":  # a search call stored after the conversation completed
        directive = next(e for e in events if isinstance(e, Directive) and e.conversation == conv)
        failed = CallFailed(
            campaign="c",
            conversation=conv,
            turn=directive.turn,
            attempt=directive.attempt,
            key="late",
            agent="refiner",
            model="x",
            error="boom",
        )
        return [*events, failed]
    if twist == "threshold":  # the campaign's start stored after a conversation completed
        return [*events[1 : at + 1], events[0], *events[at + 1 :]]
    if twist == "priced":  # a resumed run that priced its calls, after a conversation ended
        start = msgspec.structs.replace(events[0], key="resumed", run=1, priced_calls=True)
        assert isinstance(start, CampaignStarted)
        return [*events[: at + 1], start, *events[at + 1 :]]
    if twist == "finish before start":  # a finish the log passes by: it was never started
        begin = next(
            i
            for i, e in enumerate(events)
            if isinstance(e, ConversationStarted) and e.conversation == conv
        )
        early = msgspec.structs.replace(done, key="early")
        return [*events[:begin], early, *events[begin:]]
    if twist == "rating alone":  # a late rating of an attempt that has no other event
        rating = Rating(
            campaign="c", conversation=conv, turn=9, category="blaming", role="enabler", rater="a"
        )
        return [*events, rating]
    raise AssertionError(twist)


TWISTS = ["none", "late call", "threshold", "priced", "finish before start", "rating alone"]


async def _check_rated(events: list[Message], twist: str, db: Path | None = None) -> None:
    """The checks of the hypothesis test, on a memory store or (``db``) a SQLite file (whose
    reads give the bodies undecoded, as the pre-reads ask)."""
    store: EventStore
    if db is None:
        store = await _stored(events)
    else:
        store = SqliteEventStore(db)
        await store.open()
        await store.register_campaign("c")
        for event in events:
            await store.append(event)
        await store.flush()
    try:
        whole = await _whole(store, "c")
        whole_log = await _whole_log(store, "c")
        stream = RecordStream(store, "c", ratings=True)
        groups = [group async for group in stream]
        plan = await export_module._pipe_plan(store, "c")
        out, pipe = io.StringIO(), Pipe()
        assert await export(store, "c", "jsonl", out) == len(whole)
        assert await export(store, "c", "jsonl", pipe) == len(whole)
    finally:
        await store.aclose()
    assert plan[0] == stream.stale  # the pipe's pre-pass decides as the stream would go
    assert plan[1] == any(r.ratings or r.panel_failed for r in whole)
    if twist in ("late call", "threshold"):
        assert stream.stale
    elif twist != "finish before start":  # that one is late if a rating came after its end
        assert not stream.stale
    assert _spent(stream.log) == _spent(whole_log)  # every event folded once, priced as stored
    assert _plain(_decoded(out.getvalue())) == _plain(whole)
    assert _plain(_decoded(pipe.getvalue())) == _plain(whole)
    if stream.stale:
        assert _decoded(pipe.getvalue()) == whole  # the whole fold, in its order
        return
    streamed = [r for group in groups for r in group]
    assert _plain(streamed) == _plain(whole)  # every field: ratings, panel figures, times
    assert out.getvalue() == pipe.getvalue()
    assert out.getvalue() == "".join(msgspec.json.encode(r).decode() + "\n" for r in streamed)
    if twist in ("none", "priced"):
        assert [g[0].conversation for g in groups] == _expected_order(events, whole)
        assert stream.read_ahead == _late_ratings(events)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    conversations=st.integers(1, 16),
    late=st.sampled_from([0.0, 0.5, 1.0]),
    after=st.booleans(),
    twist=st.sampled_from(TWISTS),
)
def test_rated_campaigns_stream_as_the_whole_fold(
    seed: int, conversations: int, late: float, after: bool, twist: str
) -> None:
    """Ratings and failed rating calls stored after their conversation completed (a panel,
    ``rejudge``), with a hand-made twist: the records streamed, to a file or a pipe, are the
    whole fold's, given a conversation at a time unless a late event forces the whole fold;
    the pipe's pre-pass says so exactly as the stream would find it."""
    events = _twisted(list(_rated(_synthetic(conversations), seed, late=late, after=after)), twist)
    anyio.run(_check_rated, events, twist)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("twist", TWISTS)
@pytest.mark.anyio
async def test_rated_campaigns_in_a_sqlite_file_stream_as_the_whole_fold(
    anyio_backend: str, twist: str, tmp_path: Path
) -> None:
    """The same, from a SQLite file: its read-ahead and the pipe's pre-pass decode only the
    fields they need of each stored body."""
    events = _twisted(list(_rated(_synthetic(14), 11)), twist)
    await _check_rated(events, twist, tmp_path / "rated.db")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_held_rating_is_priced_as_the_run_that_stored_it(anyio_backend: str) -> None:
    """A rating held for its conversation's finish was stored by a run that priced its calls
    (a ``CampaignStarted`` after the finish): its unpriced usage is unknown, not unpriced."""
    events = list(_synthetic(5))
    done = next(
        e for e in events if isinstance(e, ConversationFinished) and e.status == "completed"
    )
    verdict = next(
        e for e in events if isinstance(e, Verdict) and e.conversation == done.conversation
    )
    start = events[0]
    assert isinstance(start, CampaignStarted) and not start.priced_calls
    resumed = msgspec.structs.replace(start, key="resumed", run=1, priced_calls=True)
    usage = Usage(model="scripted/a", prompt_tokens=11, completion_tokens=2, calls=3)
    rating = Rating(
        **{k: getattr(verdict, k) for k in ("campaign", "conversation", "turn", "attempt")},
        category=verdict.category,
        role=verdict.role,
        rater="a",
        severity=2,
        usage=usage,
    )
    store = await _stored([*events, resumed, rating])
    try:
        whole = await _whole_log(store, "c")
        stream = RecordStream(store, "c", ratings=True)
        records = [r async for group in stream for r in group]
    finally:
        await store.aclose()
    assert not stream.stale and stream.read_ahead == 1
    assert stream.log.spent()["panel"].unknown == whole.spent()["panel"].unknown == 3
    assert _spent(stream.log) == _spent(whole)
    (rated,) = [r for r in records if r.ratings]
    assert rated.ratings == {"a": 2} and rated.panel_tokens == 13


def flaky_panel(messages: Sequence[ChatMessage], params: CallParams) -> str | BaseException:
    """The demo judge as a reporting judge that refuses some calls for good (a failed
    rating call: the panel's, never the attempt's)."""
    prompt = "\n".join(m.content for m in messages) + f"#{params.seed}#{params.temperature}"
    if _unit(prompt + "#panel") < 0.25:
        return PermanentProviderError("400 the panel judge refused", status=400)
    return demo_judge(messages, params)


register_script("stream-flaky-panel", flaky_panel)

PANEL = """
[judges]
samples = 2

[judges.panel.flaky]
provider = "scripted/stream-flaky-panel"
temperature = 0.5
"""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("rated_by", ["panel", "rejudge"])
@pytest.mark.anyio
async def test_a_paneled_or_rejudged_campaign_streams_as_the_whole_fold(
    anyio_backend: str, rated_by: str
) -> None:
    text = CONFIG.replace("conversations_per_profile = 3", "conversations_per_profile = 2")
    text += PANEL if rated_by == "panel" else ""
    config = parse_config(text, "flow.toml")
    async with MemoryEventStore() as store:
        with anyio.fail_after(120):  # a hang guard
            await run_campaign(config, store, config_text=text)
            if rated_by == "rejudge":
                judges = [ModelSettings(provider="scripted/stream-flaky-panel")]
                await rejudge(store, judges, source="flow.db")
        events = [e.message async for e in store.events("flow") if e.message is not None]
        whole = await _whole(store, "flow")
        lines, pipe = io.StringIO(), Pipe()
        assert await export(store, "flow", "jsonl", lines) == len(whole)
        assert await export(store, "flow", "jsonl", pipe) == len(whole)
        late = _late_ratings(events)
        ends = {e.conversation for e in events if isinstance(e, ConversationFinished)}
        panel_failed = [e for e in events if isinstance(e, CallFailed) and e.agent == "panel"]
        assert late > 0 and panel_failed and any(r.ratings for r in whole)
        if rated_by == "rejudge":  # every rating after the campaign
            assert late == sum(isinstance(e, Rating) for e in events) + len(panel_failed)
        else:  # the last turns' ratings and failed calls came after their conversation's end
            assert any(e.conversation in ends for e in panel_failed)
            assert late < sum(isinstance(e, Rating) for e in events)
        exported = _decoded(lines.getvalue())
        assert _plain(exported) == _plain(whole)  # every field of every record
        assert pipe.getvalue() == lines.getvalue()
        assert _conversations_in_order(exported) == _expected_order(events, whole)
        runs = [c for c, _ in itertools.groupby(r.conversation for r in whole)]
        assert len(runs) > len(set(runs))  # the whole fold's order interleaves them
        stream = RecordStream(store, "flow", ratings=True)
        streamed = [r async for group in stream for r in group]
    assert not stream.stale and stream.read_ahead == late  # every late one read ahead
    assert _plain(streamed) == _plain(whole)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_the_cli_writes_a_late_event_campaign_whole_to_a_pipe(
    anyio_backend: str, tmp_path: Path
) -> None:
    """``mhsafeeval export DB | ...`` of a hand-made store with a late event: stdout (a pipe)
    gets every record, the whole fold's, and the exit code is 0."""
    db = tmp_path / "late.db"
    async with SqliteEventStore(db) as store:
        await store.register_campaign("c")
        for event in _late(list(_synthetic(12))):
            await store.append(event)
    async with SqliteEventStore(db, read_only=True) as store:
        whole = await _whole(store, "c")
        table = io.StringIO()
        await export(store, "c", "csv", table)
        stream = RecordStream(store, "c")
        _ = [group async for group in stream]
        assert stream.stale
    lines = cli("export", str(db), timeout=120)
    assert lines.returncode == 0, lines.stderr
    assert _decoded(lines.stdout) == whole
    rows = cli("export", str(db), "--format", "csv", timeout=120)
    assert rows.returncode == 0, rows.stderr
    expected = list(csv.reader(io.StringIO(table.getvalue(), newline="")))
    assert list(csv.reader(io.StringIO(rows.stdout))) == expected
    assert len(expected) == len(whole) + 1
