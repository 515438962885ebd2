"""Named plugin registries (providers, judges, controllers) with lazy built-ins and entry points."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from mhsafeeval.errors import MhSafeEvalError

__all__ = ["PluginNotFound", "Registry", "lazy_exports"]

F = TypeVar("F", bound=Callable[..., object])


class PluginNotFound(MhSafeEvalError):
    """No plugin of that kind and name (the message lists the known ones)."""


class Registry(Generic[F]):
    """Factories registered under names, found in three places, in this order:

    1. registered in code with :meth:`register` (a decorator);
    2. built-ins, imported on first use (so their SDKs cost nothing until then);
    3. the entry-point group ``group`` of installed distributions (``name = "module:factory"``).

    Example:
        >>> judges: Registry[Callable[..., object]] = Registry("judge", "mhsafeeval.judges")
        >>> @judges.register("always-safe")
        ... def make() -> object:
        ...     '''A judge that ...'''
        >>> judges.get("always-safe") is make
        True
    """

    def __init__(
        self,
        kind: str,
        group: str,
        builtin: dict[str, tuple[str, str]] | None = None,
        *,
        entry_type: type | None = None,
    ) -> None:
        """``entry_type``: the declaration class every entry must be (a plugin found through an
        entry point that was never declared is refused, naming the decorator); None: any."""
        self.kind = kind
        self.group = group
        self.entry_type = entry_type
        self._builtin = dict(builtin or {})
        self._registered: dict[str, F] = {}
        self._declared: dict[object, F] = {}

    def declare(self, name: str, entry: F, factory: object, *, replace: bool = False) -> None:
        """Register the declaration ``entry`` as ``name``, and as ``factory``'s: an entry point
        that names ``factory`` itself then finds its declaration. Declaring the same again
        (a module imported twice) is no change."""
        known = self._declared.get(factory)
        if known is not None and known == entry:
            entry = known  # the registry sees the very object it holds
        self.register(name, replace=replace)(entry)
        self._declared[factory] = entry

    def register(self, name: str, *, replace: bool = False) -> Callable[[F], F]:
        """Decorator: register ``factory`` under ``name``."""
        if not name or "/" in name:
            raise ValueError(f"{self.kind} name must be a non-empty word without '/': {name!r}")

        def add(factory: F) -> F:
            known = self._registered.get(name)
            if known is not None and known is not factory and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._registered[name] = factory
            return factory

        return add

    def get(self, name: str) -> F:
        """The factory registered as ``name``, importing a built-in or plugin on first use.

        Raises:
            PluginNotFound: nothing of that name anywhere.
        """
        if name in self._registered:
            return self._registered[name]
        if name in self._builtin:
            importlib.import_module(self._builtin[name][0])  # registers itself on import
            if name in self._registered:
                return self._registered[name]
        for ep in entry_points(group=self.group, name=name):
            found: object = ep.load()
            # An entry point names a factory; importing it ran the decorator that declared it.
            declared = self._declared.get(found) if isinstance(found, Hashable) else None
            factory: F = declared if declared is not None else found  # type: ignore[assignment]
            if self.entry_type is not None and not isinstance(factory, self.entry_type):
                raise PluginNotFound(
                    f"{self.kind} {name!r} ({found!r}) is not declared: register it with "
                    f"@{self.kind}({name!r}, ...) (its options and needs are its declaration)"
                )
            self._registered[name] = factory
            return factory
        known = ", ".join(self.available()) or "none"
        raise PluginNotFound(f"unknown {self.kind} {name!r} (known: {known})")

    def available(self) -> dict[str, str]:
        """Every known name with a one-line description, sorted by name."""
        out = {name: desc for name, (_, desc) in self._builtin.items()}
        for name, factory in self._registered.items():
            doc = (factory.__doc__ or "").strip()
            out.setdefault(name, doc.splitlines()[0] if doc else "")
        for ep in entry_points(group=self.group):
            out.setdefault(ep.name, f"plugin: {ep.value}")
        return dict(sorted(out.items()))


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562) that imports each name in ``where`` from its module
    on first use, so a package can export a class whose dependency is heavy (aiosqlite) without
    importing it with the package.

    Example:
        >>> __getattr__ = lazy_exports("pkg", {"dedent": "textwrap"})
        >>> __getattr__("dedent")("  hi")
        'hi'
    """

    def get(name: str) -> object:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return get
