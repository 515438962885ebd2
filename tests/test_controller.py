"""The refinement loop of the search controllers, driven through a real Runtime.

The controller runs alone: a fake "world" agent plays mutator, client, counselor and judge (each
Directive is answered with the whole attempt, its outcome read from a table the test controls),
and a fake refiner answers like the real one (notes for a verdict below the threshold while
attempts remain). No model is called.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Literal

import msgspec
import pytest

from helpers import archive_of, best_severity
from mhsafeeval.framework import Agent, PluginNotFound, Runtime, on
from mhsafeeval.messages import (
    SEARCH_JUDGE,
    ArchiveUpdated,
    CallFailed,
    ClientUtterance,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Directive,
    Elite,
    HandlerFailed,
    Instruction,
    Message,
    RefinerNotes,
    Seed,
    TurnCommitted,
    Unjudged,
    Verdict,
)
from mhsafeeval.search import (
    CONTROLLERS,
    MapElitesController,
    SearchRun,
    controller,
    controller_options,
)
from mhsafeeval.search._types import NoOptions, TargetingOptions
from mhsafeeval.search._uct_controller import UCTController, UCTOptions
from mhsafeeval.search.archive import CellId
from mhsafeeval.testing import Recorder

pytestmark = pytest.mark.anyio

CATEGORIES = ("toxic", "gaslighting", "dependency")
ROLES = ("perpetrator", "enabler")
CELLS: list[CellId] = [(c, r) for c in CATEGORIES for r in ROLES]
CAMPAIGN = "camp"

Failing = Literal["mutator", "client", "counselor"]
Down = Literal["mutator-down", "client-down", "judge"]
Outcome = (
    int
    | Literal["unjudged", "mutator", "client", "counselor", "judge", "mutator-down", "client-down"]
)
"""What the world does with one attempt: a severity, no verdict, or which agent's call fails:
``mutator`` and ``client`` answered unusably (the attempt is spent), ``mutator-down``,
``client-down`` and ``judge`` never answered (the turn stays open), ``counselor`` failed."""
Decide = Callable[[Directive], Outcome]
Conversations = Sequence[tuple[str, str]]
"""(conversation id, counselor model) pairs."""


def text(kind: str, msg: Message) -> str:
    """The text the world writes for one attempt: ``kind conversation/turn/attempt``."""
    return f"{kind} {msg.conversation}/{msg.turn}/{msg.attempt}"


def failure(parent: Message, agent: str, *, unusable: bool = False) -> CallFailed:
    return CallFailed(
        **parent.child_ids(key=agent),
        agent=agent,
        model=f"fake/{agent}",
        error="unusable" if unusable else "down",
        unusable=unusable,
    )


def attempt_messages(d: Directive, outcome: Outcome) -> list[Message]:
    """The messages of one attempt, as the real agents would publish them, in order."""
    category, role = d.category, d.role
    if outcome in ("mutator", "mutator-down"):
        return [failure(d, "mutator", unusable=outcome == "mutator")]
    instruction = Instruction(
        **d.child_ids(),
        category=category,
        role=role,
        text=text("instruction", d),
        operator=d.operator,
    )
    if outcome in ("client", "client-down"):
        return [instruction, failure(instruction, "client", unusable=outcome == "client")]
    said = ClientUtterance(
        **instruction.child_ids(), category=category, role=role, text=text("client", d)
    )
    if outcome == "counselor":
        return [instruction, said, failure(said, "counselor")]
    reply = CounselorReply(
        **said.child_ids(), category=category, role=role, text=text("counselor", d)
    )
    outcome_msg: Message
    if outcome == "judge":
        outcome_msg = failure(reply, "judge")
    elif outcome == "unjudged":
        outcome_msg = Unjudged(
            **reply.child_ids(key="judge"), category=category, role=role, reason="unparsable"
        )
    else:
        assert isinstance(outcome, int)
        outcome_msg = Verdict(
            **reply.child_ids(key="judge"),
            category=category,
            role=role,
            severity=outcome,
            label=f"level {outcome}",
            reasoning=text("reasoning", d),
            evidence=(text("counselor", d),),
        )
    return [instruction, said, reply, outcome_msg]


class World(Agent):
    """Plays mutator, client, counselor and judge: answers each Directive with a whole attempt.
    What the judge would say it publishes as the campaign's judge node (``publisher="judge"``):
    the controller follows that node's verdicts only."""

    def __init__(self, decide: Decide) -> None:
        super().__init__()
        self.decide = decide

    @on(Directive)
    def attempt(self, msg: Directive) -> None:
        for out in attempt_messages(msg, self.decide(msg)):
            judged = isinstance(out, Verdict | Unjudged)
            if judged or (isinstance(out, CallFailed) and out.agent == "judge"):
                out = msgspec.structs.replace(out, publisher=SEARCH_JUDGE)
            self.publish(out)


def notes_for(v: Verdict, count: int = 2) -> RefinerNotes:
    return RefinerNotes(
        **v.child_ids(key=v.key),
        category=v.category,
        role=v.role,
        notes=tuple(f"{text('note', v)}#{i}" for i in range(count)),
    )


class Refiner(Agent):
    """Answers like the real refiner: notes only below the threshold while attempts remain.

    ``fails`` lists the (turn, attempt) pairs whose notes fail (a ``CallFailed`` instead):
    unusable answers, or with ``down`` calls that never got an answer.
    """

    def __init__(
        self,
        *,
        max_attempts: int,
        threshold: int,
        per_message: int = 2,
        fails: Collection[tuple[int, int]] = (),
        down: bool = False,
    ) -> None:
        super().__init__()
        self.down = down
        self.max_attempts = max_attempts
        self.threshold = threshold
        self.per_message = per_message
        self.fails = fails

    @on(Verdict)
    def refine(self, msg: Verdict) -> None:
        if msg.severity >= self.threshold or msg.attempt + 1 >= self.max_attempts:
            return
        if (msg.turn, msg.attempt) in self.fails:
            self.publish(failure(msg, "refiner", unusable=not self.down))
        else:
            self.publish(notes_for(msg, self.per_message))


def table(*turns: Sequence[Outcome]) -> Decide:
    """Outcomes by turn (one row each), then by attempt."""
    return lambda d: turns[d.turn][d.attempt]


def started(conversation: str = "conv-a", model: str = "model-a", max_turns: int = 1) -> Message:
    return ConversationStarted(
        campaign=CAMPAIGN,
        conversation=conversation,
        key="start",
        counselor_model=model,
        profile_id="profile-1",
        max_turns=max_turns,
    )


async def run_loop(
    settings: SearchRun,
    decide: Decide,
    *waves: Conversations,
    controller: type[MapElitesController] = MapElitesController,
    max_turns: int = 1,
    refiner: bool = True,
    refiner_fails: Collection[tuple[int, int]] = (),
    refiner_down: bool = False,
    notes_per_message: int = 2,
) -> tuple[Recorder, MapElitesController]:
    """Run conversations to the end; each wave starts once the previous one is idle."""
    rec = Recorder()
    ctl = controller(CELLS, settings)
    async with Runtime() as rt:
        rt.subscribe(rec, name="recorder")
        rt.add(ctl, name="controller")
        rt.add(World(decide), name="world")
        if refiner:
            fake = Refiner(
                max_attempts=settings.max_attempts,
                threshold=settings.threshold,
                per_message=notes_per_message,
                fails=refiner_fails,
                down=refiner_down,
            )
            rt.add(fake, name="refiner")
        for wave in waves or ((("conv-a", "model-a"),),):
            for conversation, model in wave:
                rt.publish(started(conversation, model, max_turns))
            await rt.run_until_idle()
    assert not rec.of(HandlerFailed)
    return rec, ctl


def of_conversation(messages: Iterable[Message], conversation: str) -> list[Message]:
    return [m for m in messages if m.conversation == conversation]


def seed_of(d: Directive, severity: int, *, answered: bool = True) -> Seed:
    """The Seed a vary directive carries for the attempt ``d`` led to."""
    return Seed(
        category=d.category,
        role=d.role,
        instruction=text("instruction", d),
        utterance=text("client", d) if answered else "",
        reply=text("counselor", d) if answered else "",
        severity=severity,
    )


def coordinates(messages: Iterable[Message]) -> list[tuple[int, int]]:
    return [(m.turn, m.attempt) for m in messages]


# --- one turn: success, exhaustion, notes ----------------------------------------------------


async def test_a_turn_ends_at_the_first_success() -> None:
    rec, ctl = await run_loop(SearchRun(seed=1, max_attempts=5), table([1, 1, 3]))

    directives = rec.of(Directive)
    assert coordinates(directives) == [(0, 0), (0, 1), (0, 2)]
    first = directives[0]
    cell = (first.category, first.role)
    assert (first.operator, first.seeds, first.notes) == ("fresh", (), ())  # empty archive
    assert all(d.controller == "map-elites" and d.campaign == CAMPAIGN for d in directives)

    notes = rec.of(RefinerNotes)
    assert coordinates(notes) == [(0, 0), (0, 1)]
    for prev, d, consumed in zip(directives[:-1], directives[1:], notes, strict=True):
        assert (d.category, d.role, d.operator) == (*cell, "vary")
        assert d.seeds == (seed_of(prev, 1),)
        assert d.causation == consumed.id  # directed once the notes came
    assert directives[1].notes == notes[0].notes
    assert directives[2].notes == notes[0].notes + notes[1].notes

    (commit,) = rec.of(TurnCommitted)
    assert (commit.turn, commit.attempt, commit.committed_attempt) == (0, 2, 2)
    assert (commit.success, commit.best_severity, commit.counselor_calls) == (True, 3, 3)
    assert (commit.category, commit.role) == cell
    assert commit.client_text == text("client", directives[2])
    assert commit.counselor_text == text("counselor", directives[2])
    assert commit.causation == rec.of(Verdict)[-1].id

    (finished,) = rec.of(ConversationFinished)
    assert (finished.status, finished.turns) == ("completed", 1)
    assert rec.messages.index(commit) < rec.messages.index(finished)
    assert best_severity(ctl.archive("model-a"), cell) == 3


@pytest.mark.parametrize(
    ("severities", "threshold", "committed", "best"),
    [
        ([1, 1, 1], 2, 2, 1),  # ties: the latest
        ([3, 1, 2], 4, 0, 3),  # the most severe, even if first
        ([2, 3, 3], 4, 2, 3),  # the latest of the most severe
        ([1, 2, 1], 3, 1, 2),
    ],
)
async def test_a_turn_without_success_commits_its_most_severe_attempt(
    severities: list[int], threshold: int, committed: int, best: int
) -> None:
    settings = SearchRun(seed=2, max_attempts=3, threshold=threshold)
    # The refiner, like the real one, says nothing after the last attempt: waiting would hang.
    rec, _ = await run_loop(settings, table(severities))

    directives = rec.of(Directive)
    assert coordinates(directives) == [(0, 0), (0, 1), (0, 2)]
    assert coordinates(rec.of(RefinerNotes)) == [(0, 0), (0, 1)]
    (commit,) = rec.of(TurnCommitted)
    assert commit.committed_attempt == committed
    assert (commit.success, commit.best_severity, commit.counselor_calls) == (False, best, 3)
    assert commit.client_text == text("client", directives[committed])
    assert commit.counselor_text == text("counselor", directives[committed])
    assert commit.causation == rec.of(Verdict)[-1].id  # committed at the last verdict
    assert rec.of(ConversationFinished)[0].status == "completed"


async def test_single_attempt_commits_without_refinement() -> None:
    rec, _ = await run_loop(SearchRun(max_attempts=1), table([1]))
    assert len(rec.of(Directive)) == 1
    assert not rec.of(RefinerNotes)
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (0, False, 1)


def check_notes(messages: Sequence[Message], models: dict[str, str], kept: int) -> None:
    """Every Directive carries the last ``kept`` notes published before it for its (model, cell)."""
    notes: defaultdict[tuple[str, CellId], deque[str]] = defaultdict(lambda: deque(maxlen=kept))
    for msg in messages:
        if isinstance(msg, RefinerNotes):
            notes[(models[msg.conversation], (msg.category, msg.role))].extend(msg.notes)
        elif isinstance(msg, Directive):
            expected = tuple(notes[(models[msg.conversation], (msg.category, msg.role))])
            assert msg.notes == expected, msg


class KeepingThreeNotes(MapElitesController):
    notes_kept = 3


async def test_notes_are_kept_per_model_and_cell_and_reach_the_next_directive() -> None:
    settings = SearchRun(seed=3, max_attempts=2)
    models = {"conv-a": "model-a", "conv-b": "model-b", "conv-c": "model-a"}
    rec, ctl = await run_loop(
        settings,
        lambda d: 1,  # never a success: every cell stays empty, every turn gets notes
        [("conv-a", "model-a"), ("conv-b", "model-b")],
        [("conv-c", "model-a")],  # a later conversation with the same counselor model
        controller=KeepingThreeNotes,
        max_turns=8,
    )
    check_notes(rec.messages, models, kept=3)

    directives = rec.of(Directive)
    assert len(directives) == 3 * 8 * 2
    assert {len(n.notes) for n in rec.of(RefinerNotes)} == {2}
    assert max(len(d.notes) for d in directives) == 3  # capped at notes_kept
    # 8 turns over 6 cells: a cell comes back at a turn's first attempt, with the earlier notes.
    for conversation in ("conv-a", "conv-b"):
        ds = [d for d in directives if d.conversation == conversation]
        assert any(d.attempt == 0 and d.notes for d in ds)
    b_notes = [n for d in directives if d.conversation == "conv-b" for n in d.notes]
    assert b_notes
    assert all(n.startswith("note conv-b/") for n in b_notes)  # never another model's notes
    c_notes = [n for d in directives if d.conversation == "conv-c" for n in d.notes]
    assert any(n.startswith("note conv-a/") for n in c_notes)  # same model: notes carry over
    assert not any(n.startswith("note conv-b/") for n in c_notes)
    assert set(ctl.notes) <= {(m, cell) for m in ("model-a", "model-b") for cell in CELLS}


# --- unjudged replies and failed calls --------------------------------------------------------


async def test_unjudged_uses_the_attempt_without_refinement() -> None:
    rec, _ = await run_loop(SearchRun(seed=4, max_attempts=5), table(["unjudged", 1, 3]))

    d0, d1, d2 = rec.of(Directive)
    (unjudged,) = rec.of(Unjudged)
    assert d1.causation == unjudged.id  # no wait for notes that never come
    assert (d1.operator, d1.seeds, d1.notes) == ("vary", (seed_of(d0, 0),), ())
    (notes,) = rec.of(RefinerNotes)
    assert (notes.attempt, d2.notes, d2.causation) == (1, notes.notes, notes.id)
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (2, True, 3)
    assert commit.counselor_calls == 3


async def test_a_turn_of_only_unjudged_replies_is_never_safe() -> None:
    settings = SearchRun(seed=4, max_attempts=3)
    rec, ctl = await run_loop(settings, table(["unjudged"] * 3))

    assert len(rec.of(Directive)) == 3
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (2, False, None)
    assert commit.counselor_calls == 3
    assert commit.counselor_text == text("counselor", rec.of(Directive)[2])
    assert not rec.of(ArchiveUpdated)
    assert ctl.archive("model-a").elites(filled_only=False) == []
    assert rec.of(ConversationFinished)[0].status == "completed"


async def test_a_judged_attempt_wins_over_later_unjudged_ones() -> None:
    rec, _ = await run_loop(SearchRun(max_attempts=3), table([1, "unjudged", "unjudged"]))
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (0, False, 1)
    assert commit.counselor_calls == 3


@pytest.mark.parametrize(("agent", "calls"), [("mutator", 1), ("client", 1), ("counselor", 1)])
async def test_a_failed_call_voids_the_attempt_and_moves_on(agent: Failing, calls: int) -> None:
    rec, _ = await run_loop(SearchRun(seed=5, max_attempts=5), table([agent, 2]))

    d0, d1 = rec.of(Directive)
    (failed,) = rec.of(CallFailed)
    assert failed.agent == agent
    assert d1.causation == failed.id
    assert (d1.category, d1.role, d1.operator, d1.notes) == (d0.category, d0.role, "vary", ())
    assert d1.seeds[0].severity == 0
    assert not rec.of(RefinerNotes)
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (1, True, 2)
    assert commit.counselor_calls == calls
    assert commit.client_text == text("client", d1)


@pytest.mark.parametrize("down", ["mutator-down", "client-down", "judge", "refiner"])
async def test_a_role_that_never_answered_leaves_its_turn_open(down: Down | str) -> None:
    """No turn is committed past a role whose call got no answer: the conversation ends
    failed at that turn, naming the role's model, and nothing is directed after it."""
    turns: list[list[Outcome]] = [[2], [1, 2]] if down == "refiner" else [[2], [1, down]]  # type: ignore[list-item]
    rec, _ = await run_loop(
        SearchRun(seed=8, max_attempts=3),
        table(*turns),
        max_turns=3,
        refiner_fails={(1, 0)} if down == "refiner" else (),
        refiner_down=True,
    )
    (commit,) = rec.of(TurnCommitted)
    assert commit.turn == 0
    (failed,) = rec.of(CallFailed)
    (finished,) = rec.of(ConversationFinished)
    assert (finished.status, finished.turn, finished.turns) == ("failed", 1, 1)
    assert f"fake/{failed.agent}" in finished.detail and "did not answer" in finished.detail
    assert finished.causation == failed.id
    assert rec.messages[-1] == finished  # nothing is directed after the failure
    expected = 1 if down == "refiner" else 2
    assert coordinates(rec.of(Directive)) == [(0, 0), *((1, a) for a in range(expected))]


async def test_failed_calls_leave_the_judged_attempt_committed() -> None:
    rec, _ = await run_loop(SearchRun(max_attempts=3), table(["client", 1, "counselor"]))
    d0, d1, _ = rec.of(Directive)
    assert d1.seeds == (seed_of(d0, 0, answered=False),)  # the client never spoke
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (1, False, 1)
    assert commit.counselor_calls == 1


async def test_a_failed_refiner_moves_on_without_notes() -> None:
    settings = SearchRun(seed=6, max_attempts=5)
    rec, ctl = await run_loop(settings, table([1, 1, 2]), refiner_fails={(0, 0)})

    d0, d1, d2 = rec.of(Directive)
    (failed,) = rec.of(CallFailed)
    (notes,) = rec.of(RefinerNotes)
    assert (failed.agent, failed.attempt, notes.attempt) == ("refiner", 0, 1)
    assert (d1.notes, d1.causation) == ((), failed.id)
    assert d1.seeds == (seed_of(d0, 1),)  # the verdict stands
    assert (d2.notes, d2.causation) == (notes.notes, notes.id)
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.counselor_calls) == (2, True, 3)
    assert ctl.notes == {("model-a", (d0.category, d0.role)): deque(notes.notes)}


@pytest.mark.parametrize(
    ("turns", "committed"),
    [
        ([["client", "counselor", "mutator"]], 0),
        ([[2], ["counselor", "mutator", "client"]], 1),
    ],
)
async def test_a_turn_without_any_reply_fails_the_conversation(
    turns: list[list[Outcome]], committed: int
) -> None:
    rec, _ = await run_loop(SearchRun(seed=7, max_attempts=3), table(*turns), max_turns=3)

    assert len(rec.of(TurnCommitted)) == committed
    assert coordinates(rec.of(Directive))[-3:] == [(committed, a) for a in range(3)]
    (finished,) = rec.of(ConversationFinished)
    assert (finished.status, finished.turns, finished.turn) == ("failed", committed, committed)
    assert finished.detail
    assert rec.messages[-1] == finished  # nothing is directed after the failure


# --- turns and conversations ------------------------------------------------------------------


async def test_max_turns_bounds_the_conversation() -> None:
    rec, _ = await run_loop(SearchRun(seed=8), table([2], [1, 3], [1, 1, 1, 1, 1]), max_turns=3)

    commits = rec.of(TurnCommitted)
    assert [(c.turn, c.committed_attempt, c.success) for c in commits] == [
        (0, 0, True),
        (1, 1, True),
        (2, 4, False),
    ]
    assert {d.turn for d in rec.of(Directive)} == {0, 1, 2}
    (finished,) = rec.of(ConversationFinished)
    assert (finished.status, finished.turns, finished.turn) == ("completed", 3, 2)
    assert rec.messages[-1] == finished
    # each new turn starts right after the previous commit, at attempt 0
    for commit in commits[:-1]:
        after = rec.messages[rec.messages.index(commit) + 1 :]
        nxt = next(m for m in after if isinstance(m, Directive))
        assert (nxt.turn, nxt.attempt, nxt.causation) == (commit.turn + 1, 0, commit.causation)


async def test_single_turn_stops_after_one_turn() -> None:
    settings = SearchRun(seed=8, single_turn=True)
    rec, _ = await run_loop(settings, table([1, 2], [2], [2]), max_turns=3)

    assert {d.turn for d in rec.of(Directive)} == {0}
    assert len(rec.of(TurnCommitted)) == 1
    (finished,) = rec.of(ConversationFinished)
    assert (finished.status, finished.turns) == ("completed", 1)


# --- the archive ------------------------------------------------------------------------------


def severity_world(models: dict[str, str]) -> Decide:
    """Severities by model, cell, turn and attempt: some cells easy, some hard, some rising."""

    def decide(d: Directive) -> Outcome:
        i = CELLS.index((d.category, d.role))
        if models[d.conversation] == "model-a":
            return 1 + (3 * d.turn + 2 * d.attempt + i) % 5
        return 1 + (i % 3 == 0 and d.attempt >= 1) + (d.turn >= 6)

    return decide


def elite_of(u: ArchiveUpdated) -> Elite:
    return u.elite


async def test_the_archive_is_a_fold_of_its_updates_one_per_counselor_model() -> None:
    models = {"conv-a": "model-a", "conv-b": "model-b"}
    settings = SearchRun(seed=9, max_attempts=3)
    rec, ctl = await run_loop(settings, severity_world(models), list(models.items()), max_turns=10)

    assert set(ctl.archives) == {"model-a", "model-b"}
    directive_at = {(d.conversation, d.turn, d.attempt): d for d in rec.of(Directive)}
    updates = rec.of(ArchiveUpdated)
    for model in ("model-a", "model-b"):
        verdicts = [v for v in rec.of(Verdict) if models[v.conversation] == model]
        mine = [u for u in updates if u.counselor_model == model]
        # published exactly when a cell's best severity rises, for every judged verdict
        best: dict[CellId, int] = {}
        rising: list[str] = []
        for v in verdicts:
            if v.severity > best.get((v.category, v.role), 0):
                best[(v.category, v.role)] = v.severity
                rising.append(v.id)
        assert [u.verdict_id for u in mine] == rising
        assert len(rising) < len(verdicts)  # some verdicts did not improve their cell
        assert max(sum(u.category == c and u.role == r for u in mine) for c, r in CELLS) >= 2
        archive = ctl.archive(model)
        assert {cell: best_severity(archive, cell) for cell in CELLS} == {
            cell: best.get(cell) for cell in CELLS
        }
        # the update carries the whole elite: the archive is the fold of the updates
        assert archive_of(CELLS, map(elite_of, mine)).elites(filled_only=False) == (
            archive.elites(filled_only=False)
        )
        for u in mine:
            v = next(v for v in verdicts if v.id == u.verdict_id)
            d = directive_at[(v.conversation, v.turn, v.attempt)]
            assert (u.conversation, u.turn, u.attempt, u.causation) == (
                v.conversation,
                v.turn,
                v.attempt,
                v.id,
            )
            assert (u.category, u.role, u.severity, u.elite.label) == (
                v.category,
                v.role,
                v.severity,
                v.label,
            )
            assert (u.elite.reasoning, u.elite.evidence, u.elite.operator) == (
                v.reasoning,
                v.evidence,
                d.operator,
            )
            assert (u.elite.instruction, u.elite.utterance, u.elite.reply) == (
                text("instruction", v),
                text("client", v),
                text("counselor", v),
            )
        assert {e.conversation for e in archive.elites(filled_only=False)} == {
            c for c, m in models.items() if m == model
        }
    bests = [{c: best_severity(ctl.archive(m), c) for c in CELLS} for m in ("model-a", "model-b")]
    assert bests[0] != bests[1]


# --- determinism and ablations ----------------------------------------------------------------


async def directives_by_conversation(
    settings: SearchRun, models: dict[str, str], max_turns: int = 8
) -> dict[str, list[Message]]:
    rec, _ = await run_loop(
        settings, severity_world(models), list(models.items()), max_turns=max_turns
    )
    return {c: of_conversation(rec.of(Directive), c) for c in models}


async def test_same_seed_and_world_give_the_same_directives() -> None:
    models = {"conv-a": "model-a", "conv-b": "model-b"}
    first = await directives_by_conversation(SearchRun(seed=11, max_attempts=3), models)
    again = await directives_by_conversation(SearchRun(seed=11, max_attempts=3), models)
    other = await directives_by_conversation(SearchRun(seed=12, max_attempts=3), models)

    assert first == again
    assert all(len(ds) >= 8 for ds in first.values())
    assert first != other


@pytest.mark.parametrize("role_conditioning", [True, False])
async def test_role_conditioning_ablation(role_conditioning: bool) -> None:
    models = {"conv-a": "model-a"}
    settings = SearchRun(seed=13, role_conditioning=role_conditioning)
    rec, _ = await run_loop(settings, severity_world(models), max_turns=5)
    directives = rec.of(Directive)
    assert len(directives) > 5
    assert {d.role_conditioning for d in directives} == {role_conditioning}


@pytest.mark.parametrize("qd_search", [True, False])
async def test_qd_search_ablation(qd_search: bool) -> None:
    def decide(d: Directive) -> Outcome:
        return 1 if d.turn % 2 and d.attempt == 0 else 3  # odd turns need a second attempt

    settings = SearchRun(seed=14, qd_search=qd_search)
    rec, _ = await run_loop(settings, decide, max_turns=8)

    firsts = [d for d in rec.of(Directive) if d.attempt == 0]
    retries = [d for d in rec.of(Directive) if d.attempt > 0]
    assert len(firsts) == 8
    assert len(retries) == 4
    assert all(d.operator == "vary" and len(d.seeds) == 1 for d in retries)  # refinement stays
    if qd_search:
        assert any(d.operator != "fresh" and d.seeds for d in firsts)
    else:
        assert all(d.operator == "fresh" and d.seeds == () for d in firsts)


# --- stale events ------------------------------------------------------------------------------


async def test_stale_events_are_ignored() -> None:
    rec = Recorder()
    ctl = MapElitesController(CELLS, SearchRun(seed=16, max_attempts=5))
    async with Runtime() as rt:
        rt.subscribe(rec, name="recorder")
        rt.add(ctl, name="controller")

        def publish(messages: Iterable[Message]) -> None:
            for msg in messages:
                rt.publish(msg)

        rt.publish(started())
        await rt.run_until_idle()
        (d0,) = rec.of(Directive)
        category, role = d0.category, d0.role
        first = attempt_messages(d0, 1)
        v0 = first[-1]
        assert isinstance(v0, Verdict)
        publish([*first, notes_for(v0)])
        await rt.run_until_idle()
        d1 = rec.of(Directive)[-1]
        assert (d1.turn, d1.attempt) == (0, 1)
        second = attempt_messages(d1, 3)
        publish(second[:-1])  # attempt 1's instruction, utterance and reply
        await rt.run_until_idle()

        instr0, said0, reply0, _ = first
        late_verdict = Verdict(
            **reply0.child_ids(key="judge-2"),
            category=category,
            role=role,
            severity=5,
            label="x",
            reasoning="late",
        )
        ghost_directive = Directive(
            campaign=CAMPAIGN,
            conversation="ghost",
            attempt=1,
            key="x",
            category=category,
            role=role,
        )
        other_turn = Directive(
            campaign=CAMPAIGN,
            conversation="conv-a",
            turn=1,
            attempt=1,
            key="x",
            category=category,
            role=role,
        )
        stale: list[Message] = [
            # older attempt of the live conversation
            Instruction(
                **d0.child_ids(key="again"), category=category, role=role, text="stale instruction"
            ),
            ClientUtterance(
                **instr0.child_ids(key="again"),
                category=category,
                role=role,
                text="stale utterance",
            ),
            CounselorReply(
                **said0.child_ids(key="again"), category=category, role=role, text="stale reply"
            ),
            late_verdict,
            Unjudged(
                **reply0.child_ids(key="judge-3"), category=category, role=role, reason="late"
            ),
            notes_for(late_verdict),
            failure(reply0, "counselor"),
            failure(reply0, "refiner"),
            # another turn of the live conversation, at the live attempt number
            *attempt_messages(other_turn, 5),
            # a conversation the controller never started (same turn and attempt numbers)
            *attempt_messages(ghost_directive, 5),
            *attempt_messages(ghost_directive, "unjudged"),
            failure(ghost_directive, "client"),
        ]
        before = len(rec.messages)
        publish(stale)
        await rt.run_until_idle()
        assert rec.messages[before:] == stale  # the controller said nothing
        assert best_severity(ctl.archive("model-a"), (d0.category, d0.role)) == 1
        assert set(ctl.archives) == {"model-a"}
        assert list(ctl.notes.values()) == [deque(notes_for(v0).notes)]

        publish(second[-1:])  # attempt 1's verdict
        await rt.run_until_idle()
        publish(attempt_messages(d1, 5))  # after the conversation finished: ignored too
        await rt.run_until_idle()

    assert not rec.of(HandlerFailed)
    assert len(rec.of(Directive)) == 2
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (1, True, 3)
    assert (commit.client_text, commit.counselor_text) == (
        text("client", d1),
        text("counselor", d1),
    )
    assert [u.verdict_id for u in rec.of(ArchiveUpdated)] == [v0.id, second[-1].id]
    assert len(rec.of(ConversationFinished)) == 1
    assert best_severity(ctl.archive("model-a"), (d0.category, d0.role)) == 3


async def test_two_judges_improving_one_attempt_give_distinct_archive_updates() -> None:
    rec = Recorder()
    ctl = MapElitesController(CELLS, SearchRun(seed=17))
    async with Runtime() as rt:
        rt.subscribe(rec, name="recorder")
        rt.add(ctl, name="controller")
        rt.publish(started())
        await rt.run_until_idle()
        (d0,) = rec.of(Directive)
        *said, first = attempt_messages(d0, 1)  # judge "judge": severity 1, a first elite
        assert isinstance(first, Verdict)
        second = msgspec.structs.replace(first, key="judge-b", severity=4)
        for msg in (*said, first, second):
            rt.publish(msg)
        await rt.run_until_idle()

    updates = rec.of(ArchiveUpdated)
    assert [(u.verdict_id, u.severity) for u in updates] == [(first.id, 1), (second.id, 4)]
    assert len({u.id for u in updates}) == 2  # a store keyed by id keeps both
    archive = ctl.archive("model-a")
    assert archive_of(CELLS, map(elite_of, updates)).elites(filled_only=False) == (
        archive.elites(filled_only=False)
    )
    (commit,) = rec.of(TurnCommitted)
    assert (commit.committed_attempt, commit.success, commit.best_severity) == (0, True, 4)


# --- declarations --------------------------------------------------------------------------------


def test_controllers_are_declared_with_their_options_and_needs() -> None:
    """What the campaign needs to know of a controller is its declaration, not its attributes."""
    run = SearchRun(max_attempts=4)
    uct = CONTROLLERS.get("uct")
    # uct reads the refiner's notes too (issue 34), unless told not to: no refiner then
    assert (uct.factory, uct.options) == (UCTController, UCTOptions)
    assert uct.refines(UCTOptions()) and not uct.refines(UCTOptions(notes=False))
    # a turn that stops at its first success may end with its first simulations in flight
    assert uct.turn_attempts(UCTOptions(simulations=9), run) == (4, 9)
    assert uct.turn_attempts(UCTOptions(simulations=9, early_stop=False), run) == (9, 9)
    for name, options in [
        ("map-elites", TargetingOptions),
        ("random", NoOptions),
        ("single-turn", TargetingOptions),
    ]:
        spec = CONTROLLERS.get(name)
        assert (spec.options, spec.refines(options())) == (options, True)
        assert spec.turn_attempts(options(), run) == (1, 4)
    assert "Monte Carlo" in CONTROLLERS.available()["uct"]  # described by its docstring
    built = uct(CELLS, SearchRun(seed=3), controller_options("uct", {"in_flight": 2}))
    assert isinstance(built, UCTController)
    assert (built.run.seed, built.options.in_flight) == (3, 2)


class _EntryPoint:
    def __init__(self, load: Callable[[], object]) -> None:
        self.load = load


def test_a_controller_found_through_its_entry_point_is_its_declaration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry point names the factory; importing it declares it (its ``@controller``)."""

    class Plain(MapElitesController):
        """A plugin that forgot its declaration."""

    def load_declared() -> object:  # what importing the plugin's module does
        class Declared(MapElitesController):
            """A plugin controller with no refiner."""

        return controller("ep-declared-test", uses_refiner=False)(Declared)

    found: dict[str, Callable[[], object]] = {
        "ep-declared-test": load_declared,
        "ep-plain-test": lambda: Plain,
    }

    def entry_points(*, group: str, name: str | None = None) -> list[_EntryPoint]:
        assert group == "mhsafeeval.controllers"
        return [_EntryPoint(found[name])] if name in found else []

    monkeypatch.setattr("mhsafeeval.framework._plugins.entry_points", entry_points)
    spec = CONTROLLERS.get("ep-declared-test")
    assert spec.uses_refiner is False
    assert CONTROLLERS.get("ep-declared-test") is spec
    with pytest.raises(PluginNotFound, match="is not declared: register it with @controller"):
        CONTROLLERS.get("ep-plain-test")


def test_declaring_a_controller_checks_its_options() -> None:
    class Twice(MapElitesController):
        """Declared twice, the same way: one declaration."""

    controller("twice-test")(Twice)
    first = CONTROLLERS.get("twice-test")
    controller("twice-test")(Twice)
    assert CONTROLLERS.get("twice-test") is first
    with pytest.raises(ValueError, match="already registered"):
        controller("twice-test", uses_refiner=False)(Twice)
    options: Any = dict  # not a msgspec Struct
    with pytest.raises(TypeError, match="msgspec Struct"):
        controller("bad-options-test", options=options)(Twice)
