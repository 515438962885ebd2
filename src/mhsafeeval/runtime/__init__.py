"""The bottom layer: messages, agents, the runtime that routes between them, logging, providers.

Nothing here knows about counseling; the rest of mhsafeeval builds on these pieces, and so can
users composing their own agent graphs.
"""

from ._agent import Agent, AgentId, on
from ._logging import configure_logging, redact, register_secret
from ._message import (
    HandlerFailed,
    Message,
    decode_message,
    encode_message,
    message_decoder,
    message_id,
    message_types,
)
from ._plugins import PluginNotFound, Registry
from ._runtime import Observer, Runtime, Scope

__all__ = [
    "Agent",
    "AgentId",
    "HandlerFailed",
    "Message",
    "Observer",
    "PluginNotFound",
    "Registry",
    "Runtime",
    "Scope",
    "configure_logging",
    "decode_message",
    "encode_message",
    "message_decoder",
    "message_id",
    "message_types",
    "on",
    "redact",
    "register_secret",
]
