"""Live progress for long runs: one redrawn status block on a terminal, plain periodic lines
elsewhere (CI, nohup, a log file)."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TextIO

from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ConversationFinished,
    ConversationStarted,
    Message,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
)
from mhsafeeval.runtime._text import visible
from mhsafeeval.runtime.providers import ResilientClient

__all__ = ["Progress"]


class Progress:
    """An observer that shows how a campaign is going.

    On a terminal it redraws a few lines at most 4 times a second; otherwise it prints one
    summary line every ``every_s`` seconds (and at the end). It shows conversations and turns
    done against planned, attempts, ASR and coverage per counselor model, calls and tokens
    spent, retries and failures (from the model clients, when attached) and an ETA.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = 0.25 if self.tty else every_s
        self.clock = clock
        self.started = clock()
        self._last = -1e9
        self._drawn = 0
        self.planned_conversations = 0
        self.max_turns = 0
        self.conversations = 0
        self.finished = 0
        self.turns = 0
        self.attempts = 0
        self.unjudged = 0
        self.failed_calls = 0
        self.calls = 0
        self.tokens = 0
        self.model_of: dict[str, str] = {}
        self.turns_by_model: dict[str, int] = defaultdict(int)
        self.wins_by_model: dict[str, int] = defaultdict(int)
        self.filled: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self.cells = 0
        self._clients: list[ResilientClient] = []
        self.turns_before = 0  # turns a resumed campaign had committed before this run

    def attach_clients(self, clients: Iterable[ResilientClient]) -> None:
        """Read retry and failure counts from these model clients."""
        self._clients = list(clients)

    def __call__(self, msg: Message) -> None:
        self._fold(msg)
        now = self.clock()
        final = isinstance(msg, ConversationFinished) and self.finished == self.conversations
        if final or now - self._last >= self.every_s:
            self._last = now
            self._draw(now)

    def replay(self, msg: Message) -> None:
        """A message a resumed run already had: counted, but not in this run's pace (ETA)."""
        self._fold(msg)
        self.turns_before = self.turns

    def _fold(self, msg: Message) -> None:
        usage: Usage | None = getattr(msg, "usage", None)
        if usage is not None:
            self.calls += usage.calls
            self.tokens += usage.prompt_tokens + usage.completion_tokens
        if isinstance(msg, CampaignStarted):
            self.planned_conversations = msg.planned_conversations
            self.max_turns = msg.max_turns
            self.cells = len(msg.cells)
        elif isinstance(msg, ConversationStarted):
            self.conversations += 1
            self.model_of[msg.conversation] = msg.counselor_model
        elif isinstance(msg, ConversationFinished):
            self.finished += 1
        elif isinstance(msg, TurnCommitted):
            self.turns += 1
            model = self.model_of.get(msg.conversation, "?")
            self.turns_by_model[model] += 1
            self.wins_by_model[model] += msg.success
        elif isinstance(msg, Verdict):
            self.attempts += 1
        elif isinstance(msg, Unjudged):
            self.attempts += 1
            self.unjudged += 1
        elif isinstance(msg, CallFailed):
            self.failed_calls += 1
        elif isinstance(msg, ArchiveUpdated) and msg.severity >= 2:
            self.filled[msg.counselor_model].add((msg.category, msg.role))

    def lines(self, now: float | None = None) -> list[str]:
        """The status as text lines."""
        now = self.clock() if now is None else now
        elapsed = now - self.started
        planned_turns = self.planned_conversations * self.max_turns
        eta = "?"
        if self.turns > self.turns_before and planned_turns:
            pace = elapsed / (self.turns - self.turns_before)
            left = max(0.0, pace * (planned_turns - self.turns))
            eta = f"{left / 60:.1f} min"
        retries = sum(c.stats.retries for c in self._clients)
        waited = sum(c.stats.retry_wait_s for c in self._clients)
        out = [
            f"conversations {self.finished}/{self.planned_conversations} done, "
            f"turns {self.turns}/{planned_turns}, attempts {self.attempts}, "
            f"calls {self.calls}, tokens {self.tokens:,}, "
            f"retries {retries} ({waited:.1f} s backing off), "
            f"failed calls {self.failed_calls}, unjudged {self.unjudged}, "
            f"elapsed {elapsed / 60:.1f} min, ETA {eta}"
        ]
        for model, turns in sorted(self.turns_by_model.items()):
            asr = self.wins_by_model[model] / turns if turns else 0.0
            coverage = len(self.filled[model]) / self.cells if self.cells else 0.0
            out.append(f"  {model}: ASR {asr:.3f} over {turns} turns, coverage {coverage:.3f}")
        return out

    def _draw(self, now: float) -> None:
        lines = [visible(line) for line in self.lines(now)]  # model names come from a config
        if self.tty:
            # Move up over the previous block and redraw it in place.
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            self.stream.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
            self._drawn = len(lines)
        else:
            self.stream.write("progress: " + " | ".join(lines) + "\n")
        self.stream.flush()
