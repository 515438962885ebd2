"""Budgets in-process: exact counselor-call limits, token limits under concurrency, USD."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from mhsafeeval.budget import Budget, BudgetedModel
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import BudgetSection, parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import CampaignFinished, CampaignStarted, CounselorReply, Message, Usage
from mhsafeeval.providers import ChatMessage, Completion, ModelSettings, open_model
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.testing import scripted_models

pytestmark = pytest.mark.anyio

CONFIG = """
[campaign]
name = "budget"
seed = 2
max_turns = 3
max_attempts = 3
concurrency = {concurrency}
controller = "{controller}"
profile_ids = ["grief-widower", "panic-disorder-bus-driver", "depression-laid-off-engineer"]
{budget}
"""


def config(budget: str = "", concurrency: int = 1, controller: str = "map-elites"):  # type: ignore[no-untyped-def]
    text = CONFIG.format(budget=budget, concurrency=concurrency, controller=controller)
    return parse_config(text + scripted_models(), "budget.toml")


async def events(store: MemoryEventStore) -> list[Message]:
    return [e.message async for e in store.events("budget") if e.message is not None]


def tokens(msgs: list[Message]) -> int:
    used = [getattr(m, "usage", None) for m in msgs]
    return sum(u.prompt_tokens + u.completion_tokens for u in used if isinstance(u, Usage))


async def test_counselor_calls_stop_exactly_at_the_limit_under_concurrency() -> None:
    for concurrency, controller in [(1, "map-elites"), (3, "uct")]:
        async with MemoryEventStore() as store:
            cfg = config("[budget]\ncounselor_calls = 7", concurrency, controller)
            result = await run_campaign(cfg, store)
            assert result.status == "stopped_budget"
            assert result.budget == "budget.counselor_calls"
            stored = await events(store)
            assert sum(isinstance(e, CounselorReply) for e in stored) == 7
            [stop] = [e for e in stored if isinstance(e, CampaignFinished)]
            assert stop.status == "stopped_budget"
            assert "budget.counselor_calls reached: 7 counselor calls of 7" in stop.detail


async def test_a_token_limit_stops_the_run_and_a_larger_one_resumes_it() -> None:
    async with MemoryEventStore() as reference:
        await run_campaign(config(), reference)
        full = await events(reference)
    total = tokens(full)
    async with MemoryEventStore() as store:
        result = await run_campaign(config(f"[budget]\ntokens = {total // 3}"), store)
        assert result.status == "stopped_budget" and result.budget == "budget.tokens"
        spent = tokens(await events(store))
        assert total // 3 <= spent < total // 3 + 3000  # overshoot: the calls then in flight
        result = await run_campaign(config(f"[budget]\ntokens = {total * 2}"), store)
        assert result.status == "completed" and result.resumed_from > 0
        resumed = await events(store)
    same = {m.id for m in full}
    assert {m.id for m in resumed} - same == {
        m.id for m in resumed if isinstance(m, CampaignFinished) and m.status == "stopped_budget"
    }
    assert same <= {m.id for m in resumed}


async def test_the_budget_counts_what_was_stored_before() -> None:
    async with MemoryEventStore() as store:
        await run_campaign(config(), store)
        done = await events(store)
    budget = Budget(BudgetSection(counselor_calls=len(done)), done)
    assert budget.counselor_calls == sum(isinstance(e, CounselorReply) for e in done)
    assert budget.tokens == tokens(done)
    assert budget.reached is None
    assert Budget(BudgetSection(tokens=budget.tokens), done).reached == "budget.tokens"


async def test_usd_is_priced_from_litellm_and_an_unpriced_model_is_refused() -> None:
    budget = Budget(BudgetSection(usd=0.001))
    async with open_model(ModelSettings(provider="scripted/echo")) as echo:
        model = BudgetedModel(echo, budget, counselor=True)
        await model.complete([ChatMessage("user", "hello")])
    assert budget.usd == 0.0 and budget.counselor_calls == 1  # scripted models are free
    await budget.admit(False)
    priced = Completion(
        text="x",
        finish_reason="stop",
        prompt_tokens=10_000,
        completion_tokens=10_000,
        model="litellm/openai/gpt-4o-mini",
    )
    budget.settle(priced)
    assert budget.usd > 0.001 and budget.reached == "budget.usd"
    # A provider answering with a model name the price map lacks is priced as configured.
    other = Budget(BudgetSection(usd=100.0))
    await other.admit(True)
    dated = msgspec.structs.replace(priced, model="gpt-4o-mini-2099-12-31-unlisted")
    other.settle(dated, "litellm/openai/gpt-4o-mini")
    assert other.usd == pytest.approx(budget.usd)
    # ... and so is such an answer stored before a resume.
    stored = CounselorReply(
        conversation="c",
        category="blaming",
        role="enabler",
        text="x",
        usage=Usage(model=dated.model, prompt_tokens=10_000, completion_tokens=10_000),
    )
    resumed = Budget(BudgetSection(usd=100.0), [stored], lambda m: "litellm/openai/gpt-4o-mini")
    assert resumed.usd == pytest.approx(budget.usd)
    assert Budget(BudgetSection(usd=100.0), [stored]).usd == 0.0  # unknown without the config
    text = CONFIG.format(budget="[budget]\nusd = 1.0", concurrency=1, controller="map-elites")
    text += scripted_models().replace(
        'provider = "scripted/demo-counselor"', 'provider = "litellm/openai/no-such-model-xyz"'
    )
    with pytest.raises(InputError) as info:
        async with MemoryEventStore() as store:
            await run_campaign(parse_config(text, "budget.toml"), store)
    assert info.value.field == "budget.usd"
    assert "no price" in str(info.value)


def test_budget_values_are_validated() -> None:
    for bad in ("counselor_calls = 0", "tokens = -5", "usd = 0.0"):
        with pytest.raises(InputError) as info:
            config(f"[budget]\n{bad}")
        assert info.value.field is not None and info.value.field.startswith("budget.")


async def test_an_edited_taxonomy_file_is_refused_on_resume(tmp_path: Path) -> None:
    """The config may be word for word the same while a file it points to changed."""
    from importlib import resources

    taxonomy = tmp_path / "taxonomy.toml"
    taxonomy.write_text(
        (resources.files("mhsafeeval") / "data" / "r_mhsafe.toml").read_text(encoding="utf-8")
    )
    text = CONFIG.format(budget="", concurrency=1, controller="map-elites")
    text = text.replace("[campaign]\n", f'[campaign]\ntaxonomy = "{taxonomy}"\n', 1)
    cfg = parse_config(text + scripted_models(), "budget.toml")
    async with MemoryEventStore() as store:
        await run_campaign(cfg, store)
        taxonomy.write_text(
            taxonomy.read_text().replace('name = "Gaslighting"', 'name = "Gaslight"')
        )
        before = await store.count("budget")
        with pytest.raises(InputError) as info:
            await run_campaign(cfg, store)
        assert info.value.field == "inputs.taxonomy"
        assert "stored with a different configuration" in str(info.value)
        assert await store.count("budget") == before


def test_a_stored_failure_is_priced_as_its_role_s_configured_model() -> None:
    """Tokens of unusable answers (on a CallFailed) are priced on resume like any answer:
    a dated model name the price map lacks falls back to the role's configured model."""
    from mhsafeeval.campaign import _configured_model
    from mhsafeeval.messages import CallFailed

    text = CONFIG.format(budget="[budget]\nusd = 100.0", concurrency=1, controller="map-elites")
    text += scripted_models().replace(
        'provider = "scripted/demo-refiner"', 'provider = "litellm/openai/gpt-4o-mini"'
    )
    config = parse_config(text, "budget.toml")
    usage = Usage(model="gpt-4o-mini-2099-12-31-unlisted", prompt_tokens=10_000)
    failed = CallFailed(conversation="c", agent="refiner", model="m", error="no notes", usage=usage)
    resumed = Budget(BudgetSection(usd=100.0), [failed], _configured_model(config, [failed]))
    assert resumed.usd > 0.0


def test_a_resumed_budget_never_prices_calls_its_run_left_unpriced() -> None:
    """A run that priced its calls stored an unpriced one (an ``openai/`` table without
    prices) on purpose: on resume it counts as unknown, as in the report, and is not priced by
    the answering model's name from litellm's map (older runs' answers still are)."""
    reply = CounselorReply(
        conversation="c/m/p/0",
        category="a",
        role="x",
        text="ok",
        usage=Usage(model="gpt-4o-mini", prompt_tokens=10**6),
    )
    new = [CampaignStarted(campaign="c", priced_calls=True), reply]
    assert Budget(BudgetSection(), new).usd == 0.0
    old = [CampaignStarted(campaign="c"), reply]
    assert Budget(BudgetSection(), old).usd > 0.0  # litellm's price of a million tokens
