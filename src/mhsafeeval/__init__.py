"""mhsafeeval: red-team chatbots acting as mental-health counselors.

Three ways in, and what each needs (everything else lives in the subpackages):

* **Compose your own agent graph**: messages (:class:`Message`), agents (:class:`Agent`,
  :func:`on`) on a :class:`Runtime`, run as a resumable campaign by the engine
  (:class:`Graph`, :class:`Node`, :func:`run_graph`) into an :class:`EventStore`.
* **Plug in a model**: the provider registry (:func:`provider`, :func:`open_model`) and its
  contract (:class:`ModelClient`, :class:`ModelSettings`, :class:`ChatMessage`,
  :class:`CallParams`, :class:`Completion`, :class:`ModelCallError`).
* **Plug in a search strategy**: the controller registry (:func:`controller`) and its contract
  (:class:`SearchController`).

Test with the fakes (:func:`register_script`, :class:`ScriptedModel`,
:class:`MemoryEventStore`). Campaigns themselves run from the command line (``mhsafeeval run``)
or :func:`mhsafeeval.campaign.run_campaign`. Heavy dependencies (litellm, llama.cpp, aiosqlite)
are imported only when a model or store that needs them is opened.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from mhsafeeval.errors import InputError, MhSafeEvalError
from mhsafeeval.framework import Agent, AgentId, HandlerFailed, Message, Runtime, lazy_exports, on
from mhsafeeval.framework.engine import Graph, Node, RunResult, run_graph
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ModelSettings,
    ScriptedModel,
    open_model,
    provider,
    register_script,
)

# A reviewed campaign's store holds the review's events beside the campaign's: whoever reads a
# store must be able to decode them (light: msgspec and the framework only).
from mhsafeeval.review import _events as _review_events  # noqa: F401
from mhsafeeval.search import SearchController, controller
from mhsafeeval.storage import EventStore, MemoryEventStore

if _TYPE_CHECKING:
    from mhsafeeval.storage import SqliteEventStore

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentId",
    "CallParams",
    "ChatMessage",
    "Completion",
    "EventStore",
    "Graph",
    "HandlerFailed",
    "InputError",
    "MemoryEventStore",
    "Message",
    "MhSafeEvalError",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "Node",
    "RunResult",
    "Runtime",
    "ScriptedModel",
    "SearchController",
    "SqliteEventStore",
    "__version__",
    "controller",
    "on",
    "open_model",
    "provider",
    "register_script",
    "run_graph",
]


# The SQLite store imports aiosqlite: only when it is asked for.
__getattr__ = lazy_exports(__name__, {"SqliteEventStore": "mhsafeeval.storage"})
