"""The LLM seam: one protocol, registered providers, and the policies wrapped around them.

Addresses look like ``PREFIX/MODEL``: ``scripted/echo``, ``litellm/openai/gpt-4o-mini``,
``litellm/hosted_vllm/my-model``. Provider SDKs are imported only when a model of theirs is
opened.
"""

from ._registry import (
    ProviderFactory,
    available_providers,
    open_model,
    provider,
    resolve_provider,
)
from ._resilient import CallStats, ResilientClient
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ModelSettings,
    PermanentProviderError,
    ProviderError,
    ProviderUnavailable,
    TransientProviderError,
)

__all__ = [
    "CallParams",
    "CallStats",
    "ChatMessage",
    "Completion",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "PermanentProviderError",
    "ProviderError",
    "ProviderFactory",
    "ProviderUnavailable",
    "ResilientClient",
    "TransientProviderError",
    "available_providers",
    "open_model",
    "provider",
    "resolve_provider",
]
