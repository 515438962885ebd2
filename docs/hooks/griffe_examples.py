"""Griffe extension for the API reference: a Google-style ``Example:`` section (singular, as
mhsafeeval's docstrings write it) is read as ``Examples:``, so its doctests render as code."""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class SingularExamples(griffe.Extension):
    """Rename ``Example:`` sections to ``Examples:`` before the docstring is parsed."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
