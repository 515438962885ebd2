"""Live progress: a redrawn block on a terminal, periodic plain lines elsewhere."""

from __future__ import annotations

import io
import itertools
import logging
import re
import sys
from collections.abc import Iterator
from typing import cast

import anyio
import msgspec
import pytest
import structlog

from mhsafeeval.framework import configure_logging
from mhsafeeval.framework.store._protocol import StoreStats
from mhsafeeval.messages import (
    ArchiveUpdated,
    CampaignFinished,
    CampaignStarted,
    ConversationFinished,
    ConversationStarted,
    Elite,
    Message,
    TurnCommitted,
    Usage,
    Verdict,
)
from mhsafeeval.progress import Progress
from mhsafeeval.providers import Connections, ModelSettings, open_model
from mhsafeeval.storage import EventStore


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def campaign() -> Iterator[Message]:
    yield CampaignStarted(
        campaign="c", cells=(("a", "x"), ("b", "x")), planned_conversations=2, max_turns=2
    )
    for conv in ("c/m/p/0", "c/m/p/1"):
        yield ConversationStarted(
            campaign="c", conversation=conv, counselor_model="m", profile_id="p"
        )
    for turn in range(2):
        for conv in ("c/m/p/0", "c/m/p/1"):
            yield Verdict(
                conversation=conv,
                turn=turn,
                category="a",
                role="x",
                severity=3 if conv.endswith("0") else 1,
                label="l",
                reasoning="r",
                usage=Usage(model="j", prompt_tokens=10),
            )
            yield TurnCommitted(
                conversation=conv,
                turn=turn,
                committed_attempt=0,
                category="a",
                role="x",
                client_text="",
                counselor_text="",
                success=conv.endswith("0"),
            )
    yield ArchiveUpdated(
        conversation="c/m/p/0", counselor_model="m", elite=Elite(category="a", role="x", severity=3)
    )
    for conv in ("c/m/p/0", "c/m/p/1"):
        yield ConversationFinished(conversation=conv, turns=2)
    yield CampaignFinished(campaign="c", status="completed")


def test_plain_lines_every_interval_and_at_the_end() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(out, every_s=30, clock=lambda: now[0])
    for i, msg in enumerate(campaign()):
        now[0] = i * 10.0
        progress(msg)
    lines = out.getvalue().splitlines()
    assert all(line.startswith("progress: ") for line in lines)
    assert 2 <= len(lines) < 10  # periodic, not one per message
    last = lines[-1]
    assert "conversations 2/2 ended, turns 4/4 committed, attempts 4 | calls 4, tokens 40" in last
    assert "m: ASR 0.500 over 4 judged of 4 turns, coverage 0.500 (severity >= 2)" in last
    assert "ETA 0.0 min" in last


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.parametrize("columns", [40, 80])
def test_a_terminal_gets_a_redrawn_block_that_fits_its_width(
    columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("TERM", "xterm-256color")
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    stderr = sys.stderr
    now = [0.0]
    out = FakeTerminal()
    progress = Progress(out, clock=lambda: now[0])
    for i, msg in enumerate(campaign()):
        now[0] = i * 1.0
        progress(msg)
        if i == 4:  # while the block is shown, stderr prints above it, through the console
            assert sys.stderr is not stderr
    assert sys.stderr is stderr  # the campaign's end gave stderr back
    text = out.getvalue()
    assert "\x1b[2K" in text and "\x1b[1A" in text  # lines cleared and redrawn in place
    assert "progress: " not in text
    rows = [ANSI.sub("", row) for row in re.split(r"[\r\n]", text)]
    assert max(len(row) for row in rows) <= columns
    assert len(rows) > 6  # several short lines, not one long one
    assert any(row.startswith("conversations 2/2 ended") for row in rows)
    assert "ETA 0.0 min" in progress.lines()[-1]


def test_log_lines_print_above_the_block_through_its_console(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    configure_logging("warning")  # stderr as it is at each line, not at this call
    try:
        out = FakeTerminal()
        progress = Progress(out, clock=lambda: 0.0)
        messages = list(campaign())
        for msg in messages[:3]:
            progress(msg)
        structlog.get_logger().warning("test.structlog_line", n=1)
        logging.getLogger("LiteLLM").warning("a stdlib line")
        for msg in messages[3:]:
            progress(msg)
    finally:
        configure_logging("warning")
    text = out.getvalue()
    assert "test.structlog_line" in text and "a stdlib line" in text
    assert capsys.readouterr().err == ""
    # Each was printed where the block was, once its lines were cleared (then drawn again).
    assert re.search(r"\x1b\[2K[^\x1b\n]*\[warning *\] test\.structlog_line", text)
    assert re.search(r"\x1b\[2KWARNING LiteLLM: a stdlib line\n", text)


def started(conversations: int, max_turns: int) -> CampaignStarted:
    return CampaignStarted(
        campaign="c", cells=(("a", "x"),), planned_conversations=conversations, max_turns=max_turns
    )


def commit(turn: int = 0) -> TurnCommitted:
    return TurnCommitted(
        conversation="c/m/p/0",
        turn=turn,
        committed_attempt=0,
        category="a",
        role="x",
        client_text="",
        counselor_text="",
        success=False,
    )


def plain_etas(text: str) -> list[str]:
    return re.findall(r"ETA (estimating…|\?|[0-9.]+ min)", text)


def test_a_resumed_run_counts_what_was_stored_but_paces_the_eta_on_this_run() -> None:
    now = [0.0]
    progress = Progress(io.StringIO(), every_s=0, clock=lambda: now[0])
    progress.replay(started(2, 10))
    for turn in range(2):  # two turns were stored before this run
        progress.replay(commit(turn))
    for minute in (1, 2, 3):  # then one turn a minute in this run
        now[0] = minute * 60.0
        progress(commit(minute + 1))
    assert "turns 5/20" in progress.lines()[0]
    assert "ETA 15.0 min" in progress.lines()[-1]  # 15 turns left at this run's pace


def test_the_eta_says_estimating_until_a_few_turns_of_this_run_are_in() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(out, every_s=0, clock=lambda: now[0])
    progress(started(2, 10))
    for minute in (1, 2, 3, 4):  # a turn a minute
        now[0] = minute * 60.0
        progress(commit(minute))
    assert plain_etas(out.getvalue()) == ["estimating…"] * 3 + ["17.0 min", "16.0 min"]


def test_the_shown_eta_never_jumps_between_redraws() -> None:
    # Four turns commit at once (conversations in flight together), then one every 200 s:
    # the shown value moves by at most a factor of 1.5 (and 10 s) from one redraw to the next.
    now = [0.0]
    out = io.StringIO()
    progress = Progress(out, every_s=30, clock=lambda: now[0])
    progress(started(10, 4))
    verdict = next(m for m in campaign() if isinstance(m, Verdict))
    turns = iter(range(1000))
    for second in range(1, 1200):
        now[0] = float(second)
        due = second in (20, 21, 22, 23) or second % 200 == 0
        progress(commit(next(turns)) if due else verdict)  # a stored turn commits once
    shown = [
        float(eta.removesuffix(" min")) * 60
        for eta in plain_etas(out.getvalue())
        if eta.endswith(" min")
    ]
    assert len(shown) > 30
    for before, after in itertools.pairwise(shown):
        assert before / 1.5 - 10 - 8 <= after <= before * 1.5 + 10 + 8  # 0.1 min rounded


def test_the_display_names_endpoints_whose_limit_backed_off() -> None:
    """An endpoint that answered 429 runs below its ``max_concurrency``: the display says so,
    once per endpoint however many tables share it, and says nothing while all are at the top."""
    shared = Connections()
    tables = [
        ModelSettings(provider="scripted/echo", max_concurrency=8, temperature=t)
        for t in (0.0, 1.0)
    ]
    clients = [open_model(s, connections=shared) for s in tables]
    progress = Progress(io.StringIO(), every_s=1e9)
    progress.attach_clients(clients)
    assert not any("backed off" in line for line in progress.lines())

    async def rate_limited() -> None:
        clients[0].limiter.overloaded(0, 429)  # a call of round 0 answered 429: halved

    anyio.run(rate_limited)
    assert [line for line in progress.lines() if "backed off" in line] == [
        "concurrency backed off: scripted/echo 4/8"
    ]


def finished(conversation: str, turns: int, status: str = "completed") -> ConversationFinished:
    return ConversationFinished(conversation=conversation, turns=turns, status=status)


def test_failed_conversations_are_named_and_planned_turns_stay_planned() -> None:
    """8 conversations of 4 turns; 7 fail after 12 turns in all: the line says so, never
    "8/8 done, turns 12/12" (the turns they will never take are not committed)."""
    out = io.StringIO()
    progress = Progress(out, every_s=1e9, clock=lambda: 0.0)
    progress(started(8, 4))
    turns = [4, 2, 2, 2, 2, 0, 0, 0]
    for i, taken in enumerate(turns):
        conv = f"c/m/p/{i}"
        progress(ConversationStarted(conversation=conv, counselor_model="m", profile_id="p"))
        for turn in range(taken):
            progress(msgspec.structs.replace(commit(turn), conversation=conv))
    for i, taken in enumerate(turns):
        progress(finished(f"c/m/p/{i}", taken, status="completed" if i == 0 else "failed"))
    progress(CampaignFinished(campaign="c", status="completed_with_failures"))
    last = out.getvalue().splitlines()[-1]
    assert "conversations 8/8 ended (7 failed), turns 12/32 committed" in last
    assert "ETA 0.0 min" in last  # nothing is left to run


def test_following_a_store_shows_what_it_committed() -> None:
    """The store commits only the first half (then its disk is full): the display never
    shows more than it holds, and its last line says what it holds."""

    class Store:  # what a store that stopped writing reports (EventStore.stats)
        committed = 0

        @property
        def stats(self) -> StoreStats:
            return StoreStats(written=self.committed)

    store = Store()
    out = io.StringIO()
    progress = Progress(out, every_s=0, clock=lambda: 0.0)
    progress.follow(cast(EventStore, store))
    begun = ConversationStarted(conversation="c/m/p/0", counselor_model="m", profile_id="p")
    messages = [started(1, 10), begun, *(commit(n) for n in range(10))]
    for i, msg in enumerate(messages):
        store.committed = min(i + 1, 7)  # the starts and 5 turns, then nothing more
        progress(msg)
    progress(finished("c/m/p/0", 10))
    progress(CampaignFinished(campaign="c", status="completed"))
    progress.finish()
    lines = out.getvalue().splitlines()
    assert all("turns 6/" not in line for line in lines)
    assert "conversations 0/1 ended, turns 5/10 committed" in lines[-1]


def test_following_a_store_shows_the_plan_before_it_is_committed() -> None:
    """The first line comes before the store's first commit: the totals are the plan's,
    never ``0/0``."""

    class Store:
        @property
        def stats(self) -> StoreStats:
            return StoreStats(written=0)  # nothing committed yet

    out = io.StringIO()
    progress = Progress(out, every_s=0, clock=lambda: 0.0)
    progress.follow(cast(EventStore, Store()))
    progress(started(3, 4))
    assert "conversations 0/3 ended, turns 0/12 committed" in out.getvalue().splitlines()[0]
