"""The litellm adapter against a fake OpenAI-compatible server on loopback.

Everything goes through ``open_model`` as a campaign would: the adapter makes one raw attempt,
:class:`ResilientClient` retries. Backoff waits are recorded, never slept.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import subprocess
import sys
import traceback
from typing import Any

import anyio
import pytest
import structlog

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import RecordingSleep
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelSettings,
    PermanentProviderError,
    ResilientClient,
    TransientProviderError,
    open_model,
)
from mhsafeeval.providers._litellm import (
    LiteLLMModel,
    classify_error,
    import_litellm,
    parse_retry_after,
    strict_subset,
)
from mhsafeeval.providers._types import ProviderUnavailable

pytestmark = pytest.mark.anyio

KEY = "sk-mhs-test-0123456789-SECRET"
KEY_ENV = "MHS_TEST_KEY"
HELLO = [ChatMessage("system", "You are terse."), ChatMessage("user", "hello")]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"severity": {"type": "integer"}},
    "required": ["severity"],
    "additionalProperties": False,
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # litellm is asyncio-only


@pytest.fixture(scope="session", autouse=True)
def litellm() -> Any:
    """Import litellm once per session (it takes seconds), outside any test."""
    return import_litellm()


@pytest.fixture
def sleeps() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def fake_settings(server: FakeOpenAI, **changes: Any) -> ModelSettings:
    fields: dict[str, Any] = {
        "provider": "litellm/openai/fake-model",
        "api_base": f"{server.url}/v1",
        "api_key_env": KEY_ENV,
        "timeout": 5.0,
        "max_attempts": 3,
        "backoff_initial": 1.0,
        "backoff_max": 8.0,
        **changes,
    }
    return ModelSettings(**fields)


def open_fake(settings: ModelSettings, sleeps: RecordingSleep) -> ResilientClient:
    return open_model(settings, sleep=sleeps, rng=random.Random(0))


def first_backoff(settings: ModelSettings) -> float:
    """The wait ResilientClient draws before attempt 2 with ``random.Random(0)``."""
    return random.Random(0).uniform(0, settings.backoff_initial)


# Success


async def test_success_maps_text_usage_id_and_model(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.script(Reply.chat("hello there", usage=(12, 3)))
    params = CallParams(temperature=0.2, max_tokens=50, seed=7, stop=("END",))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO, params)

    assert (done.text, done.finish_reason) == ("hello there", "stop")
    assert (done.prompt_tokens, done.completion_tokens) == (12, 3)
    assert (done.provider_id, done.model, done.attempts) == ("chatcmpl-fake-1", "fake-model", 1)
    assert done.latency_s > 0
    [request] = fake_openai.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "fake-model"
    assert request.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
    ]
    assert (request.body["temperature"], request.body["max_tokens"]) == (0.2, 50)
    assert (request.body["seed"], request.body["stop"]) == (7, ["END"])
    leaked = {"num_retries", "max_retries", "timeout", "api_key", "api_base", "response_format"}
    assert leaked.isdisjoint(request.body)
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert sleeps.waits == []


async def test_settings_sampling_defaults_reach_the_request(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    settings = fake_settings(fake_openai, temperature=0.0, max_tokens=9, seed=1)
    async with open_fake(settings, sleeps) as model:
        await model.complete(HELLO)
    [request] = fake_openai.requests
    assert (request.body["temperature"], request.body["max_tokens"], request.body["seed"]) == (
        0.0,
        9,
        1,
    )
    assert "stop" not in request.body


# Retries: one HTTP request per attempt, waits recorded


async def test_429_honours_retry_after(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    fake_openai.script(Reply.error(429, headers={"Retry-After": "7"}), Reply.chat("ok"))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.attempts) == ("ok", 2)
    assert len(fake_openai.requests) == 2
    [wait] = sleeps.waits
    assert wait >= 7


async def test_429_retry_after_ms(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    fake_openai.script(Reply.error(429, headers={"retry-after-ms": "2500"}), Reply.chat())
    settings = fake_settings(fake_openai, backoff_initial=0.1, backoff_max=0.1)
    async with open_fake(settings, sleeps) as model:
        await model.complete(HELLO)
    assert sleeps.waits == [2.5]


async def test_429_without_retry_after_uses_jittered_backoff(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.script(Reply.error(429), Reply.chat("ok"))
    settings = fake_settings(fake_openai)
    async with open_fake(settings, sleeps) as model:
        done = await model.complete(HELLO)
    assert done.attempts == 2
    [wait] = sleeps.waits
    assert 0 <= wait <= settings.backoff_initial
    assert wait == first_backoff(settings)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retried(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, status: int
) -> None:
    fake_openai.script(Reply.error(status), Reply.chat("recovered"))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.attempts) == ("recovered", 2)
    assert len(fake_openai.requests) == 2
    assert len(sleeps.waits) == 1


@pytest.mark.parametrize(
    "fault",
    [Reply.drop(), Reply.malformed(), Reply.no_choices()],
    ids=["dropped-connection", "malformed-json", "empty-choices"],
)
async def test_broken_replies_are_transient(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, fault: Reply
) -> None:
    fake_openai.script(fault, Reply.chat("ok"))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.attempts) == ("ok", 2)
    assert len(fake_openai.requests) == 2


async def test_always_503_fails_after_max_attempts_with_one_request_each(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.default = Reply.error(503)
    async with open_fake(fake_settings(fake_openai, max_attempts=4), sleeps) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    err = caught.value
    assert (err.attempts, err.retryable, err.status) == (4, True, 503)
    assert len(fake_openai.requests) == 4  # neither litellm nor the OpenAI SDK retried
    assert len(sleeps.waits) == 3


async def test_slow_server_times_out_each_attempt(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.default = Reply.chat().after(60)  # cut short when the server stops
    settings = fake_settings(fake_openai, timeout=0.5, max_attempts=2)
    async with open_fake(settings, sleeps) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert (caught.value.attempts, caught.value.retryable) == (2, True)
    assert "timeout" in caught.value.reason.lower()
    assert len(fake_openai.requests) == 2


async def test_401_is_permanent_after_one_request(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.default = Reply.error(401)
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert (caught.value.attempts, caught.value.retryable, caught.value.status) == (1, False, 401)
    assert "AuthenticationError" in caught.value.reason
    assert len(fake_openai.requests) == 1
    assert sleeps.waits == []


# Answers that are not plain text


async def test_content_filter_is_an_answer(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    fake_openai.script(Reply.content_filter())
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.finish_reason, done.attempts) == ("", "content_filter", 1)


@pytest.mark.parametrize(
    ("provider", "options", "constrained"),
    [
        ("litellm/openai/gpt-4o-mini", {}, True),  # litellm's model map says it supports schemas
        ("litellm/openai/fake-model", {"supports_json_schema": True}, True),
        ("litellm/openai/fake-model", {}, True),  # unknown to litellm: try, step down
        ("litellm/openai/fake-model", {"supports_json_schema": False}, False),
        ("litellm/openai/fake-model", {"structured_output": "prompt"}, False),
    ],
)
async def test_json_schema_becomes_response_format(
    fake_openai: FakeOpenAI,
    sleeps: RecordingSleep,
    provider: str,
    options: dict[str, Any],
    constrained: bool,
) -> None:
    settings = fake_settings(fake_openai, provider=provider, options=options)
    async with open_fake(settings, sleeps) as model:
        assert model.supports_json_schema is constrained
        await model.complete(HELLO, CallParams(json_schema=SCHEMA, schema_name="verdict"))
    [request] = fake_openai.requests
    if constrained:
        assert request.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": strict_subset(SCHEMA), "strict": True},
        }
        assert "supports_json_schema" not in request.body
    else:
        assert "response_format" not in request.body


# Opening


def test_missing_key_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    settings = ModelSettings(provider="litellm/openai/fake-model", api_key_env=KEY_ENV)
    with pytest.raises(ProviderUnavailable, match=KEY_ENV):
        open_model(settings)


def test_options_cannot_override_retries_or_key() -> None:
    settings = ModelSettings(provider="litellm/openai/gpt-4o-mini", options={"num_retries": 3})
    with pytest.raises(ValueError, match="num_retries"):
        open_model(settings)


def test_importing_the_adapter_does_not_import_litellm() -> None:
    code = (
        "import sys, mhsafeeval.providers, mhsafeeval.providers._litellm\n"
        "assert 'litellm' not in sys.modules, 'litellm imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# litellm's mock_response: no server at all


async def test_mock_response_needs_no_server(sleeps: RecordingSleep) -> None:
    settings = ModelSettings(provider="litellm/openai/gpt-4o-mini", options={"mock_response": "hi"})
    async with open_model(settings, sleep=sleeps, rng=random.Random(0)) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.finish_reason, done.attempts) == ("hi", "stop", 1)


async def test_mock_rate_limit_is_retried_then_fails(sleeps: RecordingSleep) -> None:
    settings = ModelSettings(
        provider="litellm/openai/gpt-4o-mini",
        max_attempts=3,
        options={"mock_response": "litellm.RateLimitError"},
    )
    async with open_model(settings, sleep=sleeps, rng=random.Random(0)) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert (caught.value.attempts, caught.value.retryable, caught.value.status) == (3, True, 429)
    assert len(sleeps.waits) == 2


# The key stays secret


def _chain(err: BaseException) -> list[BaseException]:
    """The exceptions a traceback would show: causes, and contexts not suppressed."""
    out: list[BaseException] = []
    current: BaseException | None = err
    while current is not None:
        out.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return out


async def test_api_key_never_in_errors_or_logs(
    fake_openai: FakeOpenAI,
    sleeps: RecordingSleep,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The server quotes the key back in its error messages, as some providers do.
    fake_openai.script(Reply.error(503, echo_key=True), Reply.error(401, echo_key=True))
    caplog.set_level(logging.DEBUG, logger="LiteLLM")  # even litellm's debug log (it masks keys)
    with structlog.testing.capture_logs() as logs:
        async with open_fake(fake_settings(fake_openai), sleeps) as model:
            with pytest.raises(ModelCallError) as caught:
                await model.complete(HELLO)

    err = caught.value
    assert (err.attempts, err.retryable) == (2, False)
    assert "[api key]" in err.reason  # the echoed key was there, and was scrubbed
    assert all(f"Bearer {KEY}" == r.headers["authorization"] for r in fake_openai.requests)
    assert any(entry["event"] == "provider.retry" for entry in logs)
    out, errors = capsys.readouterr()
    shown = [
        "".join(traceback.format_exception(err)),
        *(str(e) for e in _chain(err)),
        *(repr(e) for e in _chain(err)),
        repr(logs),
        caplog.text,
        out,
        errors,
    ]
    assert not [text for text in shown if KEY in text]


# Closing


async def test_aclose_twice_and_reopen_on_the_same_loop(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, litellm: Any
) -> None:
    settings = fake_settings(fake_openai)
    model = open_fake(settings, sleeps)
    inner = model.inner
    assert isinstance(inner, LiteLLMModel)
    await model.complete(HELLO)
    import openai  # here, not at collection: importing it is slow

    cached = litellm.in_memory_llm_clients_cache.cache_dict.values()
    clients = [c for c in cached if isinstance(c, openai.AsyncOpenAI)]
    assert clients, "litellm no longer caches its OpenAI client: revisit LiteLLMModel.aclose"
    await model.aclose()
    assert all(c.is_closed() for c in clients)
    await model.aclose()
    await inner.aclose()
    with pytest.raises(ModelCallError, match="closed"):
        await model.complete(HELLO)

    # litellm's client cache is process-wide: a model opened later must get fresh clients,
    # not the ones closed above.
    async with open_fake(settings, sleeps) as again:
        done = await again.complete(HELLO)
    assert (done.text, done.attempts) == ("hello", 1)


async def test_closing_one_model_spares_another_in_flight(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    first = open_fake(fake_settings(fake_openai), sleeps)
    second = open_fake(fake_settings(fake_openai), sleeps)  # same litellm client (same cache key)
    await first.complete(HELLO)
    fake_openai.script(Reply.chat("late").hold())
    answers: list[Completion] = []

    async def ask_second() -> None:
        answers.append(await second.complete(HELLO))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask_second)
        await anyio.to_thread.run_sync(fake_openai.wait_for_requests, 2)
        await first.aclose()  # must not close the client under second's request
        fake_openai.release()
    await second.aclose()
    [done] = answers
    assert (done.text, done.attempts) == ("late", 1)
    assert len(fake_openai.requests) == 2


async def test_aclose_without_calls() -> None:
    model = open_model(ModelSettings(provider="litellm/openai/gpt-4o-mini"))
    await model.aclose()
    await model.aclose()


# Pure parts


NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": "Thu, 01 Jan 2026 12:00:30 GMT"}, 30.0),
        ({"retry-after": "Thu, 01 Jan 2026 11:00:00 GMT"}, 0.0),  # in the past
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "nan"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


def _errors(litellm: Any) -> list[tuple[BaseException, type[Exception], int | None]]:
    common = {"model": "m", "llm_provider": "openai"}
    return [
        (litellm.ContextWindowExceededError("too long", **common), PermanentProviderError, 400),
        (litellm.ContentPolicyViolationError("blocked", **common), PermanentProviderError, 400),
        (litellm.UnsupportedParamsError("seed", **common), PermanentProviderError, 400),
        (litellm.NotFoundError("no model", **common), PermanentProviderError, 404),
        (litellm.APIError(403, "forbidden", **common), PermanentProviderError, 403),
        (litellm.APIError(409, "conflict", **common), TransientProviderError, 409),
        (litellm.APIConnectionError("reset", **common), TransientProviderError, 500),
        (litellm.Timeout("slow", **common), TransientProviderError, 408),
        (litellm.BadGatewayError("bad gateway", **common), TransientProviderError, 502),
        (ConnectionResetError("reset by peer"), TransientProviderError, None),
        (KeyError("surprise"), PermanentProviderError, None),
    ]


def test_classify_error_table(litellm: Any) -> None:
    for exc, kind, status in _errors(litellm):
        mapped = classify_error(exc, litellm, secret=KEY)
        assert (type(mapped), mapped.status) == (kind, status), repr(exc)
        assert type(exc).__name__ in str(mapped)


def test_classify_error_scrubs_the_key(litellm: Any) -> None:
    exc = litellm.AuthenticationError(f"Incorrect API key provided: {KEY}", "openai", "m")
    mapped = classify_error(exc, litellm, secret=KEY)
    assert KEY not in str(mapped)
    assert "[api key]" in str(mapped)


def test_strict_subset_drops_what_strict_modes_reject() -> None:
    from mhsafeeval.judges import VERDICT_SCHEMA

    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["format", "n", "tags"],
        "properties": {
            "format": {"type": "string", "maxLength": 10, "pattern": "^a"},
            "n": {"type": "integer", "minimum": 1, "maximum": 5, "enum": [1, 2, 3, 4, 5]},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 5},
        },
    }
    assert strict_subset(schema) == {
        "type": "object",
        "additionalProperties": False,
        "required": ["format", "n", "tags"],
        "properties": {
            "format": {"type": "string"},
            "n": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    text = json.dumps(strict_subset(VERDICT_SCHEMA))
    assert "maxLength" not in text and "maxItems" not in text
    assert strict_subset(VERDICT_SCHEMA)["required"] == VERDICT_SCHEMA["required"]


LLAMA_CPP_REJECTION = (
    'response_format type must be one of "text" or "json_object", but got: json_schema'
)


@pytest.mark.parametrize(
    ("rejected", "modes"),
    [
        (("json_schema",), ["json_schema", "json_object", "json_object"]),  # llama.cpp's server
        (("json_schema", "json_object"), ["json_schema", "json_object", None, None]),
    ],
    ids=["json_object-kept", "down-to-prompt"],
)
async def test_structured_output_steps_down_once_per_rejected_mode_and_remembers(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, rejected: tuple[str, ...], modes: list[Any]
) -> None:
    fake_openai.reject_response_format(
        Reply.error(500, message=LLAMA_CPP_REJECTION), kinds=rejected
    )
    fake_openai.default = Reply.chat('{"severity": 2}')
    settings = fake_settings(fake_openai, provider="litellm/openai/fake-model")
    params = CallParams(json_schema=SCHEMA, schema_name="verdict")
    async with open_fake(settings, sleeps) as model:
        first = await model.complete(HELLO, params)
        second = await model.complete(HELLO, params)
    assert first.text == second.text == '{"severity": 2}'
    sent = [(r.body.get("response_format") or {}).get("type") for r in fake_openai.requests]
    assert sent == modes  # each rejection once, never retried, remembered for the next call
    assert sleeps.waits == []
    json_object = [
        r for r in fake_openai.requests if sent[fake_openai.requests.index(r)] == "json_object"
    ]
    for request in json_object:  # the schema is stated in the system prompt instead
        [system] = [m for m in request.body["messages"] if m["role"] == "system"]
        assert '"severity"' in system["content"] and "JSON schema" in system["content"]


async def test_a_configured_structured_output_mode_is_where_it_starts(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    options = {"structured_output": "json_object"}
    settings = fake_settings(fake_openai, provider="litellm/openai/gpt-4o-mini", options=options)
    async with open_fake(settings, sleeps) as model:
        await model.complete(HELLO, CallParams(json_schema=SCHEMA, schema_name="verdict"))
    [request] = fake_openai.requests
    assert request.body["response_format"] == {"type": "json_object"}
