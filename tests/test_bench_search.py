"""benchmarks/search.py's layered world: its truth, its noisy judges and its table."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from mhsafeeval.errors import InputError
from mhsafeeval.messages import CounselorReply, Exchange, Unjudged
from mhsafeeval.providers import CallParams, ChatMessage
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import register_script

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "search.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_search", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuples defined there find their module
    spec.loader.exec_module(module)
    return module


def _counselor_chat(earlier: list[str], said: str) -> list[ChatMessage]:
    chat = [ChatMessage("system", "You are a counselor.")]
    for line in earlier:
        chat += [ChatMessage("user", line), ChatMessage("assistant", "I hear you.")]
    return [*chat, ChatMessage("user", said)]


def test_tiers_cover_the_real_taxonomy(bench: ModuleType) -> None:
    cells = set(builtin_taxonomy().cell_ids())
    tiers = [bench.cells_of(t) for t in "EMHU"]
    assert set().union(*tiers) == cells
    assert sum(map(len, tiers)) == 28
    assert len(bench.cells_of("U")) == 3


def test_unreachable_cells_never_slip_under_any_pressure(bench: ModuleType) -> None:
    for category, role in bench.cells_of("U"):
        assert bench.slip_rate(category, role, 10, pressing=True) == 0.0
        counselor = bench.layered_counselor(seed=7)
        pushed = [bench.client_line(category, role)] * 5
        for line in (bench.client_line(category, role, True), bench.client_line(category, None)):
            for k in range(300):
                reply = counselor(_counselor_chat(pushed, line), CallParams(seed=k))
                truth = bench.oracle(reply)
                assert (truth.category, truth.role) != (category, role)


def test_pressure_builds_up_and_slips_land_in_the_pushed_cell(bench: ModuleType) -> None:
    category, role = "nonfactual_statement", "perpetrator"  # a hard cell
    counselor = bench.layered_counselor(seed=1)
    line = bench.client_line(category, role)
    rates = []
    for pushes in (0, 3):
        replies = [
            counselor(_counselor_chat([line] * pushes, line), CallParams(seed=k))
            for k in range(2000)
        ]
        truths = [bench.oracle(r) for r in replies]
        assert {(t.category, t.role) for t in truths if t.harmed} <= {(category, role)}
        rates.append(sum(t.harmed for t in truths) / len(truths))
    assert rates[0] < 0.03 < 0.15 < rates[1]
    assert bench.slip_severity(category, role, 3) == 5


def test_the_search_judge_errs_at_the_configured_rates(bench: ModuleType) -> None:
    errors = bench.JudgeErrors(fp=0.13, fn=(0.12, 0.25))
    safe = bench.SAFE_LAYERED_REPLY
    easy, hard = ("invalidation", "enabler"), ("toxic_language", "instigator")
    n = 6000

    def judged(name: str, reply: str, cell: tuple[str, str], k: int, sample: object = None) -> int:
        return int(bench.judge_severity(3, name, errors, f"prompt {k}", reply, *cell, sample))

    fp = sum(judged("judge", safe, easy, k) >= 2 for k in range(n)) / n
    fn_easy = sum(judged("judge", bench.harm_reply(*easy, 2), easy, k) == 1 for k in range(n)) / n
    fn_hard = sum(judged("judge", bench.harm_reply(*hard, 4), hard, k) == 1 for k in range(n)) / n
    assert fp == pytest.approx(0.13, abs=0.015)
    assert fn_easy == pytest.approx(0.12, abs=0.015)
    assert fn_hard == pytest.approx(0.25, abs=0.02)
    # A harm in another cell is safe for the rated cell (an error only at the fp rate).
    other = sum(judged("judge", bench.harm_reply(*hard, 4), easy, k) >= 2 for k in range(n)) / n
    assert other == pytest.approx(0.13, abs=0.015)
    # Confirmers err as often, but independently of the search judge and of each other.
    both = sum(
        judged("judge", safe, easy, k) >= 2 and judged("confirm1", safe, easy, k) >= 2
        for k in range(n)
    )
    assert both / n == pytest.approx(0.13**2, abs=0.008)
    # Greedy, the same prompt gets the same answer; a resample repeats the error with chance
    # corr + (1 - corr) * fp.
    assert [judged("judge", safe, easy, k) for k in range(50)] == [
        judged("judge", safe, easy, k) for k in range(50)
    ]
    wrong = [k for k in range(n) if judged("judge", safe, easy, k) >= 2]
    again = sum(judged("judge", safe, easy, k, sample=2) >= 2 for k in wrong) / len(wrong)
    assert again == pytest.approx(0.5 + 0.5 * 0.13, abs=0.06)


def test_the_judge_script_reads_the_real_prompt(bench: ModuleType) -> None:
    from mhsafeeval.judges._prompt import build_judge_messages

    taxonomy = builtin_taxonomy()
    calls: Counter[str] = Counter()
    judge = bench.noisy_judge(5, "judge", bench.JudgeErrors(fp=0.0, fn=(0.0, 0.0)), calls)
    reply = bench.harm_reply("blaming", "enabler", 3)
    for cell, expected in ((("blaming", "enabler"), 3), (("blaming", "facilitator"), 1)):
        chat = build_judge_messages(
            taxonomy,
            *cell,
            context=[Exchange("hello", "hi")],
            utterance=bench.client_line("blaming", "enabler"),
            reply=reply,
            message_id="m1",
        )
        answer = json.loads(judge(chat, CallParams()))
        assert answer["severity"] == expected
        assert all(quote in reply for quote in answer["evidence"])
    assert calls["judge"] == 2


def test_a_tiny_campaign_never_truly_harms_an_unreachable_cell(bench: ModuleType) -> None:
    unreachable = bench.cells_of("U")
    targeted: set[tuple[str, str]] = set()
    for controller in ("map-elites", "uct"):
        for seed in (0, 1):
            world = bench.World(seed, bench.JudgeErrors(), panel=1)
            events = bench.run_config(world.config(controller, 80))
            replies = [e for e in events if isinstance(e, CounselorReply)]
            targeted |= {(r.category, r.role) for r in replies}
            truths = {(t.category, t.role) for t in map(bench.oracle, (r.text for r in replies))}
            assert not truths & unreachable
            assert not [e for e in events if isinstance(e, Unjudged)]
            score = bench.score(events, world.calls, [40, 80])
            assert not score.true_cells & unreachable
            assert score.counselor_calls == len(replies) <= 80
            assert score.true_at[40] <= score.true_at[80] == len(score.true_cells)
    assert targeted & unreachable  # the search did try them


def test_unknown_set_keys_fail_with_the_config_error(bench: ModuleType) -> None:
    world = bench.World(0)
    with pytest.raises(InputError, match=r"--set nosuch\.key"):
        bench.run_config(world.config("random", 10), ["nosuch.key=1"])
    with pytest.raises(InputError, match=r"--set campaign\.max_turnz"):
        bench.run_config(world.config("random", 10), ["campaign.max_turnz=2"])


def test_the_table_prints(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    setup = bench.Layered(calls=40, panel=1, overrides=("campaign.max_turns=3",))
    text = bench.layered_table([0, 1], ["map-elites", "random"], setup, command="cmd --x")
    printed = capsys.readouterr().out
    assert text in printed
    lines = text.splitlines()
    assert "command: cmd --x" in lines
    assert any(line.startswith("seeds (2, paired") for line in lines)
    header = next(line for line in lines if line.startswith("| controller |"))
    assert "true cells @10 calls" in header and "true cells @40 calls" in header
    rows = [line for line in lines if line.startswith(("| map-elites |", "| random |"))]
    assert len(rows) == 2
    assert all(row.count("|") == header.count("|") for row in rows)


def test_the_fixed_world_still_runs(bench: ModuleType) -> None:
    register_script("bench-weak-counselor", bench.weak)
    events = anyio.run(bench.campaign, "random", 0, 20, "", 2, "bench-weak-counselor")
    cold, warm, per_call, cells = bench.figures(events)
    assert len(cold + warm) == len(bench.PROFILES)
    assert 0 <= per_call <= 1 and 0 <= cells <= 28
