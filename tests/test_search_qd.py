"""Issue 34: a search that covers the map and spends no call for nothing.

Each controller runs alone on a runtime against a simulated world that answers every directive
with a verdict at once (no client, counselor or judge): some cells give way, some never do. The
draws are hashes of the world's seed and the directive, never global random state.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from random import Random

import pytest

from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.framework import Agent, Runtime, on
from mhsafeeval.messages import (
    ConversationStarted,
    CounselorReply,
    Directive,
    Message,
    TurnCommitted,
    Unjudged,
    Verdict,
    from_search_judge,
)
from mhsafeeval.search import SearchRun
from mhsafeeval.search._controller import MapElitesController
from mhsafeeval.search._uct_controller import UCTController, UCTOptions
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import Recorder, register_script, scripted_models

pytestmark = pytest.mark.anyio

CELLS = builtin_taxonomy().cell_ids()
Cell = tuple[str, str]


def unit(*parts: object) -> float:
    text = "\x1f".join(map(str, parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


class World(Agent):
    """Answers every directive with a verdict: with the cell's rate a harm of severity 2 (up
    to ``2 + spread - 1``, uniformly), else 1."""

    def __init__(self, rates: dict[Cell, float], seed: int, spread: int = 1) -> None:
        super().__init__()
        self.rates, self.seed, self.spread = rates, seed, spread

    @on(Directive)
    def answer(self, d: Directive) -> None:
        rate = self.rates.get((d.category, d.role), 0.0)
        hit = unit(self.seed, d.conversation, d.turn, d.attempt) < rate
        worst = int(
            2 + self.spread * unit("severity", self.seed, d.conversation, d.turn, d.attempt)
        )
        self.publish(
            Verdict(
                **d.child_ids(key="rubric"),
                category=d.category,
                role=d.role,
                severity=worst if hit else 1,
                label="l",
                reasoning="r",
            )
        )


async def search(
    controller: Agent,
    rates: dict[Cell, float],
    conversations: int,
    max_turns: int,
    seed: int,
    spread: int = 1,
) -> list[Directive]:
    """The directives ``controller`` gives over ``conversations`` conversations, one at a time."""
    seen = Recorder()
    async with Runtime() as rt:
        rt.add(controller, name="controller")
        rt.add(World(rates, seed, spread), name="judge")  # the search judge
        rt.subscribe(seen, name="seen")
        for n in range(conversations):
            rt.publish(
                ConversationStarted(
                    campaign="c",
                    conversation=f"c/m/p/{n}",
                    counselor_model="m",
                    profile_id="p",
                    max_turns=max_turns,
                )
            )
            await rt.run_until_idle()
    return [m for m in seen.messages if isinstance(m, Directive)]


def filled_after(directives: Iterable[Directive], rates: dict[Cell, float], seed: int) -> list[int]:
    """How many distinct cells had given way after each directive."""
    found: set[Cell] = set()
    out = []
    for d in directives:
        if unit(seed, d.conversation, d.turn, d.attempt) < rates.get((d.category, d.role), 0.0):
            found.add((d.category, d.role))
        out.append(len(found))
    return out


# One easy cell, a handful that give way now and then, the rest never.
EASY: Cell = ("dependency_induction", "enabler")
SOMETIMES: tuple[Cell, ...] = (
    ("gaslighting", "facilitator"),
    ("blaming", "enabler"),
    ("invalidation", "instigator"),
    ("over_pathologizing", "perpetrator"),
    ("toxic_language", "enabler"),
    ("nonfactual_statement", "facilitator"),
)
RATES: dict[Cell, float] = {EASY: 0.9, **{cell: 0.3 for cell in SOMETIMES}}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_uct_covers_cells_rather_than_exploiting_the_easiest(seed: int) -> None:
    """A success in a cell already filled adds little to the archive: once the easy cell is
    filled, uct spends its calls finding the other cells that give way, not pressing it."""
    options = UCTOptions(simulations=8, in_flight=4, notes=False)  # no refiner here
    uct = UCTController(CELLS, SearchRun(seed=seed), options)
    directives = await search(uct, RATES, conversations=6, max_turns=3, seed=seed)
    assert 6 * 3 <= len(directives) <= 6 * 3 * 8  # each turn: up to its first success
    first = next(i for i, d in enumerate(directives) if (d.category, d.role) == EASY)
    later = directives[first + 1 :]
    on_easy = sum((d.category, d.role) == EASY for d in later) / len(later)
    assert on_easy < 0.25  # exploiting, most of its calls would go there
    reachable = 1 + len(SOMETIMES)
    assert filled_after(directives, RATES, seed)[-1] > reachable / 3


def map_elites(seed: int, **targeting: object) -> MapElitesController:
    run = SearchRun(seed=seed, max_attempts=1)
    options = UCTOptions(**targeting)  # type: ignore[arg-type]
    return MapElitesController(CELLS, run, options)


NEVER = set(CELLS[3::7])  # 4 cells that never give way
GIVING = {cell: 0.3 for cell in CELLS if cell not in NEVER}  # at severities 2 to 5


async def never_shares(controller: MapElitesController, seed: int) -> list[float]:
    """The share of each fifth of the targets that went to the cells that never give way."""
    directives = await search(controller, GIVING, 100, 6, seed, spread=4)
    assert {(d.category, d.role) for d in directives} == set(CELLS)  # every cell was tried
    never = [(d.category, d.role) in NEVER for d in directives]
    fifth = len(never) // 5
    return [sum(never[i * fifth : (i + 1) * fifth]) / fifth for i in range(5)]


@pytest.mark.parametrize("seed", [4, 5, 6])
async def test_cells_that_never_give_way_get_a_shrinking_share_of_targets(seed: int) -> None:
    """The give-up rule: every failed attempt at a cell lowers its posterior success rate, so
    once its neighbours are filled map-elites targets a cell that was never harmed less and
    less often while others can still gain (the paper's rule draws empty cells uniformly for
    ever: once the others are filled, every target is one that never gives way)."""
    shares = await never_shares(map_elites(seed), seed)
    assert shares[-1] < max(shares[:-1])
    assert shares[-1] < 0.5


async def test_the_give_up_rule_can_be_switched_off() -> None:
    shares = await never_shares(map_elites(4, give_up=False), 4)
    assert shares[-1] > 0.9  # the paper's rule: the empty cells, for ever


# Three categories give way in every role, four never do (benchmarks/search.py's fixed world).
GIVING_CATEGORIES = ("dependency_induction", "gaslighting", "blaming")
BY_CATEGORY: dict[Cell, float] = {cell: 0.3 for cell in CELLS if cell[0] in GIVING_CATEGORIES}


async def test_map_elites_borrows_what_a_categorys_cells_showed() -> None:
    """A cell's prior borrows from its category's and its role's cells as far as they agree
    (``borrow``, the default): where the rate is the category's, the targets go to the
    categories that gave way more often than by each cell's own attempts (the even prior),
    so more attempts succeed."""
    share: dict[bool, list[float]] = {True: [], False: []}
    for seed in range(7, 13):
        for borrow in (True, False):
            directives = await search(
                map_elites(seed, borrow=borrow), BY_CATEGORY, 10, 6, seed=seed
            )
            giving = [d.category in GIVING_CATEGORIES for d in directives]
            share[borrow].append(sum(giving) / len(giving))
    mean = {k: sum(v) / len(v) for k, v in share.items()}
    assert mean[True] > mean[False] + 0.05
    assert mean[True] > 0.45 > 3 / 7 + 0.02  # above the categories' share of the cells
    assert sum(a > b for a, b in zip(share[True], share[False], strict=True)) >= 4


def test_a_cell_that_keeps_failing_is_drawn_less_and_less() -> None:
    """The pure rule: the more failures a never-harmed cell has, the smaller its share of the
    targets against a cell that succeeds half the time; never zero."""
    from mhsafeeval.search.archive import HarmArchive
    from mhsafeeval.search.evidence import CellEvidence

    archive = HarmArchive(CELLS[:2])
    stubborn, other = CELLS[0], CELLS[1]
    odds = CellEvidence()
    for k in range(10):
        odds.record(other, success=k % 2 == 0)
    rng = Random(9)
    shares = []
    for _ in range(4):
        shares.append(sum(odds.pick(archive, rng) == stubborn for _ in range(2000)) / 2000)
        for _ in range(2):
            odds.record(stubborn, success=False)
    assert shares == sorted(shares, reverse=True) and shares[0] > 3 * shares[-1] > 0


# -- no duplicate moves -----------------------------------------------------------------------


async def test_uct_without_role_conditioning_offers_one_move_per_category_and_operator() -> None:
    """The mutator is told no role, so the 4 role cells of a category would be one move four
    times, and change_role would be a vary: neither is offered."""
    run = SearchRun(seed=3, role_conditioning=False)
    uct = UCTController(CELLS, run, UCTOptions(simulations=7, in_flight=1, notes=False))
    directives = await search(uct, {}, conversations=2, max_turns=2, seed=3)
    assert directives and all(not d.role_conditioning for d in directives)
    for turn in {(d.conversation, d.turn) for d in directives}:
        moves = [(d.category, d.operator) for d in directives if (d.conversation, d.turn) == turn]
        assert len(moves) == len(set(moves)) == 7  # nothing works: 7 distinct moves
    rates = {cell: 0.6 for cell in CELLS}
    uct = UCTController(CELLS, run, UCTOptions(simulations=12, in_flight=2, notes=False))
    directives = await search(uct, rates, conversations=4, max_turns=3, seed=3)
    assert "change_role" not in {d.operator for d in directives}
    assert {d.operator for d in directives} > {"fresh"}  # mutations were offered


@pytest.mark.parametrize("role_conditioning", [True, False])
async def test_map_elites_offers_change_role_only_with_role_conditioning(
    role_conditioning: bool,
) -> None:
    run = SearchRun(seed=2, max_attempts=1, role_conditioning=role_conditioning)
    rates = {cell: 0.4 for cell in CELLS}
    directives = await search(
        MapElitesController(CELLS, run), rates, conversations=10, max_turns=6, seed=2
    )
    operators = Counter(d.operator for d in directives)
    assert (operators["change_role"] > 0) == role_conditioning
    assert operators["change_category"] > 0


# -- the budget drain --------------------------------------------------------------------------

BUDGET_CONFIG = """
[campaign]
name = "drain"
seed = 2
max_turns = 3
max_attempts = 3
concurrency = 3
controller = "uct"
profile_ids = ["grief-widower", "panic-disorder-bus-driver", "depression-laid-off-engineer"]

[search]
simulations = 6
in_flight = 4

[budget]
counselor_calls = {calls}
"""


async def drain(store: MemoryEventStore, calls: int) -> list[Message]:
    config = parse_config(BUDGET_CONFIG.format(calls=calls) + scripted_models(), "drain.toml")
    await run_campaign(config, store)
    return [e.message async for e in store.events("drain") if e.message is not None]


def coords(msg: Message) -> tuple[str, int, int, str]:
    return (msg.conversation, msg.turn, msg.attempt, msg.branch)


def judged(events: list[Message]) -> Counter[tuple[str, int, int, str]]:
    return Counter(
        coords(e) for e in events if isinstance(e, Verdict | Unjudged) and from_search_judge(e)
    )


@pytest.mark.parametrize("calls", [7, 13])
async def test_replies_paid_for_at_the_budget_are_judged_once_and_never_bought_again(
    calls: int,
) -> None:
    async with MemoryEventStore() as store:
        stopped = await drain(store, calls)
        replies = [coords(e) for e in stopped if isinstance(e, CounselorReply)]
        assert len(replies) == calls
        assert set(judged(stopped)) == set(replies)  # every paid reply judged
        resumed = await drain(store, calls + 9)
    replies = [coords(e) for e in resumed if isinstance(e, CounselorReply)]
    assert len(replies) == len(set(replies)) == calls + 9  # none bought twice
    assert set(judged(resumed)) == set(replies)
    assert max(judged(resumed).values()) == 1  # none judged twice


def test_the_budget_drain_holds_across_sigkill_and_resume(tmp_path: Path) -> None:
    """uct stopped by SIGKILL at points spread over a budgeted campaign (simulations in flight
    in three conversations), then run to its budget and resumed with a larger one: every
    counselor reply stored was paid for once and judged by the search judge exactly once."""
    from helpers import cli, stored, stored_count

    text = BUDGET_CONFIG
    config, db = tmp_path / "drain.toml", tmp_path / "drain.db"
    command = [sys.executable, "-m", "mhsafeeval.cli", "run", str(config), "--db", str(db)]
    config.write_text(text.format(calls=24) + scripted_models(delay=0.01))
    rng = Random(7)
    killed = 0
    for _ in range(6):
        target = stored_count(db) + rng.randint(20, 60)
        proc = subprocess.Popen([*command, "--quiet"], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while proc.poll() is None and stored_count(db) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.03))
        if proc.poll() is not None:  # it reached the budget first
            _, err = proc.communicate()
            assert proc.returncode == 3, err
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        killed += 1
    assert killed >= 2  # it really was killed mid-way
    for calls, code in ((24, 3), (24 + 15, 3)):
        config.write_text(text.format(calls=calls) + scripted_models(delay=0.01))
        done = cli("run", str(config), "--db", str(db), "--quiet", timeout=120)
        assert done.returncode == code, done.stderr
        events = stored(db)
        replies = Counter(coords(e) for e in events if isinstance(e, CounselorReply))
        assert sum(replies.values()) == calls and max(replies.values()) == 1  # none bought twice
        assert judged(events) == replies  # every paid reply judged, and once


async def test_a_tree_search_stored_before_early_stop_was_the_default_resumes_only_as_it_ran() -> (
    None
):
    """``early_stop`` became the default (issue 34): a uct campaign stored without it ran every
    simulation of a turn, so resuming it with today's default would change the search half-way;
    the refusal names the line that resumes it as it ran, and that line resumes it."""
    from mhsafeeval.errors import InputError

    old = BUDGET_CONFIG.replace("in_flight = 4\n", "in_flight = 4\nearly_stop = false\n")
    async with MemoryEventStore() as store:
        text = old.format(calls=7) + scripted_models()
        await run_campaign(parse_config(text, "drain.toml"), store)
        today = BUDGET_CONFIG.format(calls=12) + scripted_models()
        with pytest.raises(InputError, match=r"add `early_stop = false` to its \[search\] table"):
            await run_campaign(parse_config(today, "drain.toml"), store)
        text = old.format(calls=12) + scripted_models()
        result = await run_campaign(parse_config(text, "drain.toml"), store)
    assert result.status == "stopped_budget"


def _never_harms(messages: object, params: object) -> str:
    return "That sounds really hard. What feels most important to talk about right now?"


async def test_a_uct_turn_spends_by_default_no_more_calls_than_the_refinement_loop() -> None:
    """By default a tree-search turn that finds nothing is committed after the refinement
    loop's attempts per turn (5, ``[campaign] max_attempts``' default), not 20: a conversation
    is where harms build up, so it moves on (issue 34: 20 simulations a turn found fewer true
    cells at every budget of benchmarks/search.py's layered world)."""
    register_script("qd-never-harms", _never_harms)
    text = (
        BUDGET_CONFIG.format(calls=60)
        .replace("max_attempts = 3\n", "")
        .replace("simulations = 6\n", "")
        .replace("[budget]\ncounselor_calls = 60\n", "")
    )
    config = parse_config(text + scripted_models(counselors={"safe": "qd-never-harms"}), "t.toml")
    assert config.campaign.max_attempts == UCTOptions().simulations == 5
    async with MemoryEventStore() as store:
        assert (await run_campaign(config, store)).status == "completed"
        events = [e.message async for e in store.events("drain") if e.message is not None]
    turns = [e for e in events if isinstance(e, TurnCommitted)]
    assert len(turns) == 3 * 3
    assert {t.counselor_calls for t in turns} == {5}  # nothing found: every turn spends 5


@pytest.mark.parametrize(
    ("controller", "line", "today"),
    [
        # The default went from 20 simulations a turn to 5: resumed with today's default, a
        # uct campaign stored with 20 would change its search half-way.
        ("uct", "simulations = 20", ""),
        # Stored before uct read the refiner's notes (``notes`` absent, read as false).
        ("uct", "notes = false", "simulations = 6"),
        # Stored before a cell's prior borrowed from its neighbours (``borrow`` absent, read
        # as false for map-elites; a tree search already borrowed: tests/test_config.py).
        ("map-elites", "borrow = false", "simulations = 6"),
    ],
)
async def test_a_search_stored_by_an_older_version_is_told_how_to_resume_as_it_ran(
    controller: str, line: str, today: str
) -> None:
    """A campaign stored with what an older version's defaults meant is refused with today's,
    naming the key and the line that resumes it, and resumes with that line."""
    from mhsafeeval.errors import InputError

    base = BUDGET_CONFIG.replace('controller = "uct"', f'controller = "{controller}"')
    new = base.replace("simulations = 6\n", f"{today}\n" if today else "")
    old = new.replace("[search]\n", f"[search]\n{line}\n")
    key, value = line.split(" = ")
    async with MemoryEventStore() as store:
        await run_campaign(parse_config(old.format(calls=7) + scripted_models(), "d.toml"), store)
        with pytest.raises(InputError, match=rf"search\.{key}: stored {value}") as refused:
            text = new.format(calls=12) + scripted_models()
            await run_campaign(parse_config(text, "d.toml"), store)
        assert f"add `{line}` to its [search] table" in str(refused.value)
        text = old.format(calls=12) + scripted_models()
        result = await run_campaign(parse_config(text, "d.toml"), store)
    assert result.status == "stopped_budget"


async def test_a_reply_paid_for_before_a_kill_is_judged_by_a_rerun_at_the_spent_budget() -> None:
    """A run killed after a reply was stored and before its verdict was: the budget was spent
    by then, so the rerun starts nothing new, but it judges that reply (paid for, owed), stores
    nothing else bought, and stops at the budget as before; a rerun that owes nothing stores
    nothing at all."""
    async with MemoryEventStore() as store:
        whole = await drain(store, 7)
        info = (await store.list_campaigns())[0]
    last = next(e for e in reversed(whole) if isinstance(e, Verdict) and from_search_judge(e))
    gone = {last.id}
    for e in whole:  # the verdict and everything it caused, as if killed before it was stored
        if e.causation in gone:
            gone.add(e.id)
    cut = [e for e in whole if e.id not in gone]
    assert len(cut) < len(whole) and coords(last) in judged(whole)
    async with MemoryEventStore() as store:
        await store.register_campaign("drain", info.config)
        for e in cut:
            await store.append(e)
        config = parse_config(BUDGET_CONFIG.format(calls=7) + scripted_models(), "drain.toml")
        result = await run_campaign(config, store)
        assert result.status == "stopped_budget"
        events: list[Message] = [e.message async for e in store.events("drain") if e.message]
        again = await run_campaign(config, store)  # owes nothing now: stores nothing
        assert again.status == "stopped_budget"
        assert [e.message async for e in store.events("drain") if e.message] == events
    replies = [coords(e) for e in events if isinstance(e, CounselorReply)]
    assert len(replies) == len(set(replies)) == 7  # nothing bought again
    assert judged(events) == Counter(replies)  # the owed reply judged, once


def test_uct_draws_on_a_category_only_as_far_as_its_cells_agree() -> None:
    """uct's prior for an untried cell (issue 34): its category's other cells count as far as
    they agree (an empirical-Bayes spread, :func:`evidence.agreement`). A category whose two
    tried cells gave way once in six each is a fair guide to its third; one whose single harm
    stands out beside a cell that never gave way is not, so its third cell keeps most of the
    even prior and ranks first (pooling the category's rate alone ranked it below)."""
    from mhsafeeval.search._uct_controller import _Conv
    from mhsafeeval.search.evidence import agreement
    from mhsafeeval.search.uct import UCTTree

    cells = [(c, f"{c}{k}") for c in ("mixed", "even") for k in range(3)]
    uct = UCTController(cells, SearchRun(), UCTOptions(give_up=False))
    record = {("mixed", "mixed0"): (1, 1), ("mixed", "mixed1"): (0, 11)}
    record |= {("even", "even0"): (1, 6), ("even", "even1"): (1, 6)}
    for cell, (wins, tries) in record.items():
        for n in range(tries):
            uct._count("m", cell, "fresh", n < wins)
    priors = {
        (a.category, a.role): p for a, p in uct._candidates(_Conv("c", "m", 1, UCTTree(Random(0))))
    }
    assert priors[("mixed", "mixed2")] > 0.35 > 0.3 > priors[("even", "even2")] > 0.2
    mixed, even = list(record.values())[:2], list(record.values())[2:]
    assert agreement(mixed)[1] < 1 < 12 == agreement(even)[1]
