"""mhsafeeval: red-team chatbots acting as mental-health counselors.

The public surface is small and curated; heavy dependencies (litellm, vllm, llama.cpp) are
imported only when a model that needs them is opened.
"""

from mhsafeeval.config import Config, load_config, parse_config
from mhsafeeval.errors import InputError, MhSafeEvalError
from mhsafeeval.runtime import Agent, AgentId, HandlerFailed, Message, Runtime, on
from mhsafeeval.runtime.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ModelSettings,
    open_model,
    provider,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentId",
    "CallParams",
    "ChatMessage",
    "Completion",
    "Config",
    "HandlerFailed",
    "InputError",
    "Message",
    "MhSafeEvalError",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "Runtime",
    "__version__",
    "load_config",
    "on",
    "open_model",
    "parse_config",
    "provider",
]
