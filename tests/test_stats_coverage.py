"""The report's intervals keep their coverage with few, correlated conversations (issue 35).

Campaigns are simulated with a known true rate: each conversation's success probability is
drawn from a beta distribution around it (intra-class correlation 0.5: conversations differ
strongly, as profiles and histories make them), and the report's own figure
(``overall_asr_ci`` from :func:`~mhsafeeval.storage.compute_metrics`) is checked to contain
the truth in at least 93% of campaigns. ``benchmarks/coverage.py`` prints the whole table.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from mhsafeeval.messages import (
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Message,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.storage import compute_metrics

CELL = ("blaming", "enabler")


def _campaign(rng: random.Random, conversations: int, turns: int, rate: float) -> list[Message]:
    # Beta(a, b) with a + b = 1 has intra-class correlation 1 / (a + b + 1) = 0.5.
    events: list[Message] = []
    for index in range(conversations):
        where: dict[str, Any] = {"campaign": "c", "conversation": f"c/m/p/{index}"}
        events.append(ConversationStarted(**where, counselor_model="m", profile_id="p"))
        p = rng.betavariate(rate, 1 - rate)
        for turn in range(turns):
            said: dict[str, Any] = {**where, "turn": turn, "category": CELL[0], "role": CELL[1]}
            events += [
                ClientUtterance(**said, text="c"),
                CounselorReply(**said, text="r"),
                Verdict(**said, severity=3 if rng.random() < p else 1, label="", reasoning=""),
                TurnCommitted(**said, committed_attempt=0, client_text="c", counselor_text="r"),
            ]
    return events


@pytest.mark.parametrize(
    ("conversations", "turns", "rate"),
    [(8, 5, 0.2), (6, 10, 0.5), (8, 5, 0.8)],  # before: 0.823, 0.860, 0.857 (seeded)
)
def test_the_overall_asr_interval_covers_the_truth(
    conversations: int, turns: int, rate: float
) -> None:
    rng = random.Random(f"coverage-{conversations}-{turns}-{rate}")
    runs = 300
    covered = 0
    for _ in range(runs):
        m = compute_metrics(_campaign(rng, conversations, turns, rate), [CELL])["m"]
        assert m.overall_asr_ci is not None
        low, high = m.overall_asr_ci
        covered += low <= rate <= high
    assert covered / runs >= 0.93
