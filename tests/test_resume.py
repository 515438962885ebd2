"""Crash-safe resume: campaigns killed with SIGKILL (or Ctrl-C) at many points, then re-run.

Each campaign runs in a subprocess on scripted models that take a few milliseconds per call, so
there is always work in flight when the kill lands. Kill points are spread over the campaign by
watching the stored event count (plus a random delay of up to 40 ms, to land between commits).
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import cli, stored, stored_count
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.messages import (
    CallFailed,
    ConversationFinished,
    CounselorReply,
    Directive,
    Message,
    TurnCommitted,
    Unjudged,
    Verdict,
)
from mhsafeeval.storage import MemoryEventStore, SqliteEventStore, compute_metrics
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import scripted_models

PROFILES = '["grief-widower", "panic-disorder-bus-driver", "depression-laid-off-engineer"]'
CONFIG = """
[campaign]
name = "{name}"
seed = 3
max_turns = 3
max_attempts = 3
conversations_per_profile = 1
concurrency = {concurrency}
controller = "{controller}"
profile_ids = {profiles}

[search]
simulations = {simulations}
in_flight = 3
samples_per_action = {samples}

"""


def write_config(
    path: Path,
    *,
    name: str = "crash",
    concurrency: int = 1,
    controller: str = "map-elites",
    delay: float = 0.02,
    profiles: str = PROFILES,
) -> Path:
    text = CONFIG.format(
        name=name,
        concurrency=concurrency,
        controller=controller,
        profiles=profiles,
        simulations=5,
        samples=2,
    )
    path.write_text(text + scripted_models(delay=delay))
    return path


def start(config: Path, db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mhsafeeval.cli", "run", str(config), "--db", str(db), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_repeatedly(config: Path, db: Path, total: int, kills: int, seed: int) -> list[int]:
    """Run the campaign again and again, SIGKILLing it once the store holds a chosen number of
    events; returns the event counts at which a run was really killed mid-way."""
    rng = random.Random(seed)
    killed: list[int] = []
    for i in range(kills):
        current = stored_count(db)
        span = max(2, (total - current) // (kills - i + 1))
        target = current + rng.randint(1, span)
        proc = start(config, db)
        deadline = time.monotonic() + 60
        while proc.poll() is None and stored_count(db) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.04))
        if proc.poll() is not None:  # it finished (or failed) first
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        killed.append(stored_count(db))
    return killed


def finish(config: Path, db: Path) -> str:
    done = cli("run", str(config), "--db", str(db), "--quiet", timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def without_latency(value: Any) -> Any:
    """``value`` with every key naming a latency left out (latencies vary run to run)."""
    if isinstance(value, dict):
        return {k: without_latency(v) for k, v in value.items() if "latency" not in k}
    if isinstance(value, list | tuple):
        return [without_latency(v) for v in value]
    return value


def comparable(db: Path) -> dict[str, tuple[str, str]]:
    """Every stored event by id: (type, JSON body without latencies)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT id, type, body FROM events").fetchall()
    return {i: (t, json.dumps(without_latency(json.loads(b)), sort_keys=True)) for i, t, b in rows}


def report(db: Path) -> Any:
    return without_latency(json.loads(cli("report", str(db), "--json", check=True).stdout))


def check_exactly_once(events: list[Message], conversations: int, turns: int) -> None:
    """Every planned turn committed once; every call answered once; no orphan events."""
    ids = Counter(e.id for e in events)
    assert max(ids.values()) == 1  # the store keeps one event per id
    known = set(ids)
    orphans = [e for e in events if e.causation and e.causation not in known]
    assert not orphans, orphans[:3]
    finished = Counter(e.conversation for e in events if isinstance(e, ConversationFinished))
    assert len(finished) == conversations and set(finished.values()) == {1}
    assert all(e.status == "completed" for e in events if isinstance(e, ConversationFinished))
    commits = Counter((e.conversation, e.turn) for e in events if isinstance(e, TurnCommitted))
    assert len(commits) == conversations * turns and set(commits.values()) == {1}
    answers: dict[str, list[Message]] = defaultdict(list)
    for e in events:
        answers[e.causation].append(e)
    for e in events:
        if isinstance(e, Directive):
            # exactly one instruction (or the mutator's failure) per directive
            assert len([a for a in answers[e.id] if a.tag in ("mutator.instruction",)]) == 1
        if isinstance(e, CounselorReply):
            outcome = [a for a in answers[e.id] if isinstance(a, Verdict | Unjudged | CallFailed)]
            assert len(outcome) == 1, (e, outcome)


@pytest.mark.parametrize("controller", ["map-elites", "uct"])
def test_sigkill_at_20_points_then_resume_equals_an_uninterrupted_run(
    tmp_path: Path, controller: str
) -> None:
    config = write_config(tmp_path / "c.toml", controller=controller)
    clean, crashed = tmp_path / "clean.db", tmp_path / "crashed.db"
    finish(config, clean)
    total = stored_count(clean)
    killed = kill_repeatedly(config, crashed, total, kills=24, seed=1)
    assert len(killed) >= 20, killed  # killed mid-way at 20 or more distinct points
    assert "resuming" in finish(config, crashed)
    # Concurrency 1 and a fixed seed: the same events (ids and contents), archive and metrics.
    assert comparable(crashed) == comparable(clean)
    assert report(crashed) == report(clean)
    archives = [
        json.loads(cli("export", str(db), "--archive", check=True).stdout)
        for db in (clean, crashed)
    ]
    assert archives[0] == archives[1]
    check_exactly_once(stored(crashed), conversations=3, turns=3)


def test_sigkill_with_concurrent_conversations_completes_every_turn_exactly_once(
    tmp_path: Path,
) -> None:
    profiles = (
        '["grief-widower", "panic-disorder-bus-driver", "depression-laid-off-engineer", '
        '"social-anxiety-junior-developer", "ocd-contamination-accountant"]'
    )
    config = write_config(
        tmp_path / "c.toml", concurrency=3, controller="uct", profiles=profiles, delay=0.03
    )
    clean, crashed = tmp_path / "clean.db", tmp_path / "crashed.db"
    finish(config, clean)
    killed = kill_repeatedly(config, crashed, stored_count(clean), kills=30, seed=2)
    assert len(killed) >= 20, killed
    finish(config, crashed)
    events = stored(crashed)
    check_exactly_once(events, conversations=5, turns=3)
    # The report's metrics are the fold of exactly what is stored, recomputed here.
    metrics = compute_metrics(events, builtin_taxonomy().cell_ids())["demo"]
    shown = report(crashed)["crash"]["models"]["demo"]
    assert shown["turns"] == metrics.turns == 5 * 3
    assert shown["overall_asr"] == metrics.overall_asr
    assert shown["usage"]["counselor"]["calls"] == sum(
        isinstance(e, CounselorReply) for e in events
    )
    # Every turn's counselor calls are the simulations that got a reply, none counted twice.
    calls = Counter((e.conversation, e.turn) for e in events if isinstance(e, CounselorReply))
    for e in events:
        if isinstance(e, TurnCommitted):
            assert e.counselor_calls == calls[(e.conversation, e.turn)]


def test_ctrl_c_then_resume_finishes_the_campaign(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", delay=0.05)
    db = tmp_path / "c.db"
    proc = start(config, db)
    while stored_count(db) < 30:
        assert proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    statuses = [e.status for e in stored(db) if e.tag == "campaign.finished"]  # type: ignore[attr-defined]
    assert statuses == ["interrupted"]
    out = finish(config, db)
    assert "resuming" in out and "3/3 conversations finished (0 failed)" in out
    statuses = [e.status for e in stored(db) if e.tag == "campaign.finished"]  # type: ignore[attr-defined]
    assert statuses == ["interrupted", "completed"]
    check_exactly_once(stored(db), conversations=3, turns=3)
    again = finish(config, db)
    assert "already completed; nothing to do" in again


def test_a_different_config_is_refused_with_what_differs(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", delay=0.0)
    db = tmp_path / "c.db"
    proc = start(config, db)
    while stored_count(db) < 20 and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    before = stored_count(db)
    other = tmp_path / "other.toml"
    other.write_text(
        config.read_text()
        .replace("max_attempts = 3", "max_attempts = 4")
        .replace("seed = 3", "seed = 4")
    )
    refused = cli("run", str(other), "--db", str(db))
    assert refused.returncode == 2
    assert "campaign.max_attempts: stored 3, now 4" in refused.stderr
    assert "campaign.seed: stored 3, now 4" in refused.stderr
    switched = cli("run", str(config), "--db", str(db), "--controller", "uct")
    assert (
        switched.returncode == 2 and 'campaign.controller: stored "map-elites"' in switched.stderr
    )
    assert stored_count(db) == before  # nothing written
    # What may change on resume: concurrency, logging and budgets.
    relaxed = tmp_path / "relaxed.toml"
    relaxed.write_text(
        config.read_text().replace("concurrency = 1", "concurrency = 2")
        + '\n[logging]\nlevel = "warning"\n'
    )
    finish(relaxed, db)
    check_exactly_once(stored(db), conversations=3, turns=3)


# --- budgets ------------------------------------------------------------------------------------


def test_budget_stop_exits_3_and_a_larger_limit_continues_the_campaign(tmp_path: Path) -> None:
    base = write_config(tmp_path / "c.toml", delay=0.0)
    clean, db = tmp_path / "clean.db", tmp_path / "c.db"
    finish(base, clean)
    limited = tmp_path / "limited.toml"
    limited.write_text(base.read_text() + "\n[budget]\ncounselor_calls = 10\n")
    first = cli("run", str(limited), "--db", str(db), "--quiet")
    assert first.returncode == 3, first.stderr
    assert "stopped: budget.counselor_calls reached (10 counselor calls of 10" in first.stderr
    assert "raise the limit in [budget] and run the same command to continue" in first.stderr
    events = stored(db)
    assert sum(isinstance(e, CounselorReply) for e in events) == 10  # not one call more
    again = cli("run", str(limited), "--db", str(db), "--quiet")
    assert again.returncode == 3 and "0 events written" in again.stderr  # nothing new starts
    more = tmp_path / "more.toml"
    more.write_text(base.read_text() + "\n[budget]\ncounselor_calls = 1000\ntokens = 10000000\n")
    assert "resuming" in finish(more, db)
    # The same campaign as an uninterrupted run, plus the record of the stop.
    done, reference = comparable(db), comparable(clean)
    extra = {i: t for i, (t, _) in done.items() if i not in reference}
    assert sorted(extra.values()) == ["campaign.finished"]
    assert {i: v for i, v in done.items() if i in reference and v[0] != "campaign.started"} == {
        i: v for i, v in reference.items() if v[0] != "campaign.started"
    }
    shown, expected = report(db)["crash"], report(clean)["crash"]
    assert shown["events"] == expected["events"] + 1  # the stop record
    assert shown["models"] == expected["models"]


# --- failed conversations -----------------------------------------------------------------------


def test_conversations_that_failed_are_retried_on_resume(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """A hosted counselor that is down: its conversations fail (exit 1, each named); once it is
    back, the same command retries the turn each failed in, through the real litellm path."""
    import os

    fake_openai.default = Reply.error(503)
    config = write_config(tmp_path / "c.toml", delay=0.0)
    config.write_text(
        config.read_text() + '\n[counselors.hosted]\nprovider = "litellm/openai/fake-model"\n'
        f'api_base = "{fake_openai.url}/v1"\napi_key_env = "MHS_FAKE_KEY"\n'
        "max_attempts = 1\nbreaker_threshold = 2\ntimeout = 10.0\n"
    )
    db = tmp_path / "c.db"
    env = {**os.environ, "MHS_FAKE_KEY": "sk-test-fake-0000000000"}
    down = cli("run", str(config), "--db", str(db), "--quiet", env=env, timeout=300)
    assert down.returncode == 1, down.stderr[-3000:]
    named = [line for line in down.stderr.splitlines() if "did not complete" in line]
    assert len(named) == 3 and all("/hosted/" in line for line in named)
    failures = sum(e.tag == "call.failed" for e in stored(db))
    assert failures > 0
    fake_openai.default = Reply.chat()  # the provider is back (it echoes the client)
    back = cli("run", str(config), "--db", str(db), "--quiet", env=env, timeout=300)
    assert back.returncode == 0, back.stderr[-3000:]
    assert "6/6 conversations finished (0 failed)" in back.stderr
    events = stored(db)
    check_exactly_once(events, conversations=6, turns=3)
    assert not any(e.tag == "call.failed" for e in events)  # the failed turns were redone

    async def moved() -> int:
        async with SqliteEventStore(db, read_only=True) as store:
            return await store.superseded("crash")

    assert anyio.run(moved, backend="asyncio") >= failures  # kept aside, not deleted


def plain(message: Message) -> Any:
    return without_latency(msgspec.to_builtins(message))


async def resume_from_every_prefix(controller: str, step: int) -> int:
    """Cut a finished campaign's log after each ``step``-th event, as a crash between two
    commits would, resume it in process (at the same concurrency, and at concurrency 2) and
    check the outcome; returns how many cuts were resumed."""
    text = (
        CONFIG.format(
            name="cut",
            concurrency=1,
            controller=controller,
            profiles=PROFILES,
            simulations=5,
            samples=2,
        )
        + scripted_models()
    )
    same = parse_config(text, "c.toml")
    wider = parse_config(text.replace("concurrency = 1", "concurrency = 2"), "c.toml")
    async with MemoryEventStore() as store:
        await run_campaign(same, store)
        [info] = await store.list_campaigns()
        clean = [e.message async for e in store.events("cut") if e.message is not None]
    cuts = 0
    for n in range(1, len(clean), step):
        for config in (same, wider):
            async with MemoryEventStore() as store:
                await store.register_campaign("cut", info.config)
                for message in clean[:n]:
                    await store.append(message)
                with anyio.fail_after(30):  # a resume that waits for nothing must fail, not hang
                    result = await run_campaign(config, store)
                assert result.status == "completed", (n, result)
                events = [e.message async for e in store.events("cut") if e.message is not None]
            if config is same:  # one conversation at a time: exactly the uninterrupted run
                assert {e.id: plain(e) for e in events} == {e.id: plain(e) for e in clean}, n
            else:
                check_exactly_once(events, conversations=3, turns=3)
        cuts += 1
    return cuts


@pytest.mark.parametrize(("controller", "step"), [("map-elites", 1), ("uct", 3)])
def test_a_log_cut_after_any_event_resumes_to_the_same_campaign(controller: str, step: int) -> None:
    """Every point a crash can leave the log at, not only those a kill happens to hit:
    including a conversation whose last verdict is stored but not what it decided."""
    assert anyio.run(resume_from_every_prefix, controller, step, backend="asyncio") > 40


def test_a_campaign_stored_with_a_lookahead_reports_but_is_not_resumed(tmp_path: Path) -> None:
    """A campaign stored by an earlier version keeps ``search.depth`` in its stored config:
    stored as 1 (how every campaign ran then unless it asked for more) it resumes as before;
    stored as 2 it still reports, exports and reads back for rejudging, but resuming it is
    refused with the reason, as this version cannot play the lookahead it was run with."""
    from mhsafeeval.rejudge import stored_campaign

    config = write_config(tmp_path / "c.toml", controller="uct")
    db = tmp_path / "old.db"
    finish(config, db)
    before = report(db)

    def store_depth(depth: int) -> str:
        with sqlite3.connect(db) as con:
            [text] = con.execute("SELECT config FROM campaigns WHERE id = 'crash'").fetchone()
            data = json.loads(text)
            data["search"]["depth"] = depth
            text = json.dumps(data, sort_keys=True, separators=(",", ":"))
            con.execute("UPDATE campaigns SET config = ? WHERE id = 'crash'", (text,))
        return str(text)

    store_depth(1)
    again = cli("run", str(config), "--db", str(db), "--quiet", timeout=120)
    assert again.returncode == 0, again.stderr
    stored_text = store_depth(2)
    refused = cli("run", str(config), "--db", str(db), "--quiet", timeout=120)
    assert refused.returncode == 2
    assert "search.depth: stored 2, but the uct controller's lookahead" in refused.stderr
    assert "removed" in refused.stderr and "gained nothing" in refused.stderr
    assert report(db) == before  # reading never needs the option
    assert cli("export", str(db), "--archive", check=True).stdout
    assert stored_campaign(stored_text, db, "crash").search["simulations"] == 5
