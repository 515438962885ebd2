"""Small helpers shared by the test modules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def cli(
    *args: str,
    check: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``mhsafeeval ARGS`` in a fresh interpreter (each command runs its own event loop)."""
    return subprocess.run(
        [sys.executable, "-m", "mhsafeeval.cli", *args],
        capture_output=True,
        text=True,
        check=check,
        env=None if env is None else dict(env),
        timeout=timeout,
    )
