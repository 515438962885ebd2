"""The LLM seam: one protocol, registered providers, and the policies wrapped around them.

Addresses look like ``PREFIX/MODEL``: ``scripted/echo``, ``litellm/openai/gpt-4o-mini``,
``litellm/hosted_vllm/my-model``. Provider SDKs are imported only when a model of theirs is
opened.
"""

from ._registry import (
    ProviderFactory,
    ProviderInfo,
    available_providers,
    open_model,
    provider,
    provider_info,
    resolve_provider,
)
from ._resilient import CallStats, Connections, ResilientClient
from ._structured import (
    Structured,
    StructuredOutputError,
    answer_schema,
    complete_structured,
    extract_json,
)
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
    "Connections",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "PermanentProviderError",
    "ProviderError",
    "ProviderFactory",
    "ProviderInfo",
    "ProviderUnavailable",
    "ResilientClient",
    "Structured",
    "StructuredOutputError",
    "TransientProviderError",
    "answer_schema",
    "available_providers",
    "complete_structured",
    "extract_json",
    "open_model",
    "provider",
    "provider_info",
    "resolve_provider",
]
