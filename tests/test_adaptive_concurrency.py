"""Adaptive concurrency per endpoint: rate-limit answers narrow the limit, successes widen it.

The endpoints are scripted models whose calls wait until the test releases them, one round at a
time, so every step of the AIMD rule can be watched; backoff waits are recorded, never slept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest
import structlog
import trio
from trio.testing import MockClock

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import RecordingSleep
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import CallFailed, ConversationFinished, CounselorReply
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Connections,
    ModelSettings,
    ResilientClient,
    TransientProviderError,
    _resilient,
    open_model,
)
from mhsafeeval.providers._resilient import OVERLOAD_STATUS, AdaptiveLimit
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.testing import register_script
from mhsafeeval.testing._demo import (
    demo_client,
    demo_counselor,
    demo_judge,
    demo_mutator,
    demo_refiner,
)

pytestmark = pytest.mark.anyio
HELLO = [ChatMessage("user", "hello")]

Answer = Callable[[], str | BaseException]
PERSONAS: dict[str, Callable[[Sequence[ChatMessage], CallParams], str]] = {
    "client": demo_client,
    "mutator": demo_mutator,
    "counselor": demo_counselor,
    "judge": demo_judge,
    "refiner": demo_refiner,
}


def ok() -> str:
    return "ok"


def failing(status: int) -> Answer:
    def answer() -> BaseException:
        return TransientProviderError(f"HTTP {status}", status=status, retry_after=1.0)

    return answer


rate_limited = failing(429)


class Endpoint:
    """A scripted endpoint whose calls wait for :meth:`release`, then answer as told.

    It counts the calls inside it and, as each one starts, notes how many were inside and what
    the limit of ``limiter`` allowed at that moment.
    """

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.answer: Answer = ok
        self.inside = 0
        self.peak = 0
        self.starts: list[tuple[int, int]] = []
        self.limiter: AdaptiveLimit | None = None

    async def __call__(
        self, messages: Sequence[ChatMessage], params: CallParams
    ) -> str | BaseException:
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        if self.limiter is not None:
            self.starts.append((self.inside, self.limiter.total_tokens))
        try:
            await self.gate.wait()
            return self.answer()
        finally:
            self.inside -= 1

    async def release(self, answer: Answer) -> None:
        """Answer every call inside now with ``answer``; return once the retries and the next
        calls have all come in (or wait for a slot)."""
        self.answer = answer
        gate, self.gate = self.gate, anyio.Event()
        gate.set()
        await anyio.wait_all_tasks_blocked()

    def open(self) -> None:
        """Answer every call, now and later, at once."""
        self.answer = ok
        self.gate.set()


def endpoint_model(
    name: str, *, connections: Connections | None = None, **table: object
) -> tuple[Endpoint, ResilientClient]:
    endpoint = Endpoint()
    register_script(name, endpoint)
    fields: dict[str, object] = {"max_attempts": 50, "breaker_threshold": 0, **table}
    settings = ModelSettings(provider=f"scripted/{name}", **fields)  # type: ignore[arg-type]
    model = open_model(settings, connections=connections, sleep=RecordingSleep())
    endpoint.limiter = model.limiter
    return endpoint, model


async def calls(model: ResilientClient, count: int) -> None:
    for _ in range(count):
        await model.complete(HELLO)


def never_above_the_limit(endpoint: Endpoint) -> None:
    over = [(inside, limit) for inside, limit in endpoint.starts if inside > limit]
    assert not over, f"calls started with more inside than the limit allowed: {over}"


@pytest.mark.parametrize(("minimum", "expected"), [(1, [4, 2, 1, 1]), (3, [4, 3, 3, 3])])
async def test_a_burst_of_rate_limits_halves_the_limit_once_per_round(
    minimum: int, expected: list[int]
) -> None:
    endpoint, model = endpoint_model("aimd-burst", max_concurrency=8, min_concurrency=minimum)
    async with anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        assert (endpoint.inside, model.limit) == (8, (8, 8))
        seen = []
        for _ in expected:
            # Every call inside answers 429 together: the limit halves once, not per answer.
            await endpoint.release(rate_limited)
            seen.append(model.limit[0])
            assert endpoint.inside == model.limit[0] == model.limiter.borrowed_tokens
        assert seen == expected
        endpoint.open()
    assert model.stats.failures == 0 and model.stats.calls == 12
    assert model.limiter.borrowed_tokens == 0
    never_above_the_limit(endpoint)


async def test_successes_widen_the_limit_back_to_the_maximum_and_never_above() -> None:
    endpoint, model = endpoint_model("aimd-grow", max_concurrency=6)
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(calls, model, 30)
        await anyio.wait_all_tasks_blocked()
        for _ in range(3):
            await endpoint.release(rate_limited)
        assert model.limit == (1, 6)
        limits = []
        for _ in range(12):
            await endpoint.release(ok)
            limits.append(model.limit[0])
            assert endpoint.inside == model.limit[0]
        endpoint.open()
    # One more slot per round of successes (one success per slot), then no further.
    assert limits == [2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 6, 6]
    assert endpoint.peak == 6 and model.limit == (6, 6)
    assert model.stats.failures == 0 and model.limiter.borrowed_tokens == 0
    never_above_the_limit(endpoint)


async def test_successes_that_leave_slots_free_do_not_widen_the_limit() -> None:
    endpoint, model = endpoint_model("aimd-idle", max_concurrency=8)
    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        await endpoint.release(rate_limited)  # 8 -> 4, and the 8 calls retry, 4 at a time
        await endpoint.release(ok)  # 4 succeed; the other 4 come in
        assert model.limit == (5, 8)
        await endpoint.release(ok)
    # The last 4 had a fifth slot free: the endpoint was never asked for 5 at once.
    assert model.limit == (5, 8)
    endpoint.open()
    for _ in range(20):
        await model.complete(HELLO)  # one at a time: never the limit's worth in flight
    assert model.limit == (5, 8)


@pytest.mark.parametrize("status", [429, 503, 529, 500, 502])
async def test_only_overload_answers_narrow_the_limit(status: int) -> None:
    endpoint, model = endpoint_model(f"aimd-status-{status}", max_concurrency=4)
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        await endpoint.release(failing(status))
        narrowed = model.limit[0]
        endpoint.open()
    assert model.stats.retries == 4
    assert narrowed == (2 if status in OVERLOAD_STATUS else 4)


async def test_a_fixed_limit_when_the_table_says_so() -> None:
    endpoint, model = endpoint_model("aimd-fixed", max_concurrency=4, adaptive_concurrency=False)
    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        for _ in range(3):
            await endpoint.release(rate_limited)
            assert model.limit == (4, 4) and endpoint.inside == 4
        endpoint.open()
    assert model.stats.retries == 12


async def test_cancelled_calls_and_waiters_never_keep_a_slot() -> None:
    endpoint, model = endpoint_model("aimd-cancel", max_concurrency=4)
    async with anyio.create_task_group() as first:
        for _ in range(4):
            first.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        await endpoint.release(rate_limited)  # 4 -> 2: two inside, two waiting for a slot
        assert (model.limit, endpoint.inside) == ((2, 4), 2)
        async with anyio.create_task_group() as waiters:
            for _ in range(5):
                waiters.start_soon(model.complete, HELLO)
            await anyio.wait_all_tasks_blocked()
            assert model.limiter.borrowed_tokens == 2
            waiters.cancel_scope.cancel()
        assert model.limiter.borrowed_tokens == 2 and endpoint.inside == 2
        first.cancel_scope.cancel()  # the two inside, and the two waiting, are cancelled too
    assert model.limiter.borrowed_tokens == 0 and endpoint.inside == 0
    # Every slot came back: as many new calls get in as the limit allows, and no more.
    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        assert endpoint.inside == model.limiter.borrowed_tokens == model.limit[0] == 2
        endpoint.open()
    assert model.limiter.borrowed_tokens == 0
    never_above_the_limit(endpoint)


async def test_a_free_slot_is_taken_without_yielding_to_other_tasks() -> None:
    # Each yield on the way to a call waits behind every other ready task: with many calls in
    # flight it adds to every call's latency, so a free slot must not cost one.
    limit = AdaptiveLimit(2, endpoint="fast-path")
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)  # ready to run at the next yield
        async with limit.slot():
            seen_inside = list(ran)
            assert limit.borrowed_tokens == 1
    assert seen_inside == [] and ran == ["other"]
    assert limit.borrowed_tokens == 0
    # A cancellation already pending is still raised before a slot is taken.
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with limit.slot():
            pytest.fail("entered a slot inside a cancelled scope")
    assert scope.cancelled_caught and limit.borrowed_tokens == 0


async def test_tables_on_one_endpoint_share_the_adaptive_limit() -> None:
    shared = Connections()
    endpoint, cold = endpoint_model(
        "aimd-shared", connections=shared, max_concurrency=4, min_concurrency=2
    )
    warm = open_model(
        ModelSettings(
            provider="scripted/aimd-shared", temperature=1.0, max_concurrency=8, max_attempts=50
        ),
        connections=shared,
        sleep=RecordingSleep(),
    )
    other = open_model(ModelSettings(provider="scripted/echo"), connections=shared)
    assert cold.limiter is warm.limiter and shared.limits()["scripted:aimd-shared"] == (8, 8)
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(cold.complete, HELLO)
            tg.start_soon(warm.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        assert endpoint.inside == 8
        # Rate limits answered to either table narrow the one limit both share.
        await endpoint.release(rate_limited)
        assert cold.limit == warm.limit == (4, 8) and endpoint.inside == 4
        await endpoint.release(rate_limited)
        await endpoint.release(rate_limited)  # the floor is the highest of the tables' minimums
        assert shared.limits() == {"scripted:aimd-shared": (2, 8), "scripted:echo": (4, 4)}
        assert other.limit == (4, 4)
        endpoint.open()
    assert cold.stats.failures == warm.stats.failures == 0
    never_above_the_limit(endpoint)


async def test_a_fixed_table_fixes_the_endpoint_it_shares() -> None:
    shared = Connections()
    endpoint, adaptive = endpoint_model("aimd-mixed", connections=shared, max_concurrency=4)
    fixed = open_model(
        ModelSettings(
            provider="scripted/aimd-mixed",
            temperature=1.0,
            max_concurrency=4,
            adaptive_concurrency=False,
        ),
        connections=shared,
    )
    assert fixed.limiter is adaptive.limiter
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(adaptive.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        await endpoint.release(rate_limited)
        assert adaptive.limit == (4, 4) and endpoint.inside == 4
        endpoint.open()


@pytest.mark.parametrize("anyio_backend", [("trio", {"clock": MockClock()})])
async def test_limit_changes_are_logged_at_most_once_per_interval() -> None:
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    endpoint, model = endpoint_model("aimd-log", max_concurrency=8)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(calls, model, 10)
            await anyio.wait_all_tasks_blocked()
            for _ in range(3):
                await endpoint.release(rate_limited)  # 8 -> 4 -> 2 -> 1 within one instant
            clock.jump(6.0)
            await endpoint.release(ok)  # 1 -> 2
            endpoint.open()
    lines = [entry for entry in logs if entry["event"] == "provider.concurrency"]
    assert [(e["old"], e["new"], e["changes"], e["reason"]) for e in lines[:2]] == [
        (8, 4, 1, "HTTP 429"),
        (4, 2, 3, "calls succeed"),
    ]
    assert lines[0]["log_level"] == "info" and lines[0]["endpoint"] == "scripted:aimd-log"
    assert lines[0]["maximum"] == 8


def test_an_adaptive_limit_refuses_impossible_bounds() -> None:
    with pytest.raises(ValueError, match="minimum <= maximum"):
        AdaptiveLimit(2, minimum=3, endpoint="x")
    with pytest.raises(ValueError, match="1 <= minimum"):
        AdaptiveLimit(2, minimum=0)
    limit = AdaptiveLimit(4)
    assert (limit.total_tokens, limit.maximum, limit.minimum, limit.adaptive) == (4, 4, 1, True)


@pytest.mark.parametrize(
    ("table", "field", "reason"),
    [
        ("min_concurrency = 0", "models.judge.min_concurrency", "must be >= 1"),
        ("min_concurrency = 2000", "models.judge.min_concurrency", "must be <= 1024"),
        (
            "max_concurrency = 2\nmin_concurrency = 3",
            "models.judge.min_concurrency",
            "must be <= max_concurrency",
        ),
        ('adaptive_concurrency = "yes"', "models.judge.adaptive_concurrency", "expected bool"),
    ],
)
def test_bad_concurrency_settings_name_the_key(table: str, field: str, reason: str) -> None:
    with pytest.raises(InputError) as info:
        parse_config(f'[models.judge]\nprovider = "a/b"\n{table}\n', "bad.toml")
    assert (info.value.field, info.value.source) == (field, "bad.toml")
    assert reason in info.value.reason


def test_concurrency_settings_are_read_from_the_table() -> None:
    config = parse_config(
        '[models.judge]\nprovider = "a/b"\nmax_concurrency = 6\nmin_concurrency = 2\n'
        "adaptive_concurrency = false\n",
        "ok.toml",
    )
    judge = config.models["judge"]
    assert (judge.max_concurrency, judge.min_concurrency, judge.adaptive_concurrency) == (
        6,
        2,
        False,
    )
    default = ModelSettings(provider="a/b")
    assert (default.min_concurrency, default.adaptive_concurrency) == (1, True)


# -- end to end: a campaign against a rate-limited OpenAI-compatible endpoint ------------------


def persona(role: str) -> Reply:
    """The fake server answering as the ``scripted/demo-*`` persona of ``role``."""
    script = PERSONAS[role]

    def answer(body: Any) -> str:
        messages = [ChatMessage(m["role"], m["content"]) for m in body["messages"]]
        return script(messages, CallParams(seed=body.get("seed")))

    return Reply.computed(answer)


def hosted(url: str) -> str:
    """Every role on the fake server as model ``<role>-x``; the counselor takes 4 at once."""

    def table(role: str) -> str:
        name = "counselors.bot" if role == "counselor" else f"models.{role}"
        extra = (
            "max_concurrency = 4\nmax_attempts = 10\nbackoff_initial = 0.01\nbackoff_max = 0.05\n"
            if role == "counselor"
            else ""
        )
        return (
            f'\n[{name}]\nprovider = "litellm/openai/{role}-x"\napi_base = "{url}/v1"\n'
            f'api_key_env = "MHS_FAKE_KEY"\ntimeout = 20.0\n{extra}'
        )

    return (
        '[campaign]\nname = "rate-limited"\nseed = 3\nmax_turns = 3\nmax_attempts = 2\n'
        "conversations_per_profile = 3\nconcurrency = 6\n"
        'profile_ids = ["grief-widower", "panic-disorder-bus-driver"]\n'
        + "".join(table(role) for role in PERSONAS)
    )


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # litellm is asyncio-only
async def test_a_campaign_on_a_rate_limited_endpoint_backs_off_and_recovers(
    fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHS_FAKE_KEY", "sk-test-fake-0000000000")
    monkeypatch.setattr(_resilient, "LOG_INTERVAL_S", 0.0)  # log every change, to follow them
    for role in PERSONAS:
        if role != "counselor":
            fake_openai.always(f"{role}-x", persona(role))
    # The counselor's endpoint answers its first requests 429, then answers slowly.
    limited = 8
    fake_openai.script(*[Reply.error(429, headers={"Retry-After": "0"})] * limited)
    fake_openai.default = persona("counselor").after(0.05)
    config = parse_config(hosted(fake_openai.url), "rate-limited.toml")
    clients: list[ResilientClient] = []
    store = MemoryEventStore()
    with structlog.testing.capture_logs() as logs:
        async with store:
            result = await run_campaign(config, store, on_clients=clients.extend)
            events = [e.message async for e in store.events("rate-limited")]
    assert result.status == "completed"
    # Every call succeeded in the end: the 429s were retried, nothing failed.
    assert not [m for m in events if isinstance(m, CallFailed)]
    finished = [m for m in events if isinstance(m, ConversationFinished)]
    assert [m.status for m in finished] == ["completed"] * 6
    counselor = next(c for c in clients if c.name == "litellm/openai/counselor-x")
    assert counselor.stats.retries == limited and counselor.stats.failures == 0
    replies = [m for m in events if isinstance(m, CounselorReply)]
    counselor_requests = [r for r in fake_openai.requests if r.body.get("model") == "counselor-x"]
    assert len(counselor_requests) == len(replies) + limited
    # The limit went down on the 429s, and back up while the calls succeeded.
    changes = [
        (e["old"], e["new"], e["reason"])
        for e in logs
        if e["event"] == "provider.concurrency" and e["endpoint"] == counselor.limiter.endpoint
    ]
    downs = [i for i, (old, new, _) in enumerate(changes) if new < old]
    ups = [i for i, (old, new, _) in enumerate(changes) if new > old]
    assert downs and all(changes[i][2] == "HTTP 429" for i in downs), changes
    assert ups and ups[-1] > downs[-1], changes
    assert all(changes[i][2] == "calls succeed" for i in ups), changes
    assert min(new for _, new, _ in changes) < 4 and counselor.limit[1] == 4
    assert counselor.limit[0] > min(new for _, new, _ in changes)
