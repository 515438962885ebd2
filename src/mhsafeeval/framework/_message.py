"""The base of every message on the bus, and the registry that decodes stored ones."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache
from typing import Any, ClassVar

import msgspec

__all__ = [
    "CORRELATION_FIELDS",
    "HandlerFailed",
    "Intercepted",
    "Message",
    "MessageCollision",
    "decode_message",
    "encode_message",
    "fingerprint",
    "message_decoder",
    "message_id",
    "message_types",
]

CORRELATION_FIELDS = ("campaign", "conversation", "turn", "attempt", "branch", "key", "publisher")


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """Base class of every message (event) on the bus.

    A message is a frozen, tagged msgspec Struct. The tag (``type`` in the encoded form) is part of
    the stored schema: give every subclass an explicit, lowercase ``tag=`` and never reuse or
    rename one; new fields must have defaults so that old rows still decode.

    Correlation fields say where the message belongs; together with the tag and the
    ``publisher`` they form its stable :attr:`id`, so storing the same message twice is a no-op
    and a resumed campaign can tell what already happened. ``publisher`` is the name of the
    graph node that published it: :meth:`Agent.publish <mhsafeeval.framework.Agent.publish>`
    sets it, so two agents answering one message with the same type and coordinates (two
    judges rating one reply) never share an id. One publisher's messages of one type at the
    same coordinates must differ in ``branch`` or ``key``: publishing a *different* message
    under an id already published raises :class:`MessageCollision`. A message stored before
    publishers were recorded has ``publisher == ""`` and keeps the id it was stored with.

    Example:
        >>> class Ping(Message, frozen=True, tag="example.ping"):
        ...     text: str
        >>> a = Ping(campaign="c1", conversation="c1/m/p/0", turn=2, text="hi")
        >>> a.id == Ping(campaign="c1", conversation="c1/m/p/0", turn=2, text="other").id
        True
        >>> b = Ping(**a.child_ids(), text="reply")
        >>> (b.turn, b.causation == a.id)
        (2, True)
    """

    campaign: str = ""
    conversation: str = ""
    turn: int = 0
    attempt: int = 0
    branch: str = ""
    key: str = ""
    causation: str = ""
    publisher: str = ""

    schema_version: ClassVar[int] = 1
    record: ClassVar[bool] = False
    """True for a type kept for the log and the report only (an archive update, search
    statistics): a graph's check does not ask that some agent handles it."""

    @property
    def id(self) -> str:
        """Stable id derived from the tag, the correlation fields and the publisher (not from
        the payload)."""
        return message_id(
            type(self).__struct_config__.tag,  # type: ignore[arg-type]
            self.campaign,
            self.conversation,
            self.turn,
            self.attempt,
            self.branch,
            self.key,
            self.publisher,
        )

    @property
    def tag(self) -> str:
        """The stored type name of this message."""
        return str(type(self).__struct_config__.tag)

    @classmethod
    def tag_name(cls) -> str:
        """The stored type name of this message class."""
        return str(cls.__struct_config__.tag)

    def child_ids(self, **overrides: Any) -> dict[str, Any]:
        """Correlation fields for a message caused by this one (``causation`` = this id).

        ``key`` and ``publisher`` are not inherited: the key tells apart one publisher's
        siblings of one type, and the publisher is whoever publishes the child.
        """
        ids: dict[str, Any] = {
            "campaign": self.campaign,
            "conversation": self.conversation,
            "turn": self.turn,
            "attempt": self.attempt,
            "branch": self.branch,
            "causation": self.id,
        }
        ids.update(overrides)
        return ids


def message_id(
    tag: str,
    campaign: str,
    conversation: str,
    turn: int,
    attempt: int,
    branch: str,
    key: str,
    publisher: str = "",
) -> str:
    """The id a message with these coordinates gets (24 hex characters).

    A message without a publisher (one published by the engine, or stored before publishers
    were recorded) hashes exactly as every message did then, so stored ids stay valid.
    """
    parts = (tag, campaign, conversation, str(turn), str(attempt), branch, key)
    raw = "\x1f".join((*parts, publisher) if publisher else parts)
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


class MessageCollision(ValueError):
    """A publisher published two different messages under one id (same type, coordinates,
    key and publisher): the store would keep the first and lose the second without a word, so
    publishing the second raises instead. Publishing the very same message again is allowed
    (storing it twice is a no-op)."""

    def __init__(self, msg: Message) -> None:
        who = repr(msg.publisher) if msg.publisher else "the engine (no publisher)"
        super().__init__(
            f"two different {msg.tag} messages share one id, both published by {who} at "
            f"conversation {msg.conversation!r}, turn {msg.turn}, attempt {msg.attempt}, "
            f"branch {msg.branch!r}, key {msg.key!r}: give each its own key "
            "(Message.child_ids(key=...)) or publish one"
        )
        self.message = msg


def fingerprint(msg: Message) -> int:
    """A hash of a message's whole content (what tells a re-publication from a collision)."""
    try:
        return hash(msg)
    except TypeError:  # a field holds a list or a dict
        return hash(encode_message(msg))


class HandlerFailed(Message, frozen=True, tag="runtime.handler_failed"):
    """A handler raised: the runtime records it and cancels that conversation's remaining work.

    Observers (the event store, a scheduler) receive it like any message; the conversation it
    names gets no more deliveries.

    Example:
        >>> failed = HandlerFailed(
        ...     conversation="c1", agent="judge[c1]", handler="judge",
        ...     message_type="counselor.reply", message_id="ab12",
        ...     error_type="ValueError", error="no verdict",
        ... )
        >>> failed.tag, f"{failed.agent}: {failed.error_type}: {failed.error}"
        ('runtime.handler_failed', 'judge[c1]: ValueError: no verdict')
    """

    agent: str
    handler: str
    message_type: str
    message_id: str
    error_type: str
    error: str


class Intercepted(Message, frozen=True, tag="runtime.intercepted"):
    """An interceptor dropped or rewrote a message before any agent saw it (the record a
    resumed run replays the same decision from).

    It carries the original message's coordinates and causation, ``key`` is the original's
    id and ``publisher`` the interceptor's name. ``original`` is the message it was given and
    ``replacement`` what went on instead (JSON; "" when it was dropped): a run stopped between
    the record and the replacement's storing publishes the replacement when it resumes.

    Example:
        >>> class Said(Message, frozen=True, tag="doc.said"):
        ...     text: str
        >>> said = Said(conversation="c1", text="a guarantee", publisher="counselor")
        >>> record = Intercepted.of(said, "guardrail", None)
        >>> record.action, record.original_publisher, record.key == said.id
        ('dropped', 'counselor', True)
    """

    record = True

    interceptor: str
    action: str
    """``dropped`` or ``rewritten``."""
    message_type: str
    message_id: str
    original_publisher: str
    original: str
    replacement_id: str = ""
    replacement: str = ""

    @classmethod
    def of(cls, original: Message, interceptor: str, replacement: Message | None) -> Intercepted:
        """The record of ``interceptor`` turning ``original`` into ``replacement`` (None:
        dropping it)."""
        return cls(
            campaign=original.campaign,
            conversation=original.conversation,
            turn=original.turn,
            attempt=original.attempt,
            branch=original.branch,
            key=original.id,
            causation=original.causation,
            publisher=interceptor,
            interceptor=interceptor,
            action="dropped" if replacement is None else "rewritten",
            message_type=original.tag,
            message_id=original.id,
            original_publisher=original.publisher,
            original=encode_message(original).decode(),
            replacement_id=replacement.id if replacement is not None else "",
            replacement=encode_message(replacement).decode() if replacement is not None else "",
        )


def _all_subclasses(cls: type[Message]) -> Iterable[type[Message]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def message_types() -> dict[str, type[Message]]:
    """Every message class imported so far, by tag. Duplicated tags are an error."""
    out: dict[str, type[Message]] = {}
    for cls in _all_subclasses(Message):
        tag = str(cls.__struct_config__.tag)
        other = out.get(tag)
        if other is not None and other is not cls:
            raise TypeError(f"message tag {tag!r} is used by both {other!r} and {cls!r}")
        out[tag] = cls
    return out


@cache
def _decoder(tags: frozenset[str]) -> msgspec.json.Decoder[Any]:
    types = message_types()
    union = tuple(types[t] for t in sorted(tags))
    return msgspec.json.Decoder(type=union[0] if len(union) == 1 else _union(union))


def _union(types: tuple[type[Message], ...]) -> Any:
    from typing import Union

    return Union[types]  # noqa: UP007 - a runtime union of a tuple needs the subscript form


_encoder = msgspec.json.Encoder()


def encode_message(msg: Message) -> bytes:
    """JSON bytes of a message, with its ``type`` tag."""
    return _encoder.encode(msg)


def message_decoder() -> msgspec.json.Decoder[Any]:
    """A decoder for every message class imported so far (hold on to it for bulk decoding)."""
    return _decoder(frozenset(message_types()))


def decode_message(data: bytes | str) -> Message:
    """Decode JSON produced by :func:`encode_message` into the registered message class.

    Raises:
        msgspec.ValidationError: unknown tag or a payload that does not fit the class.
    """
    decoded: Message = message_decoder().decode(data)
    return decoded
