"""The review queue: which replies people rate, drawn reproducibly from one campaign's log.

Every finding and every candidate of the search's judge is queued, with a sample of the replies
it called safe (below the threshold), so that its misses can be found too. The safe sample is
stratified by cell and by the judge's severity: each (cell, severity) stratum gives one reply
before any gives a second, so a sample of 50 covers as many cells as it can instead of the few
cells the search pressed hardest. The queue is then shuffled as a whole (seeded), so that a
rater cannot tell a finding from a safe reply by its place in the queue.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

import msgspec

from mhsafeeval.messages import CampaignStarted, Exchange, Message, TurnCommitted
from mhsafeeval.storage import AttemptFacts, CampaignLog

from ._events import ItemKind, ReviewQueueDrawn

__all__ = ["CampaignReading", "Item", "draw_queue", "item_kind", "stratified_sample"]

T = TypeVar("T")


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One reply to review, with everything a page of it may show."""

    id: str
    """The search judge's verdict id of the reply (stable: ratings point at it)."""
    conversation: str
    turn: int
    attempt: int
    branch: str = ""
    category: str
    role: str
    model: str = ""
    kind: ItemKind
    judged: int
    """The search judge's own severity."""
    severity: int
    """What the search acted on (the confirmed severity where the campaign confirms)."""
    history: tuple[Exchange, ...] = ()
    """The conversation's committed turns before the reply's."""
    utterance: str = ""
    reply: str = ""
    label: str = ""
    reasoning: str = ""
    evidence: tuple[str, ...] = ()
    refused: bool | None = None
    understood: bool | None = None

    @property
    def cell(self) -> tuple[str, str]:
        """``(category, role)``."""
        return (self.category, self.role)


def item_kind(attempt: AttemptFacts, threshold: int) -> ItemKind | None:
    """What the search judge made of a judged attempt (None: it has no verdict).

    Example:
        >>> a = AttemptFacts(conversation="c", turn=0, attempt=0, branch="", severity=2,
        ...                  judged=4, confirmed=False)
        >>> item_kind(a, 3)
        'unconfirmed'
    """
    if attempt.severity is None or attempt.judged is None:
        return None
    if attempt.severity >= threshold:
        return "finding"
    if attempt.judged < threshold:
        return "safe"
    return "unconfirmed" if attempt.confirmed is False else "candidate"


def stratified_sample(
    items: Sequence[T], n: int, rng: random.Random, stratum: Callable[[T], Hashable]
) -> list[T]:
    """``n`` of ``items`` (all of them when fewer), spread over their strata: each stratum
    gives one item, in a random order of strata, before any gives a second.

    Example:
        >>> picked = stratified_sample(list(range(10)), 3, random.Random(1), lambda x: x % 3)
        >>> sorted(x % 3 for x in picked)
        [0, 1, 2]
    """
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for item in items:
        groups[stratum(item)].append(item)
    order = list(groups.values())
    for group in order:
        rng.shuffle(group)
    rng.shuffle(order)
    out: list[T] = []
    depth = 0
    while len(out) < n and any(depth < len(g) for g in order):
        out += [g[depth] for g in order if depth < len(g)][: n - len(out)]
        depth += 1
    return out


class CampaignReading:
    """What the review needs of one campaign's stored events: the log's facts and texts, and
    each conversation's committed turns (feed it the events in stored order)."""

    def __init__(self) -> None:
        self.log = CampaignLog(keep_text=True)
        self.turns: dict[str, dict[int, Exchange]] = defaultdict(dict)

    def add(self, event: Message, recorded_at: float = 0.0, seq: int = 0) -> None:
        """Fold one stored event in."""
        self.log.add(event, recorded_at, seq)
        if isinstance(event, TurnCommitted):
            self.turns[event.conversation][event.turn] = Exchange(
                event.client_text, event.counselor_text
            )

    @classmethod
    def of(cls, events: Iterable[Message]) -> CampaignReading:
        """The reading of these events."""
        reading = cls()
        for event in events:
            reading.add(event)
        return reading

    @property
    def started(self) -> bool:
        """Whether a run of the campaign was stored (its threshold is known)."""
        return isinstance(self.log.start, CampaignStarted)

    def items(self) -> list[Item]:
        """Every reply the search's judge gave a verdict on, as a review item."""
        out = []
        threshold = self.log.threshold
        for a in self.log.attempts.values():
            kind = item_kind(a, threshold)
            if kind is None or not a.verdict_id:
                continue
            texts = self.log.texts(a.key)
            committed = self.turns.get(a.conversation, {})
            out.append(
                Item(
                    id=a.verdict_id,
                    conversation=a.conversation,
                    turn=a.turn,
                    attempt=a.attempt,
                    branch=a.branch,
                    category=a.category,
                    role=a.role,
                    model=self.log.model_of(a.conversation) or "",
                    kind=kind,
                    judged=a.judged if a.judged is not None else a.severity or 1,
                    severity=a.severity or 1,
                    history=tuple(committed[t] for t in sorted(committed) if t < a.turn),
                    utterance=texts.utterance or "",
                    reply=texts.reply or "",
                    label=texts.label or "",
                    reasoning=texts.reasoning or "",
                    evidence=texts.evidence,
                    refused=a.refused,
                    understood=a.understood,
                )
            )
        return out


def draw_queue(
    items: Sequence[Item],
    *,
    campaign: str,
    seed: int = 0,
    safe_sample: int = 50,
    raters_per_item: int = 2,
    threshold: int = 2,
) -> tuple[list[Item], ReviewQueueDrawn]:
    """The review queue of a campaign's items: every item the judge called harmful
    (findings and candidates), ``safe_sample`` of the others stratified by cell and severity,
    all in one seeded order; and the event that records it.

    The same items, seed and sizes always give the same queue (and the same event id).
    """
    rng = random.Random(f"{seed}:{campaign}")  # a str seed is hashed the same on every run
    ordered = sorted(items, key=lambda i: i.id)  # never the store's order: a stable draw
    harmful = [i for i in ordered if i.kind != "safe"]
    safe = stratified_sample(
        [i for i in ordered if i.kind == "safe"],
        safe_sample,
        rng,
        lambda i: (i.category, i.role, i.judged),
    )
    queue = harmful + sorted(safe, key=lambda i: i.id)
    rng.shuffle(queue)
    ids = tuple(i.id for i in queue)
    kinds: dict[str, int] = defaultdict(int)
    for i in queue:
        kinds[i.kind] += 1
    digest = hashlib.blake2b(
        "\x1f".join((str(seed), str(safe_sample), str(raters_per_item), *ids)).encode(),
        digest_size=8,
    ).hexdigest()
    drawn = ReviewQueueDrawn(
        campaign=campaign,
        key=f"queue:{digest}",
        publisher="review",
        seed=seed,
        safe_sample=safe_sample,
        raters_per_item=raters_per_item,
        threshold=threshold,
        items=ids,
        kinds=dict(sorted(kinds.items())),
    )
    return queue, drawn
