"""The Agent base class and the ``@on`` decorator that declares its handlers."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import msgspec

from ._message import Message

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["Agent", "AgentId", "on"]

_MARK = "_mhsafeeval_on"
F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=Message)
Handler = Callable[[Any, Message], Awaitable[None] | None]


class AgentId(NamedTuple):
    """An agent instance: its registered type name and its key (a conversation id, or "").

    Example:
        >>> str(AgentId("judge", "c1/bot/grief-widower/0")), str(AgentId("controller"))
        ('judge[c1/bot/grief-widower/0]', 'controller')
    """

    type: str
    key: str = ""

    def __str__(self) -> str:
        return f"{self.type}[{self.key}]" if self.key else self.type


def on(*types: type[Message]) -> Callable[[F], F]:
    """Declare a method as the handler of one or more message types (subclasses included).

    Example:
        >>> class Ping(Message, frozen=True, tag="doc.ping"):
        ...     n: int
        >>> class Counter(Agent):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.seen = 0
        ...     @on(Ping)
        ...     async def count(self, msg: Ping) -> None:
        ...         self.seen += msg.n
    """
    if not types or not all(isinstance(t, type) and issubclass(t, Message) for t in types):
        raise TypeError("@on() takes one or more Message subclasses")

    def mark(fn: F) -> F:
        setattr(fn, _MARK, (*getattr(fn, _MARK, ()), *types))
        return fn

    return mark


class Agent:
    """A message-passing actor.

    Each agent instance has one mailbox drained by one task, so its handlers never run
    concurrently with each other and see messages in the order they were published. Handlers are
    methods marked with :func:`on`; a message goes to every handler whose declared type is in its
    class hierarchy, in definition order. Handlers may be ``async def`` or plain ``def``.

    The runtime sets :attr:`runtime` and :attr:`id` before :meth:`on_start` runs. Use
    :meth:`publish` to send messages; build their correlation fields with
    ``Message.child_ids`` so the causal chain is stored.

    A handler that raises becomes a ``HandlerFailed`` event and cancels only that message's
    conversation; cancellation itself always propagates.

    Example:
        >>> import anyio
        >>> from mhsafeeval.framework import Runtime
        >>> class Shout(Message, frozen=True, tag="doc.shout"):
        ...     text: str
        >>> class Echo(Agent):
        ...     heard: list[str] = []
        ...     @on(Shout)
        ...     def hear(self, msg: Shout) -> None:
        ...         Echo.heard.append(msg.text.upper())
        >>> async def main() -> list[str]:
        ...     async with Runtime() as rt:
        ...         rt.register("echo", Echo)
        ...         rt.publish(Shout(conversation="c1", text="hello"))
        ...         await rt.run_until_idle()
        ...     return Echo.heard
        >>> anyio.run(main)
        ['HELLO']
    """

    max_concurrent_handlers: ClassVar[int] = 1
    """How many messages one instance may handle at once. 1 (the default) is the actor model:
    one at a time, in order. An agent whose handlers only read shared state before their first
    await (and whose state changes are synchronous) may raise it, so that, say, a tree search's
    simulations of one conversation run side by side; handlers then *start* in mailbox order."""

    outcomes: ClassVar[tuple[type[Message], ...]] = ()
    """What this agent's ``async`` handlers publish in answer to a message (with ``causation``
    set to that message's id). State lives in synchronous handlers; async handlers do the work
    (model calls). A resumed run replays stored messages into the synchronous handlers only, and
    re-delivers a stored message to the async handlers of an agent that :meth:`answered` it not:
    the work that was in flight when the run stopped."""

    publishes: ClassVar[tuple[type[Message], ...] | None] = None
    """Every message type this agent's handlers may publish (its :attr:`outcomes` too), or
    None: not declared. A graph whose nodes declare it is checked when it is built (see
    :class:`~mhsafeeval.framework.engine.Graph`): a handler for a type nothing publishes, or a
    published type nothing handles, is refused there with one line instead of a run that
    stalls."""

    _handlers: ClassVar[tuple[tuple[type[Message], str, bool], ...]] = ()
    _dispatch_cache: ClassVar[dict[type[Message], tuple[tuple[str, bool], ...]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, tuple[tuple[type[Message], ...], bool]] = {}
        for klass in reversed(cls.__mro__):
            for name, attr in vars(klass).items():
                types = getattr(attr, _MARK, None)
                if types is not None:
                    found[name] = (types, inspect.iscoroutinefunction(attr))
                elif name in found:  # overridden without @on: no longer a handler
                    del found[name]
        cls._handlers = tuple(
            (t, name, is_async) for name, (types, is_async) in found.items() for t in types
        )
        cls._dispatch_cache = {}

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        self.id = AgentId(type(self).__name__)

    @property
    def runtime(self) -> Runtime:
        """The runtime this agent runs in (set when it is started)."""
        if self._runtime is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a runtime")
        return self._runtime

    @classmethod
    def handled_types(cls) -> tuple[type[Message], ...]:
        """The message types this agent class has handlers for."""
        return tuple(dict.fromkeys(t for t, _, _ in cls._handlers))

    @classmethod
    def dispatch(cls, msg_type: type[Message]) -> tuple[tuple[str, bool], ...]:
        """Handler method names (and whether each is async) for a concrete message type."""
        try:
            return cls._dispatch_cache[msg_type]
        except KeyError:
            mro = msg_type.__mro__
            names = tuple(
                dict.fromkeys((name, is_async) for t, name, is_async in cls._handlers if t in mro)
            )
            cls._dispatch_cache[msg_type] = names
            return names

    def answered(self, msg: Message, children: Iterable[Message]) -> bool:
        """Whether this agent's async handlers finished ``msg``, given the stored messages
        ``children`` caused by it. The default: one of them is one of :attr:`outcomes`
        published by this agent's node (:meth:`mine`), so any number of agents can answer one
        message and each resumes its own work. Override it when a failure report counts as an
        answer too (and keep to :meth:`mine`)."""
        return any(isinstance(child, self.outcomes) and self.mine(child) for child in children)

    def mine(self, msg: Message) -> bool:
        """Whether ``msg`` was published by this agent's node. A message stored before
        publishers were recorded (``publisher == ""``) counts as anyone's: an earlier version
        resumed it so."""
        return msg.publisher == self.id.type or not msg.publisher

    def publish(self, msg: M, *, topic: str = "") -> M:
        """Publish a message on this agent's runtime (never blocks), as this agent's node:
        ``msg.publisher`` is set to the node's name unless it is set already. Returns the
        message as published: its :attr:`~Message.id` is the one stored (the id of ``msg``
        itself lacks the publisher).

        Raises:
            MessageCollision: a different message was published under the same id.
        """
        if not msg.publisher:
            msg = msgspec.structs.replace(msg, publisher=self.id.type)
        self.runtime.publish(msg, topic=topic)
        return msg

    async def on_start(self) -> None:
        """Called once in the agent's task before its first message."""

    async def on_stop(self) -> None:
        """Called once when the runtime stops (shielded from cancellation)."""
