from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The core is backend-neutral: its tests run on both asyncio and trio."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Tests that run the CLI configure logging for the process: undo it after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
