"""``compare``'s marks hold as a family (issue 35).

Two campaigns of the same counselor with the same true rates differ only by chance; with 28
cells each compared on its own, one of them looks "beyond the noise" in most such pairs. The
per-cell marks are controlled for the number of cells tested (Holm), the sparse rule counts
conversations, and the summary line says what was controlled.
"""

from __future__ import annotations

import math
import random
from typing import Any

from mhsafeeval.messages import (
    CampaignStarted,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Message,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.reports.compare import compare, render_comparison
from mhsafeeval.reports.text import report_of
from mhsafeeval.storage import CampaignLog
from mhsafeeval.taxonomy import builtin_taxonomy

CELLS = sorted(builtin_taxonomy().cells)


def _campaign(
    name: str, rates: dict[tuple[str, str], float], conversations: int, turns: int, seed: int
) -> list[Message]:
    """A campaign of one counselor "m": each turn targets a random cell and succeeds with the
    cell's rate, shifted on the logit scale by the conversation's vulnerability (a normal of
    standard deviation 1: conversations differ, as profiles and histories do)."""
    rng = random.Random(seed)
    events: list[Message] = [CampaignStarted(campaign=name, cells=tuple(CELLS), threshold=2)]
    for index in range(conversations):
        conv = f"{name}/m/p{index % 7}/{index}"
        where: dict[str, Any] = {"campaign": name, "conversation": conv}
        events.append(ConversationStarted(**where, counselor_model="m", profile_id=f"p{index % 7}"))
        vulnerability = rng.gauss(0.0, 1.0)
        for turn in range(turns):
            cell = rng.choice(CELLS)
            logit = math.log(rates[cell] / (1 - rates[cell])) + vulnerability
            hit = rng.random() < 1 / (1 + math.exp(-logit))
            said: dict[str, Any] = {**where, "turn": turn, "category": cell[0], "role": cell[1]}
            events += [
                ClientUtterance(**said, text="c"),
                CounselorReply(**said, text="r"),
                Verdict(**said, severity=3 if hit else 1, label="", reasoning=""),
                TurnCommitted(**said, committed_attempt=0, client_text="c", counselor_text="r"),
            ]
    return events


def _side(events: list[Message], name: str) -> tuple[Any, CampaignLog, str]:
    log = CampaignLog.of(events)
    return report_of(log, name), log, ""


def test_two_campaigns_with_the_same_rates_rarely_mark_any_cell() -> None:
    # 28 conversations x 10 turns a side, as in the issue: 57-69% of such pairs had at least
    # one cell "beyond the noise" before; Holm over the cells tested keeps it near 5%.
    rng = random.Random(35)
    pairs = 40
    any_cell = overall = 0
    for k in range(pairs):
        rates = {cell: rng.uniform(0.15, 0.85) for cell in CELLS}
        a = _side(_campaign("a", rates, 28, 10, seed=2 * k), "a")
        b = _side(_campaign("b", rates, 28, 10, seed=2 * k + 1), "b")
        [m] = compare(a, b).models
        any_cell += any(c.asr.status == "beyond_noise" for c in m.cells)
        overall += m.asr.status == "beyond_noise"
    assert any_cell <= 4, f"{any_cell} of {pairs} same-rate pairs marked a cell"
    assert overall <= 4


def test_one_conversation_a_side_is_sparse_however_many_turns() -> None:
    rates = dict.fromkeys(CELLS, 0.5)
    safe = _campaign("a", {**rates, **dict.fromkeys(CELLS, 0.001)}, 1, 12, seed=1)
    harmful = _campaign("b", {**rates, **dict.fromkeys(CELLS, 0.999)}, 1, 12, seed=2)
    [m] = compare(_side(safe, "a"), _side(harmful, "b")).models
    assert (m.asr.units_a, m.asr.units_b) == (12, 12)
    assert m.asr.status == "sparse"  # 12 judged turns, but from one conversation a side


def test_the_summary_line_says_what_was_controlled() -> None:
    rates = dict.fromkeys(CELLS, 0.5)
    a = _side(_campaign("a", rates, 12, 10, seed=3), "a")
    b = _side(_campaign("b", rates, 12, 10, seed=4), "b")
    text = render_comparison(compare(a, b))
    assert "Holm" in text and "family-wise" in text
    assert "cells tested" in text
