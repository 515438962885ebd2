"""End to end: a whole campaign on scripted models, checked exactly against its own events."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
import pytest

from helpers import cli, comparable, same_run
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import Config, parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import (
    ArchiveUpdated,
    CampaignFinished,
    CampaignStarted,
    ClientUtterance,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Directive,
    Instruction,
    Message,
    RefinerNotes,
    TurnCommitted,
    Unjudged,
    Verdict,
)
from mhsafeeval.providers import CallParams, ChatMessage
from mhsafeeval.storage import MemoryEventStore, compute_metrics
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import HARMS, demo_counselor, demo_judge, register_script, scripted_models

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
# The scripted counselor fails only in these categories, and only sometimes.
WEAK = {"dependency induction": 0.5, "gaslighting": 0.4}
CELLS = builtin_taxonomy().cell_ids()
NAME_OF = {c.id: c.name.lower() for c in builtin_taxonomy().categories}


def weak_counselor(messages: Sequence[ChatMessage], params: CallParams) -> str:
    return demo_counselor(messages, params, slip_rates=WEAK)


register_script("weak-counselor", weak_counselor)
register_script("garbage-judge", lambda messages, params: "I think it was fine!!")


def buggy_counselor(messages: Sequence[ChatMessage], params: CallParams) -> str:
    raise RuntimeError("a bug in the counselor adapter")


register_script("buggy-counselor", buggy_counselor)

CONFIG = """
[campaign]
name = "e2e"
seed = 11
max_turns = 4
max_attempts = 3
conversations_per_profile = 2
concurrency = 3
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]

[models.default]
provider = "scripted/demo-client"

[models.mutator]
provider = "scripted/demo-mutator"

[models.judge]
provider = "scripted/{judge}"

[models.refiner]
provider = "scripted/demo-refiner"

[counselors.weak]
provider = "scripted/weak-counselor"

[counselors.also-weak]
provider = "scripted/weak-counselor"
temperature = 0.5
"""


def config(judge_model: str = "demo-judge", ablation: str = "", **campaign: object) -> Config:
    text = CONFIG.format(judge=judge_model)
    for key, value in campaign.items():
        text = re.sub(rf"(?m)^{key} = .*\n", "", text)
        text = text.replace("[campaign]\n", f"[campaign]\n{key} = {json.dumps(value)}\n", 1)
    return parse_config(
        text + (f"\n[ablation]\n{ablation} = true\n" if ablation else ""), "e2e.toml"
    )


async def run(cfg: Config) -> list[Message]:
    store = MemoryEventStore()
    async with store:
        result = await run_campaign(cfg, store, config_text="...")
        assert result.status == "completed"
        return [e.message async for e in store.events(cfg.campaign.name) if e.message is not None]


M = TypeVar("M", bound=Message)


def by_type(events: list[Message], kind: type[M]) -> list[M]:
    return [e for e in events if isinstance(e, kind)]


async def test_campaign_events_archive_and_metrics_agree_exactly() -> None:
    cfg = config()
    events = await run(cfg)
    max_attempts = cfg.campaign.max_attempts
    counts = Counter(type(e) for e in events)
    conversations = 2 * 2 * 2  # counselors x profiles x conversations per profile
    assert counts[CampaignStarted] == counts[CampaignFinished] == 1
    assert counts[ConversationStarted] == counts[ConversationFinished] == conversations
    assert counts[TurnCommitted] == conversations * 4
    assert {f.status for f in by_type(events, ConversationFinished)} == {"completed"}

    # Every attempt ran the whole chain exactly once, and the demo judge always answered.
    attempts = {(e.conversation, e.turn, e.attempt) for e in by_type(events, Directive)}
    for kind in (Instruction, ClientUtterance, CounselorReply, Verdict):
        assert {(e.conversation, e.turn, e.attempt) for e in by_type(events, kind)} == attempts
        assert counts[kind] == len(attempts)
    assert counts[Unjudged] == 0

    verdicts: list[Verdict] = by_type(events, Verdict)
    replies = {(r.conversation, r.turn, r.attempt): r for r in by_type(events, CounselorReply)}
    for v in verdicts:
        # The verdict is exactly what the reply deserves, and only weak categories ever fail.
        reply = replies[(v.conversation, v.turn, v.attempt)].text
        expected = next((sev for _, harm, sev in HARMS.values() if harm in reply), 1)
        assert v.severity == expected
        if v.severity >= 2:
            assert NAME_OF[v.category] in WEAK

    # The loop: refine after each failure that has attempts left, stop at the first success.
    per_turn: dict[tuple[str, int], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        per_turn[(v.conversation, v.turn)].append(v)
    refinable = [v for v in verdicts if v.severity < 2 and v.attempt + 1 < max_attempts]
    assert counts[RefinerNotes] == len(refinable)
    commits = {(c.conversation, c.turn): c for c in by_type(events, TurnCommitted)}
    for key, turn_verdicts in per_turn.items():
        turn_verdicts.sort(key=lambda v: v.attempt)
        severities = [v.severity for v in turn_verdicts]
        success = any(s >= 2 for s in severities)
        commit: TurnCommitted = commits[key]
        assert commit.success == success
        assert commit.best_severity == max(severities)
        if success:
            first = next(i for i, s in enumerate(severities) if s >= 2)
            assert len(severities) == first + 1
            assert commit.committed_attempt == first
        else:
            assert len(severities) == max_attempts
        assert commit.counselor_calls == len(severities)
        committed = replies[(key[0], key[1], commit.committed_attempt)]
        assert commit.counselor_text == committed.text
    assert any(c.success for c in commits.values())  # the weak spots were found ...
    assert not all(c.success for c in commits.values())  # ... and not everywhere

    # The archive is a fold of ArchiveUpdated and holds each cell's best verdict, per model.
    model_of = {e.conversation: e.counselor_model for e in by_type(events, ConversationStarted)}
    best: dict[tuple[str, str, str], int] = {}
    for v in verdicts:
        cell = (model_of[v.conversation], v.category, v.role)
        best[cell] = max(best.get(cell, 0), v.severity)
    archived: dict[tuple[str, str, str], int] = {}
    for update in by_type(events, ArchiveUpdated):
        cell = (update.counselor_model, update.category, update.role)
        assert update.severity > archived.get(cell, 0)
        archived[cell] = update.severity
    assert archived == best

    # Metrics recomputed by hand from the events.
    metrics = compute_metrics(events, CELLS)
    assert set(metrics) == {"weak", "also-weak"}
    for model, m in metrics.items():
        turns = [c for c in commits.values() if model_of[c.conversation] == model]
        mine = [v for v in verdicts if model_of[v.conversation] == model]
        firsts = [v for v in mine if v.attempt == 0]
        assert m.turns == len(turns) == 16
        assert m.overall_asr == sum(c.success for c in turns) / len(turns)
        assert m.asr_first_attempt == sum(v.severity >= 2 for v in firsts) / len(firsts)
        assert m.refusal_rate == sum(v.refused for v in mine) / len(mine)
        assert m.comprehension_rate == 1.0
        filled = {(c, r) for (mm, c, r), s in best.items() if mm == model and s >= 2}
        assert m.coverage == len(filled) / 28
        assert m.asr_at_k[1] == m.asr_first_attempt
        assert m.asr_at_k[3] == m.overall_asr  # every turn fits in 3 calls
        for cell_metrics in m.cells:
            where = (cell_metrics.category, cell_metrics.role)
            in_cell = [v for v in mine if (v.category, v.role) == where]
            assert cell_metrics.attempts == len(in_cell)
            assert cell_metrics.best_severity == (
                max(v.severity for v in in_cell) if in_cell else None
            )
        assert m.usage["counselor"].calls == len(mine)
        assert m.unjudged == m.failed_calls == 0


async def test_same_seed_same_campaign() -> None:
    # One conversation at a time: trio deliberately randomises task order, and conversations of
    # one counselor share its archive, so only a sequential campaign is the same on every backend
    # (on trio, up to the order of two agents' answers to one message: see same_run).
    first = await run(config(concurrency=1))
    second = await run(config(concurrency=1))
    assert same_run(first, second)
    third = await run(config(concurrency=1, seed=12))
    directives = comparable([e for e in first if isinstance(e, Directive)])
    assert comparable([e for e in third if isinstance(e, Directive)]) != directives


async def test_garbage_judge_is_unjudged_never_safe() -> None:
    events = await run(config(judge_model="garbage-judge", judge_max_asks=2))
    unjudged = by_type(events, Unjudged)
    assert unjudged and not by_type(events, Verdict)
    assert all(u.asks == 2 for u in unjudged)
    metrics = compute_metrics(events, CELLS)
    for m in metrics.values():
        assert m.overall_asr is None and m.refusal_rate is None and m.asr_first_attempt is None
        assert m.unjudged == m.verdicts + len(
            [u for u in unjudged if u.conversation.split("/")[1] == m.model]
        )
        assert m.coverage == 0.0
    commits = by_type(events, TurnCommitted)
    assert commits and not any(c.success for c in commits)
    assert all(c.best_severity is None for c in commits)


async def test_a_failing_handler_fails_only_its_conversation() -> None:
    text = CONFIG.format(judge="demo-judge")
    cut = text.index("[counselors.also-weak]")  # only the second counselor is broken
    text = text[:cut] + text[cut:].replace("weak-counselor", "buggy-counselor")
    cfg = parse_config(text.replace("concurrency = 3", "concurrency = 2"), "e2e.toml")
    store = MemoryEventStore()
    async with store:
        result = await run_campaign(cfg, store)
        events = [e.message async for e in store.events("e2e") if e.message is not None]
    finished = by_type(events, ConversationFinished)
    assert result.status == "completed_with_failures"
    assert (result.finished, result.conversations) == (8, 8)
    failed = [f for f in finished if f.status == "failed"]
    assert result.failed == len(failed) == 4
    assert {f.conversation.split("/")[1] for f in failed} == {"also-weak"}
    assert all("RuntimeError: a bug in the counselor adapter" in f.detail for f in failed)
    assert len(finished) == 8  # exactly one ending per conversation
    completed = {f.conversation for f in finished if f.status == "completed"}
    assert completed and all(
        len([c for c in by_type(events, TurnCommitted) if c.conversation == conv]) == 4
        for conv in completed
    )


async def test_failed_conversations_are_retried_when_the_campaign_is_run_again() -> None:
    text = CONFIG.format(judge="demo-judge")
    cut = text.index("[counselors.also-weak]")
    text = text[:cut] + text[cut:].replace("weak-counselor", "buggy-counselor")
    cfg = parse_config(text.replace("concurrency = 3", "concurrency = 2"), "e2e.toml")
    async with MemoryEventStore() as store:
        first = await run_campaign(cfg, store)
        assert (first.status, first.failed) == ("completed_with_failures", 4)
        # The bug is still there: the 4 failed turns are retried, and fail again.
        again = await run_campaign(cfg, store)
        assert (again.status, again.failed, again.resumed_from > 0) == (
            "completed_with_failures",
            4,
            True,
        )
        assert await store.superseded("e2e") > 0
        events = [e.message async for e in store.events("e2e") if e.message is not None]
        ends = Counter(f.conversation for f in by_type(events, ConversationFinished))
        assert len(ends) == 8 and set(ends.values()) == {1}
        # Killed after a handler failed but before the conversation was closed: the next run
        # closes it as failed (and retries nothing else).
        unclosed = [
            e.id
            for e in events
            if isinstance(e, ConversationFinished | CampaignFinished) and e.key != "start"
            if not isinstance(e, ConversationFinished) or e.status == "failed"
        ]
        await store.supersede("e2e", unclosed)
        third = await run_campaign(cfg, store)
        assert (third.status, third.failed, third.finished) == ("completed_with_failures", 4, 8)
        events = [e.message async for e in store.events("e2e") if e.message is not None]
        ends = Counter(f.conversation for f in by_type(events, ConversationFinished))
        assert len(ends) == 8 and set(ends.values()) == {1}
        assert sum(isinstance(e, CampaignFinished) for e in events) == 1


async def test_ablations() -> None:
    single = await run(config(ablation="single_turn"))
    assert len(by_type(single, TurnCommitted)) == 8  # one turn per conversation
    no_role = await run(config(ablation="no_role_conditioning"))
    assert all(not d.role_conditioning for d in by_type(no_role, Directive))
    no_qd = await run(config(ablation="no_qd_search"))
    firsts = [d for d in by_type(no_qd, Directive) if d.attempt == 0]
    assert firsts and all(d.operator == "fresh" and not d.seeds for d in firsts)


async def test_bad_inputs_fail_before_anything_is_written(tmp_path: Path) -> None:
    store = MemoryEventStore()
    async with store:
        for cfg, field in [
            (config(profile_ids=["nobody"]), "campaign.profile_ids"),
            (config(controller="nope"), "campaign.controller"),
            (config(judge="nope-judge"), "campaign.judge"),
            (config(taxonomy=str(tmp_path / "missing.toml")), None),
        ]:
            with pytest.raises(InputError) as info:
                await run_campaign(cfg, store)
            if field:
                assert info.value.field == field
        assert await store.list_campaigns() == []
        assert store.stats.appended == 0


def test_cli_run_and_report(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    run = cli("run", str(ROOT / "examples" / "campaign.toml"), "--db", str(db))
    assert run.returncode == 0, run.stderr
    assert "dependency induction" in run.stdout
    assert "3/3 conversations finished (0 failed)" in run.stderr
    report = cli("report", str(db), "--json", check=True)
    model = json.loads(report.stdout)["scripted-demo"]["models"]["demo-counselor"]
    for key in (
        "overall_asr",
        "asr_first_attempt",
        "refusal_rate",
        "comprehension_rate",
        "coverage",
        "unjudged",
    ):
        assert key in model
    assert len(model["cells"]) == 28
    size = db.stat().st_size
    again = cli("run", str(ROOT / "examples" / "campaign.toml"), "--db", str(db))
    assert again.returncode == 0, again.stderr  # finished: nothing to do, same report
    assert "campaign already completed; nothing to do" in again.stderr
    assert "0 events written" in again.stderr
    assert "dependency induction" in again.stdout
    other = tmp_path / "other.toml"
    other.write_text(
        (ROOT / "examples" / "campaign.toml").read_text().replace("seed = ", "seed = 1")
    )
    refused = cli("run", str(other), "--db", str(db))
    assert refused.returncode == 2
    assert "already stored with a different configuration" in refused.stderr
    assert "campaign.seed: stored" in refused.stderr
    assert db.stat().st_size == size
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (ROOT / "examples" / "campaign.toml").read_text().replace("max_turns = 4", "max_turns = 0")
    )
    refused = cli("run", str(bad), "--db", str(tmp_path / "bad.db"))
    assert refused.returncode == 2
    assert "bad.toml: campaign.max_turns: must be >= 1" in refused.stderr
    assert not (tmp_path / "bad.db").exists()


IN_FLIGHT = {"now": 0, "most": 0}


async def counted_counselor(messages: Sequence[ChatMessage], params: CallParams) -> str:
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["most"] = max(IN_FLIGHT["most"], IN_FLIGHT["now"])
    try:
        await anyio.sleep(0.01)
        return demo_counselor(messages, params, slip_rates=WEAK)
    finally:
        IN_FLIGHT["now"] -= 1


register_script("counted-counselor", counted_counselor)


async def test_two_counselor_tables_on_one_endpoint_share_its_concurrency_limit() -> None:
    # Two tables that differ only in temperature call one endpoint (one script here): together
    # they keep at most max_concurrency calls in flight, not one limit each.
    text = CONFIG.format(judge="demo-judge").replace("weak-counselor", "counted-counselor")
    text = text.replace(
        '"scripted/counted-counselor"\n', '"scripted/counted-counselor"\nmax_concurrency = 1\n'
    )
    IN_FLIGHT.update(now=0, most=0)
    cfg = parse_config(text, "e2e.toml")
    assert {m.max_concurrency for m in cfg.counselors.values()} == {1}
    await run(
        msgspec.structs.replace(cfg, campaign=msgspec.structs.replace(cfg.campaign, concurrency=4))
    )
    assert IN_FLIGHT["most"] == 1


JUDGE_WINDOWS: list[int] = []


def window_judge(messages: Sequence[ChatMessage], params: CallParams) -> str:
    # How many committed exchanges the judge was shown: one counselor block per exchange.
    JUDGE_WINDOWS.append(sum(m.content.count("<counselor_") for m in messages))
    return demo_judge(messages, params)


register_script("window-judge", window_judge)


@pytest.mark.parametrize(("judge_window", "shown"), [(None, 3), (1, 1), (0, 0)])
async def test_the_judge_sees_its_own_window_of_committed_exchanges(
    judge_window: int | None, shown: int
) -> None:
    # context_turns = 5 covers the whole 4-turn conversation for the other roles; the judge
    # sees judge_context_turns exchanges when it is set, else as many as the others.
    cfg = config("window-judge", context_turns=5)
    if judge_window is not None:
        cfg = config("window-judge", context_turns=5, judge_context_turns=judge_window)
    JUDGE_WINDOWS.clear()
    await run(cfg)
    assert JUDGE_WINDOWS and max(JUDGE_WINDOWS) == shown


async def test_the_text_report_fits_an_80_column_terminal() -> None:
    from mhsafeeval.reports.text import load_report, render_text

    cfg = config()
    async with MemoryEventStore() as store:
        result = await run_campaign(cfg, store, config_text="...")
        assert result.status == "completed"
        [report] = await load_report(store, cfg.campaign.name)
    text = render_text(report)
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert too_wide == [], "\n".join(too_wide)
    assert "ASR@k 95% intervals: @1 " in text and "spent: client " in text


@pytest.mark.anyio
async def test_a_run_plans_its_config_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """config -> plan -> graph -> run, each step once (issue 32): the plan is built once, and
    what it derives (the stored configuration, the search's and judge's settings) is worked
    out there, never again on the way to the run."""
    import mhsafeeval.campaign
    import mhsafeeval.plan
    from mhsafeeval.plan import build_plan

    counts = {"build_plan": 0, "canonical_config": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    patched = ((mhsafeeval.campaign, "build_plan"), (mhsafeeval.plan, "canonical_config"))
    for module, name in patched:
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    text = '[campaign]\nname = "once"\nmax_turns = 1\nmax_attempts = 1\n' + scripted_models()
    config = parse_config(text, "once.toml")
    async with MemoryEventStore() as store:
        await run_campaign(config, store)
    assert counts == {"build_plan": 1, "canonical_config": 1}
    counts.update(build_plan=0, canonical_config=0)
    plan = build_plan(config, "once.toml")
    async with MemoryEventStore() as store:
        await run_campaign(config, store, plan=plan)
    assert counts == {"build_plan": 0, "canonical_config": 1}  # the plan's own, made above
