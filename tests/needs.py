"""What a test needs from the machine: skipped where it is missing, a failure in CI.

A developer who installed only part of the project (``pip install -e .``, no extras) sees the
tests that need a missing tool skipped, each with the reason and the fix. In CI (``CI`` set, as
``.ci/run`` does) the same absence is a failure: CI installs every tool, so a missing one means
something silently stopped being tested.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

__all__ = ["has_command", "has_module", "need", "need_command", "need_module", "tool_path"]


def in_ci() -> bool:
    """``CI`` is set to anything but empty, ``0`` or ``false`` (``.ci/run`` sets ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def has_module(name: str) -> bool:
    """Whether ``name`` (dotted names too) can be imported, without importing it.

    ``find_spec("a.b")`` imports ``a`` and raises when ``a`` is missing: that is an answer here.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def tool_path(name: str) -> str | None:
    """The command ``name``: beside this interpreter (a venv's ``bin``) first, then on PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def has_command(name: str) -> bool:
    return tool_path(name) is not None


def need(present: bool, what: str, install: str) -> None:
    """Skip the test (or, at import, the module) when ``present`` is false; fail in CI.

    Args:
        present: whether the tool is there.
        what: what is missing, e.g. ``"the ruff command"``.
        install: how to get it, e.g. ``"pip install -e '.[test]'"``.
    """
    if present:
        return
    reason = f"{what} is missing ({install})"
    if in_ci():
        pytest.fail(f"CI is set but {reason}: CI must run this test", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def need_module(name: str, install: str) -> None:
    """:func:`need` for an importable module (``llama_cpp``, ``llama_cpp.server``, ``ray``)."""
    need(has_module(name), f"the Python module {name}", install)


def need_command(name: str, install: str) -> str:
    """:func:`need` for a command; returns its path."""
    found = tool_path(name)
    need(found is not None, f"the {name} command", install)
    assert found is not None
    return found
