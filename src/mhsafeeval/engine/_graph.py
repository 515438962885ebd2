"""The declaration of a run: which agents, which conversations, what is shared."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import anyio
import msgspec
from anyio.abc import TaskStatus

from mhsafeeval.errors import InputError
from mhsafeeval.runtime import Agent, AgentId, Message, Scope

__all__ = ["Graph", "Limits", "Node", "RunResult", "Service"]

A = TypeVar("A", bound=Agent)


@dataclass(frozen=True)
class Node:
    """One agent of a graph: its name, how an instance is made, and what it receives.

    ``scope="conversation"``: one instance per conversation (made on its first message);
    ``"global"``: one instance for the whole run (a search controller). The message types come
    from the agent class's ``@on`` handlers, so the wiring is declared by types, never looked up
    by name.

    Example:
        >>> from mhsafeeval.runtime import Agent, on
        >>> from mhsafeeval.messages import ConversationStarted
        >>> class Greeter(Agent):
        ...     @on(ConversationStarted)
        ...     def greet(self, msg: ConversationStarted) -> None: ...
        >>> Node.of(Greeter, lambda agent_id: Greeter()).types
        (<class 'mhsafeeval.messages.ConversationStarted'>,)
    """

    name: str
    make: Callable[[AgentId], Agent]
    types: tuple[type[Message], ...]
    scope: Scope = "conversation"

    @classmethod
    def of(
        cls,
        agent_type: type[A],
        make: Callable[[AgentId], A] | None = None,
        *,
        name: str | None = None,
        scope: Scope = "conversation",
    ) -> Node:
        """The node of ``agent_type`` (``make``: its factory; the class itself by default;
        ``name``: the class name, lowercased, by default)."""
        factory: Callable[[AgentId], Agent] = make if make is not None else (lambda _: agent_type())
        return cls(name or agent_type.__name__.lower(), factory, agent_type.handled_types(), scope)

    @classmethod
    def shared(cls, agent: Agent, *, name: str | None = None) -> Node:
        """A node with one instance for the whole run (a search controller)."""
        return cls(
            name or type(agent).__name__.lower(),
            lambda _: agent,
            type(agent).handled_types(),
            "global",
        )


class Limits(Protocol):
    """What stops a run early (``[budget]``): :class:`mhsafeeval.budget.Budget` is one.

    ``stop`` is set when a limit is reached; calls then no longer start. The engine waits for
    :meth:`drained` (the calls in flight) before it stops, so their answers are stored.
    """

    @property
    def stop(self) -> anyio.Event:
        """Set once a limit is reached."""
        ...

    @property
    def reached(self) -> str | None:
        """The limit reached (``"max_usd"``), or None."""
        ...

    async def drained(self) -> None:
        """Return once no admitted call is in flight."""
        ...

    def spent(self) -> str:
        """What was spent so far, for people."""
        ...


class Service(Protocol):
    """Work beside the conversations that never steers them (a reporting judge panel).

    It reads the bus (:meth:`observe`, for the messages of :attr:`types`) and writes to the store
    only: what it stores (:meth:`owns`) never goes on the bus, so no agent sees it, and a resumed
    run never replays it. The run ends once every service has done what it was given
    (:meth:`join`), or a limit is reached.
    """

    @property
    def types(self) -> tuple[type[Message], ...]:
        """The message types :meth:`observe` is given."""
        ...

    @property
    def pending(self) -> bool:
        """Whether it holds work it has not done (a resumed run serves it even when the
        conversations are all finished)."""
        ...

    def owns(self, msg: Message) -> bool:
        """Whether a stored message is one of its own records."""
        ...

    def resume(self, stored: Sequence[Message]) -> None:
        """Take note of the next part of the stored campaign (what it stored earlier among
        them: work it need not do again). A resumed run streams the stored messages to it in
        stored order, a page per call, before :meth:`serve` starts: fold them in as they come
        (nothing holds the whole campaign)."""
        ...

    def observe(self, msg: Message) -> None:
        """Take note of a message from the bus."""
        ...

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Do the work until cancelled; call ``task_status.started()`` once ready."""
        ...

    async def join(self) -> None:
        """Return once everything observed so far is done."""
        ...

    def close(self) -> None:
        """No more work will come."""
        ...


def same_config(graph_config: str, campaign: str) -> Callable[[str], None]:
    """The default check of a stored run: stored with exactly this configuration text."""

    def check(stored: str) -> None:
        if stored != graph_config:
            raise InputError(
                "<graph>",
                "config",
                f"campaign {campaign!r} is already stored with another configuration, so it "
                "cannot be resumed with this one; use a new store or campaign name",
            )

    return check


@dataclass(frozen=True, kw_only=True)
class Graph:
    """Everything the engine needs to run (and resume) one campaign of any agent graph.

    Args:
        campaign: the campaign id (the ``campaign`` field of every message).
        nodes: the agents.
        conversations: one start message per planned conversation, in the order they start
            (distinct ``conversation`` fields). Each conversation must end with exactly one
            ``ConversationFinished``, published by an agent of the graph.
        concurrency: how many conversations run at once.
        opening: published once when the campaign starts fresh (``CampaignStarted``), or None.
        config: the configuration text stored with the campaign.
        accepts: ``accepts(stored_config)`` raises (an InputError) when a stored campaign of
            this name cannot be resumed with this graph; by default the text must be equal.
        settled: message types that change what other conversations see (an archive update):
            a failed turn that has one is kept, one without is done again from its start.
        services: work beside the conversations (:class:`Service`).

    Example (the run itself: :func:`~mhsafeeval.engine.run_graph`):
        >>> graph = Graph(campaign="doc", nodes=[], conversations=[], config="v2")
        >>> graph.check_stored("v2")  # stored with this configuration: it resumes
        >>> try:
        ...     graph.check_stored("v1")  # stored with another one: refused, before any write
        ... except InputError as exc:
        ...     print(exc.field)
        config
    """

    campaign: str
    nodes: Sequence[Node]
    conversations: Sequence[Message]
    concurrency: int = 8
    opening: Message | None = None
    config: str = ""
    accepts: Callable[[str], None] | None = None
    settled: tuple[type[Message], ...] = ()
    services: Sequence[Service] = field(default=())

    def __post_init__(self) -> None:
        seen: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            if node.name in seen:  # the runtime registers agents by name
                raise InputError(
                    "<graph>",
                    f"nodes[{index}].name",
                    f"two nodes are named {node.name!r} (nodes {seen[node.name]} and {index}; "
                    "Node.of names a node after its class): give each its own, "
                    "Node.of(..., name=...)",
                )
            seen[node.name] = index

    def check_stored(self, stored_config: str) -> None:
        """Raise if a stored campaign of this name cannot be resumed with this graph."""
        (self.accepts or same_config(self.config, self.campaign))(stored_config)

    def on_bus(self, msg: Message) -> bool:
        """Whether a stored message travelled on the bus (a service's own records never do)."""
        return not any(s.owns(msg) for s in self.services)


class RunResult(msgspec.Struct, kw_only=True):
    """How a run ended.

    Example:
        >>> r = RunResult(
        ...     campaign="c", status="completed_with_failures", conversations=3, finished=3,
        ...     failed=1, events_written=40,
        ... )
        >>> f"{r.status}: {r.finished - r.failed}/{r.conversations} completed"
        'completed_with_failures: 2/3 completed'
    """

    campaign: str
    status: str
    """``completed``, ``completed_with_failures``, ``stopped_budget``, ``interrupted`` or
    ``failed`` (a stored campaign that had finished: its stored status)."""
    conversations: int
    finished: int
    failed: int
    events_written: int
    """Events this run stored."""
    resumed_from: int = 0
    """Events already stored when this run started (0: a fresh campaign)."""
    redone: int = 0
    """Stored messages whose unfinished work this run did again (the calls in flight when the
    previous run stopped)."""
    budget: str | None = None
    """The limit that stopped the run (status ``stopped_budget``), else None."""
    spent: str = ""
    """What the whole campaign spent so far, against the limits."""
