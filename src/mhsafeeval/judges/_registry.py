"""Judges are plugins: factories declared by name with the options they accept."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import msgspec

from mhsafeeval.config import convert_table
from mhsafeeval.framework import Agent, Registry
from mhsafeeval.providers import ModelClient
from mhsafeeval.taxonomy import Taxonomy

from ._judge import RubricJudge

__all__ = [
    "JUDGES",
    "JudgeFactory",
    "JudgeRun",
    "JudgeSpec",
    "RubricOptions",
    "judge",
    "judge_options",
    "make_rubric_judge",
]


class JudgeRun(msgspec.Struct, frozen=True, kw_only=True):
    """What the campaign tells every judge (from ``[campaign]``): how many committed exchanges
    it sees before the reply (``context_turns``), how often it may re-ask a model whose answer
    did not validate (``judge_max_asks``), and the severity that counts as a success."""

    context_turns: int = 5
    max_asks: int = 3
    threshold: int = 2

    def settings(self) -> JudgeSettings:
        """These as :class:`RubricJudge`'s keyword arguments."""
        return JudgeSettings(
            context_turns=self.context_turns, max_asks=self.max_asks, threshold=self.threshold
        )


class JudgeSettings(TypedDict):
    """:class:`JudgeRun` as keyword arguments."""

    context_turns: int
    max_asks: int
    threshold: int


JudgeFactory = Callable[[ModelClient, Taxonomy, JudgeRun, Any], Agent]
"""``factory(model, taxonomy, run, options) -> Agent``: one judge (one per conversation)."""

F = TypeVar("F", bound=JudgeFactory)


@dataclass(frozen=True)
class JudgeSpec:
    """A declared judge: its factory and the msgspec Struct its ``[judge]`` table decodes to
    (None: it takes no options). Calling it builds the judge."""

    factory: JudgeFactory
    options: type[msgspec.Struct] | None = None

    def __call__(
        self, model: ModelClient, taxonomy: Taxonomy, run: JudgeRun, options: Any = None
    ) -> Agent:
        """Build one judge."""
        return self.factory(model, taxonomy, run, options)


JUDGES: Registry[JudgeSpec] = Registry("judge", "mhsafeeval.judges", entry_type=JudgeSpec)
"""Declared judges by name: in code with :func:`judge`, or from the ``mhsafeeval.judges``
entry points (naming a factory decorated with :func:`judge`)."""


def judge(
    name: str, *, options: type[msgspec.Struct] | None = None, replace: bool = False
) -> Callable[[F], F]:
    """Declare a judge factory ``(model, taxonomy, run, options) -> Agent`` as ``name``
    (``campaign.judge = "name"``); ``options``: the Struct its ``[judge]`` table decodes to,
    checked by ``mhsafeeval check``. Returns the factory unchanged.

    Example:
        >>> @judge("doc-strict-rubric")
        ... def make_strict(model, taxonomy, run, options):
        ...     '''The rubric judge with two more re-asks than the campaign allows.'''
        ...     return RubricJudge(
        ...         model, taxonomy, context_turns=run.context_turns, max_asks=run.max_asks + 2,
        ...         threshold=run.threshold, name="strict",
        ...     )
        >>> JUDGES.get("doc-strict-rubric").factory is make_strict
        True

    Third-party packages register theirs through the ``mhsafeeval.judges`` entry-point group
    (name = judge name, value = ``module:factory``), loaded on first use.
    """

    def add(factory: F) -> F:
        JUDGES.declare(name, JudgeSpec(factory, options), factory, replace=replace)
        return factory

    return add


def judge_options(
    name: str, table: Mapping[str, Any], source: str | Path | None = None
) -> msgspec.Struct | None:
    """The ``[judge]`` table decoded into judge ``name``'s options (None: it takes none).

    Example:
        >>> judge_options("rubric", {"string_limits": False})
        RubricOptions(string_limits=False)
        >>> judge_options("rubric", {"strict": True}, "c.toml")
        Traceback (most recent call last):
        ...
        mhsafeeval.errors.InputError: c.toml: judge.strict: unknown field

    Raises:
        InputError: a bad key or value, naming ``source`` and the key path (``judge.<key>``).
        PluginNotFound: no judge of that name.
    """
    kind = JUDGES.get(name).options
    if kind is None:
        convert_table(dict(table), _NoOptions, source, "judge")
        return None
    return convert_table(dict(table), kind, source, "judge")


class _NoOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A judge without options accepts an empty ``[judge]`` table only."""


class RubricOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[judge]`` options of the ``rubric`` judge."""

    string_limits: bool = True
    """Bound the verdict's strings and lists in its JSON schema (``maxLength``/``maxItems``);
    false for a provider whose structured output refuses those keywords."""


@judge("rubric", options=RubricOptions)
def make_rubric_judge(
    model: ModelClient, taxonomy: Taxonomy, run: JudgeRun, options: RubricOptions | None = None
) -> RubricJudge:
    """The rubric judge (:class:`RubricJudge`) with the campaign's settings and its options."""
    chosen = options if options is not None else RubricOptions()
    return RubricJudge(model, taxonomy, **run.settings(), string_limits=chosen.string_limits)
