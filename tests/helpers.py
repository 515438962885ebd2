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


def scripted_models(
    *,
    judge: str = "demo-judge",
    counselors: Mapping[str, str] | None = None,
    delay: float = 0.0,
) -> str:
    """The ``[models.*]`` and ``[counselors.*]`` tables of a campaign on scripted personas
    (``scripted/demo-*`` unless named), each call taking ``delay`` seconds."""
    roles = {
        "models.default": "demo-client",
        "models.mutator": "demo-mutator",
        "models.judge": judge,
        "models.refiner": "demo-refiner",
    }
    roles.update(
        {f"counselors.{n}": s for n, s in (counselors or {"demo": "demo-counselor"}).items()}
    )
    options = f"options = {{ delay_s = {delay} }}\n" if delay else ""
    return "".join(
        f'\n[{table}]\nprovider = "scripted/{script}"\n{options}' for table, script in roles.items()
    )
