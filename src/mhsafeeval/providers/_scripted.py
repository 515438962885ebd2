"""``scripted/<name>``: a deterministic model for tests and examples (no network, no weights)."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Annotated, Union

import anyio
import msgspec

from ._demo import DEMO_SCRIPTS
from ._registry import provider, typed_options
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelSettings,
    ProviderUnavailable,
    TransientProviderError,
)

__all__ = [
    "KEPT_CALLS",
    "Reply",
    "Script",
    "ScriptedModel",
    "ScriptedOptions",
    "check_scripted_settings",
    "register_demo_scripts",
    "register_script",
    "scripted_factory",
]

KEPT_CALLS = 16
"""How many of its latest calls a :class:`ScriptedModel` keeps for assertions by default."""

Reply = Union[str, Completion, BaseException]  # noqa: UP007 - a runtime alias
ScriptFn = Callable[[Sequence[ChatMessage], CallParams], Union[Reply, Awaitable[Reply]]]  # noqa: UP007
Script = Union[Sequence[Reply], ScriptFn]  # noqa: UP007


class ScriptedModel:
    """A model whose answers are scripted.

    ``script`` is either a list of replies, used in order (``cycle=True`` starts over at the
    end; otherwise running out raises), or a function that sees the messages and parameters and
    returns (or awaits) a reply. A reply that is an exception is raised, which is how tests
    inject provider faults (e.g. ``TransientProviderError("429", retry_after=2)``).

    The last ``keep_calls`` calls (messages and parameters, oldest first) are kept in
    :attr:`calls` for assertions, and :attr:`call_count` counts all of them: a campaign of
    thousands of conversations on scripted models holds only those few prompts. It is free
    (:meth:`price` is 0), retries :class:`TransientProviderError` only, and its connection is
    its script's name.

    Example:
        >>> import anyio
        >>> m = ScriptedModel("demo", ["first", "second"])
        >>> anyio.run(m.complete, [ChatMessage("user", "hi")]).text
        'first'
        >>> m.call_count, m.calls[-1][0]
        (1, (ChatMessage(role='user', content='hi'),))
    """

    supports_json_schema = True
    sampling = CallParams()  # applies none of its own: open_model's wrapper applies the table's

    def __init__(
        self,
        name: str,
        script: Script,
        *,
        cycle: bool = False,
        delay_s: float = 0.0,
        keep_calls: int = KEPT_CALLS,
    ) -> None:
        if keep_calls < 0:
            raise ValueError(f"ScriptedModel(keep_calls={keep_calls}): must be 0 or more")
        self.name = f"scripted/{name}"
        self.connection_key = name
        self.delay_s = delay_s
        self.keep_calls = keep_calls
        self.calls: list[tuple[tuple[ChatMessage, ...], CallParams]] = []
        """The last ``keep_calls`` calls, oldest first (a plain list, so tests compare and
        slice it as one)."""
        self.call_count = 0
        """Every call made, those no longer in :attr:`calls` included."""
        self._fn: ScriptFn | None = None
        self._replies: Iterator[Reply] | None = None
        if callable(script):
            self._fn = script
        else:
            replies = list(script)
            self._replies = itertools.cycle(replies) if cycle else iter(replies)
        self.closed = False

    def should_retry(self, error: Exception) -> bool:
        """Transient provider errors only (as the real providers)."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """Scripted models cost nothing."""
        return 0.0

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Return the next scripted reply (or raise it, if it is an exception)."""
        params = params or CallParams()
        if self.delay_s:
            await anyio.sleep(self.delay_s)  # a stand-in for network latency (tests, demos)
        self.call_count += 1
        self.calls.append((tuple(messages), params))
        if len(self.calls) > self.keep_calls:
            del self.calls[0]  # a short list: cheaper than a deque that tests cannot slice
        if self._fn is not None:
            reply = self._fn(messages, params)
            if inspect.isawaitable(reply):
                reply = await reply
        else:
            assert self._replies is not None
            try:
                reply = next(self._replies)
            except StopIteration:
                raise ScriptExhausted(
                    f"{self.name}: script has no reply left for call {self.call_count}"
                ) from None
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Completion):
            return reply
        prompt = sum(len(m.content.split()) for m in messages)
        return Completion(
            text=reply,
            finish_reason="stop",
            prompt_tokens=prompt,
            completion_tokens=len(reply.split()),
            model=self.name,
            provider_id=f"{self.name}#{self.call_count}",
        )

    async def aclose(self) -> None:
        """Nothing to release; marks the model closed."""
        self.closed = True


class ScriptExhausted(AssertionError):
    """A list script ran out of replies: the test scripted too few (never a silent default)."""


def _echo(messages: Sequence[ChatMessage], params: CallParams) -> str:
    users = [m.content for m in messages if m.role == "user"]
    return users[-1] if users else ""


_scripts: dict[str, tuple[Script, bool]] = {"echo": (_echo, False)}


def register_script(name: str, script: Script, *, cycle: bool = False) -> None:
    """Make ``scripted/<name>`` answer with ``script`` (replacing any earlier one).

    ``script``: a list of replies (in order; ``cycle`` starts over) or a function of the
    messages and parameters that returns (or awaits) the reply.

    Example:
        >>> import anyio
        >>> from mhsafeeval.providers import open_model
        >>> register_script("doc-counselor", lambda messages, params: "Tell me more.")
        >>> async def main() -> str:
        ...     async with open_model("scripted/doc-counselor") as model:
        ...         return (await model.complete([ChatMessage("user", "I feel low.")])).text
        >>> anyio.run(main)
        'Tell me more.'
    """
    _scripts[name] = (script, cycle)


def register_demo_scripts() -> None:
    """Register every ``scripted/demo-*`` persona again (they are registered when this
    provider is imported; this undoes a replacement). Idempotent."""
    for name, script in DEMO_SCRIPTS.items():
        register_script(name, script)


register_demo_scripts()


class ScriptedOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``options`` of a ``scripted/...`` model."""

    delay_s: Annotated[float, msgspec.Meta(ge=0, lt=3600)] = 0.0
    """Seconds to wait before each reply (a stand-in for network latency)."""
    replies: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    """Answer with these, in order, instead of a registered script."""
    cycle: bool = True
    """With ``replies``: start over at the end (otherwise running out is an error)."""


def check_scripted_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """A script name nothing registered, unless the table gives ``options.replies``."""
    if model in _scripts or settings.options.get("replies") is not None:
        return []
    known = ", ".join(sorted(_scripts))
    return [
        (
            "provider",
            f"no script named {model!r} for scripted/{model} (registered: {known}); "
            "register one with mhsafeeval.testing.register_script or set options.replies",
        )
    ]


@provider("scripted", options=ScriptedOptions, check=check_scripted_settings)
def scripted_factory(model: str, settings: ModelSettings) -> ScriptedModel:
    """Scripted replies for tests and examples (options: :class:`ScriptedOptions`)."""
    options = typed_options(settings, ScriptedOptions)
    if options.replies is not None:
        return ScriptedModel(model, options.replies, cycle=options.cycle, delay_s=options.delay_s)
    for _, reason in check_scripted_settings(model, settings):
        raise ProviderUnavailable(reason)
    script, cycle = _scripts[model]
    return ScriptedModel(model, script, cycle=cycle, delay_s=options.delay_s)
