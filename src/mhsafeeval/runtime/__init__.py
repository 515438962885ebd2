"""The bottom layer: messages, agents, the runtime that routes between them, logging, providers.

Nothing here knows about counseling; the rest of mhsafeeval builds on these pieces, and so can
users composing their own agent graphs.
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
from ._redact import KEY_SHAPES, excerpt, redact
from ._runtime import Interceptor, Runtime, Scope
from ._text import visible

__all__ = [
    "KEY_SHAPES",
    "Agent",
    "AgentId",
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
    "visible",
]
