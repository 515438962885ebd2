"""Live progress: a redrawn block on a terminal, periodic plain lines elsewhere."""

from __future__ import annotations

import io
from collections.abc import Iterator

from mhsafeeval.messages import (
    ArchiveUpdated,
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
                severity=3,
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
    assert "conversations 2/2 done, turns 4/4, attempts 4, calls 4, tokens 40" in last
    assert "m: ASR 0.500 over 4 turns, coverage 0.500" in last


def test_a_terminal_gets_a_redrawn_block() -> None:
    now = [0.0]
    out = FakeTerminal()
    progress = Progress(out, clock=lambda: now[0])
    for i, msg in enumerate(campaign()):
        now[0] = i * 1.0
        progress(msg)
    text = out.getvalue()
    assert "\x1b[2K" in text and "\x1b[2F" in text  # lines cleared and redrawn in place
    assert "progress: " not in text
    assert "ETA 0.0 min" in progress.lines()[0]


def test_a_resumed_run_counts_what_was_stored_but_paces_the_eta_on_this_run() -> None:
    now = [0.0]
    progress = Progress(io.StringIO(), every_s=1e9, clock=lambda: now[0])
    messages = list(campaign())
    commits = [i for i, m in enumerate(messages) if isinstance(m, TurnCommitted)]
    for msg in messages[: commits[1] + 1]:  # two turns were stored before this run
        progress.replay(msg)
    now[0] = 60.0
    progress(messages[commits[2]])  # one turn in this run's first minute
    line = progress.lines()[0]
    assert "turns 3/4" in line
    assert "ETA 1.0 min" in line  # one turn left at this run's pace, not the replayed one's
