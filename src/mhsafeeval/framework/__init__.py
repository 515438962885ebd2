"""The framework: the bus (messages, agents, the runtime that routes between them), the engine
that runs any agent graph as a resumable campaign (:mod:`mhsafeeval.framework.engine`), the
event stores (:mod:`mhsafeeval.framework.store`), the lifecycle messages, logging and plugins.

It imports nothing of the MHSafeEval campaign (``tests/test_package.py`` checks it): the
campaign (its agents, judges, search, metrics, reports and CLI) is an application on it, and
so is a graph of your own. The model providers are a package of their own
(:mod:`mhsafeeval.providers`).
"""

from ._agent import Agent, AgentId, on
from ._logging import configure_logging
from ._message import (
    HandlerFailed,
    Intercepted,
    Message,
    MessageCollision,
    encode_message,
    message_decoder,
)
from ._plugins import PluginNotFound, Registry, lazy_exports
from ._redact import (
    KEY_SHAPES,
    excerpt,
    redact,
    register_env_secrets,
    register_secret,
    secret_variables,
)
from ._resource import AsyncResource
from ._runtime import Interceptor, Runtime, Scope
from ._text import visible
from .lifecycle import CampaignFinished, ConversationFinished

__all__ = [
    "KEY_SHAPES",
    "Agent",
    "AgentId",
    "AsyncResource",
    "CampaignFinished",
    "ConversationFinished",
    "HandlerFailed",
    "Intercepted",
    "Interceptor",
    "Message",
    "MessageCollision",
    "PluginNotFound",
    "Registry",
    "Runtime",
    "Scope",
    "configure_logging",
    "encode_message",
    "excerpt",
    "lazy_exports",
    "message_decoder",
    "on",
    "redact",
    "register_env_secrets",
    "register_secret",
    "secret_variables",
    "visible",
]
