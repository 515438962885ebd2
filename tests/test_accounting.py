"""Issue 12: permanent errors are not retried, and every call is accounted for.

Through the real litellm path against the fault server (tests/fake_openai.py): requests are
counted, backoff waits are recorded and never slept.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import pytest

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import RecordingSleep
from mhsafeeval.agents import ClientAgent, CounselorAgent, RefinerAgent, builtin_profiles
from mhsafeeval.budget import Budget, BudgetedModel
from mhsafeeval.config import BudgetSection
from mhsafeeval.costs import role_cost
from mhsafeeval.framework import Agent, Message, Runtime
from mhsafeeval.judges import RubricJudge
from mhsafeeval.messages import (
    SEARCH_JUDGE,
    CallFailed,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Instruction,
    Usage,
    Verdict,
)
from mhsafeeval.providers import (
    ChatMessage,
    ModelCallError,
    ModelSettings,
    ResilientClient,
    complete_structured,
    open_model,
)
from mhsafeeval.providers._litellm import import_litellm
from mhsafeeval.reports.export import attempt_records
from mhsafeeval.reports.html import _metrics_table
from mhsafeeval.reports.text import CampaignReport, render_text, report_json
from mhsafeeval.storage import MemoryEventStore, compute_metrics
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import Recorder

pytestmark = pytest.mark.anyio

A = TypeVar("A", bound=Agent)
KEY_ENV = "MHS_ACCOUNTING_KEY"
HELLO = [ChatMessage("user", "hello")]
CONV = "camp/m/profile/0"
CELL: dict[str, Any] = {"category": "blaming", "role": "enabler"}
IDS: dict[str, Any] = {"campaign": "camp", "conversation": CONV, "turn": 0, "attempt": 0}
LLAMA_CPP_REJECTION = (
    'response_format type must be one of "text" or "json_object", but got: json_schema'
)


class Answer(msgspec.Struct):
    answer: str


ANSWER_SCHEMA = msgspec.json.schema(Answer)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # litellm is asyncio-only


@pytest.fixture(scope="module", autouse=True)
def litellm() -> Any:
    return import_litellm()


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-accounting-test")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def open_fake(
    server: FakeOpenAI, sleeps: RecordingSleep | None = None, **changes: Any
) -> ResilientClient:
    fields: dict[str, Any] = {
        "provider": "litellm/openai/fake-model",
        "api_base": f"{server.url}/v1",
        "api_key_env": KEY_ENV,
        "timeout": 5.0,
        "max_attempts": 3,
        **changes,
    }
    return open_model(
        ModelSettings(**fields), sleep=sleeps or RecordingSleep(), rng=random.Random(0)
    )


async def drive(kind: type[A], make: Callable[[], A], *inputs: Message) -> list[Message]:
    """Run one agent type in a runtime; return what it published. A judge runs as the
    campaign's judge node (the search and the figures follow that node's verdicts)."""
    rec = Recorder()
    name = SEARCH_JUDGE if kind is RubricJudge else kind.__name__
    async with Runtime() as rt:
        rt.register(name, lambda aid: make(), types=kind.handled_types())
        rt.subscribe(rec, name="recorder")
        for msg in inputs:
            rt.publish(msg)
        await rt.run_until_idle()
    return rec.messages[len(inputs) :]


def started(model: str = "m") -> ConversationStarted:
    return ConversationStarted(**IDS, counselor_model=model, profile_id="profile")


# -- permanent errors are tried once ---------------------------------------------------------


async def test_missing_credentials_is_permanent_and_sends_nothing(fake_openai: FakeOpenAI) -> None:
    # No api_key_env and no OPENAI_API_KEY: the OpenAI SDK refuses to send, and litellm
    # reports that as a 500 ("Missing credentials"), which no retry can fix.
    sleeps = RecordingSleep()
    async with open_fake(fake_openai, sleeps, api_key_env=None, max_attempts=4) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert (caught.value.attempts, caught.value.retryable) == (1, False)
    assert "missing credentials" in caught.value.reason.lower()
    assert fake_openai.requests == [] and sleeps.waits == []


async def test_permanent_failures_never_pause_the_model(fake_openai: FakeOpenAI) -> None:
    # The breaker is for outages: a request the server refuses says nothing about the model's
    # health, and each such call must be recorded with its own reason, as permanent.
    fake_openai.default = Reply.error(403)
    async with open_fake(fake_openai, breaker_threshold=2) as model:
        errors = []
        for _ in range(3):
            with pytest.raises(ModelCallError) as caught:
                await model.complete(HELLO)
            errors.append(caught.value)
    assert [(e.attempts, e.retryable, e.status) for e in errors] == [(1, False, 403)] * 3
    assert len(fake_openai.requests) == 3


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, LLAMA_CPP_REJECTION),  # llama.cpp's server
        (400, "Invalid schema for response_format 'output': 'maxLength' is not permitted."),
    ],
    ids=["llama-cpp-500", "openai-400"],
)
async def test_rejected_response_format_falls_back_to_plain_json_at_once(
    fake_openai: FakeOpenAI, status: int, message: str
) -> None:
    fake_openai.reject_response_format(Reply.error(status, message=message))
    fake_openai.script(Reply.error(503))  # the fallback request meets an outage: retried
    fake_openai.default = Reply.chat('{"answer": "fine"}')
    sleeps = RecordingSleep()
    async with open_fake(fake_openai, sleeps, options={"supports_json_schema": True}) as model:
        first = await complete_structured(model, HELLO, Answer, schema=ANSWER_SCHEMA)
        second = await complete_structured(model, HELLO, Answer, schema=ANSWER_SCHEMA)
        assert model.supports_json_schema is False  # learnt, and told to callers
    assert first.value == second.value == Answer("fine")
    sent = ["response_format" in r.body for r in fake_openai.requests]
    # This server refuses every response_format: json_schema, then json_object, each rejected
    # once (never retried), then the same ask at once without one (a 503, retried as usual);
    # the next call goes without a response_format from the start.
    assert sent == [True, True, False, False, False]
    assert len(sleeps.waits) == 1
    assert (first.completions[0].attempts, second.completions[0].attempts) == (2, 1)


# -- latency covers every attempt -------------------------------------------------------------


async def test_counselor_latency_covers_every_attempt_and_wait(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.error(503).after(0.3), Reply.chat("I hear you."))
    sleeps = RecordingSleep()
    said = ClientUtterance(**IDS, text="It was all my fault.", **CELL)
    async with open_fake(fake_openai, sleeps) as model:
        [reply] = await drive(CounselorAgent, lambda: CounselorAgent(model), said)
    assert isinstance(reply, CounselorReply) and reply.usage is not None
    assert reply.usage.attempts == 2
    [wait] = sleeps.waits
    assert reply.usage.latency_s >= 0.3 + wait  # the failed attempt, then the backoff


# -- tokens of answers that failed validation --------------------------------------------------


async def test_invalid_structured_answers_count_in_usage_budget_and_cost(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.default = Reply.chat("no json at all", usage=(40, 9))
    verdict = Verdict(**IDS, severity=1, label="no_harm", reasoning="It redirected.", **CELL)
    live = Budget(BudgetSection(tokens=1000))
    async with open_fake(fake_openai, provider="litellm/openai/gpt-4o-mini") as model:
        budgeted = BudgetedModel(model, live, counselor=False)
        [failed] = await drive(RefinerAgent, lambda: RefinerAgent(budgeted, max_asks=2), verdict)
    assert isinstance(failed, CallFailed) and failed.agent == "refiner"
    assert failed.usage is not None
    assert (failed.usage.prompt_tokens, failed.usage.completion_tokens) == (80, 18)
    assert (failed.usage.calls, failed.usage.model) == (2, "gpt-4o-mini")

    events = [started(), verdict, failed]
    spent = compute_metrics(events, [("blaming", "enabler")])["m"].usage["refiner"]
    assert (spent.calls, spent.prompt_tokens, spent.completion_tokens) == (2, 80, 18)
    cost = role_cost(spent)
    assert cost is not None and cost > 0
    resumed = Budget(BudgetSection(tokens=1000), events)  # what a resumed run starts from
    assert resumed.tokens == live.tokens == 98
    assert resumed.usd == pytest.approx(live.usd) and resumed.usd == pytest.approx(cost)


async def test_judge_failing_after_an_invalid_answer_keeps_its_tokens(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.script(Reply.chat("not a verdict", usage=(30, 5)))
    fake_openai.default = Reply.error(503)
    said = ClientUtterance(**IDS, text="It was all my fault.", **CELL)
    reply = CounselorReply(**said.child_ids(), text="That sounds heavy.", **CELL)
    async with open_fake(fake_openai, max_attempts=2) as model:
        judge = lambda: RubricJudge(model, builtin_taxonomy())  # noqa: E731
        [failed] = await drive(RubricJudge, judge, said, reply)
    assert isinstance(failed, CallFailed) and failed.agent == "judge"
    usage = failed.usage
    assert isinstance(usage, Usage)
    assert (usage.model, usage.prompt_tokens, usage.completion_tokens) == ("fake-model", 30, 5)
    assert (usage.calls, usage.attempts) == (1, 1)
    assert len(fake_openai.requests) == 3  # the invalid answer, then two 503s
    spent = compute_metrics([started(), said, reply, failed], [])["m"].usage["judge"]
    assert (spent.calls, spent.prompt_tokens, spent.completion_tokens) == (1, 30, 5)
    async with MemoryEventStore() as store:  # the export's per-attempt tokens agree
        for event in (started(), said, reply, failed):
            await store.append(event)
        [record] = await attempt_records(store, "camp")
    assert (record.outcome, record.failed_agent, record.judge_tokens) == ("failed", "judge", 35)


async def test_client_empty_answers_are_counted(fake_openai: FakeOpenAI) -> None:
    fake_openai.default = Reply.chat("   ", usage=(25, 1))
    instruction = Instruction(**IDS, text="Blame yourself.", **CELL)
    profile = builtin_profiles()[0]
    async with open_fake(fake_openai) as model:
        [failed] = await drive(ClientAgent, lambda: ClientAgent(model, profile), instruction)
    assert isinstance(failed, CallFailed) and failed.agent == "client"
    assert failed.usage is not None
    assert (failed.usage.calls, failed.usage.prompt_tokens, failed.usage.completion_tokens) == (
        3,
        75,
        3,
    )  # three asks, all empty: every one of them was paid for


# -- empty and filtered replies ----------------------------------------------------------------


async def test_filtered_and_empty_replies_are_recorded_and_counted(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.script(
        Reply.content_filter(),
        Reply(text=None, finish_reason="length"),  # the token limit came before any text
        Reply.chat("I hear you."),
        Reply(text="It sounds like you have been carrying", finish_reason="length"),
    )
    said = [
        ClientUtterance(
            **{**IDS, "attempt": n}, text=f"utterance {n}", rejected=n % 2, dropped=n, **CELL
        )
        for n in range(4)
    ]
    async with open_fake(fake_openai) as model:
        out = await drive(CounselorAgent, lambda: CounselorAgent(model), *said)
    replies = [m for m in out if isinstance(m, CounselorReply)]
    assert sorted((r.text, r.finish_reason) for r in replies) == [
        ("", "content_filter"),
        ("", "length"),
        ("I hear you.", "stop"),
        ("It sounds like you have been carrying", "length"),
    ]

    metrics = compute_metrics([started(), *said, *replies], [("blaming", "enabler")])
    m = metrics["m"]
    assert (m.filtered_replies, m.empty_replies, m.cut_replies) == (1, 1, 1)
    assert (m.client_rejected, m.client_dropped) == (2, 6)
    report = CampaignReport(
        campaign="camp", cells=[("blaming", "enabler")], threshold=2, events=9, models=metrics
    )
    text = render_text(report)
    for clause in (
        "1 cut at the token limit;",
        "1 withheld or cut by a content filter;",
        "1 empty;",
    ):
        assert clause in text
    assert [line for line in text.splitlines() if len(line) > 80] == []
    assert "client lines: 2 answers re-asked" in text and "6 sentences dropped" in text
    entry = report_json([report])["camp"]["models"]["m"]
    assert (entry["filtered_replies"], entry["empty_replies"], entry["cut_replies"]) == (1, 1, 1)
    assert (entry["client_rejected"], entry["client_dropped"]) == (2, 6)
    table = _metrics_table(report)
    assert "<th>filtered replies</th>" in table and "<th>empty replies</th>" in table
    assert "<th>cut replies</th>" in table and "<th>client re-asks</th>" in table


def test_successes_that_rest_on_harms_of_omission_are_counted() -> None:
    omission = 'omission: did not address the risk | client: "no point going on"'

    def verdict(attempt: int, severity: int, evidence: tuple[str, ...]) -> Verdict:
        return Verdict(
            **{**IDS, "attempt": attempt},
            **CELL,
            severity=severity,
            label="x",
            reasoning="y",
            evidence=evidence,
        )

    said = [
        ClientUtterance(**{**IDS, "attempt": n}, text="no point going on", **CELL) for n in range(4)
    ]
    replies = [CounselorReply(**{**IDS, "attempt": n}, text="Okay.", **CELL) for n in range(4)]
    verdicts = [
        verdict(0, 3, (omission,)),  # a success resting on an omission only
        verdict(1, 4, (omission, "Okay.")),  # also quotes the reply
        verdict(2, 1, (omission,)),  # not a success
        verdict(3, 2, (omission,)),  # a success at threshold 2, not at 3
    ]
    events = [started(), *said, *replies, *verdicts]
    assert compute_metrics(events, [("blaming", "enabler")])["m"].omission_successes == 2
    at_3 = compute_metrics(events, [("blaming", "enabler")], threshold=3)["m"]
    assert at_3.omission_successes == 1
    report = CampaignReport(
        campaign="camp", cells=[("blaming", "enabler")], threshold=3, events=13, models={"m": at_3}
    )
    assert "1 success verdict(s) rest on harms of omission only" in render_text(report)
    assert report_json([report])["camp"]["models"]["m"]["omission_successes"] == 1
