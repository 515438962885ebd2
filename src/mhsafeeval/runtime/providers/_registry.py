"""Providers are registered factories addressed by the prefix of a model string."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .._plugins import PluginNotFound, Registry
from ._resilient import ResilientClient
from ._types import ModelClient, ModelSettings, ProviderUnavailable

__all__ = ["ProviderFactory", "available_providers", "open_model", "provider", "resolve_provider"]

ProviderFactory = Callable[[str, ModelSettings], ModelClient]
"""``factory(model, settings)``: ``model`` is the address after the prefix
(``openai/gpt-4o-mini`` for ``litellm/openai/gpt-4o-mini``)."""

F = TypeVar("F", bound=ProviderFactory)

# Built-ins are imported only when used: the litellm and llama.cpp adapters cost seconds to import.
PROVIDERS: Registry[ProviderFactory] = Registry(
    "provider",
    "mhsafeeval.providers",
    {
        "scripted": (
            "mhsafeeval.runtime.providers._scripted",
            "Scripted model replies for tests and examples",
        ),
        "litellm": (
            "mhsafeeval.runtime.providers._litellm",
            "Any model litellm reaches (hosted APIs, vLLM servers, Ollama)",
        ),
        "local": (
            "mhsafeeval.runtime.providers._local",
            "llama.cpp in-process: local/gemma-3-270m or local/<path to a .gguf> (extra: local)",
        ),
    },
)


def provider(prefix: str, *, replace: bool = False) -> Callable[[F], F]:
    """Register a provider factory under ``prefix``.

    Example:
        >>> from mhsafeeval.runtime.providers import provider
        >>> @provider("example-echo")
        ... def make_echo(model: str, settings: ModelSettings) -> ModelClient:
        ...     ...  # return an object with name, supports_json_schema, complete(), aclose()

    Third-party packages register theirs through the ``mhsafeeval.providers`` entry-point group
    (name = prefix, value = ``module:factory``), loaded on first use.
    """
    return PROVIDERS.register(prefix, replace=replace)  # type: ignore[return-value]


def available_providers() -> dict[str, str]:
    """Every known provider prefix with a one-line description (built-in, registered, plugin)."""
    return PROVIDERS.available()


def resolve_provider(prefix: str) -> ProviderFactory:
    """The factory for ``prefix``, importing a built-in or plugin on first use."""
    try:
        return PROVIDERS.get(prefix)
    except PluginNotFound as exc:
        raise ProviderUnavailable(str(exc)) from None


def open_model(settings: ModelSettings | str, **resilience: object) -> ResilientClient:
    """Open the model a settings block (or a bare address) names, wrapped with limits and retries.

    ``resilience`` is passed to :class:`ResilientClient` (``sleep``, ``rng``: for tests).
    """
    if isinstance(settings, str):
        settings = ModelSettings(provider=settings)
    prefix, _, model = settings.provider.partition("/")
    if not model:
        raise ProviderUnavailable(
            f"model address {settings.provider!r} must look like 'PREFIX/MODEL'"
        )
    inner = resolve_provider(prefix)(model, settings)
    return ResilientClient(inner, settings, **resilience)  # type: ignore[arg-type]
