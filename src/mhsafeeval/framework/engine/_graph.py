"""The declaration of a run: which agents, which conversations, what is shared."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import anyio
import msgspec
from anyio.abc import TaskStatus

from mhsafeeval.errors import InputError
from mhsafeeval.framework import Agent, AgentId, HandlerFailed, Interceptor, Message, Scope
from mhsafeeval.framework.lifecycle import CampaignFinished, ConversationFinished

from ._stored import never_owed

__all__ = ["Graph", "Intercept", "Limits", "Node", "RunResult", "Service"]

A = TypeVar("A", bound=Agent)


@dataclass(frozen=True)
class Node:
    """One agent of a graph: its name, how an instance is made, and what it receives.

    ``scope="conversation"``: one instance per conversation (made on its first message);
    ``"global"``: one instance for the whole run (a search controller). The message types come
    from the agent class's ``@on`` handlers, so the wiring is declared by types, never looked up
    by name.

    Example:
        >>> from mhsafeeval.framework import Agent, on
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
    publishes: tuple[type[Message], ...] | None = None
    """What its agents may publish (``Agent.publishes``), or None: not declared (the graph's
    wiring checks then take what it publishes as unknown)."""
    topic: str | None = None
    """Receive only messages published on this topic (``Agent.publish(msg, topic=...)``);
    None: every matching message, whatever its topic."""

    @classmethod
    def of(
        cls,
        agent_type: type[A],
        make: Callable[[AgentId], A] | None = None,
        *,
        name: str | None = None,
        scope: Scope = "conversation",
        topic: str | None = None,
    ) -> Node:
        """The node of ``agent_type`` (``make``: its factory; the class itself by default;
        ``name``: the class name, lowercased, by default; ``topic``: see :attr:`topic`)."""
        factory: Callable[[AgentId], Agent] = make if make is not None else (lambda _: agent_type())
        return cls(
            name or agent_type.__name__.lower(),
            factory,
            agent_type.handled_types(),
            scope,
            _declared(agent_type),
            topic,
        )

    @classmethod
    def shared(cls, agent: Agent, *, name: str | None = None, topic: str | None = None) -> Node:
        """A node with one instance for the whole run (a search controller)."""
        return cls(
            name or type(agent).__name__.lower(),
            lambda _: agent,
            type(agent).handled_types(),
            "global",
            _declared(type(agent)),
            topic,
        )


def _declared(agent_type: type[Agent]) -> tuple[type[Message], ...] | None:
    """What an agent class says it publishes (its outcomes with it), or None."""
    if agent_type.publishes is None:
        return None
    return tuple(dict.fromkeys((*agent_type.publishes, *agent_type.outcomes)))


@dataclass(frozen=True)
class Intercept:
    """An interceptor of a graph: ``check(msg)`` sees every message of ``types`` before any
    agent does and returns it, a replacement, or None to drop it
    (:meth:`~mhsafeeval.framework.Runtime.intercept` says the rules). Each drop or rewrite is
    stored as an :class:`~mhsafeeval.framework.Intercepted` record, so a resumed run keeps the
    decisions made before the stop; ``check`` must be quick and must not block (a model-based
    check is an agent).

    Example:
        >>> from mhsafeeval.messages import CounselorReply
        >>> import msgspec
        >>> def soften(reply: CounselorReply) -> CounselorReply:
        ...     if "guarantee" not in reply.text:
        ...         return reply
        ...     return msgspec.structs.replace(reply, text="I can't promise that.")
        >>> Intercept("guardrail", soften, (CounselorReply,)).name
        'guardrail'
    """

    name: str
    check: Callable[[Any], Message | None]
    types: tuple[type[Message], ...] = (Message,)

    @property
    def interceptor(self) -> Interceptor:
        """``check`` as the runtime takes it."""
        return self.check


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
        """Return once no admitted call is in flight and none will be admitted (a limit may
        still admit the calls that finish what was paid for: the judges of replies bought)."""
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
        owes: whether a stored message records work still owed (a call that failed for good):
            a failed conversation with one is picked up from there (see ``to_retry``).
        services: work beside the conversations (:class:`Service`).
        interceptors: checks between publishers and everyone else (:class:`Intercept`), in
            order.

    Example (the run itself: :func:`~mhsafeeval.framework.engine.run_graph`):
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
    interceptors: Sequence[Intercept] = field(default=())
    owes: Callable[[Message], bool] = never_owed

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
        for index, intercept in enumerate(self.interceptors):
            if intercept.name in seen or intercept.name in {
                i.name for i in self.interceptors[:index]
            }:
                raise InputError(
                    "<graph>",
                    f"interceptors[{index}].name",
                    f"{intercept.name!r} already names a node or an interceptor: give each "
                    "its own name",
                )
        self._check_wiring()

    def _check_wiring(self) -> None:
        """Refuse a handler for a type nothing publishes and a published type nothing
        handles (one line each), as far as the nodes declare what they publish."""
        engine: list[type[Message]] = [type(m) for m in self.conversations]
        engine += [type(self.opening)] if self.opening is not None else []
        engine += [ConversationFinished, HandlerFailed, CampaignFinished]
        made = engine + [t for node in self.nodes for t in node.publishes or ()]
        taken: list[type[Message]] = [ConversationFinished, HandlerFailed]  # the scheduler's
        taken += [t for node in self.nodes for t in node.types]
        for index, node in enumerate(self.nodes):
            for sent in node.publishes or ():
                if not sent.record and not any(issubclass(sent, t) for t in taken):
                    raise InputError(
                        "<graph>",
                        f"nodes[{index}].publishes",
                        f"node {node.name!r} publishes {sent.__name__} ({sent.tag_name()!r}), "
                        "which no node handles: add the node that takes it, or mark the type "
                        "`record = True` if it is kept for the log only",
                    )
        if any(node.publishes is None for node in self.nodes):
            return  # what an undeclared node publishes is unknown: it may feed any handler
        for index, node in enumerate(self.nodes):
            for wanted in node.types:
                if not any(issubclass(m, wanted) for m in made):
                    raise InputError(
                        "<graph>",
                        f"nodes[{index}].types",
                        f"node {node.name!r} handles {wanted.__name__} "
                        f"({wanted.tag_name()!r}), which nothing in the graph publishes: add "
                        "the node that publishes it, or declare it in that agent's `publishes`",
                    )

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
