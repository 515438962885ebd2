"""Providers are registered factories addressed by the prefix of a model string."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TypeVar

import msgspec

from ._resilient import ResilientClient
from ._types import ModelClient, ModelSettings, ProviderUnavailable

__all__ = ["ProviderFactory", "available_providers", "open_model", "provider", "resolve_provider"]

ENTRY_POINT_GROUP = "mhsafeeval.providers"

ProviderFactory = Callable[[str, ModelSettings], ModelClient]
"""``factory(model, settings)``: ``model`` is the address after the prefix
(``openai/gpt-4o-mini`` for ``litellm/openai/gpt-4o-mini``)."""

F = TypeVar("F", bound=ProviderFactory)

_registered: dict[str, ProviderFactory] = {}
# Built-ins are imported only when used: the litellm and llama.cpp adapters cost seconds to import.
_builtin: dict[str, tuple[str, str]] = {
    "scripted": (
        "mhsafeeval.runtime.providers._scripted",
        "Scripted model replies for tests and examples",
    ),
    "litellm": (
        "mhsafeeval.runtime.providers._litellm",
        "Any model litellm reaches (hosted APIs, vLLM, Ollama)",
    ),
}


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
    if not prefix or "/" in prefix:
        raise ValueError(f"provider prefix must be a non-empty word without '/': {prefix!r}")

    def register(factory: F) -> F:
        if prefix in _registered and _registered[prefix] is not factory and not replace:
            raise ValueError(f"provider {prefix!r} is already registered")
        _registered[prefix] = factory
        return factory

    return register


def available_providers() -> dict[str, str]:
    """Every known provider prefix with a one-line description (built-in, registered, plugin)."""
    out = {name: desc for name, (_, desc) in _builtin.items()}
    for name, factory in _registered.items():
        out.setdefault(
            name, (factory.__doc__ or "").strip().splitlines()[0] if factory.__doc__ else ""
        )
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        out.setdefault(ep.name, f"plugin: {ep.value}")
    return dict(sorted(out.items()))


def resolve_provider(prefix: str) -> ProviderFactory:
    """The factory for ``prefix``, importing a built-in or plugin on first use."""
    if prefix in _registered:
        return _registered[prefix]
    if prefix in _builtin:
        importlib.import_module(_builtin[prefix][0])  # registers itself
        return _registered[prefix]
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=prefix):
        factory: ProviderFactory = ep.load()
        _registered[prefix] = factory
        return factory
    known = ", ".join(available_providers())
    raise ProviderUnavailable(f"unknown provider {prefix!r} (known: {known})")


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


def with_defaults(settings: ModelSettings, **changes: object) -> ModelSettings:
    """A copy of ``settings`` with some fields changed (validated again)."""
    return msgspec.convert({**msgspec.structs.asdict(settings), **changes}, ModelSettings)
