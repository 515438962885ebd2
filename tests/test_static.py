"""Lint and strict typing are part of the test suite (the tools come with the test extra)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from needs import need_command

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    return need_command(name, "pip install -e '.[test]'")


def test_ruff_clean() -> None:
    paths = ["src", "tests", "examples", "benchmarks"]
    done = subprocess.run(
        [_tool("ruff"), "check", *paths], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_clean() -> None:
    done = subprocess.run([_tool("mypy"), "src", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
