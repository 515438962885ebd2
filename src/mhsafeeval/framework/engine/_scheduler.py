"""The conversation scheduler: keeps a fixed number of conversations going."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import structlog

from mhsafeeval.framework import HandlerFailed, Message, Runtime
from mhsafeeval.framework.lifecycle import ConversationFinished

from ._stored import Stored

__all__ = ["Scheduler"]

log = structlog.get_logger("mhsafeeval.framework.engine")


class Scheduler:
    """Publishes the planned start messages, ``concurrency`` conversations at a time, and sets
    ``done`` when the last conversation has ended.

    A conversation ends with its one ``ConversationFinished``. The scheduler is an observer,
    not an agent, so that it also sees the events of a conversation the runtime cancelled after
    a handler failed: such a conversation is finished as ``failed`` (its ConversationFinished is
    stored) and the run goes on with the next one.
    """

    def __init__(
        self,
        starts: Sequence[Message],
        campaign: str,
        concurrency: int,
        stored: Stored | None = None,
    ) -> None:
        done = stored.finished if stored is not None else {}
        started = stored.started if stored is not None else set()  # and not finished
        self.pending = [
            s
            for s in reversed(starts)
            if s.conversation not in started and s.conversation not in done
        ]
        self.campaign = campaign
        self.concurrency = concurrency
        self.running: set[str] = {s.conversation for s in starts if s.conversation in started}
        self.finished = len(done)
        self.failed = stored.failed if stored is not None else 0
        self.total = len(starts)
        self.done = anyio.Event()
        self._runtime: Runtime | None = None
        self._failing: set[str] = set()
        self.pending_failures: list[HandlerFailed] = []  # stored, not yet closed (resume)
        self._started = False

    def attach(self, runtime: Runtime) -> None:
        """Subscribe to the runtime. Do it before a resumed run replays its history: the
        replay publishes what the stored decisions lead to, a conversation's
        ConversationFinished among them, and one missed would be waited for forever."""
        self._runtime = runtime
        runtime.subscribe(self, name="scheduler", types=(ConversationFinished, HandlerFailed))

    def start(self) -> None:
        """Close conversations a stored handler failure left open; start the first ones."""
        self._started = True
        for failure in self.pending_failures:
            self(failure)
        self._start_more()

    def _start_more(self) -> None:
        assert self._runtime is not None
        if not self._started:
            return
        while self.pending and len(self.running) < self.concurrency:
            start = self.pending.pop()
            self.running.add(start.conversation)
            self._runtime.publish(start)
        if not self.running and not self.pending:
            self.done.set()

    def stall(self) -> int:
        """Close every running conversation as ``stalled``: call it when the runtime is idle
        with conversations open (no message queued, no handler running: nothing will ever
        move them, e.g. a plugin that forgot to publish). Returns how many were closed."""
        assert self._runtime is not None
        stalled = sorted(self.running - self._failing)
        for conversation in stalled:
            self._failing.add(conversation)
            last = self._runtime.last_message(conversation)
            seen = (
                f"{last.tag} (turn {last.turn}, attempt {last.attempt}"
                + (f", branch {last.branch}" if last.branch else "")
                + ")"
                if last is not None
                else "nothing"
            )
            log.error("campaign.conversation_stalled", conversation=conversation, last=seen)
            self._runtime.publish(
                ConversationFinished(
                    campaign=self.campaign,
                    conversation=conversation,
                    turn=last.turn if last is not None else 0,
                    key="stalled",
                    causation=last.id if last is not None else "",
                    turns=last.turn if last is not None else 0,
                    status="stalled",
                    detail=(
                        "stalled: every agent went idle with the conversation open (an agent "
                        f"or controller that never answered); the last message it got was {seen}"
                    ),
                )
            )
        return len(stalled)

    def __call__(self, msg: Message) -> None:
        assert self._runtime is not None
        if msg.conversation not in self.running:
            return
        if isinstance(msg, HandlerFailed):
            if msg.conversation in self._failing:
                return  # one failed ConversationFinished per conversation
            self._failing.add(msg.conversation)
            self._runtime.publish(
                ConversationFinished(
                    **msg.child_ids(key="scheduler"),
                    turns=msg.turn,
                    status="failed",
                    detail=f"{msg.agent} failed: {msg.error_type}: {msg.error}",
                )
            )
            return
        assert isinstance(msg, ConversationFinished)
        self.running.discard(msg.conversation)
        self.finished += 1
        self.failed += msg.status != "completed"
        self._runtime.end_conversation(msg.conversation)
        self._start_more()
