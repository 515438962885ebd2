"""Campaigns on a Ray cluster (``run --ray``): one local cluster for the module, scripted models.

What a sharded run must keep of a plain one: the same campaign (conversations, turns, one end
each), every planned turn committed exactly once across lost workers, a killed driver and
resumes in either direction, one budget for all workers, archives shared through the hub.
What it need not keep: the figures (the search's decisions depend on when each worker hears
of the others' elites).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from helpers import cli, stored, stored_count
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import Config, parse_config
from mhsafeeval.messages import (
    ArchiveUpdated,
    CampaignFinished,
    CampaignStarted,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Directive,
    Message,
    Rating,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.storage import SqliteEventStore
from mhsafeeval.testing import scripted_models
from needs import need_module

need_module("ray", "pip install -e '.[ray]' (the test extra has it)")
import ray  # noqa: E402 - after the check

from mhsafeeval.distributed import run_distributed  # noqa: E402 - after the skip

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

NAME = "rt"
PROFILES = '["grief-widower", "panic-disorder-bus-driver"]'


def config_text(*, budget: int | None = None, delay: float = 0.0, per_profile: int = 2) -> str:
    return (
        f'[campaign]\nname = "{NAME}"\nseed = 5\nmax_turns = 3\nmax_attempts = 2\n'
        f"conversations_per_profile = {per_profile}\nconcurrency = 4\n"
        f"profile_ids = {PROFILES}\n"
        + (f"\n[budget]\ncounselor_calls = {budget}\n" if budget is not None else "")
        + scripted_models(counselors={"a": "demo-counselor", "b": "demo-counselor"}, delay=delay)
    )


def config(**kwargs: Any) -> Config:
    return parse_config(config_text(**kwargs), "rt.toml")


@pytest.fixture
def anyio_backend() -> str:
    """Ray's ObjectRefs are awaited on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    """One local cluster for the module: two CPUs, a small object store."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024 * 1024,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


async def read(db: Path) -> list[Message]:
    async with SqliteEventStore(db, read_only=True) as store:
        return [e.message async for e in store.events(NAME) if e.message is not None]


def check_exactly_once(messages: list[Message], cfg: Config) -> None:
    """Every planned conversation started and ended once, each of its turns committed once,
    each attempt answered once, and the campaign opened and completed once."""
    planned = 2 * 2 * cfg.campaign.conversations_per_profile
    turns = cfg.campaign.max_turns
    counts = Counter(type(m) for m in messages)
    assert counts[CampaignStarted] == 1
    assert [
        m.status for m in messages if isinstance(m, CampaignFinished) and m.key == "finish"
    ] == ["completed"]
    started = Counter(m.conversation for m in messages if isinstance(m, ConversationStarted))
    ended = Counter(m.conversation for m in messages if isinstance(m, ConversationFinished))
    assert len(started) == planned and set(started.values()) == {1}
    assert ended == started
    assert {m.status for m in messages if isinstance(m, ConversationFinished)} == {"completed"}
    commits = Counter((m.conversation, m.turn) for m in messages if isinstance(m, TurnCommitted))
    assert len(commits) == planned * turns and set(commits.values()) == {1}
    directed = {(m.conversation, m.turn, m.attempt) for m in messages if isinstance(m, Directive)}
    for kind in (CounselorReply, Verdict):
        answered = Counter(
            (m.conversation, m.turn, m.attempt) for m in messages if isinstance(m, kind)
        )
        assert set(answered) == directed and set(answered.values()) == {1}


def check_prefixes(messages: list[Message]) -> None:
    """What a store holds is whole: every message's cause is stored before it."""
    seen: set[str] = set()
    for m in messages:
        assert not m.causation or m.causation in seen, (m.tag, m.conversation, m.turn)
        seen.add(m.id)


def shape(messages: list[Message]) -> tuple[list[tuple[str, int]], int]:
    """What a sharded run shares with a plain one: each conversation's committed turns."""
    turns = Counter(m.conversation for m in messages if isinstance(m, TurnCommitted))
    return sorted(turns.items()), sum(isinstance(m, ConversationFinished) for m in messages)


async def test_a_sharded_run_stores_the_campaign_a_plain_run_stores(tmp_path: Path) -> None:
    cfg = config()
    async with SqliteEventStore(tmp_path / "ray.db") as store:
        result = await run_distributed(cfg, store, workers=2, config_text="...")
    async with SqliteEventStore(tmp_path / "plain.db") as store:
        plain = await run_campaign(cfg, store, config_text="...")
    assert (result.status, result.finished, result.failed) == ("completed", 8, 0)
    sharded, single = await read(tmp_path / "ray.db"), await read(tmp_path / "plain.db")
    assert result.events_written == len(sharded) and plain.events_written == len(single)
    check_exactly_once(sharded, cfg)
    check_prefixes(sharded)
    assert shape(sharded) == shape(single)
    # The report and the export read it as they read a plain run's.
    for args in (["report", str(tmp_path / "ray.db")], ["export", str(tmp_path / "ray.db")]):
        done = cli(*args, timeout=120)
        assert done.returncode == 0, done.stderr


async def test_a_uct_campaign_shares_its_rates_and_runs_sharded_exactly_once(
    tmp_path: Path,
) -> None:
    text = config_text().replace("[campaign]\n", '[campaign]\ncontroller = "uct"\n', 1)
    cfg = parse_config(text + "\n[search]\nsimulations = 4\nin_flight = 2\n", "rt.toml")
    async with SqliteEventStore(tmp_path / "uct.db") as store:
        result = await run_distributed(cfg, store, workers=2, config_text="...")
    assert (result.status, result.finished) == ("completed", 8)
    check_exactly_once(await read(tmp_path / "uct.db"), cfg)


async def test_the_budget_is_one_for_all_workers_and_a_plain_run_continues_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "budget.db"
    async with SqliteEventStore(db) as store:
        result = await run_distributed(config(budget=15), store, workers=2, config_text="...")
    assert (result.status, result.budget) == ("stopped_budget", "budget.counselor_calls")
    messages = await read(db)
    # Exactly the limit was called, the calls in flight at the stop stored, however many
    # workers asked at once; the stop is recorded.
    assert sum(isinstance(m, CounselorReply) for m in messages) == 15
    ends = [m for m in messages if isinstance(m, CampaignFinished)]
    assert [m.status for m in ends] == ["stopped_budget"] and ends[0].key.startswith("stopped:")
    check_prefixes(messages)
    async with SqliteEventStore(db) as store:  # raised: a plain run continues it
        rest = await run_campaign(config(), store, config_text="...")
    assert (rest.status, rest.finished) == ("completed", 8) and rest.resumed_from > 0
    check_exactly_once(await read(db), config())


PANEL = """
[judges]
samples = 2
[judges.panel.x]
provider = "scripted/demo-judge"
temperature = 0.7
"""


def check_rated_once(messages: list[Message]) -> None:
    """Every judged reply rated once by each of the panel's two raters, and nothing else."""
    judged = {
        (m.conversation, m.turn, m.attempt, m.branch) for m in messages if isinstance(m, Verdict)
    }
    ratings = Counter(
        (m.conversation, m.turn, m.attempt, m.branch, m.rater)
        for m in messages
        if isinstance(m, Rating)
    )
    raters = {"scripted/demo-judge", "scripted/demo-judge#2"}
    assert set(ratings) == {(*reply, rater) for reply in judged for rater in raters}
    assert set(ratings.values()) == {1}


async def test_a_panel_rates_in_the_driver_and_a_stopped_run_rates_the_rest(
    tmp_path: Path,
) -> None:
    db = tmp_path / "panel.db"
    stopped = parse_config(config_text(budget=9) + PANEL, "rt.toml")
    async with SqliteEventStore(db) as store:
        first = await run_distributed(stopped, store, workers=2, config_text="...")
    assert first.status == "stopped_budget" and first.panel is not None
    early = Counter(
        (m.conversation, m.turn, m.attempt, m.rater)
        for m in await read(db)
        if isinstance(m, Rating)
    )
    assert set(early.values()) <= {1}  # what it rated before the stop, once each
    whole = parse_config(config_text() + PANEL, "rt.toml")
    async with SqliteEventStore(db) as store:  # the stored replies not rated yet, then the rest
        rest = await run_distributed(whole, store, workers=2, config_text="...")
    assert (rest.status, rest.finished) == ("completed", 8)
    messages = await read(db)
    check_exactly_once(messages, whole)
    check_rated_once(messages)
    async with SqliteEventStore(tmp_path / "plain.db") as store:
        await run_campaign(whole, store, config_text="...")
    check_rated_once(await read(tmp_path / "plain.db"))  # as a plain run rates


async def test_a_resumed_sharded_run_starts_from_the_stored_archive(tmp_path: Path) -> None:
    db = tmp_path / "archive.db"
    async with SqliteEventStore(db) as store:  # a plain run, stopped part-way
        first = await run_campaign(config(budget=20, per_profile=3), store, config_text="...")
    assert first.status == "stopped_budget"
    before = await read(db)
    best: dict[tuple[str, str, str], int] = {}
    for m in before:
        if isinstance(m, ArchiveUpdated):
            key = (m.counselor_model, m.elite.category, m.elite.role)
            best[key] = max(best.get(key, 0), m.elite.severity)
    assert best  # something was found before the stop
    async with SqliteEventStore(db) as store:
        result = await run_distributed(config(per_profile=3), store, workers=2, config_text=".")
    assert result.status == "completed"
    after = (await read(db))[len(before) :]
    # Every worker's archives start from what the whole stored campaign found (the hub), not
    # only from its own conversations' replay: nothing it publishes is short of a stored best.
    for m in after:
        if isinstance(m, ArchiveUpdated):
            key = (m.counselor_model, m.elite.category, m.elite.role)
            assert m.elite.severity > best.get(key, 0), (key, m.conversation)
    check_exactly_once(await read(db), config(per_profile=3))


async def test_a_lost_worker_is_replaced_and_every_turn_is_committed_once(
    tmp_path: Path,
) -> None:
    cfg = config(delay=0.02)
    killed: list[str] = []

    def kill_a_worker(msg: Message) -> None:  # the first shard's worker, five turns in
        if isinstance(msg, TurnCommitted) and not killed:
            seen.append(msg)
            if len(seen) == 5:
                [name] = [
                    n
                    for n in ray.util.list_named_actors()
                    if n.startswith(f"mhsafeeval-{NAME}-") and n.endswith("-shard0-1")
                ]
                ray.kill(ray.get_actor(name))
                killed.append(name)

    seen: list[TurnCommitted] = []
    db = tmp_path / "lost.db"
    with anyio.fail_after(180):  # hang guard
        async with SqliteEventStore(db) as store:
            result = await run_distributed(
                cfg, store, workers=2, config_text="...", observers=(kill_a_worker,)
            )
    assert killed and result.status == "completed"
    messages = await read(db)
    check_exactly_once(messages, cfg)
    check_prefixes(messages)
    async with SqliteEventStore(tmp_path / "plain.db") as store:
        await run_campaign(cfg, store, config_text="...")
    assert shape(messages) == shape(await read(tmp_path / "plain.db"))


def test_a_stopped_or_killed_driver_leaves_a_log_the_same_command_continues(
    tmp_path: Path,
) -> None:
    path, db = tmp_path / "rt.toml", tmp_path / "driver.db"
    path.write_text(config_text(delay=0.05))
    command = [
        sys.executable, "-m", "mhsafeeval.cli", "run", str(path), "--db", str(db),
        "--ray", "local", "--workers", "2", "--quiet",
    ]  # fmt: skip

    def start_and_wait(events: int) -> subprocess.Popen[bytes]:
        # Its own session: a kill takes the driver and the local cluster it started.
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while proc.poll() is None and stored_count(db) < events and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        return proc

    # SIGTERM stops it as Ctrl-C does: its end is recorded, the exit code says so.
    proc = start_and_wait(50)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, err
    first = stored(db)
    ends = [m for m in first if isinstance(m, CampaignFinished)]
    assert [m.status for m in ends] == ["interrupted"]
    # SIGKILL of the driver and its cluster: a prefix of each conversation stays, nothing else.
    proc = start_and_wait(len(first) + 50)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    part = stored(db)
    assert len(part) >= len(first) + 50
    assert [m for m in part if isinstance(m, CampaignFinished)] == ends
    check_prefixes(part)
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr and "8/8 conversations finished (0 failed)" in done.stderr
    messages = stored(db)
    assert messages[: len(part)] == part
    check_exactly_once(messages, config())


def test_no_cluster_at_the_address_or_workers_without_ray_is_one_clear_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rt.toml"
    path.write_text(config_text())
    db = tmp_path / "none.db"
    done = cli("run", str(path), "--db", str(db), "--workers", "2", timeout=60)
    assert done.returncode == 2 and "--workers" in done.stderr and "add --ray" in done.stderr
    # No Ray where the run is: a package named ray that cannot be imported stands in for it.
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    done = cli("run", str(path), "--db", str(db), "--ray", env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'mhsafeeval[ray]'" in done.stderr and "Traceback" not in done.stderr
    assert not db.exists() or stored_count(db) == 0
    done = cli("run", str(path), "--db", str(db), "--ray", "127.0.0.1:1", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "cannot connect to the Ray cluster at '127.0.0.1:1'" in done.stderr
    assert "Traceback" not in done.stderr and (not db.exists() or stored_count(db) == 0)
