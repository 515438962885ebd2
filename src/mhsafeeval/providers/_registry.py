"""Providers are registered factories addressed by the prefix of a model string."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from mhsafeeval.errors import validation_error
from mhsafeeval.framework import PluginNotFound, Registry, register_env_secrets, secret_variables

from ._resilient import Connections, ResilientClient
from ._types import ModelClient, ModelSettings, ProviderUnavailable

__all__ = [
    "EnvironmentNames",
    "PriceCheck",
    "ProviderFactory",
    "ProviderInfo",
    "SettingsCheck",
    "SettingsError",
    "available_providers",
    "open_model",
    "provider",
    "provider_info",
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

EnvironmentNames = Callable[[str, ModelSettings], list[tuple[str, str]]]
"""``environment(model, settings)``: the environment variables a table's model reads that the
table does not name itself (``openai/`` on OpenAI reads ``OPENAI_API_KEY``), as ``(key path,
variable)`` pairs: ``check`` warns when one is unset, ``run`` refuses to start."""

PriceCheck = Callable[[str, ModelSettings], bool]
"""``prices(model, settings)``: whether the provider will price this table's calls
(:meth:`~mhsafeeval.providers.ModelClient.price` not ``None``), known without calling
anything: a USD budget needs it of every model."""

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
            "mhsafeeval.providers._scripted",
            "Scripted model replies for tests and examples",
        ),
        "litellm": (
            "mhsafeeval.providers._litellm",
            "Any model litellm reaches (hosted APIs, vLLM servers, Ollama) (extra: litellm)",
        ),
        "openai": (
            "mhsafeeval.providers._openai",
            "OpenAI or any OpenAI-compatible server (vLLM, llama.cpp, Ollama), no SDK needed",
        ),
        "local": (
            "mhsafeeval.providers._local",
            "llama.cpp in-process: local/gemma-3-270m or local/<path to a .gguf> (extra: local)",
        ),
        "vllm": (
            "mhsafeeval.providers._vllm",
            "vLLM in-process on a GPU: vllm/<Hub id or model folder> (extra: vllm)",
        ),
        "http": (
            "mhsafeeval.providers._http",
            "An app reached over HTTP: http/<name>, its URL, body and reply path in options",
        ),
        "python": (
            "mhsafeeval.providers._python",
            "An app that is a Python callable: python/<module>:<function> or python/<file.py>:<f>",
        ),
    },
)


@dataclass(frozen=True)
class ProviderInfo:
    """What a provider declared when it was registered (see :func:`provider`)."""

    factory: ProviderFactory
    options: type[msgspec.Struct] | None = None
    """The msgspec Struct that a model table's ``options`` must convert to (``None``: options
    are not checked)."""
    check: SettingsCheck | None = None
    """More checks made without calling anything (see :data:`SettingsCheck`)."""
    prices: PriceCheck | None = None
    """Whether a table's calls get a price (see :data:`PriceCheck`); ``None``: not declared,
    and litellm's price map is asked by the model's name."""
    environment: EnvironmentNames | None = None
    """The environment variables a table reads without naming them (see
    :data:`EnvironmentNames`)."""
    own_prompt: bool = False
    """The target is an application with a system prompt of its own (``http/``, ``python/``):
    a counselor table of it is sent no system message unless it sets ``system_prompt``."""


_declared: dict[str, ProviderInfo] = {}


def provider(
    prefix: str,
    *,
    replace: bool = False,
    options: type[msgspec.Struct] | None = None,
    check: SettingsCheck | None = None,
    prices: PriceCheck | None = None,
    environment: EnvironmentNames | None = None,
    own_prompt: bool = False,
) -> Callable[[F], F]:
    """Register a provider factory under ``prefix``, with what it accepts.

    Args:
        prefix: the address prefix (``litellm`` in ``litellm/openai/gpt-4o-mini``).
        replace: replace a factory already registered under ``prefix``.
        options: the msgspec Struct that the model table's ``options`` must convert to (unknown
            keys, types and ranges are refused by ``check`` and when the model is opened, with
            the key path). ``None``: options are not checked.
        check: more checks made without calling anything (see :data:`SettingsCheck`).
        prices: whether a table's calls will be priced (see :data:`PriceCheck`).
        environment: the environment variables a table reads without naming them (see
            :data:`EnvironmentNames`).
        own_prompt: the target is an application with its own system prompt: counselors
            send it none unless their table sets ``system_prompt``.

    Example:
        >>> import msgspec
        >>> from mhsafeeval.providers import provider
        >>> class EchoOptions(msgspec.Struct, forbid_unknown_fields=True):
        ...     shout: bool = False
        >>> @provider("example-echo", options=EchoOptions)
        ... def make_echo(model: str, settings: ModelSettings) -> ModelClient:
        ...     ...  # return a ModelClient (name, complete(), aclose(), ...)
        >>> settings_problems(ModelSettings(provider="example-echo/x", options={"shuot": 1}))
        [('options.shuot', 'unknown option for example-echo/ models (known: shout)')]

    Third-party packages register theirs through the ``mhsafeeval.providers`` entry-point group
    (name = prefix, value = ``module:factory``), loaded on first use; the module declares its
    options and check with this decorator, which runs when the entry point is loaded. A factory
    registered without it has its options passed unchecked.
    """
    register = PROVIDERS.register(prefix, replace=replace)  # checks the prefix at once

    def add(factory: F) -> F:
        register(factory)  # refuses a second factory unless replace
        _declared[prefix] = ProviderInfo(factory, options, check, prices, environment, own_prompt)
        return factory

    return add


def provider_info(prefix: str) -> ProviderInfo:
    """What the provider registered as ``prefix`` declared, importing it on first use.

    Raises:
        ProviderUnavailable: no such provider.
    """
    factory = resolve_provider(prefix)
    info = _declared.get(prefix)
    return info if info is not None and info.factory is factory else ProviderInfo(factory)


def available_providers() -> dict[str, str]:
    """Every known provider prefix with a one-line description (built-in, registered, plugin)."""
    return PROVIDERS.available()


def resolve_provider(prefix: str) -> ProviderFactory:
    """The factory for ``prefix``, importing a built-in or plugin on first use."""
    try:
        return PROVIDERS.get(prefix)
    except PluginNotFound as exc:
        raise ProviderUnavailable(str(exc)) from None


def open_model(
    settings: ModelSettings | str,
    *,
    connections: Connections | None = None,
    **resilience: object,
) -> ResilientClient:
    """Open the model a settings block (or a bare address) names, wrapped with limits and retries.

    ``connections``: clients opened with the same one share a concurrency limit per endpoint
    (the provider's :attr:`~ModelClient.connection_key`), as wide as the largest
    ``max_concurrency`` among them; without it the client has a limit of its own.
    ``resilience`` is passed to :class:`ResilientClient` (``sleep``, ``rng``: for tests).

    Raises:
        ProviderUnavailable: no such provider, or a setting it refuses (:class:`SettingsError`,
            naming the key, as :func:`settings_problems` does).

    Example:
        >>> import anyio
        >>> from mhsafeeval.providers import ChatMessage, Connections
        >>> shared = Connections()  # one limit per endpoint for every client opened with it
        >>> async def main() -> str:
        ...     async with open_model("scripted/echo", connections=shared) as model:
        ...         return (await model.complete([ChatMessage("user", "are you there?")])).text
        >>> anyio.run(main)
        'are you there?'
    """
    if isinstance(settings, str):
        settings = ModelSettings(provider=settings)
    for field, reason in settings_problems(settings):
        raise SettingsError(settings.provider, field, reason)
    # Whatever a provider does with them, the values of the variables the table names as
    # secrets are masked wherever text from outside is stored or shown.
    register_env_secrets(secret_variables(settings.api_key_env, settings.options))
    prefix, _, model = settings.provider.partition("/")
    inner = resolve_provider(prefix)(model, settings)
    limiter = None
    if connections is not None:
        key = f"{prefix}:{inner.connection_key}"  # two providers never share an endpoint
        limiter = connections.limiter(key, settings.max_concurrency)
    return ResilientClient(inner, settings, limiter=limiter, **resilience)  # type: ignore[arg-type]


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
        info = provider_info(prefix)
    except ProviderUnavailable as exc:
        return [("provider", str(exc))]
    problems: list[tuple[str, str]] = []
    if info.options is not None:
        try:
            msgspec.convert(settings.options, info.options)
        except (msgspec.ValidationError, ValueError) as exc:
            problems.append(_option_problem(exc, info.options, prefix))
    if info.check is not None:
        try:
            problems += info.check(model, settings)
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
