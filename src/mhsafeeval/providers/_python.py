"""``python/<module>:<function>``: a counselor that is a Python callable.

``<module>`` is a module name (``my_bot.app``; the current directory is searched first, as
``python -m`` does) or a file path ending in ``.py`` (``examples/app_target.py``, relative to
the current directory). The function takes the conversation, as a list of
``{"role": ..., "content": ...}`` dicts (OpenAI's shape), and returns the reply text, or a dict
``{"text": ..., "usage": {"prompt_tokens": N, "completion_tokens": M}, "usd": X}`` (``usage``
and ``usd`` optional). A function with a ``session_id`` parameter is also given the
conversation's session id, one stable string per conversation (for bots that keep state).

An ``async def`` function is awaited on the event loop; a plain one runs in a worker thread
(:func:`anyio.to_thread.run_sync`), so a slow app never blocks the loop. When a call runs past
the table's ``timeout`` the campaign stops waiting for it, but a thread cannot be stopped: it
runs to its end and its answer is dropped.

Failures: a :class:`TransientProviderError` or :class:`PermanentProviderError` the function
raises is taken at its word; ``TimeoutError`` and ``ConnectionError`` are transient (retried);
any other exception, and an answer of the wrong shape, is permanent (tried once).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ._http import read_usage, unused_sampling
from ._registry import provider
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelSettings,
    PermanentProviderError,
    ProviderUnavailable,
    TransientProviderError,
)

__all__ = ["PythonApp", "check_python_settings", "load_callable", "python_factory"]


def load_callable(target: str) -> Callable[..., Any]:
    """The function ``module:function`` (or ``path/file.py:function``) names.

    Raises:
        ProviderUnavailable: no such module, file or function, an import that fails, or a
            function that cannot take the conversation as its one argument.
    """
    module_name, colon, attribute = target.rpartition(":")
    if not colon or not module_name or not attribute:
        raise ProviderUnavailable(
            "expected python/<module>:<function> (python/my_bot:reply) "
            "or python/<file.py>:<function>"
        )
    function = _import(module_name)
    for part in attribute.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise ProviderUnavailable(f"{module_name} has no {attribute!r}")
    if not callable(function):
        raise ProviderUnavailable(f"{module_name}:{attribute} is not callable")
    try:
        signature = inspect.signature(function)
    except ValueError:  # a builtin without a signature: take it on trust
        return function  # type: ignore[no-any-return]
    try:
        signature.bind([], **({"session_id": ""} if _takes_session(signature) else {}))
    except TypeError as exc:
        raise ProviderUnavailable(
            f"{module_name}:{attribute} must take the conversation as its one argument "
            f"(and optionally session_id): {exc}"
        ) from None
    return function  # type: ignore[no-any-return]


def _takes_session(signature: inspect.Signature) -> bool:
    """Whether a function is given the session id: it has a ``session_id`` parameter (or
    ``**kwargs``)."""
    return "session_id" in signature.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    )


def _import(module_name: str) -> Any:
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ProviderUnavailable(f"no such file: {path} (relative to {os.getcwd()})")
            return _import_file(path.resolve())
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does
        return importlib.import_module(module_name)
    except ProviderUnavailable:
        raise
    except BaseException as exc:  # an app's import that fails, even by sys.exit
        if not isinstance(exc, Exception | SystemExit):  # Ctrl-C, SIGTERM: not the app's fault
            raise
        raise ProviderUnavailable(
            f"cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None


@functools.cache
def _import_file(resolved: Path) -> Any:
    """The module of a ``.py`` file (by its resolved path), imported once."""
    digest = hashlib.blake2b(str(resolved).encode(), digest_size=6).hexdigest()
    name = f"mhsafeeval_app_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        raise ProviderUnavailable(f"cannot load {resolved}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def check_python_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """Import the module and find the function (without calling it)."""
    problems = unused_sampling(settings)
    if settings.options:
        problems.append(("options", "python/ models take no options"))
    if settings.api_base is not None or settings.api_key_env is not None:
        key = "api_base" if settings.api_base is not None else "api_key_env"
        problems.append((key, "not used by python/ models"))
    try:
        load_callable(model)
    except ProviderUnavailable as exc:
        problems.insert(0, ("provider", str(exc)))
    return problems


class PythonApp:
    """A counselor that is a Python callable; see the module docstring."""

    supports_json_schema = False
    sampling = CallParams()

    def __init__(self, target: str, function: Callable[..., Any]) -> None:
        self.name = f"python/{target}"
        self.function = function
        self._async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            getattr(function, "__call__", None)  # noqa: B004 - an object with async __call__
        )
        try:
            self._sessions = _takes_session(inspect.signature(function))
        except ValueError:  # no signature to read: called with the conversation only
            self._sessions = False

    @property
    def connection_key(self) -> str:
        """The function's address."""
        return self.name

    def should_retry(self, error: Exception) -> bool:
        """Transient failures only (module docstring)."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """What the function said the call cost (``usd``), else unknown."""
        return completion.usd

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Call the function once with the conversation.

        Raises:
            TransientProviderError: it raised TimeoutError or ConnectionError (or said so).
            PermanentProviderError: any other failure, or an answer of the wrong shape.
        """
        chat = [{"role": m.role, "content": m.content} for m in messages]
        kwargs = {"session_id": (params or CallParams()).session_id} if self._sessions else {}
        call = functools.partial(self.function, chat, **kwargs)
        try:
            if self._async:
                answer = await call()
            else:
                answer = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except (TransientProviderError, PermanentProviderError):
            raise
        except (TimeoutError, ConnectionError) as exc:
            raise TransientProviderError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # cancellation is a BaseException and passes through
            raise PermanentProviderError(f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        return self._completion(answer)

    def _completion(self, answer: Any) -> Completion:
        usd = None
        prompt = completion = 0
        if isinstance(answer, dict):
            text, usd = answer.get("text"), answer.get("usd")
            prompt, completion = read_usage(answer.get("usage"), f"{self.name}: usage")
            if usd is not None and (
                isinstance(usd, bool) or not isinstance(usd, int | float) or usd < 0
            ):
                raise PermanentProviderError(f"{self.name}: usd must be a number >= 0")
        else:
            text = answer
        if not isinstance(text, str):
            raise PermanentProviderError(
                f"{self.name} returned {type(text).__name__}: expected the reply text (a str) "
                'or a dict with "text"'
            )
        return Completion(
            text=text,
            finish_reason="stop",
            prompt_tokens=prompt,
            completion_tokens=completion,
            model=self.name,
            usd=None if usd is None else float(usd),
        )

    async def aclose(self) -> None:
        """Nothing to release: the function stays imported."""


@provider(
    "python",
    check=check_python_settings,
    prices=lambda model, settings: False,
    own_prompt=True,
)
def python_factory(model: str, settings: ModelSettings) -> PythonApp:
    """A Python callable (see the module docstring)."""
    try:
        function = load_callable(model)
    except ProviderUnavailable as exc:
        raise ProviderUnavailable(f"python/{model}: {exc}") from None
    return PythonApp(model, function)
