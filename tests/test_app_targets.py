"""Counselors that are apps: ``http/`` (an aiohttp app on loopback) and ``python/`` (a callable).

The HTTP apps run in a thread of their own with their own event loop, so the tests (and the
campaigns they run) may use any event loop. Backoff waits are recorded, never slept.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from aiohttp import web

from helpers import RecordingSleep, stored
from mhsafeeval.agents import CounselorAgent
from mhsafeeval.agents._counselor import session_id
from mhsafeeval.campaign import _counselor_prompts
from mhsafeeval.cli import main
from mhsafeeval.config import parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import ClientUtterance, CounselorReply
from mhsafeeval.plan import preflight
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ModelSettings,
    PermanentProviderError,
    ResilientClient,
    TransientProviderError,
    open_model,
    provider_info,
    settings_problems,
)
from mhsafeeval.providers._python import PythonApp
from mhsafeeval.storage import SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHAT = [
    ChatMessage("user", "I lost my job."),
    ChatMessage("assistant", "That sounds hard."),
    ChatMessage("user", "I feel useless."),
]
ROLES = """
[models.client]
provider = "scripted/demo-client"
[models.mutator]
provider = "scripted/demo-mutator"
[models.judge]
provider = "scripted/demo-judge"
[models.refiner]
provider = "scripted/demo-refiner"
"""


class LoopbackApp:
    """An aiohttp app on 127.0.0.1 (a free port), served from a thread with its own loop.

    ``requests`` records each request's JSON body and headers, in arrival order.
    """

    def __init__(self, handler: Handler) -> None:
        self.requests: list[tuple[Any, dict[str, str]]] = []
        self._handler = handler
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _record(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.requests.append((body, dict(request.headers)))
        return await self._handler(request)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._record)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def __enter__(self) -> LoopbackApp:
        self._thread.start()
        assert self._ready.wait(10), "the loopback app did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def stateful_app() -> tuple[Handler, dict[str, list[str]]]:
    """A bot that keeps each session's history itself, reading only the latest message."""
    sessions: dict[str, list[str]] = {}

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        history = sessions.setdefault(body["session"], [])
        history.append(body["message"])
        reply = f"({len(history)}) I hear that {len(body['message'])} characters weigh on you."
        usage = {"prompt_tokens": sum(map(len, history)), "completion_tokens": 9}
        return web.json_response({"reply": {"text": reply}, "usage": usage})

    return chat, sessions


def scripted_app(*answers: web.Response) -> Handler:
    """A handler answering with ``answers`` in order (the last one again once they run out)."""
    queue = list(answers)

    async def handle(request: web.Request) -> web.Response:
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        # a fresh copy each time: aiohttp sends a response object once
        return web.Response(body=answer.body, status=answer.status, headers=answer.headers)

    return handle


def openai_shaped(text: str) -> web.Response:
    return web.json_response({"choices": [{"message": {"role": "assistant", "content": text}}]})


def http_settings(url: str, **options: Any) -> ModelSettings:
    table: dict[str, Any] = {"url": url, "reply_path": "choices[0].message.content"}
    return ModelSettings(
        provider="http/app", max_attempts=3, timeout=10, options={**table, **options}
    )


def opened(settings: ModelSettings, sleeps: RecordingSleep) -> ResilientClient:
    return open_model(settings, sleep=sleeps, rng=random.Random(0))


@pytest.fixture
def sleeps() -> RecordingSleep:
    return RecordingSleep()


# -- http/: the request, the reply, the session ---------------------------------------------


@pytest.mark.anyio
async def test_http_app_gets_the_chat_in_openai_shape_and_its_reply_is_read_by_path(
    sleeps: RecordingSleep,
) -> None:
    with LoopbackApp(scripted_app(openai_shaped("You are not useless."))) as app:
        async with opened(http_settings(f"{app.url}/v1/chat"), sleeps) as model:
            done = await model.complete(CHAT)
    assert done.text == "You are not useless."
    assert done.attempts == 1 and done.model == "http/app"
    [(body, headers)] = app.requests
    assert body == {"messages": [{"role": m.role, "content": m.content} for m in CHAT]}
    assert headers["Content-Type"] == "application/json"


@pytest.mark.anyio
async def test_every_placeholder_is_filled_and_the_session_goes_in_url_and_header(
    sleeps: RecordingSleep,
) -> None:
    body = {
        "input": {"text": "$message", "past": "$history"},
        "all": "$messages",
        "prompt": "$system",
        "sid": "$session_id",
        "literal": "$$message",
        "n": 3,
    }
    with LoopbackApp(scripted_app(web.json_response({"out": ["a", "the reply"]}))) as app:
        settings = http_settings(
            f"{app.url}/sessions/$session_id/turns",
            body=body,
            reply_path="out[-1]",
            session_header="X-Session-Id",
            method="PUT",
        )
        chat = [ChatMessage("system", "Be kind."), *CHAT]
        async with opened(settings, sleeps) as model:
            done = await model.complete(chat, CallParams(session_id="mhs-a/b"))
    assert done.text == "the reply"
    [(sent, headers)] = app.requests
    assert sent == {
        "input": {
            "text": "I feel useless.",
            "past": [{"role": m.role, "content": m.content} for m in CHAT[:2]],
        },
        "all": [{"role": m.role, "content": m.content} for m in chat],
        "prompt": "Be kind.",
        "sid": "mhs-a/b",
        "literal": "$message",
        "n": 3,
    }
    assert headers["X-Session-Id"] == "mhs-a/b"


@pytest.mark.anyio
async def test_header_values_come_from_the_environment_by_name(
    sleeps: RecordingSleep, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHS_APP_TEST_AUTH", "Token abc-123")
    with LoopbackApp(scripted_app(openai_shaped("ok"))) as app:
        settings = http_settings(
            app.url,
            extra_headers={"X-Client": "mhs"},
            extra_headers_env={"X-Auth": "MHS_APP_TEST_AUTH"},
        )
        async with opened(settings, sleeps) as model:
            await model.complete(CHAT)
    headers = app.requests[0][1]
    assert headers["X-Auth"] == "Token abc-123" and headers["X-Client"] == "mhs"
    monkeypatch.delenv("MHS_APP_TEST_AUTH")
    with pytest.raises(Exception, match="MHS_APP_TEST_AUTH"):
        open_model(settings)


@pytest.mark.anyio
async def test_usage_is_read_where_usage_path_points(sleeps: RecordingSleep) -> None:
    answer = {"reply": "hi", "meta": {"tokens": {"prompt_tokens": 40, "completion_tokens": 5}}}
    with LoopbackApp(scripted_app(web.json_response(answer))) as app:
        settings = http_settings(app.url, reply_path="reply", usage_path="meta.tokens")
        async with opened(settings, sleeps) as model:
            done = await model.complete(CHAT)
    assert (done.prompt_tokens, done.completion_tokens) == (40, 5)


# -- http/: what is retried -------------------------------------------------------------------


@pytest.mark.anyio
async def test_429_is_retried_after_its_retry_after_and_5xx_is_retried(
    sleeps: RecordingSleep,
) -> None:
    answers = (
        web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "7"}),
        web.Response(status=502, text="bad gateway"),
        openai_shaped("finally"),
    )
    with LoopbackApp(scripted_app(*answers)) as app:
        async with opened(http_settings(app.url), sleeps) as model:
            done = await model.complete(CHAT)
    assert done.text == "finally" and done.attempts == 3
    assert len(app.requests) == 3
    assert sleeps.waits[0] >= 7  # Retry-After honoured


@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_4xx_is_not_retried(sleeps: RecordingSleep, status: int) -> None:
    with LoopbackApp(scripted_app(web.Response(status=status, text="no"))) as app:
        async with opened(http_settings(app.url), sleeps) as model:
            with pytest.raises(ModelCallError) as info:
                await model.complete(CHAT)
    assert info.value.attempts == 1 and not info.value.retryable
    assert info.value.status == status and len(app.requests) == 1


@pytest.mark.anyio
async def test_an_answer_without_text_at_the_reply_path_is_permanent_and_says_where(
    sleeps: RecordingSleep,
) -> None:
    with LoopbackApp(scripted_app(web.json_response({"answer": "hi"}))) as app:
        async with opened(http_settings(app.url), sleeps) as model:
            with pytest.raises(ModelCallError) as info:
                await model.complete(CHAT)
    assert info.value.attempts == 1
    assert "reply_path 'choices[0].message.content' found nothing" in info.value.reason
    assert "['answer']" in info.value.reason


@pytest.mark.anyio
async def test_an_answer_that_is_not_json_and_a_refused_connection_are_retried(
    sleeps: RecordingSleep,
) -> None:
    with LoopbackApp(scripted_app(web.Response(text="<html>oops</html>"))) as app:
        async with opened(http_settings(app.url), sleeps) as model:
            with pytest.raises(ModelCallError) as info:
                await model.complete(CHAT)
        closed = app.url
    assert info.value.attempts == 3 and info.value.retryable
    assert "not JSON" in info.value.reason
    async with opened(http_settings(closed), sleeps) as model:  # nothing listens there now
        with pytest.raises(ModelCallError) as refused:
            await model.complete(CHAT)
    assert refused.value.attempts == 3 and refused.value.retryable


@pytest.mark.anyio
async def test_max_concurrency_bounds_the_requests_in_flight(sleeps: RecordingSleep) -> None:
    in_flight, most = 0, 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return openai_shaped("ok")

    with LoopbackApp(slow) as app:
        settings = ModelSettings(
            provider="http/app",
            max_concurrency=2,
            options={"url": app.url, "reply_path": "choices[0].message.content"},
        )
        async with opened(settings, sleeps) as model, anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(model.complete, CHAT)
    assert len(app.requests) == 8 and most == 2


# -- http/: config errors, found without calling anything ------------------------------------


@pytest.mark.parametrize(
    ("options", "field", "reason"),
    [
        ({"reply_path": "reply"}, "options.url", "missing required field"),
        ({"url": "ftp://x", "reply_path": "r"}, "options.url", "http(s) URL"),
        ({"url": "http://h/$turn", "reply_path": "r"}, "options.url", "only $session_id"),
        ({"url": "http://h", "reply_path": "a[?"}, "options.reply_path", "not a JMESPath"),
        (
            {"url": "http://h", "reply_path": "r", "body": {"q": {"x": "$mesage"}}},
            "options.body.q.x",
            "unknown placeholder $mesage",
        ),
        (
            {"url": "http://h", "reply_path": "r", "body": {"sid": "$session_id"}},
            "options.body",
            "never sends the client's words",
        ),
        ({"url": "http://h", "reply_path": "r", "method": "GET"}, "options.method", "invalid enum"),
        ({"url": "http://h", "reply_path": "r", "timeout_s": 3}, "options.timeout_s", "unknown"),
    ],
)
def test_http_settings_problems_name_the_key(
    options: dict[str, Any], field: str, reason: str
) -> None:
    [(got_field, got_reason), *_] = settings_problems(
        ModelSettings(provider="http/app", options=options)
    )
    assert got_field == field and reason in got_reason


def _config(tmp_path: Path, counselor: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    text = '[campaign]\nname = "apps"\nmax_turns = 2\nmax_attempts = 2\n'
    text += 'profile_ids = ["depression-laid-off-engineer", "grief-widower"]\n'
    path.write_text(text + ROLES + counselor)
    return path


def test_check_reads_an_http_config_without_calling_the_app_and_exits_2_on_a_bad_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _config(
        tmp_path,
        '[counselors.bot]\nprovider = "http/bot"\n'
        '[counselors.bot.options]\nurl = "http://127.0.0.1:9/chat"\nreply_path = "reply"\n',
    )
    assert main(["check", str(good)]) == 0  # nothing listens on port 9: nothing was called
    assert main(["check", str(ROOT / "examples" / "http_app.toml")]) == 0
    bad = _config(
        tmp_path,
        '[counselors.bot]\nprovider = "http/bot"\n'
        '[counselors.bot.options]\nurl = "http://127.0.0.1:9/chat"\nreply_path = "reply[?"\n',
        "bad.toml",
    )
    capsys.readouterr()
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "counselors.bot.options.reply_path" in err


# -- http/: a whole campaign against a stateful app ------------------------------------------


STATEFUL = """
[counselors.bot]
provider = "http/bot"
[counselors.bot.options]
url = "{url}/chat"
body = {{ session = "$session_id", message = "$message" }}
reply_path = "reply.text"
usage_path = "usage"
session_header = "X-Session-Id"
"""


def _registered_at(db: Path) -> float:
    async def read() -> float:
        async with SqliteEventStore(db, read_only=True) as store:
            [info] = await store.list_campaigns()
            return info.created_at

    return anyio.run(read)


def test_a_campaign_against_a_stateful_http_app_keeps_one_session_per_conversation(
    tmp_path: Path,
) -> None:
    handler, sessions = stateful_app()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with LoopbackApp(handler) as app:
        config = _config(tmp_path, STATEFUL.format(url=app.url))
        # stopped by its budget after 3 counselor calls, then resumed to its end
        stop = ["--set", "budget.counselor_calls=3"]
        assert main(["run", str(config), "--db", str(a), "--quiet", *stop]) == 3
        before = len(app.requests)
        assert main(["run", str(config), "--db", str(a), "--quiet"]) == 0
        first = [body["session"] for body, _ in app.requests]
        # the same config into another database: a new campaign of the same name
        assert main(["run", str(config), "--db", str(b), "--quiet"]) == 0
        second = [body["session"] for body, _ in app.requests[len(first) :]]
    events = stored(a)
    utterances = [e for e in events if isinstance(e, ClientUtterance)]
    replies = [e for e in events if isinstance(e, CounselorReply)]
    conversations = {u.conversation for u in utterances}
    assert len(conversations) == 2 and len(replies) == len(first)  # one request per reply
    assert all(r.text.startswith("(") and "weigh on you" in r.text for r in replies)
    # only what a stateful app needs: the session and the latest message, no history
    assert all(set(body) == {"session", "message"} for body, _ in app.requests)
    assert all(h["X-Session-Id"] == body["session"] for body, h in app.requests)
    # one stable session per conversation, told apart across conversations, kept on resume
    salt = repr(_registered_at(a))
    expected = {u.conversation: session_id(u, salt) for u in utterances}
    assert len(set(expected.values())) == 2 and set(first) == set(expected.values())
    assert 0 < before < len(first) and set(first[before:]) <= set(first[:before])
    by_session = {sid: [u.text for u in utterances if session_id(u, salt) == sid] for sid in first}
    for sid in set(first):
        assert set(sessions[sid]) <= set(by_session[sid])
    # a new campaign of the same name never continues the old one's sessions in the app
    assert len(set(second)) == 2 and not set(second) & set(first)


# -- python/ ---------------------------------------------------------------------------------


def _bot(tmp_path: Path, code: str) -> str:
    path = tmp_path / "bot.py"
    path.write_text(code)
    return str(path)


@pytest.mark.anyio
async def test_a_sync_function_runs_in_a_worker_thread_and_gets_the_session(
    tmp_path: Path,
) -> None:
    bot = _bot(
        tmp_path,
        "import threading\n"
        "calls = []\n"
        "def reply(messages, session_id):\n"
        "    calls.append((messages, session_id, threading.get_ident()))\n"
        "    return {'text': 'heard you', 'usage': {'prompt_tokens': 3, 'completion_tokens': 2},"
        " 'usd': 0.5}\n",
    )
    async with open_model(f"python/{bot}:reply") as model:
        done = await model.complete(CHAT, CallParams(session_id="mhs-1"))
        assert isinstance(model.inner, PythonApp)
        calls = model.inner.function.__globals__["calls"]
    assert done.text == "heard you" and (done.prompt_tokens, done.completion_tokens) == (3, 2)
    assert done.usd == 0.5
    [(messages, session, thread)] = calls
    assert messages == [{"role": m.role, "content": m.content} for m in CHAT]
    assert session == "mhs-1" and thread != threading.get_ident()


@pytest.mark.anyio
async def test_an_async_function_is_awaited_and_its_failures_are_sorted(tmp_path: Path) -> None:
    bot = _bot(
        tmp_path,
        "tries = []\n"
        "async def reply(messages):\n"
        "    tries.append(1)\n"
        "    if len(tries) == 1:\n"
        "        raise ConnectionError('backend down')\n"
        "    return 'back again'\n"
        "async def broken(messages):\n"
        "    raise KeyError('oops')\n"
        "def wrong(messages):\n"
        "    return 42\n",
    )
    sleeps = RecordingSleep()
    async with open_model(f"python/{bot}:reply", sleep=sleeps) as model:
        done = await model.complete(CHAT)
    assert done.text == "back again" and done.attempts == 2
    for name, words in (("broken", "raised KeyError"), ("wrong", "returned int")):
        async with open_model(f"python/{bot}:{name}", sleep=sleeps) as model:
            with pytest.raises(ModelCallError) as info:
                await model.complete(CHAT)
        assert info.value.attempts == 1 and words in info.value.reason


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("no_such_module_mhs:reply", "cannot import no_such_module_mhs: ModuleNotFoundError"),
        ("{bot}:nope", "has no 'nope'"),
        ("{bot}:two", "must take the conversation as its one argument"),
        ("{broken}:reply", "cannot import"),
        ("{bot}", "expected python/<module>:<function>"),
    ],
)
def test_python_targets_that_cannot_be_called_are_config_errors(
    tmp_path: Path, target: str, reason: str
) -> None:
    bot = _bot(tmp_path, "def reply(m):\n    return 'x'\ndef two(a, b):\n    return 'x'\n")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no config')\n")
    address = "python/" + target.format(bot=bot, broken=broken)
    [(field, got)] = settings_problems(ModelSettings(provider=address))
    assert field == "provider" and reason in got


def test_check_names_the_key_and_the_module_of_a_python_target_that_fails_to_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, '[counselors.bot]\nprovider = "python/mhs_missing_bot:reply"\n')
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "counselors.bot.provider" in err and "mhs_missing_bot" in err


def test_a_campaign_against_a_python_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # python/ file paths are relative to where mhsafeeval runs
    config = "examples/python_app.toml"
    assert main(["check", config]) == 0
    assert main(["run", config, "--db", str(tmp_path / "p.db"), "--quiet"]) == 0
    replies = [e for e in stored(tmp_path / "p.db") if isinstance(e, CounselorReply)]
    assert replies and all(r.text.startswith("That sounds hard.") for r in replies)


# -- system prompts ----------------------------------------------------------------------------


RECORDING = (
    "import json, pathlib\n"
    "def reply(messages):\n"
    "    with open(pathlib.Path(__file__).with_name('seen.jsonl'), 'a') as f:\n"
    "        f.write(json.dumps(messages) + '\\n')\n"
    "    return 'I am here.'\n"
)


def _seen(tmp_path: Path) -> list[list[dict[str, str]]]:
    lines = (tmp_path / "seen.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_an_app_gets_no_system_message_unless_its_table_sets_one(tmp_path: Path) -> None:
    bot = _bot(tmp_path, RECORDING)
    config = _config(tmp_path, f'[counselors.bot]\nprovider = "python/{bot}:reply"\n')
    assert main(["run", str(config), "--db", str(tmp_path / "a.db"), "--quiet"]) == 0
    seen = _seen(tmp_path)
    assert seen and all(m["role"] != "system" for chat in seen for m in chat)

    (tmp_path / "seen.jsonl").unlink()
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "bot.txt").write_text("You are Ada, a warm counselor.\n")
    table = f'[counselors.bot]\nprovider = "python/{bot}:reply"\n'
    config = _config(tmp_path, table + 'system_prompt_file = "prompts/bot.txt"\n', "f.toml")
    assert main(["run", str(config), "--db", str(tmp_path / "b.db"), "--quiet"]) == 0
    seen = _seen(tmp_path)
    assert seen and all(
        chat[0] == {"role": "system", "content": "You are Ada, a warm counselor."} for chat in seen
    )


def test_each_counselor_table_chooses_its_system_prompt() -> None:
    text = (
        '[campaign]\ncounselor_system_prompt = "Campaign prompt."\n'
        + ROLES
        + '[counselors.model]\nprovider = "scripted/echo"\n'
        + '[counselors.own]\nprovider = "scripted/echo"\nsystem_prompt = "Mine."\n'
        + '[counselors.bare]\nprovider = "scripted/echo"\nsystem_prompt = ""\n'
        + '[counselors.app]\nprovider = "http/x"\n'
        + '[counselors.app.options]\nurl = "http://127.0.0.1:9"\nreply_path = "r"\n'
        + '[counselors.fn]\nprovider = "python/examples/app_target.py:reply"\n'
        + 'system_prompt = "Told."\n'
    )
    prompts = _counselor_prompts(parse_config(text))
    assert prompts == {
        "model": "Campaign prompt.",
        "own": "Mine.",
        "bare": None,
        "app": None,
        "fn": "Told.",
    }
    agent = CounselorAgent(open_model("scripted/echo"), system_prompt=None)
    utterance = ClientUtterance(category="x", role="y", text="hello")
    assert agent.prompt(utterance) == [ChatMessage("user", "hello")]


@pytest.mark.parametrize(
    ("table", "field", "reason"),
    [
        ('system_prompt_file = "absent.txt"\n', "system_prompt_file", "no such file"),
        ('system_prompt_file = "empty.txt"\n', "system_prompt_file", "is empty"),
        (
            'system_prompt = "a"\nsystem_prompt_file = "p.txt"\n',
            "system_prompt_file",
            "not both",
        ),
        ("system_prompt = 3\n", "system_prompt", "expected str | null"),
    ],
)
def test_system_prompt_config_errors_name_the_key(
    tmp_path: Path, table: str, field: str, reason: str
) -> None:
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "p.txt").write_text("A prompt.")
    path = _config(tmp_path, '[counselors.bot]\nprovider = "scripted/echo"\n' + table)
    with pytest.raises(InputError) as info:
        parse_config(path.read_text(), path)
    assert info.value.field == f"counselors.bot.{field}" and reason in info.value.reason


def test_a_prompt_file_is_read_relative_to_the_config_and_stored_as_text(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("A prompt.\n")
    path = _config(
        tmp_path, '[counselors.bot]\nprovider = "scripted/echo"\nsystem_prompt_file = "p.txt"\n'
    )
    config = parse_config(path.read_text(), path)
    assert config.counselors["bot"].system_prompt == "A prompt."
    assert preflight(config, path).missing == ()


# -- both speak the whole provider protocol, and refuse what they would ignore ----------------


@pytest.mark.anyio
async def test_app_clients_speak_the_whole_protocol() -> None:
    http = open_model(http_settings("http://127.0.0.1:9/chat")).inner
    python = open_model("python/examples/app_target.py:reply").inner
    done = Completion(text="x", finish_reason="stop", usd=0.25)
    for client in (http, python):
        assert isinstance(client, ModelClient), client
        assert isinstance(client.sampling, CallParams) and client.connection_key
        assert client.should_retry(TransientProviderError("429", status=429))
        assert not client.should_retry(PermanentProviderError("400", status=400))
        assert not client.supports_json_schema
        await client.aclose()
    assert http.price(done) is None and python.price(done) == 0.25
    assert provider_info("http").own_prompt and provider_info("python").own_prompt
    assert not provider_info("scripted").own_prompt


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"temperature": 0.2}, "temperature"),
        ({"seed": 3}, "seed"),
        ({"stop": ["\n"]}, "stop"),
        ({"options": {"x": 1}}, "options"),
        ({"api_base": "http://h"}, "api_base"),
    ],
)
def test_app_tables_refuse_keys_an_app_would_ignore(table: dict[str, Any], field: str) -> None:
    python = ModelSettings(provider="python/examples/app_target.py:reply", **table)
    assert [f for f, _ in settings_problems(python)] == [field]
    if field != "options":
        http = msgspec.structs.replace(http_settings("http://127.0.0.1:9"), **table)
        assert [f for f, _ in settings_problems(http)] == [field]
