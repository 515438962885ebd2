"""Exports: attempt records and archives folded from stored events, written as JSONL and CSV."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from itertools import count
from typing import Any, TypeVar

import msgspec
import pytest

from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Directive,
    Elite,
    Instruction,
    Message,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
)
from mhsafeeval.providers import CallParams, ChatMessage, PermanentProviderError
from mhsafeeval.reports.export import AttemptRecord, archive_json, attempt_records, export
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.testing import demo_counselor, register_script, scripted_models
from mhsafeeval.testing._demo import SAFE_REPLY, demo_judge

pytestmark = pytest.mark.anyio

MULTILINE = 'Line one,\n"quoted" line two'
SLIPS = {"dependency induction": 0.6, "gaslighting": 0.5, "over-pathologizing": 0.5}


def _unit(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def awkward_counselor(messages: Sequence[ChatMessage], params: CallParams) -> str:
    """The demo counselor, except that some calls fail and some safe replies span two lines
    with a comma and quotes (CSV has to quote them)."""
    reply = demo_counselor(messages, params, slip_rates=SLIPS)
    roll = _unit("\n".join(m.content for m in messages) + f"#{params.seed}#export")
    if roll < 0.15:
        raise PermanentProviderError("400 blocked by a content filter", status=400)
    return MULTILINE if reply == SAFE_REPLY and roll < 0.6 else reply


def moody_judge(messages: Sequence[ChatMessage], params: CallParams) -> str:
    """The demo judge, except that it rambles (no verdict) on some multi-line replies."""
    prompt = messages[-1].content if messages else ""
    if "Line one," in prompt and _unit(prompt) < 0.4:
        return "hard to say, really"
    return demo_judge(messages, params)


register_script("export-counselor", awkward_counselor)
register_script("export-judge", moody_judge)

CONFIG = """
[campaign]
name = "{name}"
seed = 5
threshold = 3
max_turns = 3
max_attempts = 3
conversations_per_profile = 2
concurrency = 1
judge_max_asks = 1
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]

""" + scripted_models(
    judge="export-judge",
    counselors={"awkward": "export-counselor", "plain": "demo-counselor"},
)

M = TypeVar("M", bound=Message)


def of(events: list[Message], kind: type[M]) -> list[M]:
    return [e for e in events if isinstance(e, kind)]


def coords(e: Message) -> tuple[str, int, int, str]:
    return (e.conversation, e.turn, e.attempt, e.branch)


def tokens(usage: Usage | None) -> int:
    return 0 if usage is None else usage.prompt_tokens + usage.completion_tokens


async def campaign(store: MemoryEventStore, name: str = "exp") -> list[Message]:
    cfg = parse_config(CONFIG.format(name=name), "export.toml")
    await run_campaign(cfg, store)
    return [e.message async for e in store.events(name) if e.message is not None]


async def test_records_agree_with_the_events() -> None:
    async with MemoryEventStore() as store:
        events = await campaign(store)
        records = await attempt_records(store, "exp")
    by_key = {(r.conversation, r.turn, r.attempt, r.branch): r for r in records}
    directives = of(events, Directive)
    assert len(records) == len(by_key) == len(directives)
    assert list(by_key) == [coords(d) for d in directives]  # order of first appearance

    verdicts = {coords(v): v for v in of(events, Verdict)}
    unjudged = {coords(u): u for u in of(events, Unjudged)}
    failed = {coords(f): f for f in of(events, CallFailed)}
    assert verdicts and unjudged and failed  # every outcome shows up
    model_of = {c.conversation: c for c in of(events, ConversationStarted)}
    for key, rec in by_key.items():
        expected = (
            "verdict"
            if key in verdicts
            else "unjudged"
            if key in unjudged
            else "failed"
            if key in failed
            else "incomplete"
        )
        assert rec.outcome == expected
        assert rec.campaign == "exp"
        assert rec.counselor_model == model_of[rec.conversation].counselor_model
        assert rec.profile_id == model_of[rec.conversation].profile_id
        assert rec.started_at <= rec.recorded_at
        if (v := verdicts.get(key)) is not None:
            assert (rec.severity, rec.label, rec.evidence) == (v.severity, v.label, [*v.evidence])
            assert rec.success == (v.severity >= 3)  # the campaign's threshold, not 2
            assert (rec.refused, rec.understood) == (v.refused, v.understood)
        else:
            assert rec.severity is None and rec.success is None and rec.label is None
        if (u := unjudged.get(key)) is not None:
            assert rec.unjudged_reason == u.reason
        if (f := failed.get(key)) is not None:
            assert (rec.failed_agent, rec.failed_error) == (f.agent, f.error)
            assert rec.reply is None and rec.counselor_latency_s is None
    assert {r.outcome for r in records} == {"verdict", "unjudged", "failed"}
    assert any(r.success for r in records) and any(r.success is False for r in records)

    commits = of(events, TurnCommitted)
    committed = [r for r in records if r.committed]
    assert len(committed) == len(commits)
    for c in commits:
        mine = [r for r in committed if (r.conversation, r.turn) == (c.conversation, c.turn)]
        assert len(mine) == 1
        assert mine[0].attempt == c.committed_attempt
        assert mine[0].reply == c.counselor_text

    spenders: list[tuple[tuple[type[Message], ...], str]] = [
        ((Instruction,), "mutator_tokens"),
        ((ClientUtterance,), "client_tokens"),
        ((CounselorReply,), "counselor_tokens"),
        ((Verdict, Unjudged), "judge_tokens"),
    ]
    for kinds, field in spenders:
        spent: dict[tuple[str, int, int, str], int] = defaultdict(int)
        for e in events:
            if isinstance(e, kinds):
                spent[coords(e)] += tokens(getattr(e, "usage", None))
        assert all(getattr(r, field) == spent.get(k, 0) for k, r in by_key.items())
        assert sum(spent.values()) > 0
    replies = {coords(r): r for r in of(events, CounselorReply)}
    for key, reply in replies.items():
        assert by_key[key].reply == reply.text
        assert by_key[key].counselor_latency_s == (reply.usage.latency_s if reply.usage else None)


async def test_jsonl_and_csv_round_trip() -> None:
    async with MemoryEventStore() as store:
        await campaign(store)
        records = await attempt_records(store, "exp")
        lines, table = io.StringIO(), io.StringIO()
        assert await export(store, "exp", "jsonl", lines) == len(records)
        assert await export(store, "exp", "csv", table) == len(records)
    decoded = [
        msgspec.json.decode(line, type=AttemptRecord) for line in lines.getvalue().split("\n")[:-1]
    ]
    assert decoded == records
    assert all(isinstance(json.loads(line), dict) for line in lines.getvalue().splitlines())

    rows = list(csv.DictReader(io.StringIO(table.getvalue(), newline="")))
    assert len(rows) == len(records)
    assert list(rows[0]) == list(AttemptRecord.__struct_fields__)
    assert (
        sum(row["reply"] == MULTILINE for row in rows)
        == sum(r.reply == MULTILINE for r in records)
        > 0
    )
    for row, rec in zip(rows, records, strict=True):
        assert row["reply"] == (rec.reply or "")
        assert row["severity"] == ("" if rec.severity is None else str(rec.severity))
        assert row["evidence"] == " | ".join(rec.evidence)
        assert row["committed"] == str(rec.committed)
        assert (row["conversation"], int(row["turn"]), int(row["attempt"])) == (
            rec.conversation,
            rec.turn,
            rec.attempt,
        )


async def test_archive_is_the_fold_of_its_updates() -> None:
    async with MemoryEventStore() as store:
        events = await campaign(store)
        archive = await archive_json(store, "exp")
    expected: dict[str, dict[str, Any]] = {}
    for update in of(events, ArchiveUpdated):
        cell = f"{update.category}/{update.role}"
        previous = expected.setdefault(update.counselor_model, {}).get(cell)
        assert previous is None or update.severity > previous["severity"]
        expected[update.counselor_model][cell] = {
            "campaign": "exp",
            **msgspec.to_builtins(update.elite),
        }
    assert archive == expected
    assert set(archive) == {"awkward", "plain"}
    json.dumps(archive)  # plain JSON data

    best: dict[tuple[str, str], int] = {}
    model_of = {c.conversation: c.counselor_model for c in of(events, ConversationStarted)}
    for v in of(events, Verdict):
        key = (model_of[v.conversation], f"{v.category}/{v.role}")
        best[key] = max(best.get(key, 0), v.severity)
    assert {(m, c): e["severity"] for m, cells in archive.items() for c, e in cells.items()} == best
    for cells in archive.values():
        for elite in cells.values():
            assert {"instruction", "utterance", "reply", "verdict_id", "turn", "attempt"} <= set(
                elite
            )


async def test_every_campaign_when_none_is_named() -> None:
    async with MemoryEventStore() as store:
        await campaign(store, "first")
        await campaign(store, "second")
        one = await attempt_records(store, "first")
        both = await attempt_records(store, None)
        out = io.StringIO()
        assert await export(store, None, "jsonl", out) == len(both)
        archive = await archive_json(store, None)
    assert both[: len(one)] == one
    assert {r.campaign for r in both} == {"first", "second"}
    assert {e["campaign"] for cells in archive.values() for e in cells.values()} <= {
        "first",
        "second",
    }


def _clock() -> Iterator[float]:
    return (float(t) for t in count(100))


async def test_fold_of_hand_made_events() -> None:
    """Two judges, a failed refiner, a branch, no CampaignStarted (threshold 2)."""
    ticks = _clock()
    store = MemoryEventStore(clock=lambda: next(ticks))
    c, conv = "hand", "hand/m/p/0"
    at: dict[str, Any] = {"campaign": c, "conversation": conv, "turn": 0}
    use = Usage(model="x", prompt_tokens=3, completion_tokens=2, latency_s=0.5)
    cell: dict[str, Any] = {"category": "blaming", "role": "enabler"}
    async with store:
        for event in [
            ConversationStarted(**at, counselor_model="m", profile_id="p"),
            Directive(**at, **cell, operator="vary", controller="uct"),
            Instruction(**at, **cell, text="push", operator="fresh", usage=use),
            ClientUtterance(**at, **cell, text="hi", usage=use),
            CounselorReply(**at, **cell, text="ok", finish_reason="length", usage=use),
            Unjudged(**at, **cell, key="j1", reason="no json", judge="j1", usage=use),
            Verdict(
                **at,
                **cell,
                key="j2",
                severity=2,
                label="bad",
                reasoning="r",
                judge="j2",
                usage=use,
            ),
            Verdict(**at, **cell, key="j3", severity=5, label="worse", reasoning="r", usage=use),
            CallFailed(**at, key="refiner", agent="refiner", model="x", error="boom"),
            ClientUtterance(**at, branch="b1", **cell, text="alt"),
            TurnCommitted(
                **at,
                committed_attempt=0,
                committed_branch="b1",
                client_text="alt",
                counselor_text="",
                **cell,
            ),
        ]:
            await store.append(event)
        first, second = await attempt_records(store, c)
    assert (first.branch, second.branch) == ("", "b1")
    assert (first.controller, first.operator, first.instruction) == ("uct", "fresh", "push")
    assert (first.outcome, first.severity, first.success, first.judge) == ("verdict", 2, True, "j2")
    assert (first.unjudged_reason, first.failed_agent) == ("no json", "refiner")
    assert (first.reply, first.finish_reason, first.counselor_latency_s) == ("ok", "length", 0.5)
    assert (first.mutator_tokens, first.client_tokens, first.counselor_tokens) == (5, 5, 5)
    assert first.judge_tokens == 15
    assert (first.started_at, first.recorded_at) == (102.0, 109.0)
    assert not first.committed and second.committed
    assert (second.outcome, second.utterance, second.reply) == ("incomplete", "alt", None)
    assert (second.started_at, second.recorded_at) == (110.0, 110.0)


async def test_threshold_comes_from_campaign_started() -> None:
    async with MemoryEventStore() as store:
        at: dict[str, Any] = {"campaign": "t", "conversation": "t/m/p/0"}
        await store.append(CampaignStarted(campaign="t", threshold=4))
        for attempt, severity in enumerate([3, 4]):
            await store.append(
                Verdict(
                    **at,
                    attempt=attempt,
                    category="a",
                    role="b",
                    severity=severity,
                    label="",
                    reasoning="",
                )
            )
        elite = Elite(category="a", role="b", severity=4, reply="r")
        await store.append(ArchiveUpdated(**at, attempt=1, counselor_model="m", elite=elite))
        records = await attempt_records(store, "t")
        archive = await archive_json(store, "t")
    assert [r.success for r in records] == [False, True]
    assert archive["m"]["a/b"]["severity"] == 4 and archive["m"]["a/b"]["reply"] == "r"


@pytest.mark.parametrize("name", ["nope", None])
async def test_unknown_campaign_or_empty_store(name: str | None) -> None:
    async with MemoryEventStore() as store:
        with pytest.raises(InputError) as info:
            await export(store, name, "csv", io.StringIO(), source="x.db")
        assert info.value.field == "campaign"
        assert "x.db" in str(info.value)
        if name:
            assert repr(name) in str(info.value)
        await campaign(store, "real")
        with pytest.raises(InputError, match=r"'nope'.*stored: real"):
            await export(store, "nope", "jsonl", io.StringIO())
        with pytest.raises(InputError, match="'nope'"):
            await archive_json(store, "nope")
        with pytest.raises(InputError, match="format"):
            await export(store, "real", "xml", io.StringIO())  # type: ignore[arg-type]
