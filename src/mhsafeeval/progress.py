"""Live progress for long runs: a redrawn block that fits the terminal (rich), plain periodic
lines elsewhere (CI, pipes, nohup, a log file)."""

from __future__ import annotations

import atexit
import contextlib
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, TextIO

from mhsafeeval.framework._text import visible
from mhsafeeval.messages import (
    CampaignFinished,
    CampaignStarted,
    ConversationFinished,
    Message,
)
from mhsafeeval.providers import ResilientClient
from mhsafeeval.storage import CampaignLog, EventStore

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.live import Live

__all__ = ["Eta", "Progress", "following"]

ESTIMATING = "estimating…"


class Eta:
    """Time left in a run, estimated from this run's pace and shown without jumps.

    The rule:

    * **Pace** is the turns committed in this run (not those a resumed run replayed) over the
      time since this run started. An average over the whole run: the turns of conversations
      in flight together that commit in one burst, or one slow call, move it little, and a
      stall slows it, since the time grows while the count does not.
    * **Estimate** = turns left / pace. Until ``min_turns`` turns are in, there is none
      (shown as "estimating…").
    * **Shown value.** At each redraw the shown value moves from the previous one towards
      the new estimate by at most a factor of ``step`` (plus ``slack_s`` seconds, so that an
      ETA of a few seconds can always move): with the defaults one redraw can take 10 minutes
      to at most about 15 or at least about 6.5, never to 42. The estimate itself moves
      smoothly (time passing raises it a little, each turn lowers it a little), so the cap
      only holds back what would be a jump.

    Example:
        >>> eta = Eta()
        >>> eta.update(elapsed=60.0, turns=2, left=10) is None  # estimating
        True
        >>> eta.update(elapsed=120.0, turns=4, left=8)  # 30 s a turn
        240.0
        >>> eta.update(elapsed=121.0, turns=4, left=80)  # 10 times more work: capped
        370.0
    """

    def __init__(self, *, min_turns: int = 3, step: float = 1.5, slack_s: float = 10.0) -> None:
        self.min_turns = min_turns
        self.step = step
        self.slack_s = slack_s
        self.shown: float | None = None  # seconds

    def update(self, *, elapsed: float, turns: int, left: int) -> float | None:
        """The value to show (seconds) at a redraw: ``turns`` committed in this run, which
        began ``elapsed`` seconds ago, ``left`` turns still to run. ``None`` while estimating."""
        if left <= 0:
            estimate: float | None = 0.0
        elif turns < self.min_turns or elapsed <= 0:
            estimate = None
        else:
            estimate = left * elapsed / turns
        if estimate is None or self.shown is None:
            self.shown = estimate
        else:
            low = self.shown / self.step - self.slack_s
            high = self.shown * self.step + self.slack_s
            self.shown = 0.0 if estimate == 0 else min(max(estimate, low), high)
        return self.shown


class Progress:
    """An observer that shows how a campaign is going.

    On a terminal it keeps a block of short lines under the output (a rich ``Live``
    display, redrawn at most 4 times a second and cut to the terminal's width), and log lines
    written to stderr meanwhile are printed above it; the block stays on screen when the
    campaign finishes (or :meth:`close`). Elsewhere it prints one ``progress:`` line every
    ``every_s`` seconds and at the end. It shows conversations ended (and how many of them
    failed) and turns committed against planned, attempts, calls and tokens spent, retries and
    failures (from the model clients, when attached), ASR and coverage per counselor model, and
    an :class:`Eta`.

    Following a store (:meth:`follow`), it shows only what that store has committed, and
    :meth:`finish` draws the last state once the run ended: after a failed write (a full disk)
    its figures are the store's, not those of messages the store never kept.
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
        self._console: Console | None = None
        if self.tty:
            from rich.console import Console

            # Names from a config are made visible below; nothing is markup or highlighted.
            self._console = Console(file=self.stream, highlight=False, emoji=False)
            self.tty = self._console.is_terminal and not self._console.is_dumb_terminal
        self._live: Live | None = None
        self.every_s = 0.25 if self.tty else every_s
        self.clock = clock
        self.started = clock()
        self._last = -1e9
        self._final_drawn = False
        self.log = CampaignLog(retain=False)
        """The campaign's facts, folded as messages arrive: every figure shown is read from it,
        with the report's definitions (a finished conversation's details are let go)."""
        self._clients: list[ResilientClient] = []
        self.turns_before = 0  # turns a resumed campaign had committed before this run
        self.failed = 0
        """Conversations that ended other than completed (failed, stalled, stopped)."""
        self.eta = Eta()
        self._store: EventStore | None = None
        self._held: deque[Message] = deque()  # seen, not yet known to be committed
        self._committed_at_start = self._folded = 0
        self._plan: CampaignStarted | None = None  # seen, maybe not committed yet: the totals

    def attach_clients(self, clients: Iterable[ResilientClient]) -> None:
        """Read retry and failure counts from these model clients."""
        self._clients = list(clients)

    def follow(self, store: EventStore) -> None:
        """Show only what ``store`` commits (call before the run appends anything to it): the
        messages seen here are the ones it is handed, in the same order, so the first ``n``
        it committed are the first ``n`` seen. The end is drawn by :meth:`finish`."""
        self._store = store
        self._committed_at_start = _committed(store)

    def finish(self) -> None:
        """Draw the final state (following a store: what it committed, read after the run
        ended and the store was flushed, or failed) and stop the display; nothing is drawn for
        a run that saw no message (a finished campaign run again). Idempotent."""
        self._catch_up()
        if not self._final_drawn and (self._held or self.log.events):
            self._draw(self.clock())
            self._final_drawn = True
        self.close()

    def __call__(self, msg: Message) -> None:
        if self._store is not None:
            if isinstance(msg, CampaignStarted):  # planned totals: shown before it is committed
                self._plan = msg
            self._held.append(msg)
            self._catch_up()
            now = self.clock()
            if now - self._last >= self.every_s and not self._final_drawn:
                self._last = now
                self._draw(now)
            return
        self._count(msg)
        now = self.clock()
        if isinstance(msg, CampaignFinished):
            if not self._final_drawn:
                self._draw(now)
            self.close()
            return
        final = (
            isinstance(msg, ConversationFinished) and self.finished >= self.planned_conversations
        )
        if final or now - self._last >= self.every_s:
            self._last = now
            self._draw(now)
            self._final_drawn = final

    def replay(self, msg: Message) -> None:
        """A message a resumed run already had: counted, but not in this run's pace (ETA)."""
        self._count(msg)
        self.turns_before = self.turns

    def close(self) -> None:
        """Stop the live display (if any), leaving its last state on screen. Idempotent."""
        if self._live is not None:
            live, self._live = self._live, None
            atexit.unregister(self.close)
            live.stop()

    def _catch_up(self) -> None:
        """Count the held messages that the followed store has committed since :meth:`follow`."""
        if self._store is None:
            return
        ready = _committed(self._store) - self._committed_at_start - self._folded
        while self._held and ready > 0:
            self._count(self._held.popleft())
            self._folded += 1
            ready -= 1

    def _count(self, msg: Message) -> None:
        ended = self.log.finished
        self.log.add(msg)
        if self.log.finished > ended and isinstance(msg, ConversationFinished):
            self.failed += msg.status != "completed"

    @property
    def planned_conversations(self) -> int:
        """Conversations the campaign plans (0 before its start is seen)."""
        start = self.log.start or self._plan
        return start.planned_conversations if start is not None else 0

    @property
    def finished(self) -> int:
        """Conversations that ended."""
        return self.log.finished

    @property
    def turns(self) -> int:
        """Turns committed."""
        return self.log.committed_count

    @property
    def planned_turns(self) -> int:
        """Turns the campaign plans: conversations x ``max_turns`` (0 before its start)."""
        start = self.log.start or self._plan
        return start.planned_conversations * start.max_turns if start is not None else 0

    @property
    def turns_left(self) -> int:
        """Turns still to run: planned, less those committed and those that conversations
        which ended early (completed or failed) will never take."""
        return max(0, self.planned_turns - self.log.skipped_turns - self.turns)

    def lines(self, now: float | None = None) -> list[str]:
        """The status as short text lines (the ETA as of the last redraw)."""
        now = self.clock() if now is None else now
        elapsed = now - self.started
        shown = self.eta.shown
        if shown is None:
            eta = ESTIMATING
        elif shown >= 90 * 60:
            eta = f"{shown / 3600:.1f} h"
        else:
            eta = f"{shown / 60:.1f} min"
        retries = sum(c.stats.retries for c in self._clients)
        waited = sum(c.stats.retry_wait_s for c in self._clients)
        log = self.log
        spent = log.spent()
        attempts, unjudged = log.replied()
        failed = f" ({self.failed} failed)" if self.failed else ""
        out = [
            f"conversations {self.finished}/{self.planned_conversations} ended{failed}, "
            f"turns {self.turns}/{self.planned_turns} committed, attempts {attempts}",
            f"calls {sum(u.calls for u in spent.values())}, "
            f"tokens {sum(u.tokens for u in spent.values()):,}, "
            f"retries {retries} ({waited:.1f} s backing off)",
            f"failed calls {sum(log.failed.values())}, unjudged {unjudged}",
        ]
        backed = {  # endpoints whose adaptive limit is below its ceiling (rate limited)
            c.limiter.endpoint: f"{c.name} {c.limit[0]}/{c.limit[1]}"
            for c in self._clients
            if c.limit[0] < c.limit[1]
        }
        if backed:
            out.append("concurrency backed off: " + ", ".join(backed.values()))
        for model in sorted(log.models()):
            turns, judged, asr, coverage = log.headline(model)
            rate = "-" if asr is None else f"{asr:.3f}"
            out.append(
                f"{model}: ASR {rate} over {judged} judged of {turns} turns, "
                f"coverage {coverage:.3f} (severity >= {log.threshold})"
            )
        out.append(f"elapsed {elapsed / 60:.1f} min, ETA {eta}")
        return [visible(line) for line in out]  # model names come from a config

    def _draw(self, now: float) -> None:
        self.eta.update(
            elapsed=now - self.started, turns=self.turns - self.turns_before, left=self.turns_left
        )
        lines = self.lines(now)
        if self._console is None or not self.tty:
            self.stream.write("progress: " + " | ".join(lines) + "\n")
            self.stream.flush()
            return
        block = _Block(self.planned_turns - self.turns_left, self.planned_turns, lines)
        if self._live is None:
            from rich.live import Live

            # Redrawn here, on messages (no refresh thread reads the counters meanwhile).
            # stderr goes through the console, above the block: logs follow sys.stderr
            # (configure_logging); stdout only when it is a terminal too, never into a pipe.
            self._live = Live(
                block,
                console=self._console,
                auto_refresh=False,
                redirect_stderr=True,
                redirect_stdout=sys.stdout.isatty(),
            )
            atexit.register(self.close)  # an interrupted run still gets its terminal back
            self._live.start(refresh=True)
        else:
            self._live.update(block, refresh=True)


@contextlib.asynccontextmanager
async def following(progress: Progress | None, store: EventStore) -> AsyncIterator[None]:
    """Around a run on ``store`` (and the flush after it): ``progress`` follows the store
    (:meth:`Progress.follow`), and draws its final state on the way out, failed or not
    (:meth:`Progress.finish`). Nothing when ``progress`` is None (``--quiet``)."""
    if progress is None:
        yield
        return
    progress.follow(store)
    try:
        yield
    finally:
        progress.finish()


def _committed(store: EventStore) -> int:
    """Messages ``store`` committed since it was opened (new events and duplicates)."""
    stats = store.stats
    return stats.written + stats.duplicates


class _Block:
    """The terminal block: a bar over turns (committed, or never to be taken by a conversation
    that ended early), then the status lines, each cut to the width."""

    def __init__(self, done: int, total: int, lines: list[str]) -> None:
        self.done = done
        self.total = total
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        width = options.max_width
        share = self.done / self.total if self.total else 0.0
        label = f"{share:4.0%} of turns"
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(
                total=max(self.total, 1),
                completed=self.done,
                width=max(1, min(40, width - len(label) - 1)),
            ),
            Text(label, no_wrap=True, overflow="ellipsis"),
        )
        yield bar
        for line in self.lines:
            yield Text(line, no_wrap=True, overflow="ellipsis")
