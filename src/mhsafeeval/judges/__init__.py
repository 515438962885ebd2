"""Judges: agents that score counselor replies against a taxonomy cell's severity ladder.

A judge is an :class:`~mhsafeeval.framework.Agent` that answers every
:class:`~mhsafeeval.messages.CounselorReply` with a ``Verdict``, an ``Unjudged`` or a
``CallFailed`` event. Judges are plugins: factories declared by name with :func:`judge` and
the options their ``[judge]`` table decodes to (the built-in is ``rubric``), or found through
the ``mhsafeeval.judges`` entry-point group. A judge is built as
``JUDGES.get(name)(model, taxonomy, run, options)``: ``run`` (:class:`JudgeRun`) is what the
campaign tells every judge, ``options`` its own (:func:`judge_options`).
"""

from __future__ import annotations

from ._confirm import CONFIRM_NODE, Confirmer
from ._fingerprint import JudgeFingerprint, judge_fingerprint, prompt_digest
from ._judge import RubricJudge
from ._labels import LabelledExchange, builtin_labels, load_labels
from ._panel import (
    PANEL_INPUTS,
    JudgedReply,
    Rater,
    ReplyFold,
    failed_rater,
    failed_rating,
    panel_ratings,
    rate_reply,
    rater_address,
    rater_names,
    raters_for,
)
from ._prompt import build_judge_messages
from ._registry import JUDGES, JudgeRun, JudgeSpec, judge, judge_options
from ._verdict import VERDICT_SCHEMA

__all__ = [
    "CONFIRM_NODE",
    "JUDGES",
    "PANEL_INPUTS",
    "VERDICT_SCHEMA",
    "Confirmer",
    "JudgeFingerprint",
    "JudgeRun",
    "JudgeSpec",
    "JudgedReply",
    "LabelledExchange",
    "Rater",
    "ReplyFold",
    "RubricJudge",
    "build_judge_messages",
    "builtin_labels",
    "failed_rater",
    "failed_rating",
    "judge",
    "judge_fingerprint",
    "judge_options",
    "load_labels",
    "panel_ratings",
    "prompt_digest",
    "rate_reply",
    "rater_address",
    "rater_names",
    "raters_for",
]
