"""What the four agents share: prompt templates, call seeds, and the committed transcript.

Prompt texts live in ``prompts/*.txt`` (package data) as :class:`string.Template` texts with
``$name`` placeholders, so JSON braces need no escaping; a literal dollar sign is ``$$``.
They are rendered with ``substitute``: a missing variable is an error, never a silent gap.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Any, Generic, TypeVar

import structlog

from mhsafeeval.framework import Agent, on
from mhsafeeval.messages import CallFailed, Exchange, Message, Transcript, TurnCommitted
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    ModelCallError,
    ModelClient,
    Structured,
    StructuredOutputError,
    complete_structured,
)

T = TypeVar("T")

__all__ = [
    "TranscriptAgent",
    "bullets",
    "call_seed",
    "render",
    "render_context",
    "template",
]

log = structlog.get_logger("mhsafeeval.agents")

_PERSON = b"mhsafeeval.call"  # domain separation from the search RNG streams
# json.dumps(parts, ensure_ascii=True, separators=(",", ":")), without an encoder made per call
_SEED_JSON = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
_NO_CONTEXT = "(Nothing has been said yet: this is the start of the session.)"


@functools.cache
def template(name: str) -> Template:
    """The prompt template ``prompts/<name>.txt`` (read once, then cached).

    Raises:
        FileNotFoundError: there is no such template.
    """
    text = resources.files(__package__ or "mhsafeeval.agents") / "prompts" / f"{name}.txt"
    return Template(text.read_text(encoding="utf-8").strip())


def render(name: str, /, **values: str) -> str:
    """Render template ``name`` with ``values``.

    Raises:
        KeyError: a placeholder of the template has no value.
        ValueError: the template has a malformed placeholder.
    """
    return template(name).substitute(values)


def render_context(exchanges: Iterable[Exchange]) -> str:
    """Committed exchanges as ``Client: ...`` / ``Counselor: ...`` lines, oldest first."""
    lines: list[str] = []
    for ex in exchanges:
        lines += [f"Client: {ex.client}", f"Counselor: {ex.counselor}"]
    return "\n".join(lines) or _NO_CONTEXT


def bullets(items: Sequence[str], empty: str = "(none)") -> str:
    """Items as ``- item`` lines, or ``empty`` when there are none."""
    return "\n".join(f"- {item}" for item in items) or empty


def call_seed(msg: Message, purpose: str = "") -> int:
    """The sampling seed for a model call made while handling ``msg``.

    Derived from the message's coordinates (campaign, conversation, turn, attempt, branch) and
    ``purpose`` (the calling agent's role), so a resumed run asks exactly what the first run
    asked, while each attempt, branch and agent samples differently. The value fits in 31 bits:
    some providers reject larger seeds.

    Example:
        >>> from mhsafeeval.messages import Directive
        >>> d = Directive(conversation="c/m/p/0", turn=2, attempt=1, category="c", role="r")
        >>> call_seed(d, "mutator") == call_seed(d, "mutator") != call_seed(d, "client")
        True
    """
    parts = [msg.campaign, msg.conversation, msg.turn, msg.attempt, msg.branch, purpose]
    payload = _SEED_JSON.encode(parts).encode("ascii")
    digest = hashlib.blake2b(payload, digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") >> 33


@dataclass(frozen=True)
class Answer(Generic[T]):
    """What a structured answer must be: the Struct it decodes to, its JSON schema (generated
    from the Struct), the schema's name, what a failure calls it, and the checks beyond the
    schema."""

    kind: type[T]
    schema: dict[str, Any]
    name: str
    what: str
    validate: Callable[[T], None]


class TranscriptAgent(Agent):
    """Base of the conversation agents: one instance per conversation, with a model.

    Folds :class:`TurnCommitted` into :attr:`transcript`, so prompts are built from committed
    turns only (attempts that were not committed never reach a model), and reports a model
    call that finally failed as :class:`CallFailed` (and nothing else).
    """

    role: str = "agent"
    """The agent's name in ``CallFailed.agent``, log events and call seeds."""

    max_concurrent_handlers = 4
    # Tree search runs several simulations of one conversation at once. Handlers only read the
    # transcript, which changes synchronously (TurnCommitted), so this is safe.

    def __init__(self, model: ModelClient, *, context_turns: int) -> None:
        super().__init__()
        if context_turns < 0:
            raise ValueError(f"context_turns must be >= 0, got {context_turns}")
        self.model = model
        self.context_turns = context_turns
        self.transcript = Transcript()

    @on(TurnCommitted)
    def _commit(self, msg: TurnCommitted) -> None:
        self.transcript.add(msg)

    def answered(self, msg: Message, children: Iterable[Message]) -> bool:
        """An outcome, or this agent's own :class:`CallFailed`, published by this agent's node
        was stored for ``msg``."""
        return any(
            self.mine(c)
            and (
                isinstance(c, self.outcomes) or (isinstance(c, CallFailed) and c.agent == self.role)
            )
            for c in children
        )

    def recent(self) -> list[Exchange]:
        """The last ``context_turns`` committed exchanges, oldest first."""
        return self.transcript.recent(self.context_turns)

    async def ask(
        self, parent: Message, messages: list[ChatMessage], answer: Answer[T], max_asks: int
    ) -> Structured[T] | None:
        """A structured ``answer`` for ``parent``, or None once its failure has been published.

        A call that finally fails, and an answer that stays invalid after ``max_asks`` asks,
        both become :class:`CallFailed` (an invalid answer is as unusable as no answer).
        """
        try:
            return await complete_structured(
                self.model,
                messages,
                answer.kind,
                schema=answer.schema,
                schema_name=answer.name,
                params=CallParams(seed=call_seed(parent, self.role)),
                max_asks=max_asks,
                validate=answer.validate,
            )
        except ModelCallError as exc:
            self.fail(parent, exc)
        except StructuredOutputError as exc:
            tries = sum(c.attempts for c in exc.completions)
            reason = f"no valid {answer.what} after {len(exc.completions)} asks: {exc.reason}"
            error = ModelCallError(
                self.model.name, tries, reason, retryable=True, completions=exc.completions
            )  # the invalid answers' tokens are counted (CallFailed.usage)
            self.fail(parent, error, unusable=True)
        return None

    def fail(self, parent: Message, error: ModelCallError, *, unusable: bool = False) -> None:
        """Publish the :class:`CallFailed` for a call made while handling ``parent``
        (``unusable``: the model answered, but not usably)."""
        log.warning(f"{self.role}.call_failed", model=error.model, error=error.reason)
        self.publish(CallFailed.caused_by(parent, self.role, error, unusable=unusable))
