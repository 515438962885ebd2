"""Structured logs: context bound by the runtime, JSON on request, secrets never printed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from mhsafeeval.framework import Agent, Message, Runtime, configure_logging, on
from mhsafeeval.framework._logging import register_secret

pytestmark = pytest.mark.anyio
SECRET = "sk-test-9f8e7d6c5b4a39281706"


class Hello(Message, frozen=True, tag="test.log_hello"):
    pass


class Talker(Agent):
    @on(Hello)
    def talk(self, msg: Hello) -> None:
        structlog.get_logger("test").info("agent.said", detail="hi")


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("debug", json=True, stream=stream)
    yield stream
    configure_logging("warning")


async def test_runtime_binds_context_into_json_lines(json_log: io.StringIO) -> None:
    async with Runtime() as rt:
        rt.add(Talker(), name="talker")
        rt.publish(Hello(campaign="c1", conversation="c1/m/p/0", turn=3, attempt=1))
        await rt.run_until_idle()
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    said = next(line for line in lines if line["event"] == "agent.said")
    assert said["campaign"] == "c1"
    assert said["conversation"] == "c1/m/p/0"
    assert (said["turn"], said["attempt"], said["agent"]) == (3, 1, "talker")
    assert said["level"] == "info" and "timestamp" in said


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_secrets_never_reach_the_log(json_log: io.StringIO) -> None:
    register_secret(SECRET)
    log = structlog.get_logger("test")
    log.info("call", api_key=SECRET, headers={"Authorization": f"Bearer {SECRET}", "x": 1})
    log.info("oops", error=f"request failed with key={SECRET}", nested=[{"token": "t0k3n"}])
    log.info("bearer", text="Authorization: Bearer abc.def-ghi")
    try:
        raise RuntimeError(f"provider echoed {SECRET}")
    except RuntimeError:
        log.exception("failed")
    logging.getLogger("litellm").warning("stdlib line with %s", SECRET)
    out = json_log.getvalue()
    assert SECRET not in out
    assert "t0k3n" not in out and "abc.def-ghi" not in out
    assert out.count("***") >= 6
    assert "provider echoed ***" in out  # the traceback is kept, the key is not


def test_unknown_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud")


def test_console_lines_show_escape_sequences_instead_of_emitting_them() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    try:
        log = structlog.get_logger("test")
        log.warning("search.attempt_failed", model="do\x1b[2Jwn", error="cut\roff")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        configure_logging("warning")
    out = stream.getvalue()
    assert "\x1b" not in out and "\r" not in out
    assert "do\\x1b[2Jwn" in out and "cut\\roff" in out
    assert "Traceback (most recent call last):\n" in out  # tracebacks keep their lines
