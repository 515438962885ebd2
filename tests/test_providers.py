"""The provider seam: registry, scripted provider, and the resilience wrapper's policies."""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from trio.testing import MockClock

from helpers import RecordingSleep
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelSettings,
    PermanentProviderError,
    TransientProviderError,
    available_providers,
    open_model,
    provider,
    settings_problems,
)
from mhsafeeval.providers._scripted import ScriptedModel, ScriptExhausted
from mhsafeeval.providers._types import ProviderUnavailable
from mhsafeeval.testing import register_script

pytestmark = pytest.mark.anyio
HELLO = [ChatMessage("user", "hello")]
ROOT = Path(__file__).resolve().parents[1]


def settings(name: str, **kw: object) -> ModelSettings:
    return ModelSettings(provider=f"scripted/{name}", **kw)  # type: ignore[arg-type]


async def test_echo_and_defaults_from_settings() -> None:
    seen: list[CallParams] = []

    def script(messages: Sequence[ChatMessage], params: CallParams) -> str:
        seen.append(params)
        return messages[-1].content.upper()

    register_script("upper", script)
    async with open_model(settings("upper", temperature=0.3, max_tokens=50, seed=9)) as model:
        done = await model.complete(HELLO, CallParams(max_tokens=7))
    assert done.text == "HELLO"
    assert (done.finish_reason, done.attempts, done.model) == ("stop", 1, "scripted/upper")
    assert seen == [CallParams(temperature=0.3, max_tokens=7, seed=9)]
    assert model.stats.calls == 1 and model.stats.completion_tokens == 1


async def test_stop_sequences_of_the_settings_end_free_text_never_structured_answers() -> None:
    seen: list[CallParams] = []

    def script(messages: Sequence[ChatMessage], params: CallParams) -> str:
        seen.append(params)
        return '{"a": 1}' if params.json_schema else "fine"

    register_script("stops", script)
    async with open_model(settings("stops", stop=("\n\n", "Client:"))) as model:
        await model.complete(HELLO)
        await model.complete(HELLO, CallParams(stop=("Client:", "END")))
        await model.complete(HELLO, CallParams(json_schema={"type": "object"}))
    assert [p.stop for p in seen] == [("\n\n", "Client:"), ("Client:", "END", "\n\n"), ()]


@pytest.mark.parametrize(
    ("stop", "reason"),
    [(("a", "b", "c", "d", "e"), "at most 4"), (("\n", ""), "must not be empty")],
)
def test_bad_stop_sequences_are_refused(stop: tuple[str, ...], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        settings("x", stop=stop)


async def test_transient_errors_are_retried_honouring_retry_after() -> None:
    register_script(
        "flaky",
        [
            TransientProviderError("429", status=429, retry_after=7.0),
            TransientProviderError("503", status=503),
            "finally",
        ],
    )
    sleep = RecordingSleep()
    model = open_model(
        settings("flaky", backoff_initial=1.0, backoff_max=8.0), sleep=sleep, rng=random.Random(1)
    )
    done = await model.complete(HELLO)
    assert done.text == "finally"
    assert done.attempts == 3
    assert len(sleep.waits) == 2
    assert sleep.waits[0] >= 7.0  # Retry-After honoured
    assert 0 <= sleep.waits[1] <= 2.0  # full jitter under initial * 2**(attempt-1)
    assert model.stats.retries == 2


async def test_retry_after_is_capped() -> None:
    register_script("slowdown", [TransientProviderError("429", retry_after=10_000), "ok"])
    sleep = RecordingSleep()
    model = open_model(settings("slowdown", max_retry_after=30.0), sleep=sleep)
    await model.complete(HELLO)
    assert sleep.waits == [30.0]


async def test_backoff_grows_exponentially_within_bounds() -> None:
    model = open_model(settings("echo", backoff_initial=0.5, backoff_max=4.0), rng=random.Random(3))
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (8, 4.0)]:
        waits = [model.backoff(attempt, None) for _ in range(200)]
        assert min(waits) >= 0 and max(waits) <= ceiling
        assert max(waits) > ceiling * 0.8  # really jittered over the range


async def test_final_failure_raises_typed_error_never_an_empty_answer() -> None:
    register_script("down", [TransientProviderError("503 unavailable", status=503)] * 3)
    model = open_model(settings("down", max_attempts=3), sleep=RecordingSleep())
    with pytest.raises(ModelCallError) as info:
        await model.complete(HELLO)
    err = info.value
    assert (err.attempts, err.retryable, err.status, err.model) == (3, True, 503, "scripted/down")
    assert "503 unavailable" in str(err)
    assert model.stats.failures == 1


async def test_permanent_errors_are_not_retried() -> None:
    register_script("denied", [PermanentProviderError("401 bad key", status=401), "never"])
    sleep = RecordingSleep()
    model = open_model(settings("denied"), sleep=sleep)
    with pytest.raises(ModelCallError) as info:
        await model.complete(HELLO)
    assert (info.value.attempts, info.value.retryable) == (1, False)
    assert sleep.waits == []


@pytest.mark.parametrize("anyio_backend", [("trio", {"clock": MockClock(autojump_threshold=0)})])
async def test_deadline_on_every_attempt_with_a_fake_clock() -> None:
    calls = 0

    async def hangs(messages: Sequence[ChatMessage], params: CallParams) -> str:
        nonlocal calls
        calls += 1
        await anyio.sleep(3600)
        return "too late"

    register_script("hangs", hangs)
    start = anyio.current_time()
    model = open_model(
        settings("hangs", timeout=30, max_attempts=3, backoff_initial=1, backoff_max=1)
    )
    with pytest.raises(ModelCallError, match="timeout") as info:
        await model.complete(HELLO)
    elapsed = anyio.current_time() - start
    assert calls == 3 and info.value.retryable
    assert 90 <= elapsed <= 92  # three 30 s deadlines plus two backoffs of at most 1 s


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_each_call_gets_its_own_deadline_on_asyncio() -> None:
    """One timer serves a client's deadlines on asyncio: each call still times out at its own
    start plus the timeout, whether the calls before it ended early or hang too."""

    async def sleeps(messages: Sequence[ChatMessage], params: CallParams) -> str:
        await anyio.sleep(float(messages[-1].content))
        return "done"

    register_script("sleeps", sleeps)
    model = open_model(settings("sleeps", timeout=0.4, max_attempts=1))
    start = anyio.current_time()
    ended: dict[str, float | str] = {}

    async def call(name: str, after: float, duration: float) -> None:
        await anyio.sleep(after)
        try:
            ended[name] = (await model.complete([ChatMessage("user", str(duration))])).text
        except ModelCallError as exc:
            ended[name] = anyio.current_time() - start
            ended[f"{name} error"] = str(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "quick", 0.0, 0.01)
        tg.start_soon(call, "hangs", 0.0, 30)
        tg.start_soon(call, "later", 0.2, 30)  # its deadline is 0.2 s after the first's
        tg.start_soon(call, "in time", 0.2, 0.1)
    assert ended["quick"] == ended["in time"] == "done"
    hangs, later = ended["hangs"], ended["later"]
    assert isinstance(hangs, float) and isinstance(later, float)
    assert 0.4 <= hangs < 5 and 0.6 <= later < 5  # never before its own deadline
    assert "timeout" in str(ended["hangs error"]) and "timeout" in str(ended["later error"])
    # after a quiet spell the next call's deadline is armed again
    await anyio.sleep(0.5)
    with pytest.raises(ModelCallError, match="timeout"):
        await model.complete([ChatMessage("user", "30")])
    assert anyio.current_time() - start >= 1.3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_deadlines_use_one_timer_not_one_per_call_on_asyncio() -> None:
    import asyncio

    async def quick(messages: Sequence[ChatMessage], params: CallParams) -> str:
        await anyio.lowlevel.checkpoint()
        return "ok"

    register_script("quick-timer", quick)
    model = open_model(settings("quick-timer", timeout=60, max_concurrency=64))
    loop = asyncio.get_running_loop()
    armed = 0
    call_at = loop.call_at

    def counting(*args: object, **kw: object) -> asyncio.TimerHandle:
        nonlocal armed
        armed += 1
        return call_at(*args, **kw)  # type: ignore[arg-type]

    loop.call_at = counting  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(model.complete, HELLO)
    finally:
        del loop.call_at
    assert model.stats.calls == 50
    assert armed <= 2  # anyio.fail_after armed one per call


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancelled_call_is_not_a_timeout_and_leaves_deadlines_working() -> None:
    async def sleeps(messages: Sequence[ChatMessage], params: CallParams) -> str:
        await anyio.sleep(float(messages[-1].content))
        return "done"

    register_script("sleeps-cancel", sleeps)
    model = open_model(settings("sleeps-cancel", timeout=0.3, max_attempts=1))
    with anyio.move_on_after(0.05) as scope:
        await model.complete([ChatMessage("user", "30")])
    assert scope.cancelled_caught  # the caller's cancellation, not a failed call
    assert model.stats.failures == 0
    with pytest.raises(ModelCallError, match="timeout"):
        await model.complete([ChatMessage("user", "30")])
    assert (await model.complete([ChatMessage("user", "0.01")])).text == "done"


def test_deadlines_hold_when_a_client_moves_to_a_new_event_loop() -> None:
    async def sleeps(messages: Sequence[ChatMessage], params: CallParams) -> str:
        await anyio.sleep(float(messages[-1].content))
        return "done"

    register_script("sleeps-loops", sleeps)
    model = open_model(settings("sleeps-loops", timeout=0.2, max_attempts=1))

    async def hang() -> str:
        try:
            await model.complete([ChatMessage("user", "30")])
        except ModelCallError as exc:
            return str(exc)
        return "answered"

    for _ in range(2):  # a timer armed on the first loop must not serve the second
        assert "timeout" in anyio.run(hang, backend="asyncio")


async def test_concurrency_limit_per_model() -> None:
    running = peak = 0

    async def tracked(messages: Sequence[ChatMessage], params: CallParams) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        running -= 1
        return "ok"

    register_script("tracked", tracked)
    model = open_model(settings("tracked", max_concurrency=2))
    async with anyio.create_task_group() as tg:
        for _ in range(7):
            tg.start_soon(model.complete, HELLO)
    assert peak == 2


async def test_cancellation_is_never_turned_into_a_failure() -> None:
    started = anyio.Event()

    async def blocks(messages: Sequence[ChatMessage], params: CallParams) -> str:
        started.set()
        await anyio.sleep_forever()
        return ""

    register_script("blocks", blocks)
    model = open_model(settings("blocks", max_attempts=5))
    outcome: list[str] = []

    async def call() -> None:
        try:
            await model.complete(HELLO)
        except ModelCallError:
            outcome.append("failure")
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await started.wait()
        tg.cancel_scope.cancel()
    assert outcome == ["cancelled"]
    assert model.stats.attempts == 1


async def test_scripted_list_runs_out_loudly() -> None:
    model = ScriptedModel("short", ["one"])
    assert (await model.complete(HELLO)).text == "one"
    with pytest.raises(ScriptExhausted):
        await model.complete(HELLO)


async def test_scripted_replies_from_settings_and_completion_objects() -> None:
    model = open_model(settings("anything", options={"replies": ["a", "b"]}))
    assert [(await model.complete(HELLO)).text for _ in range(3)] == ["a", "b", "a"]
    done = Completion(text="x", finish_reason="content_filter", model="m")
    register_script("filtered", [done])
    assert (
        await open_model(settings("filtered")).complete(HELLO)
    ).finish_reason == "content_filter"


def test_unknown_provider_and_script_are_clear_errors() -> None:
    with pytest.raises(ProviderUnavailable, match=r"unknown provider 'nope'.*scripted"):
        open_model("nope/model")
    with pytest.raises(ProviderUnavailable, match="no script named 'missing'"):
        open_model("scripted/missing")
    with pytest.raises(ValueError, match="PREFIX/MODEL"):
        ModelSettings(provider="scripted")
    with pytest.raises(ProviderUnavailable, match=r"options\.replies"):
        open_model(settings("bad", options={"replies": "not a list"}))


def test_register_a_provider_and_list_it() -> None:
    @provider("unit-test-echo")
    def make(model: str, s: ModelSettings) -> ScriptedModel:
        """Echoes, for this test."""
        return ScriptedModel(model, ["from plugin"])

    assert available_providers()["unit-test-echo"] == "Echoes, for this test."
    assert {"scripted", "litellm"} <= set(available_providers())
    client = open_model("unit-test-echo/x")
    assert client.name == "scripted/x"
    with pytest.raises(ValueError, match="already registered"):
        provider("unit-test-echo")(lambda m, s: make(m, s))
    with pytest.raises(ValueError, match="without '/'"):
        provider("a/b")


@pytest.mark.parametrize("anyio_backend", [("trio", {"clock": MockClock(autojump_threshold=0)})])
async def test_a_model_that_keeps_failing_is_paused_then_tried_again() -> None:
    calls = 0
    healthy = False

    async def flaky(messages: Sequence[ChatMessage], params: CallParams) -> str:
        nonlocal calls
        calls += 1
        if not healthy:
            raise TransientProviderError("500 broken", status=500)
        return "back"

    register_script("breaker", flaky)
    model = open_model(
        settings("breaker", max_attempts=1, breaker_threshold=3, breaker_cooldown=60)
    )
    for _ in range(3):
        with pytest.raises(ModelCallError, match="500 broken"):
            await model.complete(HELLO)
    with pytest.raises(ModelCallError, match="paused: the last 3 calls failed") as info:
        await model.complete(HELLO)
    assert calls == 3  # the paused call never reached the provider
    assert info.value.retryable
    await anyio.sleep(61)
    healthy = True
    assert (await model.complete(HELLO)).text == "back"  # half-open: one call let through
    assert (await model.complete(HELLO)).text == "back"
    assert calls == 5


def test_breaker_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="breaker_threshold"):
        ModelSettings(provider="scripted/echo", breaker_threshold=-1)


def test_a_missing_optional_sdk_is_one_line_naming_the_model_and_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """litellm is an extra (``pip install 'mhsafeeval[litellm]'``): without it, ``check`` and
    ``run`` refuse a litellm/ table in one line that says what to install (exit 2, nothing
    written), and stored usage is priced as unknown instead of failing the report."""
    from mhsafeeval.cli import main
    from mhsafeeval.costs import model_cost

    monkeypatch.setitem(sys.modules, "litellm", None)  # as if it were not installed
    address = "litellm/openai/gpt-4o-mini"
    hint = "pip install 'mhsafeeval[litellm]'"
    [(field, reason)] = settings_problems(ModelSettings(provider=address))
    assert field == "provider"
    assert address in reason and hint in reason
    with pytest.raises(ProviderUnavailable, match=re.escape(hint)):
        open_model(address)
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + f'\n[counselors.hosted]\nprovider = "{address}"\n'
    )
    capsys.readouterr()
    assert main(["check", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "counselors.hosted.provider" in line and address in line and hint in line, line
    db = tmp_path / "c.db"
    assert main(["run", str(config), "--db", str(db)]) == 2
    assert hint in capsys.readouterr().err and not db.exists()
    assert model_cost("openai/gpt-4o-mini", 1000, 1000) is None  # unknown, not an error
