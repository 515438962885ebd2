from __future__ import annotations

from typing import TypeVar

from mhsafeeval.framework import Message

M = TypeVar("M", bound=Message)


class Recorder:
    """An observer that records every message it receives, in order.

    Example:
        >>> rec = Recorder()
        >>> # runtime.subscribe(rec, name="recorder"); ...; rec.of(Verdict)
    """

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, msg: Message) -> None:
        self.messages.append(msg)

    def of(self, kind: type[M]) -> list[M]:
        """The recorded messages of one type (subclasses included)."""
        return [m for m in self.messages if isinstance(m, kind)]

    def tags(self) -> list[str]:
        """The recorded messages' tags, in order."""
        return [m.tag for m in self.messages]
