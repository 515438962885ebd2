"""Providers are registered factories addressed by the prefix of a model string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from mhsafeeval.errors import validation_error

from .._plugins import PluginNotFound, Registry
from ._resilient import ResilientClient
from ._types import ModelClient, ModelSettings, ProviderUnavailable

__all__ = [
    "ProviderFactory",
    "SettingsCheck",
    "SettingsError",
    "available_providers",
    "open_model",
    "provider",
    "resolve_provider",
    "settings_problems",
    "typed_options",
]

ProviderFactory = Callable[[str, ModelSettings], ModelClient]
"""``factory(model, settings)``: ``model`` is the address after the prefix
(``openai/gpt-4o-mini`` for ``litellm/openai/gpt-4o-mini``)."""

SettingsCheck = Callable[[str, ModelSettings], list[tuple[str, str]]]
"""``check(model, settings)``: what a provider can tell is wrong without calling anything, as
``(key path inside the model table, reason)`` pairs (``("provider", "no such model")``)."""

F = TypeVar("F", bound=ProviderFactory)
S = TypeVar("S", bound=msgspec.Struct)


class SettingsError(ProviderUnavailable, ValueError):
    """A model table's setting its provider refuses. ``field`` is the key path inside the table
    (``options.n_ctx``)."""

    def __init__(self, address: str, field: str, reason: str) -> None:
        super().__init__(f"{address}: {field}: {reason}")
        self.field = field
        self.reason = reason


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


def provider(
    prefix: str,
    *,
    replace: bool = False,
    options: type[msgspec.Struct] | None = None,
    check: SettingsCheck | None = None,
) -> Callable[[F], F]:
    """Register a provider factory under ``prefix``, with what it accepts.

    Args:
        prefix: the address prefix (``litellm`` in ``litellm/openai/gpt-4o-mini``).
        replace: replace a factory already registered under ``prefix``.
        options: the msgspec Struct that the model table's ``options`` must convert to (unknown
            keys, types and ranges are refused by ``check`` and when the model is opened, with
            the key path). ``None``: options are not checked.
        check: more checks made without calling anything (see :data:`SettingsCheck`).

    A factory registered otherwise (an entry point) declares the same with the attributes
    ``options_type`` and ``check_settings``.

    Example:
        >>> from mhsafeeval.runtime.providers import provider
        >>> @provider("example-echo")
        ... def make_echo(model: str, settings: ModelSettings) -> ModelClient:
        ...     ...  # return an object with name, supports_json_schema, complete(), aclose()

    Third-party packages register theirs through the ``mhsafeeval.providers`` entry-point group
    (name = prefix, value = ``module:factory``), loaded on first use.
    """
    register = PROVIDERS.register(prefix, replace=replace)  # checks the prefix at once

    def add(factory: F) -> F:
        if options is not None:
            setattr(factory, "options_type", options)  # noqa: B010 - declared on the function
        if check is not None:
            setattr(factory, "check_settings", check)  # noqa: B010
        register(factory)
        return factory

    return add


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

    Raises:
        ProviderUnavailable: no such provider, or a setting it refuses (:class:`SettingsError`,
            naming the key, as :func:`settings_problems` does).
    """
    if isinstance(settings, str):
        settings = ModelSettings(provider=settings)
    for field, reason in settings_problems(settings):
        raise SettingsError(settings.provider, field, reason)
    prefix, _, model = settings.provider.partition("/")
    inner = resolve_provider(prefix)(model, settings)
    return ResilientClient(inner, settings, **resilience)  # type: ignore[arg-type]


def settings_problems(settings: ModelSettings) -> list[tuple[str, str]]:
    """What the provider of ``settings`` refuses in them, found without calling any model:
    ``(key path inside the model table, reason)`` pairs, e.g.
    ``("options.n_ctxx", "unknown option ...")``. Empty when all is well.

    Checks the address (a known prefix and a model after it), the options against the
    provider's options Struct, and the provider's own check (litellm: can it route the model).

    Example:
        >>> settings_problems(ModelSettings(provider="scripted/"))
        [('provider', "no model after 'scripted/' (an address is PREFIX/MODEL)")]
    """
    prefix, _, model = settings.provider.partition("/")
    if not prefix.strip() or not model.strip():
        what = f"no model after {prefix + '/'!r}" if prefix.strip() else "no provider prefix"
        return [("provider", f"{what} (an address is PREFIX/MODEL)")]
    try:
        factory = resolve_provider(prefix)
    except ProviderUnavailable as exc:
        return [("provider", str(exc))]
    problems: list[tuple[str, str]] = []
    kind: type[msgspec.Struct] | None = getattr(factory, "options_type", None)
    if kind is not None:
        try:
            msgspec.convert(settings.options, kind)
        except (msgspec.ValidationError, ValueError) as exc:
            problems.append(_option_problem(exc, kind, prefix))
    check: SettingsCheck | None = getattr(factory, "check_settings", None)
    if check is not None:
        try:
            problems += check(model, settings)
        except ProviderUnavailable as exc:  # its SDK is not installed, say
            problems.append(("provider", str(exc)))
    return problems


def typed_options(settings: ModelSettings, kind: type[S]) -> S:
    """``settings.options`` as the provider's options Struct ``kind``.

    Raises:
        SettingsError: naming the option and the reason.
    """
    try:
        return msgspec.convert(settings.options, kind)
    except (msgspec.ValidationError, ValueError) as exc:
        field, reason = _option_problem(exc, kind, settings.provider.partition("/")[0])
        raise SettingsError(settings.provider, field, reason) from None


def _option_problem(exc: Exception, kind: type[Any], prefix: str) -> tuple[str, str]:
    error = validation_error(None, exc, "options")
    reason = error.reason
    if reason == "unknown field":
        known = ", ".join(kind.__struct_fields__) or "none"
        reason = f"unknown option for {prefix}/ models (known: {known})"
    return error.field or "options", reason
