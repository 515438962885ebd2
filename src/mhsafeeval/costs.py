"""Estimated cost in USD of the tokens a campaign spent, from litellm's price map.

Scripted and local models cost nothing. Hosted models are priced with litellm's bundled map
(``LITELLM_LOCAL_MODEL_COST_MAP=True``: no network); a model the map does not know has no price
(``None``), which reports show as unknown rather than as free. litellm is imported only when a
priced model is present.
"""

from __future__ import annotations

from mhsafeeval.storage import RoleUsage

__all__ = ["model_cost", "role_cost"]

_FREE = ("scripted/", "local/")


def model_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD for these tokens of ``model`` (0 for scripted and local models; None if unpriced).

    A live call is priced by its client (:meth:`~mhsafeeval.providers.ModelClient.price`);
    this prices stored usage by model name, with the same price map.
    """
    if model.startswith(_FREE) or not (prompt_tokens or completion_tokens):
        return 0.0
    from mhsafeeval.providers._litellm import token_price

    return token_price(model, prompt_tokens, completion_tokens)


def role_cost(usage: RoleUsage) -> float | None:
    """USD spent by one agent role: the prices its calls were made at, stored with them, plus,
    for answers stored without a price, the price map's for their model (None when one of
    those has none). litellm is imported only for such answers. A call its run stored without a
    price (:attr:`~mhsafeeval.storage.RoleUsage.unknown`) makes the role's cost unknown."""
    if usage.unknown:
        return None
    total = usage.usd
    for model, (prompt, completion) in usage.unpriced.items():
        cost = model_cost(model, prompt, completion)
        if cost is None:
            return None
        total += cost
    return total
