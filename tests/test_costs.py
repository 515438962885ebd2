"""Estimated cost per agent role: free for scripted and local models, unknown stays unknown."""

from __future__ import annotations

import pytest

from mhsafeeval.costs import model_cost, role_cost
from mhsafeeval.storage import RoleUsage


def test_free_models_cost_nothing() -> None:
    assert model_cost("scripted/demo-judge", 1000, 1000) == 0.0
    assert model_cost("local/gemma-3-270m", 1000, 1000) == 0.0


def test_hosted_models_are_priced_from_litellms_map() -> None:
    cost = model_cost("gpt-4o-mini", 1_000_000, 0)
    assert cost is not None
    assert cost == pytest.approx(0.15, rel=0.5)  # gpt-4o-mini input: cents per million tokens
    assert model_cost("litellm/openai/gpt-4o-mini", 1000, 1000) == model_cost(
        "openai/gpt-4o-mini", 1000, 1000
    )


def test_an_unpriced_model_is_unknown_not_free() -> None:
    assert model_cost("no-such-model-anywhere", 10, 10) is None
    # Answers stored without a price (by an earlier version) are priced by model name.
    tokens = {"scripted/x": [5, 5], "no-such-model-anywhere": [1, 1]}
    assert role_cost(RoleUsage(by_model=tokens, unpriced=tokens)) is None
    free = {"scripted/x": [5, 5]}
    assert role_cost(RoleUsage(by_model=free, unpriced=free)) == 0.0
