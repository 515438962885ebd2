"""Agents added to the campaign's graph without forking it: ``[agents.NAME]`` in the config,
or nodes and interceptors passed from Python (:func:`mhsafeeval.campaign.run_campaign`).

A class named by an ``[agents.NAME]`` table is an :class:`~mhsafeeval.framework.Agent` that
makes itself from the campaign's setup::

    class Guardrail(Agent):
        Options = GuardrailOptions           # a msgspec Struct: [agents.NAME.options]
        scope = "conversation"               # or "global": one instance for the campaign
        model_required = False               # True: [agents.NAME.model] must be given
        publishes = (Flagged,)               # what it publishes (the graph's checks use it)

        @classmethod
        def from_config(cls, setup: AgentSetup) -> Guardrail:
            return cls(setup.options, setup.model)

``check`` imports the class and checks the table (the class, its options against ``Options``,
its model table like any other), so a bad table fails before anything runs, with one line
naming the key; the node's name is ``NAME``, and every message it publishes carries it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import msgspec

from mhsafeeval.config import Config, convert_table
from mhsafeeval.errors import InputError
from mhsafeeval.framework import Agent, AgentId
from mhsafeeval.framework.engine import Node
from mhsafeeval.providers import ModelClient
from mhsafeeval.taxonomy import Taxonomy

__all__ = ["BUILT_IN_NODES", "AddedAgent", "AgentSetup", "added_agents", "added_nodes"]

BUILT_IN_NODES = ("mutator", "client", "counselor", "judge", "refiner", "controller")
"""The campaign graph's own node names: an ``[agents.NAME]`` table cannot take one."""

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class AgentSetup(NamedTuple):
    """What an ``[agents.NAME]`` class's ``from_config`` is given, once per instance."""

    name: str
    """The node's name (``NAME``)."""
    options: Any
    """``[agents.NAME.options]`` decoded into the class's ``Options`` (None: it has none)."""
    model: ModelClient | None
    """``[agents.NAME.model]``, opened with the campaign's budget and limits (None: none)."""
    taxonomy: Taxonomy
    threshold: int
    """The campaign's success threshold (``campaign.threshold``)."""
    context_turns: int
    """How many committed turns the campaign's own agents show their models."""
    conversation: str
    """The conversation this instance serves ("" for a ``global`` agent)."""
    counselor: str
    """The counselor model's name in that conversation ("" for a ``global`` agent)."""
    profile_id: str
    """The client profile of that conversation ("" for a ``global`` agent)."""


@dataclass(frozen=True)
class AddedAgent:
    """An ``[agents.NAME]`` table, checked: the class, its decoded options and scope."""

    name: str
    cls: type[Agent]
    options: Any
    scope: Literal["conversation", "global"]


def added_agents(config: Config, source: str | Path = "<config>") -> tuple[AddedAgent, ...]:
    """Import and check every ``[agents.NAME]`` table, in the config's order.

    Raises:
        InputError: a bad name, a class that cannot be imported or is no configurable agent,
            options its ``Options`` refuses, or a required model table missing (naming the
            key: ``agents.NAME.class``, ``agents.NAME.options.KEY``, ...).
    """
    out = []
    for name, table in config.agents.items():
        where = f"agents.{name}"
        if not _NAME.fullmatch(name):
            raise InputError(
                source, where, "a node name is 1-40 lowercase letters, digits, '-' or '_'"
            )
        if name in BUILT_IN_NODES:
            raise InputError(
                source,
                where,
                f"{name!r} is a node of the campaign graph already "
                f"({', '.join(BUILT_IN_NODES)}): choose another name",
            )
        if not _PATH.fullmatch(table.class_):
            raise InputError(
                source,
                f"{where}.class",
                f"{table.class_!r} is no import path: write 'package.module:ClassName'",
            )
        cls = _import(table.class_, source, f"{where}.class")
        kind = getattr(cls, "Options", None)
        if kind is None:
            if table.options:
                raise InputError(
                    source, f"{where}.options", f"{table.class_} takes no options (no Options)"
                )
            options = None
        elif isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            options = convert_table(dict(table.options), kind, source, f"{where}.options")
        else:
            raise InputError(
                source, f"{where}.class", f"{table.class_}.Options is no msgspec Struct"
            )
        scope: Literal["conversation", "global"] = getattr(cls, "scope", "conversation")
        if scope not in ("conversation", "global"):
            raise InputError(
                source, f"{where}.class", f"{table.class_}.scope must be 'conversation' or 'global'"
            )
        if getattr(cls, "model_required", False) and table.model is None:
            raise InputError(
                source, f"{where}.model", f"{table.class_} calls a model: add [{where}.model]"
            )
        out.append(AddedAgent(name, cls, options, scope))
    return tuple(out)


def _import(path: str, source: str | Path, field: str) -> type[Agent]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise InputError(
            source, field, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise InputError(source, field, f"module {module_name!r} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise InputError(source, field, f"{path} is not an Agent subclass")
    if not callable(getattr(cls, "from_config", None)):
        raise InputError(
            source,
            field,
            f"{path} has no from_config(setup) classmethod: see mhsafeeval.added.AgentSetup",
        )
    return cls


def added_nodes(
    added: Sequence[AddedAgent],
    models: Mapping[str, ModelClient],
    *,
    taxonomy: Taxonomy,
    threshold: int,
    context_turns: int,
    conversations: Mapping[str, tuple[str, str]],
) -> list[Node]:
    """The graph nodes of the checked ``[agents.NAME]`` tables. ``models``: each one's opened
    model (those that have one); ``conversations``: each planned conversation's (counselor,
    profile id)."""
    nodes = []
    for agent in added:

        def make(agent_id: AgentId, agent: AddedAgent = agent) -> Agent:
            counselor, profile = conversations.get(agent_id.key, ("", ""))
            setup = AgentSetup(
                name=agent.name,
                options=agent.options,
                model=models.get(agent.name),
                taxonomy=taxonomy,
                threshold=threshold,
                context_turns=context_turns,
                conversation=agent_id.key,
                counselor=counselor,
                profile_id=profile,
            )
            made = agent.cls.from_config(setup)  # type: ignore[attr-defined]
            if not isinstance(made, Agent):
                raise TypeError(f"{agent.cls.__name__}.from_config returned {type(made).__name__}")
            return made

        node = Node.of(agent.cls, make, name=agent.name, scope=agent.scope)
        nodes.append(node)
    return nodes
