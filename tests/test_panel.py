"""Reporting judges: the campaign's ``[judges]`` panel and ``mhsafeeval rejudge``."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from helpers import cli, comparable, same_run, stored, stored_count, tokens_of
from mhsafeeval.campaign import run_campaign
from mhsafeeval.cli import main
from mhsafeeval.config import Config, config_differences, parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import (
    CallFailed,
    Confirmation,
    ConversationFinished,
    CounselorReply,
    Message,
    Rating,
    TurnCommitted,
    Unjudged,
    Verdict,
    from_search_judge,
)
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    ModelSettings,
    PermanentProviderError,
)
from mhsafeeval.rejudge import rejudge
from mhsafeeval.search import CONTROLLERS, SearchRun, controller_options
from mhsafeeval.storage import MemoryEventStore, SqliteEventStore
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import register_script, scripted_models
from mhsafeeval.testing._demo import demo_judge

Prompt = tuple[tuple[str, str], ...]
SAFE = json.dumps(
    {
        "reasoning": "The reply stays supportive.",
        "evidence": [],
        "refused": False,
        "understood": True,
        "severity": 1,
        "label": "safe",
    }
)
PROMPTS: dict[str, list[Prompt]] = {}
"""What each recording script was shown, one prompt per call."""
BROKEN: set[str] = set()
"""Recording scripts that fail (a permanent error) while named here."""


def _key(messages: Sequence[ChatMessage]) -> Prompt:
    return tuple((m.role, m.content) for m in messages)


def recording_judge(messages: Sequence[ChatMessage], params: CallParams) -> str:
    PROMPTS.setdefault("search", []).append(_key(messages))
    return demo_judge(messages, params)


def recording_panel(name: str) -> Any:
    def script(messages: Sequence[ChatMessage], params: CallParams) -> str | BaseException:
        PROMPTS.setdefault(name, []).append(_key(messages))
        if name in BROKEN:
            return PermanentProviderError("the panel judge refused the request", status=400)
        return SAFE

    return script


register_script("panel-search-judge", recording_judge)
for _name in ("panel-a", "panel-b", "panel-c"):
    register_script(_name, recording_panel(_name))

BASE = """
[campaign]
name = "{name}"
seed = 5
max_turns = 3
max_attempts = 3
concurrency = {concurrency}
controller = "{controller}"
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]

[search]
simulations = 4
in_flight = 2
samples_per_action = 1
"""
PANEL = """
[judges]
samples = 2

[judges.panel.a]
provider = "scripted/panel-a"
temperature = 0.7

[judges.panel.b]
provider = "scripted/panel-b"
temperature = 0.7
"""
RATERS = {"scripted/panel-a", "scripted/panel-a#2", "scripted/panel-b", "scripted/panel-b#2"}


def config_text(
    *,
    name: str = "panel",
    controller: str = "map-elites",
    panel: str = PANEL,
    extra: str = "",
    concurrency: int = 2,
) -> str:
    models = scripted_models(judge="panel-search-judge")
    return (
        BASE.format(name=name, controller=controller, concurrency=concurrency)
        + models
        + panel
        + extra
    )


def config(**kwargs: Any) -> Config:
    return parse_config(config_text(**kwargs), "panel.toml")


async def events_of(store: MemoryEventStore | SqliteEventStore, name: str) -> list[Message]:
    return [e.message async for e in store.events(name) if e.message is not None]


def by_reply(events: list[Message]) -> dict[tuple[str, int, int, str], CounselorReply]:
    return {
        (m.conversation, m.turn, m.attempt, m.branch): m
        for m in events
        if isinstance(m, CounselorReply)
    }


def coords(m: Message) -> tuple[str, int, int, str]:
    return (m.conversation, m.turn, m.attempt, m.branch)


@pytest.fixture(autouse=True)
def _fresh_scripts() -> None:
    PROMPTS.clear()
    BROKEN.clear()


# -- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("panel", "field", "reason"),
    [
        (
            '[judges.panel.x]\nprovider = "scripted/a"\n'
            '[judges.panel.y]\nprovider = "scripted/a"\n',
            "judges.panel.y.provider",
            "the same model as judges.panel.x",
        ),
        (
            '[judges]\nsamples = 3\n[judges.panel.x]\nprovider = "scripted/a"\n',
            "judges.panel.x.temperature",
            "must be > 0 when judges.samples is 3",
        ),
        ("[judges]\nsamples = 0\n", "judges.samples", "must be >= 1"),
        ("[judges]\nsamples = 21\n", "judges.samples", "must be <= 20"),
        ("[judges]\npanels = {}\n", "judges.panels", "unknown field"),
        ('[judges.panel.x]\nprovidr = "scripted/a"\n', "judges.panel.x.providr", "unknown field"),
        (
            '[judges.panel.x]\nprovider = "scripted/a"\napi_key = "x"\n',
            "judges.panel.x.api_key",
            "",
        ),
        (
            '[judges.panel.x]\nprovider = "scripted/a"\napi_base = "ftp://h"\n',
            "judges.panel.x.api_base",
            "http(s) URL",
        ),
    ],
)
def test_bad_judges_sections_name_the_key(panel: str, field: str, reason: str) -> None:
    with pytest.raises(InputError) as caught:
        config(panel=panel)
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"panel.toml: {field}: ")


def test_a_panel_is_a_resumable_change_and_other_changes_are_not() -> None:
    from mhsafeeval.config import canonical_config

    without = config(panel="")
    stored_text = canonical_config(without)
    assert config_differences(stored_text, config()) == []
    assert config_differences(canonical_config(config()), without) == []
    changed = config(panel="", extra="")
    changed = msgspec.structs.replace(
        changed, campaign=msgspec.structs.replace(changed.campaign, seed=6)
    )
    assert config_differences(stored_text, changed) == ["campaign.seed: stored 5, now 6"]


def test_check_lists_the_panel_and_refuses_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process: `check` refuses a scripted model whose script is not registered, and
    # this module registers the panel's scripts.
    good = tmp_path / "good.toml"
    good.write_text(config_text())
    code = main(["check", str(good)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "judges.panel.a" in out or "panel     a" in out
    assert "scripted/panel-b" in out
    bad = tmp_path / "bad.toml"
    bad.write_text(config_text(panel='[judges.panel.x]\nprovider = "nosuch/model"\n'))
    assert main(["check", str(bad)]) == 2
    assert f"{bad}: judges.panel.x.provider" in capsys.readouterr().err


# -- the campaign's panel ------------------------------------------------------------------------


async def run(cfg: Config, store: MemoryEventStore | SqliteEventStore) -> list[Message]:
    result = await run_campaign(cfg, store, config_text="...")
    assert result.status == "completed", result
    return await events_of(store, cfg.campaign.name)


@pytest.mark.anyio
@pytest.mark.parametrize("controller", ["map-elites", "uct"])
async def test_every_judged_reply_is_rated_once_by_every_rater_with_the_judges_prompt(
    controller: str,
) -> None:
    async with MemoryEventStore() as store:
        events = await run(config(controller=controller), store)
    verdicts = [m for m in events if isinstance(m, Verdict)]
    ratings = [m for m in events if isinstance(m, Rating)]
    assert verdicts
    per_reply = Counter((coords(r), r.rater) for r in ratings)
    expected = {(coords(v), rater) for v in verdicts for rater in RATERS}
    assert set(per_reply) == expected
    assert set(per_reply.values()) == {1}
    unjudged = {coords(m) for m in events if isinstance(m, Unjudged)}
    assert not unjudged & {coords(r) for r in ratings}
    replies = by_reply(events)
    # The panel confirms candidates ([confirm] raters = "auto"): a rating it gave there is
    # adopted as its rating of the reply, its usage counted once, on the Confirmation.
    confirmed = {
        (coords(c), r.rater): r for c in events if isinstance(c, Confirmation) for r in c.ratings
    }
    for r in ratings:
        reply = replies[coords(r)]
        assert r.causation == reply.id and r.key == Rating.key_for(r.rater)
        assert (r.source, r.judge, r.severity) == ("panel", r.rater.split("#")[0], 1)
        assert (r.category, r.role) == (reply.category, reply.role)
        adopted = confirmed.get((coords(r), r.rater))
        usage = r.usage if adopted is None else adopted.usage
        assert usage is not None and usage.model == r.judge
        assert adopted is None or r.usage is None
    # Each panel model is shown exactly the prompts the search's judge was shown (so it sees
    # the conversation, the utterance and the reply, and never a verdict), twice (2 samples).
    judge_prompts = Counter(PROMPTS["search"])
    for name in ("panel-a", "panel-b"):
        shown = Counter(PROMPTS[name])
        assert set(shown.values()) == {2}
        assert set(shown) <= set(judge_prompts)
        assert len(shown) == len(verdicts)
    reasons = {v.reasoning for v in verdicts if len(v.reasoning) > 20}
    text = "".join(c for p in PROMPTS["panel-a"] for _, c in p)
    assert reasons and not any(reason in text for reason in reasons)


@pytest.mark.anyio
@pytest.mark.parametrize(("confirm", "calls"), [("auto", 7), ("off", 10)])
async def test_a_turn_still_open_at_the_budget_is_rated_by_the_panel(
    confirm: str, calls: int
) -> None:
    """uct stopped by its counselor-call budget in the middle of a turn: the turn is not
    committed (a resumed run decides it as an uninterrupted one would), but its judged replies
    are rated by every panel rater like any other (a candidate once it is confirmed); resumed
    with a larger budget, nothing is rated twice."""
    budget = f'\n[confirm]\nraters = "{confirm}"\n\n[budget]\ncounselor_calls = {{calls}}\n'
    async with MemoryEventStore() as store:
        for limit in (calls, calls + 6):
            cfg = config(controller="uct", extra=budget.format(calls=limit), concurrency=1)
            result = await run_campaign(cfg, store, config_text="...")
            assert result.status == "stopped_budget"
            events = await events_of(store, cfg.campaign.name)
            committed = {(m.conversation, m.turn) for m in events if isinstance(m, TurnCommitted)}
            verdicts = [m for m in events if isinstance(m, Verdict) and from_search_judge(m)]
            ratings = Counter((coords(m), m.rater) for m in events if isinstance(m, Rating))
            assert any((v.conversation, v.turn) not in committed for v in verdicts)  # open
            assert set(ratings) == {(coords(v), rater) for v in verdicts for rater in RATERS}
            assert set(ratings.values()) == {1}


@pytest.mark.anyio
@pytest.mark.parametrize("controller", ["map-elites", "uct"])
async def test_the_search_does_the_same_with_and_without_a_panel(controller: str) -> None:
    # One conversation at a time: then a campaign is reproducible, event for event. A panel
    # that only reports ([confirm] off) never steers the search; one that confirms does.
    off = '[confirm]\nraters = "off"\n'
    async with MemoryEventStore() as store:
        plain = await run(config(controller=controller, panel="", concurrency=1, extra=off), store)
    async with MemoryEventStore() as store:
        paneled = await run(config(controller=controller, concurrency=1, extra=off), store)
    assert not any(isinstance(m, Rating) for m in plain)
    assert any(isinstance(m, Rating) for m in paneled)
    searched = [m for m in paneled if not isinstance(m, Rating)]
    assert sorted(comparable(searched)) == sorted(comparable(plain))
    if controller == "map-elites":  # a tree search's simulations in flight may store in any order
        assert same_run(searched, plain)


def test_no_controller_subscribes_to_ratings() -> None:
    cells = builtin_taxonomy().cell_ids()
    for name in ("map-elites", "uct"):
        controller = CONTROLLERS.get(name)(cells, SearchRun(), controller_options(name, {}))
        handled = controller.handled_types()
        assert handled and Rating not in handled and Message not in handled


@pytest.mark.anyio
async def test_a_failing_panel_judge_fails_nothing_and_the_next_run_rates_what_it_missed() -> None:
    BROKEN.add("panel-b")
    cfg = config(panel=PANEL.replace("samples = 2", "samples = 1"))
    async with MemoryEventStore() as store:
        first = await run(cfg, store)
        finished = [m for m in first if isinstance(m, ConversationFinished)]
        assert finished and {m.status for m in finished} == {"completed"}
        verdicts = {coords(m) for m in first if isinstance(m, Verdict)}
        failed = [m for m in first if isinstance(m, CallFailed)]
        assert {(m.agent, m.key) for m in failed} == {("panel", "rating:scripted/panel-b@0")}
        assert {coords(m) for m in failed} == verdicts
        assert {(coords(m), m.rater) for m in first if isinstance(m, Rating)} == {
            (c, "scripted/panel-a") for c in verdicts
        }
        # The campaign is finished; run again once the judge is back: only what is missing.
        BROKEN.clear()
        calls_a = len(PROMPTS["panel-a"])
        result = await run_campaign(cfg, store, config_text="...")
        assert result.status == "completed" and result.panel is not None
        assert (result.panel.made, result.panel.present) == (len(verdicts), len(verdicts))
        again = await events_of(store, cfg.campaign.name)
    assert len(PROMPTS["panel-a"]) == calls_a
    ratings = Counter((coords(m), m.rater) for m in again if isinstance(m, Rating))
    assert set(ratings.values()) == {1}
    assert set(ratings) == {
        (c, r) for c in verdicts for r in ("scripted/panel-a", "scripted/panel-b")
    }
    assert comparable([m for m in again if not isinstance(m, Rating)]) == comparable(
        [m for m in first if not isinstance(m, Rating)]
    )


@pytest.mark.anyio
async def test_a_panel_added_to_a_finished_campaign_rates_its_old_replies() -> None:
    async with MemoryEventStore() as store:
        before = await run(config(panel=""), store)
        result = await run_campaign(config(), store, config_text="...")
        assert result.panel is not None and result.panel.failed == 0
        after = await events_of(store, "panel")
    verdicts = [coords(m) for m in before if isinstance(m, Verdict)]
    assert result.panel.made == len(verdicts) * len(RATERS)
    assert Counter((coords(m), m.rater) for m in after if isinstance(m, Rating)) == Counter(
        (c, r) for c in verdicts for r in RATERS
    )
    assert [m.id for m in after if not isinstance(m, Rating)] == [m.id for m in before]


@pytest.mark.anyio
async def test_a_token_budget_counts_panel_calls() -> None:
    async with MemoryEventStore() as store:
        events = await run(config(), store)
    panel_tokens, everything = tokens_of(events, Rating), tokens_of(events)
    assert panel_tokens > 0
    # A limit that the search alone stays under, but not with the panel's calls.
    limit = everything - panel_tokens // 2
    cfg = config(extra=f"\n[budget]\ntokens = {limit}\n")
    async with MemoryEventStore() as store:
        result = await run_campaign(cfg, store, config_text="...")
        assert result.status == "stopped_budget" and result.budget == "budget.tokens"
        raised = msgspec.structs.replace(
            cfg, budget=msgspec.structs.replace(cfg.budget, tokens=10**9)
        )
        result = await run_campaign(raised, store, config_text="...")
        assert result.status == "completed"
        done = await events_of(store, "panel")
    ratings = Counter((coords(m), m.rater) for m in done if isinstance(m, Rating))
    verdicts = [coords(m) for m in done if isinstance(m, Verdict)]
    assert ratings == Counter((c, r) for c in verdicts for r in RATERS)


def ratings_stored(db: Path) -> int:
    """Rating events in the database so far (0 before it exists)."""
    return stored_count(db, "judge.rating")


def test_sigkill_then_resume_leaves_exactly_one_rating_per_reply_and_rater(tmp_path: Path) -> None:
    """The panel runs in a subprocess (its scripts take a few ms) killed at several points."""
    import subprocess
    import sys
    import time

    panel = f"""
[judges]
samples = 2

[judges.panel.a]
provider = "scripted/panel-x"
temperature = 0.5
options = {{ replies = [{json.dumps(SAFE)}], delay_s = 0.01 }}
"""
    path = tmp_path / "kill.toml"
    text = BASE.format(name="kill", controller="map-elites", concurrency=2) + scripted_models(
        delay=0.005
    )
    path.write_text(text + panel)
    db = tmp_path / "kill.db"
    kills = 0
    for _ in range(4):  # killed once more ratings are stored each time (never by the clock)
        target = ratings_stored(db) + 2
        proc = subprocess.Popen(
            [sys.executable, "-m", "mhsafeeval.cli", "run", str(path), "--db", str(db), "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 90
        while proc.poll() is None and ratings_stored(db) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
    assert kills >= 2
    done = cli("run", str(path), "--db", str(db), "--quiet", timeout=120)
    assert done.returncode == 0, done.stderr
    events = stored(db)
    ratings = Counter((coords(m), m.rater) for m in events if isinstance(m, Rating))
    verdicts = [coords(m) for m in events if isinstance(m, Verdict)]
    raters = ("scripted/panel-x", "scripted/panel-x#2")
    assert ratings == Counter((c, r) for c in verdicts for r in raters)
    turns = Counter((m.conversation, m.turn) for m in events if isinstance(m, TurnCommitted))
    assert set(turns.values()) == {1} and len(turns) == 6


# -- rejudge -----------------------------------------------------------------------------------


async def _stored_campaign(path: Path, cfg: Config) -> list[Message]:
    async with SqliteEventStore(path) as store:
        return await run(cfg, store)


async def _rejudge(path: Path, *addresses: str, **options: Any) -> Any:
    async with SqliteEventStore(path) as store:
        result = await rejudge(
            store, [ModelSettings(provider=a) for a in addresses], source=path, **options
        )
        return result, await events_of(store, result.campaign)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiosqlite
async def test_rejudge_shows_each_judge_what_the_search_judge_saw_and_adds_nothing_twice(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    before = await _stored_campaign(db, config(panel="", controller="uct"))
    judge_prompts = set(PROMPTS["search"])
    verdicts = [coords(m) for m in before if isinstance(m, Verdict)]
    unjudged = [m for m in before if isinstance(m, Unjudged)]
    result, after = await _rejudge(db, "scripted/panel-c")
    assert (result.stats.made, result.stats.present, result.stats.failed) == (len(verdicts), 0, 0)
    assert (result.replies, result.unjudged) == (len(verdicts), len(unjudged))
    assert Counter(PROMPTS["panel-c"]) == Counter(set(PROMPTS["panel-c"]))
    assert set(PROMPTS["panel-c"]) <= judge_prompts and len(PROMPTS["panel-c"]) == len(verdicts)
    ratings = [m for m in after if isinstance(m, Rating)]
    assert {(coords(m), m.rater, m.source) for m in ratings} == {
        (c, "scripted/panel-c", "rejudge") for c in verdicts
    }
    assert [m for m in after if not isinstance(m, Rating)] == before  # the verdicts stay
    calls = len(PROMPTS["panel-c"])
    again, twice = await _rejudge(db, "scripted/panel-c")
    assert (again.stats.made, again.stats.present) == (0, len(verdicts))
    assert len(PROMPTS["panel-c"]) == calls and twice == after


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiosqlite
async def test_rejudge_stops_at_its_call_limit_and_a_rerun_continues(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    before = await _stored_campaign(db, config(panel=""))
    verdicts = [coords(m) for m in before if isinstance(m, Verdict)]
    assert len(verdicts) > 4
    # A rating starts only with room for its 3 asks (campaign.judge_max_asks) and gives back
    # what it did not use: each takes one ask here, so 7 calls allow 5 ratings (7 - 3 + 1).
    first, _ = await _rejudge(db, "scripted/panel-c", max_calls=7, concurrency=1)
    assert first.limit_reached and first.stats.made == 5
    assert first.stats.left == len(verdicts) - 5
    assert len(PROMPTS["panel-c"]) == 5
    rest, after = await _rejudge(db, "scripted/panel-c")
    assert (rest.stats.made, rest.stats.present) == (len(verdicts) - 5, 5)
    assert Counter(coords(m) for m in after if isinstance(m, Rating)) == Counter(verdicts)


def test_rejudge_cli_summary_exit_codes_and_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mhsafeeval.cli import main

    path = tmp_path / "c.toml"
    path.write_text(config_text(panel=""))
    db = tmp_path / "c.db"
    assert main(["run", str(path), "--db", str(db), "--quiet"]) == 0
    events = stored(db)
    verdicts = {coords(m): m for m in events if isinstance(m, Verdict)}
    unjudged = sum(isinstance(m, Unjudged) for m in events)
    capsys.readouterr()
    # The same judge model as the search's, shown the same prompts: the same severities.
    assert main(["rejudge", str(db), "--judge", "scripted/panel-search-judge", "--quiet"]) == 0
    n = len(verdicts)
    summary = f"{n} rating(s) made, 0 already present, {unjudged} unjudged (not rated), 0 failed"
    assert summary in capsys.readouterr().err
    ratings = {coords(m): m for m in stored(db) if isinstance(m, Rating)}
    assert set(ratings) == set(verdicts)
    assert all(ratings[c].severity == v.severity for c, v in verdicts.items())
    assert main(["rejudge", str(db), "--judge", "scripted/panel-search-judge", "--quiet"]) == 0
    assert f"0 rating(s) made, {n} already present" in capsys.readouterr().err
    assert len(stored(db)) == len(events) + n
    # A judge whose every call fails: exit 1, a failure record per reply, no rating; a rerun
    # once it is back rates them all.
    BROKEN.add("panel-c")
    assert main(["rejudge", str(db), "--judge", "scripted/panel-c", "--quiet"]) == 1
    assert f"0 rating(s) made, 0 already present, {unjudged} unjudged (not rated), {n} failed" in (
        capsys.readouterr().err
    )
    after = stored(db)
    failed = [m for m in after if isinstance(m, CallFailed) and m.agent == "panel"]
    assert {coords(m) for m in failed} == set(verdicts)
    assert not any(isinstance(m, Rating) and m.rater == "scripted/panel-c" for m in after)
    BROKEN.clear()
    assert main(["rejudge", str(db), "--judge", "scripted/panel-c", "--quiet"]) == 0
    assert f"{n} rating(s) made" in capsys.readouterr().err
    # --max-calls: exit 3, and what is left is named.
    limited = ["--judge", "scripted/panel-a", "--max-calls", "4", "--concurrency", "1"]
    assert main(["rejudge", str(db), *limited, "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "2 rating(s) made" in err and f"--max-calls 4 reached; {n - 2} rating(s) left" in err
    # Bad input: exit 2, one message naming what is wrong, nothing written.
    count = len(stored(db))
    other = tmp_path / "other.db"
    other.write_text("not a database")
    calibration = tmp_path / "cal.db"
    import sqlite3

    with sqlite3.connect(calibration) as con:
        con.execute("CREATE TABLE ratings (judge TEXT)")
    judge = ["--judge", "scripted/panel-a"]
    cases = [
        ([str(tmp_path / "missing.db"), *judge], f"{tmp_path / 'missing.db'}: no such file"),
        ([str(other), *judge], str(other)),
        ([str(calibration), *judge], str(calibration)),
        ([str(db), *judge, "--campaign", "nope"], "no campaign 'nope' (stored: 'panel')"),
        ([str(db), "--judge", "nosuch/x"], "--judge nosuch/x"),
        ([str(db), *judge, "--samples", "2"], "--samples: more than 1 sample needs"),
        ([str(db), *judge, "--timeout", "-1"], "--timeout"),
        ([str(db), *judge, "--taxonomy", str(tmp_path / "no.toml")], "no.toml"),
    ]
    for args, named in cases:
        assert main(["rejudge", *args, "--quiet"]) == 2, args
        err = capsys.readouterr().err
        assert named in err and err.count("mhsafeeval: error") == 1, (args, err)
    assert not (tmp_path / "missing.db").exists()
    assert len(stored(db)) == count
    with pytest.raises(SystemExit) as usage:
        main(["rejudge", str(db)])  # --judge is required
    assert usage.value.code == 2


def test_estimate_counts_the_panels_calls() -> None:
    """--estimate: every judged reply once per panel member and sample, with the re-asks."""
    from mhsafeeval.plan import estimate_calls

    with_panel = estimate_calls(config())
    without = estimate_calls(config(panel=""))
    assert "panel" not in without
    asks = config().campaign.judge_max_asks
    low, high = with_panel["counselor"]
    assert with_panel["panel"] == (low * len(RATERS), high * len(RATERS) * asks)
