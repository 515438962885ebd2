from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The core is backend-neutral: its tests run on both asyncio and trio."""
    return str(request.param)
