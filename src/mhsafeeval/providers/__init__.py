"""The LLM seam: one protocol, registered providers, and the policies wrapped around them.

Addresses look like ``PREFIX/MODEL``: ``scripted/echo``, ``litellm/openai/gpt-4o-mini``,
``litellm/hosted_vllm/my-model``, ``vllm/Qwen/Qwen2.5-0.5B-Instruct`` (in-process, GPU),
``http/my-app`` and ``python/my_bot:reply`` (an app as the counselor). Provider SDKs are
imported only when a model of theirs is opened.
"""

from ._registry import (
    available_providers,
    open_model,
    provider,
    provider_info,
    settings_problems,
)
from ._resilient import Connections, ResilientClient
from ._scripted import ScriptedModel, register_script
from ._structured import Structured, StructuredOutputError, answer_schema, complete_structured
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ModelSettings,
    PermanentProviderError,
    TransientProviderError,
)

__all__ = [
    "CallParams",
    "ChatMessage",
    "Completion",
    "Connections",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "PermanentProviderError",
    "ResilientClient",
    "ScriptedModel",
    "Structured",
    "StructuredOutputError",
    "TransientProviderError",
    "answer_schema",
    "available_providers",
    "complete_structured",
    "open_model",
    "provider",
    "provider_info",
    "register_script",
    "settings_problems",
]
