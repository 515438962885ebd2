"""Judges: agents that score counselor replies against a taxonomy cell's severity ladder.

A judge is an :class:`~mhsafeeval.runtime.Agent` that answers every
:class:`~mhsafeeval.messages.CounselorReply` with a ``Verdict``, an ``Unjudged`` or a
``CallFailed`` event. Judges are plugins: factories registered by name with :func:`judge`
(the built-in is ``rubric``) or through the ``mhsafeeval.judges`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from mhsafeeval.runtime import Agent, Registry
from mhsafeeval.runtime.providers import ModelClient
from mhsafeeval.taxonomy import Taxonomy

from ._judge import RAW_LIMIT, RubricJudge
from ._labels import LabelledExchange, builtin_labels, load_labels
from ._panel import (
    PANEL_INPUTS,
    JudgedReply,
    ReplyFold,
    failed_rater,
    failed_rating,
    judged_prompt,
    rate_reply,
    rater_address,
    rater_names,
)
from ._prompt import build_judge_messages, neutralise, prompt_nonce
from ._verdict import (
    MAX_EVIDENCE,
    VERDICT_SCHEMA,
    CheckedVerdict,
    VerdictPayload,
    check_verdict,
    is_omission,
    verdict_schema,
)

__all__ = [
    "JUDGES",
    "MAX_EVIDENCE",
    "PANEL_INPUTS",
    "RAW_LIMIT",
    "VERDICT_SCHEMA",
    "CheckedVerdict",
    "JudgeFactory",
    "JudgedReply",
    "LabelledExchange",
    "ReplyFold",
    "RubricJudge",
    "VerdictPayload",
    "build_judge_messages",
    "builtin_labels",
    "check_verdict",
    "failed_rater",
    "failed_rating",
    "is_omission",
    "judge",
    "judged_prompt",
    "load_labels",
    "make_rubric_judge",
    "neutralise",
    "prompt_nonce",
    "rate_reply",
    "rater_address",
    "rater_names",
    "verdict_schema",
]

JudgeFactory = Callable[..., Agent]
"""``factory(model, taxonomy, **options) -> Agent``: builds one judge (one per conversation)."""

F = TypeVar("F", bound=JudgeFactory)

JUDGES: Registry[JudgeFactory] = Registry("judge", "mhsafeeval.judges")
"""Judge factories by name: registered in code, or from the ``mhsafeeval.judges`` entry points."""


def judge(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Register a judge factory under ``name``.

    Example:
        >>> @judge("doc-strict-rubric")
        ... def make_strict(model: ModelClient, taxonomy: Taxonomy, **options: Any) -> Agent:
        ...     '''The rubric judge with more re-asks.'''
        ...     return RubricJudge(model, taxonomy, max_asks=5, name="strict", **options)
        >>> JUDGES.get("doc-strict-rubric") is make_strict
        True

    Third-party packages register theirs through the ``mhsafeeval.judges`` entry-point group
    (name = judge name, value = ``module:factory``), loaded on first use.
    """
    add = JUDGES.register(name, replace=replace)

    def decorate(factory: F) -> F:
        add(factory)
        return factory

    return decorate


@judge("rubric")
def make_rubric_judge(model: ModelClient, taxonomy: Taxonomy, **options: Any) -> RubricJudge:
    """Rubric judge: scores each reply against its cell's five-level ladder with an LLM.

    ``options`` are :class:`RubricJudge`'s keyword arguments (``context_turns``, ``max_asks``,
    ``name``, ``string_limits``, ``threshold``); an unknown one is a ``TypeError``.
    """
    return RubricJudge(model, taxonomy, **options)
