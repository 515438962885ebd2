"""The ``async with`` half of everything the library opens and closes (stores, model clients)."""

from __future__ import annotations

from typing import Self

__all__ = ["AsyncResource"]


class AsyncResource:
    """Opened by ``async with`` and closed on the way out, however the body ends.

    Subclasses define :meth:`aclose` (idempotent) and, when there is something to acquire,
    :meth:`open`; ``async with`` then calls one on entry and the other on exit. When the body
    failed and closing fails too, the body's error is the one raised, with a note naming the
    other (:attr:`what` says what failed to close).

    Example:
        >>> import anyio
        >>> class Door(AsyncResource):
        ...     state = "new"
        ...     async def open(self) -> None:
        ...         self.state = "open"
        ...     async def aclose(self) -> None:
        ...         self.state = "closed"
        >>> async def main() -> tuple[str, str]:
        ...     async with Door() as door:
        ...         inside = door.state
        ...     return inside, door.state
        >>> anyio.run(main)
        ('open', 'closed')
    """

    what: str = "closing it"
    """How the note on the body's error names a failure to close."""

    async def open(self) -> None:
        """Acquire what the resource needs (nothing, unless a subclass says otherwise)."""

    async def aclose(self) -> None:
        """Release what the resource holds. Idempotent."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_details: object) -> None:
        body = exc_details[1] if len(exc_details) > 1 else None  # (type, error, traceback)
        try:
            await self.aclose()
        except Exception as failure:
            if not isinstance(body, BaseException):
                raise
            body.add_note(f"and {self.what} failed: {failure}")  # keep the body's error
