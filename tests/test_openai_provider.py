"""The ``openai/`` provider against the fake OpenAI-compatible server on loopback.

Calls go through ``open_model`` as a campaign's do: the provider makes one HTTP request per
attempt, :class:`ResilientClient` retries. Backoff waits are recorded, never slept. Every test
runs on asyncio (aiohttp) and trio (httpx), the two backends of the one HTTP stack
(``_transport.py``); the tests under "both backends" compare them.
"""

from __future__ import annotations

import gc
import json
import os
import random
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import RecordingSleep, cli
from mhsafeeval.cli import main
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    Connections,
    ModelCallError,
    ModelSettings,
    PermanentProviderError,
    ResilientClient,
    TransientProviderError,
    open_model,
    settings_problems,
)
from mhsafeeval.providers._openai import NO_KEY, OpenAIModel, OpenAIOptions
from mhsafeeval.providers._openai_compat import strict_subset
from mhsafeeval.providers._registry import provider_info
from mhsafeeval.providers._types import ProviderUnavailable
from mhsafeeval.testing import scripted_models
from mhsafeeval.testing._demo import demo_counselor

pytestmark = pytest.mark.anyio

KEY = "sk-mhs-openai-test-0123456789-SECRET"
ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "MHS_OPENAI_TEST_KEY"
HELLO = [ChatMessage("system", "You are terse."), ChatMessage("user", "hello")]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"severity": {"type": "integer", "minimum": 1}},
    "required": ["severity"],
    "additionalProperties": False,
}
VERDICT = CallParams(json_schema=SCHEMA, schema_name="verdict")
LLAMA_CPP_REJECTION = (
    'response_format type must be one of "text" or "json_object", but got: json_schema'
)


@pytest.fixture
def sleeps() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def fake_settings(server: FakeOpenAI, **changes: Any) -> ModelSettings:
    fields: dict[str, Any] = {
        "provider": "openai/fake-model",
        "api_base": f"{server.url}/v1",
        "api_key_env": KEY_ENV,
        "timeout": 5.0,
        "max_attempts": 3,
        **changes,
    }
    return ModelSettings(**fields)


def open_fake(
    settings: ModelSettings, sleeps: RecordingSleep, connections: Connections | None = None
) -> ResilientClient:
    return open_model(settings, sleep=sleeps, rng=random.Random(0), connections=connections)


def inner(model: ResilientClient) -> OpenAIModel:
    assert isinstance(model.inner, OpenAIModel)
    return model.inner


def sent_formats(server: FakeOpenAI) -> list[Any]:
    return [(r.body.get("response_format") or {}).get("type") for r in server.requests]


# -- answers --------------------------------------------------------------------------------


async def test_a_reply_maps_text_usage_id_and_model(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.script(Reply.chat("hello there", usage=(12, 3)))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.finish_reason) == ("hello there", "stop")
    assert (done.prompt_tokens, done.completion_tokens) == (12, 3)
    assert (done.provider_id, done.model, done.attempts) == ("chatcmpl-fake-1", "fake-model", 1)
    assert done.usd is None  # no prices in the table: unpriced
    [request] = fake_openai.requests
    assert request.path == "/v1/chat/completions"
    assert request.body == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hello"},
        ],
    }
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert sleeps.waits == []


async def test_sampling_of_the_call_and_of_the_table_is_sent(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    settings = fake_settings(fake_openai, temperature=0.0, max_tokens=9, seed=1, stop=("END",))
    async with open_fake(settings, sleeps) as model:
        await model.complete(HELLO)
        await model.complete(HELLO, CallParams(temperature=0.7, max_tokens=50, seed=7))
    first, second = (r.body for r in fake_openai.requests)
    assert (first["temperature"], first["max_tokens"], first["seed"], first["stop"]) == (
        0.0,
        9,
        1,
        ["END"],
    )
    assert (second["temperature"], second["max_tokens"], second["seed"]) == (0.7, 50, 7)


async def test_a_server_of_your_own_gets_the_placeholder_key(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    settings = fake_settings(fake_openai, api_key_env=None)
    async with open_fake(settings, sleeps) as model:
        await model.complete(HELLO)
    [request] = fake_openai.requests
    assert request.headers["authorization"] == f"Bearer {NO_KEY}"


async def test_options_headers_and_extra_body_reach_the_request(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHS_OPENAI_TEST_PROXY", "proxy-secret-value")
    options = {
        "extra_headers": {"X-Team": "safety"},
        "extra_headers_env": {"X-Proxy-Auth": "MHS_OPENAI_TEST_PROXY"},
        "extra_body": {"top_k": 20},
    }
    async with open_fake(fake_settings(fake_openai, options=options), sleeps) as model:
        await model.complete(HELLO, CallParams(temperature=0.5))
    [request] = fake_openai.requests
    assert request.headers["x-team"] == "safety"
    assert request.headers["x-proxy-auth"] == "proxy-secret-value"
    assert (request.body["top_k"], request.body["temperature"]) == (20, 0.5)


@pytest.mark.parametrize(
    ("reply", "text", "finish"),
    [
        (Reply.content_filter(), "", "content_filter"),
        (Reply(text=None, finish_reason="length"), "", "length"),
    ],
    ids=["content-filter", "length"],
)
async def test_null_content_filtered_or_cut_is_an_empty_answer(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, reply: Reply, text: str, finish: str
) -> None:
    fake_openai.script(reply)
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.finish_reason, done.attempts) == (text, finish, 1)


@pytest.mark.parametrize(
    "fault",
    [Reply.no_choices(), Reply.malformed(), Reply(text=None)],
    ids=["empty-choices", "malformed-json", "null-content"],
)
async def test_broken_replies_are_transient(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, fault: Reply
) -> None:
    fake_openai.script(fault, Reply.chat("ok"))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.attempts) == ("ok", 2)
    assert len(fake_openai.requests) == 2


async def test_prices_from_the_table(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    fake_openai.script(Reply.chat("hi", usage=(1000, 500)))
    options = {"usd_per_million_prompt_tokens": 0.15, "usd_per_million_completion_tokens": 0.6}
    async with open_fake(fake_settings(fake_openai, options=options), sleeps) as model:
        done = await model.complete(HELLO)
    assert done.usd == pytest.approx((1000 * 0.15 + 500 * 0.6) / 1e6)
    free = Completion(text="", finish_reason="stop", prompt_tokens=10, completion_tokens=10)
    assert inner(model).price(free) == pytest.approx(10 * (0.15 + 0.6) / 1e6)


# -- structured output ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "json_schema", "json_object", "prompt"])
async def test_each_structured_output_mode(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, mode: str
) -> None:
    fake_openai.default = Reply.chat('{"severity": 2}')
    settings = fake_settings(fake_openai, options={"structured_output": mode})
    async with open_fake(settings, sleeps) as model:
        assert model.supports_json_schema is (mode in ("auto", "json_schema"))
        done = await model.complete(HELLO, VERDICT)
    assert done.text == '{"severity": 2}'
    [request] = fake_openai.requests
    [system] = [m["content"] for m in request.body["messages"] if m["role"] == "system"]
    if mode in ("auto", "json_schema"):
        assert request.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": strict_subset(SCHEMA), "strict": True},
        }
        assert system == "You are terse."
    elif mode == "json_object":
        assert request.body["response_format"] == {"type": "json_object"}
        assert '"severity"' in system and "JSON schema" in system
    else:
        assert "response_format" not in request.body


@pytest.mark.parametrize(
    ("rejected", "modes"),
    [
        (("json_schema",), ["json_schema", "json_object", "json_object"]),  # llama.cpp's server
        (("json_schema", "json_object"), ["json_schema", "json_object", None, None]),
    ],
    ids=["json_object-kept", "down-to-prompt"],
)
async def test_a_refused_mode_steps_down_once_and_is_remembered(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, rejected: tuple[str, ...], modes: list[Any]
) -> None:
    fake_openai.reject_response_format(
        Reply.error(500, message=LLAMA_CPP_REJECTION), kinds=rejected
    )
    fake_openai.default = Reply.chat('{"severity": 2}')
    with structlog.testing.capture_logs() as logs:
        async with open_fake(fake_settings(fake_openai), sleeps) as model:
            first = await model.complete(HELLO, VERDICT)
            second = await model.complete(HELLO, VERDICT)
    assert first.text == second.text == '{"severity": 2}'
    assert (first.attempts, second.attempts) == (1, 1)  # a step down is no retry
    assert sent_formats(fake_openai) == modes
    assert sleeps.waits == []
    steps = [e for e in logs if e["event"] == "provider.structured_output_mode"]
    assert [(e["rejected"], e["now"]) for e in steps] == [
        ("json_schema", "json_object"),
        ("json_object", "prompt"),
    ][: len(rejected)]


async def test_a_500_that_does_not_name_the_format_is_retried_not_stepped_down(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.script(Reply.error(500, message="upstream exploded"), Reply.chat('{"severity": 1}'))
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        done = await model.complete(HELLO, VERDICT)
    assert done.attempts == 2
    assert sent_formats(fake_openai) == ["json_schema", "json_schema"]


# -- failures: one request per attempt ------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "wait"),
    [({"Retry-After": "7"}, 7.0), ({"retry-after-ms": "2500"}, 2.5)],
    ids=["retry-after", "retry-after-ms"],
)
async def test_429_is_transient_with_the_servers_wait(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, headers: dict[str, str], wait: float
) -> None:
    fake_openai.script(Reply.error(429, headers=headers))
    model = open_fake(fake_settings(fake_openai), sleeps)
    with pytest.raises(TransientProviderError) as caught:
        await inner(model).complete(HELLO)
    assert (caught.value.status, caught.value.retry_after) == (429, wait)
    assert "RateLimitError" in str(caught.value)

    await model.aclose()
    fake_openai.script(Reply.error(429, headers=headers), Reply.chat("ok"))
    settings = fake_settings(fake_openai, backoff_initial=0.1, backoff_max=0.1)
    async with open_fake(settings, sleeps) as model:
        done = await model.complete(HELLO)
    assert (done.text, done.attempts) == ("ok", 2)
    assert sleeps.waits == [wait]


@pytest.mark.parametrize(("status", "name"), [(401, "AuthenticationError"), (404, "NotFound")])
async def test_401_and_404_are_permanent_after_one_request(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, status: int, name: str
) -> None:
    fake_openai.default = Reply.error(status)
    async with open_fake(fake_settings(fake_openai), sleeps) as model:
        with pytest.raises(PermanentProviderError) as refused:
            await inner(model).complete(HELLO)
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert refused.value.status == status
    err = caught.value
    assert (err.attempts, err.retryable, err.status) == (1, False, status)
    assert name in err.reason
    assert len(fake_openai.requests) == 2
    assert sleeps.waits == []


async def test_a_dropped_connection_is_transient(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.script(Reply.drop())
    model = open_fake(fake_settings(fake_openai), sleeps)
    with pytest.raises(TransientProviderError, match="disconnected"):
        await inner(model).complete(HELLO)
    fake_openai.script(Reply.drop(), Reply.chat("ok"))
    done = await model.complete(HELLO)
    assert (done.text, done.attempts) == ("ok", 2)
    assert len(fake_openai.requests) == 3
    await model.aclose()


async def test_a_slow_server_times_out_each_attempt(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    fake_openai.default = Reply.chat().after(60)  # cut short when the server stops
    settings = fake_settings(fake_openai, timeout=0.5, max_attempts=2)
    async with open_fake(settings, sleeps) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert (caught.value.attempts, caught.value.retryable) == (2, True)
    assert "time" in caught.value.reason.lower()
    assert len(fake_openai.requests) == 2


async def test_one_request_per_attempt(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    fake_openai.default = Reply.error(503)
    async with open_fake(fake_settings(fake_openai, max_attempts=3), sleeps) as model:
        with pytest.raises(ModelCallError) as caught:
            await model.complete(HELLO)
    assert (caught.value.attempts, caught.value.retryable, caught.value.status) == (3, True, 503)
    assert len(fake_openai.requests) == 3  # nothing retries below ResilientClient
    assert len(sleeps.waits) == 2


def _chain(err: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = err
    while current is not None:
        out.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return out


async def test_the_key_is_never_in_an_error_or_log(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, capsys: pytest.CaptureFixture[str]
) -> None:
    # The server quotes the key back in its error messages, as some providers do.
    fake_openai.script(Reply.error(503, echo_key=True), Reply.error(401, echo_key=True))
    with structlog.testing.capture_logs() as logs:
        async with open_fake(fake_settings(fake_openai), sleeps) as model:
            with pytest.raises(ModelCallError) as caught:
                await model.complete(HELLO)
    err = caught.value
    assert (err.attempts, err.retryable) == (2, False)
    assert "[api key]" in err.reason  # the echoed key was there, and was scrubbed
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in fake_openai.requests)
    out, errors = capsys.readouterr()
    shown = [
        "".join(traceback.format_exception(err)),
        *(str(e) for e in _chain(err)),
        *(repr(e) for e in _chain(err)),
        repr(logs),
        out,
        errors,
    ]
    assert not [text for text in shown if KEY in text]


# -- both backends -------------------------------------------------------------------------


BACKENDS = ("asyncio", "trio")


def test_both_backends_send_the_same_request(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHS_OPENAI_TEST_PROXY", "proxy-value")
    options = {
        "extra_headers": {"X-Team": "safety"},
        "extra_headers_env": {"X-Proxy-Auth": "MHS_OPENAI_TEST_PROXY"},
        "extra_body": {"top_k": 20},
    }

    async def call() -> str:
        async with open_fake(fake_settings(fake_openai, options=options), sleeps) as model:
            done = await model.complete(HELLO, CallParams(temperature=0.5, json_schema=SCHEMA))
        return done.text

    assert [anyio.run(call, backend=backend) for backend in BACKENDS] == ["hello", "hello"]
    on_asyncio, on_trio = fake_openai.requests
    assert (on_asyncio.method, on_asyncio.path) == ("POST", "/v1/chat/completions")
    assert (on_asyncio.method, on_asyncio.path, on_asyncio.body) == (
        on_trio.method,
        on_trio.path,
        on_trio.body,
    )
    for header in ("authorization", "content-type", "accept", "user-agent", "x-team"):
        assert on_asyncio.headers[header] == on_trio.headers[header], header
    assert on_asyncio.headers["authorization"] == f"Bearer {KEY}"
    assert on_asyncio.headers["x-proxy-auth"] == on_trio.headers["x-proxy-auth"] == "proxy-value"
    assert on_asyncio.headers["user-agent"].startswith("mhsafeeval/")


_ANSWERS = {
    "429": (Reply.error(429, headers={"Retry-After": "7"}), TransientProviderError, 429, 7.0),
    "503": (Reply.error(503), TransientProviderError, 503, None),
    "401": (Reply.error(401), PermanentProviderError, 401, None),
    "404": (Reply.error(404), PermanentProviderError, 404, None),
    "drop": (Reply.drop(), TransientProviderError, None, None),
    "malformed": (Reply.malformed(), TransientProviderError, None, None),
}


@pytest.mark.parametrize("answer", list(_ANSWERS))
def test_both_backends_sort_an_answer_the_same(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, answer: str
) -> None:
    reply, kind, status, wait = _ANSWERS[answer]

    async def call() -> BaseException:
        fake_openai.script(reply)
        model = open_fake(fake_settings(fake_openai), sleeps)
        try:
            with pytest.raises(kind) as caught:
                await inner(model).complete(HELLO)
        finally:
            await model.aclose()
        return caught.value

    on_asyncio, on_trio = (anyio.run(call, backend=backend) for backend in BACKENDS)
    assert type(on_asyncio) is type(on_trio)
    for got in (on_asyncio, on_trio):
        assert (getattr(got, "status", None), getattr(got, "retry_after", None)) == (status, wait)
    if status is not None:  # the SDK's exception name and the status, on both
        assert str(on_asyncio).split(" - ")[0] == str(on_trio).split(" - ")[0]


async def test_a_timeout_names_the_limit(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    fake_openai.default = Reply.chat().after(60)
    model = open_fake(fake_settings(fake_openai, timeout=0.3), sleeps)
    with pytest.raises(TransientProviderError, match=r"timed out after 0.3 s"):
        await inner(model).complete(HELLO)
    await model.aclose()


async def test_no_server_is_a_transient_connection_error(sleeps: RecordingSleep) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ModelSettings(
        provider="openai/fake-model", api_base=f"http://127.0.0.1:{port}/v1",
        timeout=5.0, max_attempts=1,
    )  # fmt: skip
    model = open_fake(settings, sleeps)
    with pytest.raises(TransientProviderError, match=r"(?i)connect"):
        await inner(model).complete(HELLO)
    await model.aclose()


async def test_a_redirect_is_not_followed(fake_openai: FakeOpenAI, sleeps: RecordingSleep) -> None:
    """A POST is never sent on to where a server points: the table names the wrong address."""
    fake_openai.script(Reply.error(308, headers={"Location": "http://127.0.0.1:9/v1/chat"}))
    model = open_fake(fake_settings(fake_openai), sleeps)
    with pytest.raises(PermanentProviderError) as caught:
        await inner(model).complete(HELLO)
    assert caught.value.status == 308
    assert len(fake_openai.requests) == 1
    await model.aclose()


@pytest.mark.parametrize("transport", ["auto", "aiohttp"])
async def test_the_old_transport_names_still_read_and_mean_the_one_stack(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, transport: str
) -> None:
    settings = fake_settings(fake_openai, options={"transport": transport})
    assert settings_problems(settings) == []
    async with open_fake(settings, sleeps) as model:
        assert (await model.complete(HELLO)).text == "hello"


def test_the_sdk_transport_is_refused_by_check_in_one_line(tmp_path: Path) -> None:
    settings = ModelSettings(provider="openai/m", options={"transport": "sdk"})
    [(field, reason)] = settings_problems(settings)
    assert field == "options.transport"
    assert "removed" in reason and "delete the option" in reason
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + '\n[counselors.gpt]\nprovider = "openai/m"\napi_base = "http://127.0.0.1:9/v1"\n'
        + 'options = { transport = "sdk" }\n'
    )
    checked = cli("check", str(config))
    assert checked.returncode == 2, checked.stderr
    [line] = checked.stderr.strip().splitlines()
    assert "counselors.gpt.options.transport" in line and '"sdk" was removed' in line, line


# -- one client per endpoint ----------------------------------------------------------------


async def test_tables_on_one_endpoint_share_one_client_sized_to_the_widest(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    shared = Connections()
    narrow = open_fake(fake_settings(fake_openai, max_concurrency=2), sleeps, shared)
    wide = open_fake(fake_settings(fake_openai, max_concurrency=6, temperature=1.0), sleeps, shared)
    other = open_fake(fake_settings(fake_openai, provider="openai/other"), sleeps, shared)
    await narrow.complete(HELLO)
    await wide.complete(HELLO)
    assert inner(narrow).endpoint is inner(wide).endpoint is inner(other).endpoint
    client = inner(narrow).endpoint.session
    assert client is not None
    # One model (two tables, one limit of 6) plus another model (its own limit of 4).
    assert inner(narrow).endpoint.pool_size == 6 + 4
    await other.complete(HELLO)
    assert inner(other).endpoint.session is client
    for model in (narrow, wide, other):
        await model.aclose()
    assert client.is_closed()


async def test_the_pool_limits_requests_in_flight(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    model = inner(open_fake(fake_settings(fake_openai, max_concurrency=2), sleeps))
    fake_openai.default = Reply.chat("held").hold()
    answers: list[Completion] = []

    async def ask() -> None:
        answers.append(await model.complete(HELLO))

    async with anyio.create_task_group() as tg:
        for _ in range(4):  # the provider alone: no ResilientClient limiter in the way
            tg.start_soon(ask)
        await anyio.to_thread.run_sync(fake_openai.wait_for_requests, 2)
        await anyio.sleep(0.3)  # time for a third request to arrive, were the pool wider
        assert len(fake_openai.requests) == 2
        fake_openai.release()
    assert [a.text for a in answers] == ["held"] * 4
    await model.aclose()


async def test_a_wider_table_opened_later_widens_the_pool_safely(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    first = open_fake(fake_settings(fake_openai, max_concurrency=2), sleeps)
    await first.complete(HELLO)
    old = inner(first).endpoint.session
    assert old is not None
    fake_openai.script(Reply.chat("late").hold())
    answers: list[Completion] = []

    async def ask_first() -> None:
        answers.append(await first.complete(HELLO))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask_first)
        await anyio.to_thread.run_sync(fake_openai.wait_for_requests, 2)
        later = open_fake(fake_settings(fake_openai, max_concurrency=8, seed=3), sleeps)
        done = await later.complete(HELLO)  # a new, wider session; the old one is busy
        new = inner(later).endpoint.session
        assert new is not old and inner(later).endpoint.pool_size == 8
        assert old.is_closed()  # it takes no new request, and finishes the one it has
        fake_openai.release()
    assert [(a.text, a.attempts) for a in answers] == [("late", 1)] and done.text == "hello"
    await first.aclose()
    await later.aclose()
    assert new is not None and new.is_closed()


async def test_closing_one_model_spares_the_other_in_flight(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep
) -> None:
    first = open_fake(fake_settings(fake_openai), sleeps)
    second = open_fake(fake_settings(fake_openai, temperature=0.3), sleeps)
    await first.complete(HELLO)
    client = inner(first).endpoint.session
    fake_openai.script(Reply.chat("late").hold())
    answers: list[Completion] = []

    async def ask_second() -> None:
        answers.append(await second.complete(HELLO))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask_second)
        await anyio.to_thread.run_sync(fake_openai.wait_for_requests, 2)
        await first.aclose()  # must not close the client under second's request
        fake_openai.release()
    assert [(a.text, a.attempts) for a in answers] == [("late", 1)]
    assert client is not None and not client.is_closed()
    assert (await second.complete(HELLO)).text == "hello"
    await second.aclose()
    assert client.is_closed()
    await second.aclose()  # idempotent
    await inner(second).aclose()
    with pytest.raises(ModelCallError, match="closed"):
        await second.complete(HELLO)


# The client left on the first loop cannot be closed from the second: aiohttp says so when it
# is collected (below, within this test).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
def test_a_model_left_open_works_on_the_next_event_loop(
    fake_openai: FakeOpenAI, sleeps: RecordingSleep, anyio_backend: str
) -> None:
    model = open_fake(fake_settings(fake_openai), sleeps)
    texts = [
        anyio.run(model.complete, HELLO, backend=anyio_backend).text,
        anyio.run(model.complete, HELLO, backend=anyio_backend).text,
    ]
    assert texts == ["hello", "hello"]
    anyio.run(model.aclose, backend=anyio_backend)
    gc.collect()


# -- settings -------------------------------------------------------------------------------


def test_declares_its_options_and_a_check() -> None:
    info = provider_info("openai")
    assert info.options is OpenAIOptions
    assert info.check is not None


@pytest.mark.parametrize(
    ("options", "where", "reason"),
    [
        ({"structured_outputs": "prompt"}, "options.structured_outputs", "unknown option"),
        ({"structured_output": "grammar"}, "options.structured_output", "invalid enum"),
        ({"transport": "fast"}, "options.transport", "invalid enum"),
        ({"usd_per_million_prompt_tokens": -1.0}, "options.usd_per_million_prompt_tokens", ">="),
        (
            {"usd_per_million_prompt_tokens": 0.15},
            "options.usd_per_million_completion_tokens",
            "both",
        ),
        ({"extra_body": {"model": "x"}}, "options.extra_body.model", "set by mhsafeeval"),
        ({"extra_headers": {"X-A": 1}}, "options.extra_headers[...]", "expected str"),
    ],
)
def test_settings_problems_name_the_option(
    options: dict[str, Any], where: str, reason: str
) -> None:
    settings = ModelSettings(provider="openai/m", api_base="http://127.0.0.1:9/v1", options=options)
    problems = settings_problems(settings)
    assert [field for field, _ in problems] == [where], problems
    assert reason in problems[0][1]
    with pytest.raises(ProviderUnavailable) as caught:
        open_model(settings)
    assert where in str(caught.value)


def test_openai_itself_needs_its_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """OpenAI's key, read from OPENAI_API_KEY when the table names none, is like any named
    key: unset, ``check`` warns (exit 0: a config is checked where secrets are not), ``run``
    refuses before anything is written (exit 2), and opening the model raises."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings = ModelSettings(provider="openai/gpt-4o-mini")
    assert settings_problems(settings) == []  # the table itself is right
    with pytest.raises(ProviderUnavailable, match="OPENAI_API_KEY"):
        open_model(settings)
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + '\n[counselors.gpt]\nprovider = "openai/gpt-4o-mini"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    checked = cli("check", str(config), env=env)
    assert checked.returncode == 0, checked.stderr
    assert "counselors.gpt.api_key_env: the environment variable OPENAI_API_KEY" in checked.stderr
    db = tmp_path / "c.db"
    refused = cli("run", str(config), "--db", str(db), env=env)
    assert refused.returncode == 2, refused.stderr
    assert "OPENAI_API_KEY" in refused.stderr and not db.exists()
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert settings_problems(settings) == []
    model = open_model(settings)
    assert model.connection_key == "gpt-4o-mini@https://api.openai.com/v1"


def test_a_named_key_variable_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    settings = ModelSettings(provider="openai/m", api_key_env=KEY_ENV)
    with pytest.raises(ProviderUnavailable, match=KEY_ENV):
        open_model(settings)


def test_importing_mhsafeeval_does_not_import_openai() -> None:
    code = (
        "import sys, mhsafeeval, mhsafeeval.providers\n"
        "import mhsafeeval.providers._openai\n"
        "assert 'openai' not in sys.modules, 'openai imported eagerly'\n"
        "assert 'litellm' not in sys.modules, 'litellm imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_calls_never_import_the_sdk(fake_openai: FakeOpenAI, backend: str) -> None:
    # openai/ needs no SDK at all (it is not a dependency): errors are sorted by status.
    fake_openai.script(Reply.error(429), Reply.chat("fine"))
    code = (
        "import sys, anyio\n"
        "from mhsafeeval.providers import ModelSettings, ChatMessage, open_model\n"
        "async def main():\n"
        f"    settings = ModelSettings(provider='openai/m', api_base='{fake_openai.url}/v1',\n"
        "                             max_attempts=2, backoff_initial=0.01, backoff_max=0.01)\n"
        "    model = open_model(settings)\n"
        "    done = await model.complete([ChatMessage('user', 'hi')])\n"
        "    await model.aclose()\n"
        "    assert (done.text, done.attempts) == ('fine', 2), done\n"
        f"anyio.run(main, backend={backend!r})\n"
        "assert 'openai' not in sys.modules, 'the SDK was imported'\n"
        "assert 'litellm' not in sys.modules, 'litellm was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
    assert len(fake_openai.requests) == 2


# -- a campaign whose counselor is openai/ --------------------------------------------------


def counselor_persona(body: Any) -> str:
    messages = [ChatMessage(m["role"], m["content"]) for m in body["messages"]]
    return demo_counselor(messages, CallParams(seed=body.get("seed")))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_a_campaign_with_an_openai_counselor(
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    capsys: pytest.CaptureFixture[str],
    anyio_backend: str,
) -> None:
    fake_openai.default = Reply.computed(counselor_persona)
    config = tmp_path / "c.toml"
    config.write_text(
        f"""
[campaign]
name = "openai-counselor"
seed = 5
max_turns = 2
max_attempts = 2
conversations_per_profile = 1
concurrency = 2
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]
{scripted_models(counselors={})}
[counselors.bot]
provider = "openai/counselor-x"
api_base = "{fake_openai.url}/v1"
max_attempts = 1
options = {{ usd_per_million_prompt_tokens = 1.0, usd_per_million_completion_tokens = 2.0 }}
"""
    )
    db = tmp_path / "c.db"
    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "2/2 conversations finished (0 failed)" in err, err
    calls = fake_openai.requests
    assert calls and all(r.body["model"] == "counselor-x" for r in calls)
    assert main(["report", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    bot = report["openai-counselor"]["models"]["bot"]
    assert bot["counselor_calls"] == len(calls)
    usage = bot["usage"]["counselor"]
    tokens = [11 * len(calls), 7 * len(calls)]  # the fake server's usage per reply
    assert usage["by_model"] == {"counselor-x": tokens}
    assert usage["usd"] == pytest.approx((tokens[0] * 1.0 + tokens[1] * 2.0) / 1e6)
