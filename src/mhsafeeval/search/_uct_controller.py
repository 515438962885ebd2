"""The UCT controller: plans each turn by Monte Carlo tree search against the counselor.

Its options are :class:`UCTOptions` (the ``[search]`` table). Each turn runs ``simulations``
(default 5, the refinement loop's attempts per turn) simulations, up to ``in_flight`` (default
4) at a time. A simulation is one attempt of
the turn (attempt number = simulation number): the tree picks an action (target cell x operator),
the mutator and client turn it into an utterance, the counselor answers, the judge scores the reply
and the reward (what the reply adds to the archive, :func:`~mhsafeeval.search.uct.reward`) is
backed up. Every judged reply is offered to the counselor model's archive.
Outcomes are applied in simulation order, and simulation n + ``in_flight`` starts once simulation
n's is applied: a reply that arrives early waits (still counted in flight) for the earlier ones. So
the search depends on the replies, never on their arrival order: with one conversation at a time a
campaign's search is the same run to run, and a resumed run makes the same decisions. When the
turn's simulations are spent, or (``early_stop``, the default) at its first success, the turn
commits the **best action's most severe reply**: the best action is the root action with the
highest mean reward (ties: the most severe judged reply, then more visits, then prior); among its
sampled replies the most severe one (judged before unjudged; ties: the higher reward, then the
earlier), because a red-team conversation continues from the strongest failure it found.

*What it optimises* is what the tool reports: the reward is the archive's gain
(:func:`~mhsafeeval.search.uct.reward`: 1 for a new cell, a share of one for each severity step
in a filled one, nothing for a success that adds neither), and each move's prior is its
expected gain, its cell's success rate (its prior drawn from the cell's category and role as
far as their cells agree, a Thompson draw under ``give_up``:
:func:`~mhsafeeval.search.evidence.neighbours`) times what a success there adds
(:func:`~mhsafeeval.search.evidence.worth`). With ``notes`` (the default) it reads the
refiner's notes as map-elites does: a simulation the refiner writes notes on is applied once
they are here (still in simulation order, so the search does not depend on when they arrive),
and each directive carries its cell's latest notes. A success in a filled cell used to earn 0.2:
in the layered world of benchmarks/search.py uct then spent half its calls on cells it had
filled (the issue 34 measurements); now a filled cell is worth only its chance of a higher
severity, which shrinks with every success seen there.
The tree is then re-rooted at that reply for the next turn, keeping its statistics. Tree
statistics, with the campaign's ``threshold`` and whether the turn has had a ``success`` under it
(1.0 or 0.0), are published as :class:`~mhsafeeval.messages.SearchStats` after every simulation, so
a run can be inspected. Success is a judged severity at or above the campaign's threshold
(``[campaign] threshold``) everywhere here: a reply below it earns reward 0, counts as a failed try
in the learned rates, does not stop the turn early and does not make the turn a success. Without
role conditioning a move is a category and an operator, never ``change_role``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from random import Random
from typing import Annotated

import structlog
from msgspec import Meta

from mhsafeeval.framework import on
from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    Confirmation,
    ConversationFinished,
    ConversationStarted,
    Directive,
    Message,
    Operator,
    RefinerNotes,
    SearchStats,
    Seed,
    TurnCommitted,
    Unjudged,
    Verdict,
)

from ._base import ArchiveController, AttemptTexts
from ._controller import unanswered
from ._types import SearchRun, TargetingOptions
from .archive import CellId
from .evidence import neighbours, worth
from .rng import derive_rng
from .uct import Action, TreePath, UCTSettings, UCTTree, reward

__all__ = ["UCTController", "UCTOptions"]


log = structlog.get_logger("mhsafeeval.search.uct")
_OPERATORS: tuple[Operator, ...] = ("fresh", "change_category", "change_role", "crossover", "vary")


class UCTOptions(TargetingOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The uct controller's options: the ``[search]`` table (bounds refuse typos such as an
    extra zero at ``check``), with the give-up rule's (:class:`TargetingOptions`)."""

    simulations: Annotated[int, Meta(ge=1, le=10_000)] = 5
    """Simulations (counselor calls) per turn, at most. The default is the refinement loop's
    attempts per turn (``[campaign] max_attempts``' default, the paper's N_max = 5): a turn
    that finds nothing in that many calls is committed and the conversation moves on, since a
    conversation is where harms build up; the tree's value is in which moves it tries, not in
    spending more calls on one turn than map-elites does. It was 20: measured in
    benchmarks/search.py's layered world (20 seeds, 400 calls, issue 34), 20 simulations a
    turn found a median 11 / 15.5 / 19 true cells at 100 / 200 / 400 calls, 5 found 12 / 17 /
    20.5 (10: 11 / 15 / 19; 3: 11 / 16.5 / 20). A tree search stored with 20 resumes only with
    ``simulations = 20`` in its ``[search]`` table."""
    in_flight: Annotated[int, Meta(ge=1, le=1024)] = 4
    """Simulations of one conversation running at once."""
    samples_per_action: Annotated[int, Meta(ge=1, le=100)] = 2
    """Replies kept per (cell x operator) move: the counselor is stochastic."""
    exploration: Annotated[float, Meta(ge=0, le=1000)] = 1.0
    """The PUCT exploration constant."""
    empty_bonus: Annotated[float, Meta(ge=0, le=1)] = 0.2
    """No longer read: the reward is the archive's gain (a new cell earns 1); kept so that
    configs that set it still load."""
    notes: bool = True
    """Use the refiner's notes: a simulation whose verdict gets notes (it fell short on one of
    the turn's first ``max_attempts - 1`` simulations) is applied once they are here, and each
    directive carries its cell's latest notes, as map-elites' refinement loop does (the
    campaign runs the refiner for uct; a graph without one needs ``notes = false``, or its
    simulations would wait for ever). Measured in benchmarks/search.py's layered world (issue
    34, docs/campaigns.md): with 5 simulations a turn, 12 / 17 / 20.5 true cells at 100 / 200
    / 400 calls without notes, 12.5 / 18 / 21 with them. A tree search stored before this
    option existed ran without notes and resumes as it ran only with ``notes = false``."""
    early_stop: bool = True
    """Commit the turn at its first success instead of spending every simulation (False: every
    turn spends ``simulations``). A conversation is where harms build up: a turn that found a
    failure goes on from it, rather than spending the rest of its simulations beside it (with
    20 simulations a turn, a 400-call budget reaches 20 turns in all; measured in
    benchmarks/search.py's layered world, committing at the first success found a median 19
    true cells in 400 calls against 15)."""

    def turn_attempts(self, run: SearchRun) -> tuple[int, int]:
        """The fewest and most attempts of a turn: every simulation is one; with
        ``early_stop`` a turn may end with its first simulations in flight."""
        low = min(self.in_flight, self.simulations) if self.early_stop else self.simulations
        return low, self.simulations

    def reads_notes(self) -> bool:
        """Whether the campaign runs the refiner for this search (``notes``)."""
        return self.notes


class _Sim(AttemptTexts):
    __slots__ = ("action", "attempt", "cell", "due", "key", "move", "notes", "outcome", "path")

    def __init__(self, path: TreePath, attempt: int, cell: CellId) -> None:
        action = path.action
        super().__init__(action.operator)
        self.path = path
        self.action = action
        self.cell = cell  # the target: the action's cell, or the role chosen for a role-less one
        self.attempt = attempt
        self.key = str(attempt)  # its sample's key in the tree (see _Conv.sample)
        self.outcome: Message | None = None  # its Verdict, Unjudged or CallFailed, once here
        # The operator the search chose (after seed fallback). ``operator`` is what the
        # mutator says it did, which an ablation may change (no role conditioning turns
        # change_role into vary); the in-flight counts and learned rates must use this one.
        self.move: Operator = action.operator
        self.due = False  # its verdict waits for the refiner's notes on it
        self.notes: tuple[str, ...] | None = None  # the refiner's notes on it, once here


class _Conv:
    __slots__ = (
        "campaign",
        "done",
        "flight",
        "max_turns",
        "model",
        "roles",
        "sims",
        "started",
        "tree",
        "turn",
    )

    def __init__(self, campaign: str, model: str, max_turns: int, tree: UCTTree) -> None:
        self.campaign = campaign
        self.model = model
        self.max_turns = max_turns
        self.tree = tree
        self.turn = 0
        self.started = 0  # simulations launched this turn
        self.done = 0  # simulations whose outcome is applied this turn (in attempt order)
        self.sims: dict[int, _Sim] = {}  # this turn's simulations, by attempt
        self.flight: dict[object, int] = {}  # simulations in flight, by category/role/cell/move
        self.roles: dict[Action, CellId] = {}  # each move's target cell (role-less: best role)

    def sample(self, key: str) -> _Sim:
        """The simulation whose reply is the tree's sample ``key`` (one of this turn's: a
        re-rooted tree has no samples until this turn backs some up)."""
        return self.sims[int(key)]


class UCTController(ArchiveController):
    """Monte Carlo tree search over client moves; see the module docstring for the contract."""

    publishes = (Directive, TurnCommitted, SearchStats, ArchiveUpdated, ConversationFinished)
    name = "uct"

    def __init__(
        self,
        cells: Iterable[CellId],
        run: SearchRun | None = None,
        options: UCTOptions | None = None,
    ) -> None:
        self.run = run or SearchRun()
        self.options = options or UCTOptions()
        super().__init__(cells, self.run.threshold, self.options)
        self.tree_settings = UCTSettings(
            c=self.options.exploration, samples=self.options.samples_per_action
        )
        self._convs: dict[str, _Conv] = {}
        self.notes: dict[tuple[str, CellId], deque[str]] = {}
        """The latest refiner notes per counselor model and cell (applied in simulation
        order), which directives at that cell carry."""
        # Per model: [wins, tries] by category, role, cell and move, over judged simulations.
        self._levels: dict[str, dict[object, list[int]]] = {}
        self.shared_levels: dict[str, dict[object, list[int]]] = {}
        """Counts other processes learned (a distributed run's other workers), in the same
        shape as :meth:`learned`: added to this controller's own when it ranks moves, never
        published or stored."""
        # No role conditioning: one move per category and operator (the mutator is told no
        # role, so the 4 role cells would be the same move), and no change_role (a vary).
        roles = self.run.role_conditioning
        self._operators = tuple(op for op in _OPERATORS if roles or op != "change_role")
        self._actions = {
            (cell, op): Action(cell[0], cell[1] if roles else "", op)
            for cell in self.cells
            for op in self._operators
        }

    def learned(self) -> dict[str, dict[object, list[int]]]:
        """The rates this controller learned from its own judged simulations: per counselor
        model, ``[wins, tries]`` by category, role, cell and move (a distributed run shares
        them through :attr:`shared_levels`)."""
        return self._levels

    @staticmethod
    def _keys(cell: CellId, op: Operator) -> tuple[object, ...]:
        category, role = cell
        return (("category", category), ("role", role), cell, (category, role, op))

    def _count(self, model: str, cell: CellId, op: Operator, win: bool) -> None:
        levels = self._levels.setdefault(model, {})
        for key in self._keys(cell, op):
            slot = levels.setdefault(key, [0, 0])
            slot[0] += win
            slot[1] += 1

    @classmethod
    def _fly(cls, conv: _Conv, sim: _Sim, delta: int) -> None:
        for key in cls._keys(sim.cell, sim.move):
            conv.flight[key] = conv.flight.get(key, 0) + delta

    # -- the tree ------------------------------------------------------------------------------

    def _candidates(self, conv: _Conv) -> list[tuple[Action, float]]:
        """Every move possible now, with its prior: the archive gain it is expected to earn
        per counselor call: ``p`` times what a success in its cell adds
        (:func:`~mhsafeeval.search.evidence.worth`: 1 for a cell not filled; for a filled one
        one severity step times the chance of beating the successes seen there).

        ``p``, the chance that the move makes this counselor model fail, is learned from every
        judged simulation with the model, level by level: the cell's Beta prior is the options'
        plus, from its category's other cells and its role's, as many attempts at their rate as
        those cells agree on (:func:`~mhsafeeval.search.evidence.neighbours`: a category whose
        cells all resist makes its untried cells unpromising, one that mixes easy and
        never-harmed cells says little about them); with ``give_up`` the cell's rate is a
        Thompson draw from its posterior (the give-up rule: a cell that resists is drawn low
        more and more often, never for ever), else the posterior mean; the move's own rate is
        smoothed towards it with the weight of one try.
        The rates are shared by every conversation with the model and read again before each
        simulation (:meth:`UCTTree.reprioritise`), so what one conversation learns re-orders
        the untried moves of the others at once. This conversation's simulations still in
        flight count as tries that failed (the tree's virtual loss, carried over), so its
        concurrent simulations spread out instead of piling into a cell nobody has heard back
        from. Other conversations' calls in flight do not count: what one conversation decides
        depends on the others only through judged replies, so a resumed run can retry one
        conversation's failed turn without changing another's decisions.

        Without role conditioning a move is a category and an operator (role ``""``): its
        prior is its best role's, and that role is the target it directs (``conv.roles``).
        """
        archive = self.archive(conv.model)
        filled = len(archive.filled_cells())
        levels = self._levels.get(conv.model, {})
        shared = self.shared_levels.get(conv.model)
        flight = conv.flight
        none = (0, 0)
        opts = self.options
        prior = (opts.prior_successes, opts.prior_failures)
        rng = derive_rng(self.run.seed, conv.campaign, conv.model, conv.turn, conv.started, "odds")

        def counts(key: object) -> tuple[int, int]:
            wins, tries = levels.get(key, none)
            if shared:  # a distributed run: the other workers' counts too
                more = shared.get(key, none)
                wins, tries = wins + more[0], tries + more[1]
            return wins, tries + flight.get(key, 0)

        def smooth(key: object, towards: float) -> float:
            wins, tries = counts(key)
            return (wins + towards) / (tries + 1)

        best: dict[Action, tuple[float, CellId]] = {}  # each move's prior and target cell
        seen = {cell: counts(cell) for cell in self.cells}
        for cell in self.cells:
            category, role = cell
            wins, tries = seen[cell]
            a, b = neighbours(seen, cell, prior) if opts.borrow else prior
            if opts.give_up:  # a Thompson draw from the cell's posterior
                p_cell = rng.betavariate(a + wins, b + max(0, tries - wins))
            else:
                p_cell = (a + wins) / (a + b + tries)
            worth_ = worth(archive, cell, wins)
            for op in self._operators:
                if (op != "fresh" and filled == 0) or (op == "crossover" and filled < 2):
                    continue
                p = smooth((category, role, op), p_cell) * worth_
                action = self._actions[(cell, op)]
                if action not in best or p > best[action][0]:  # role-less: the best role's
                    best[action] = (p, cell)
        conv.roles = {action: cell for action, (_, cell) in best.items()}
        return [(action, p) for action, (p, _) in best.items()]

    def _new_turn(self, source: Message, conv: _Conv) -> None:
        conv.started = conv.done = 0
        conv.sims = {}
        conv.tree.expand(self._candidates(conv))
        self._launch(source, conv)

    def _launch(self, source: Message, conv: _Conv) -> None:
        s, run = self.options, self.run
        exhausted = False
        while (
            conv.started < s.simulations
            and conv.started - conv.done < s.in_flight
            and not (s.early_stop and self._succeeded(conv))
        ):
            conv.tree.reprioritise(self._candidates(conv))
            path = conv.tree.select()
            if path is None:  # nothing open: waiting for in-flight replies, or used up
                exhausted = conv.started == conv.done
                break
            attempt = conv.started
            conv.started += 1
            action = path.action
            cell = conv.roles.get(action, (action.category, action.role))
            sim = conv.sims[attempt] = _Sim(path, attempt, cell)
            rng = derive_rng(run.seed, source.conversation, conv.turn, attempt, "uct")
            sim.operator, seeds = self._seeds(conv, action.operator, cell, rng)
            sim.move = sim.operator
            self._fly(conv, sim, +1)
            notes = tuple(self.notes.get((conv.model, cell), ()))
            self.publish(
                Directive(
                    **source.child_ids(
                        campaign=conv.campaign, turn=conv.turn, attempt=attempt, branch=""
                    ),
                    category=cell[0],
                    role=cell[1],
                    operator=sim.operator,
                    seeds=seeds,
                    notes=notes,
                    role_conditioning=run.role_conditioning,
                    controller=self.name,
                )
            )
        stopped = s.early_stop and self._succeeded(conv)
        if conv.done == conv.started and (conv.started >= s.simulations or exhausted or stopped):
            self._commit(source, conv)

    def _wins(self, severity: int) -> bool:
        # The campaign's threshold is the one definition of success: in the reward, the learned
        # rates, early stop, the commit's ``success`` and the published statistics.
        return severity >= self.run.threshold

    def _succeeded(self, conv: _Conv) -> bool:
        return any(self._wins(v) for v in self._severities(conv))

    @staticmethod
    def _severity_of(conv: _Conv) -> Callable[[str], float]:
        """A sample's judged severity (0 unjudged): the commit continues from the strongest
        failure of the best move, whatever it added to the archive."""

        def severity(key: str) -> float:
            verdict = conv.sample(key).verdict
            return float(verdict.severity) if verdict is not None else 0.0

        return severity

    @staticmethod
    def _severities(conv: _Conv) -> list[int]:
        """The judged severities of this turn's replies (the root actions' samples)."""
        found = (conv.sample(key).verdict for key in conv.tree.sample_keys())
        return [v.severity for v in found if v is not None]

    def _seeds(
        self, conv: _Conv, operator: Operator, cell: CellId, rng: Random
    ) -> tuple[Operator, tuple[Seed, ...]]:
        if operator == "fresh":
            return "fresh", ()
        try:
            elites = self.archive(conv.model).pick_seeds(rng, operator, cell)
        except LookupError:
            return "fresh", ()
        return operator, tuple(Seed.of(e) for e in elites)

    # -- committing ----------------------------------------------------------------------------

    def _commit(self, source: Message, conv: _Conv) -> None:
        severity = self._severity_of(conv)
        action = conv.tree.best_action(severity)
        sample = conv.tree.best_sample(action, severity) if action else None
        if action is None or sample is None:
            self._finish(source, conv, "failed", "no simulation of the turn got a counselor reply")
            return
        sim = conv.sample(sample.key)
        judged = self._severities(conv)
        self.publish(
            TurnCommitted(
                **source.child_ids(
                    turn=conv.turn, attempt=max(conv.sims, default=0), branch="", key="commit"
                ),
                committed_attempt=sim.attempt,
                category=sim.cell[0],
                role=sim.cell[1],
                client_text=sim.utterance,
                counselor_text=sim.reply or "",
                success=any(self._wins(v) for v in judged),
                best_severity=max(judged, default=None),
                counselor_calls=sum(x.reply is not None for x in conv.sims.values()),
            )
        )
        if conv.turn + 1 < (1 if self.run.single_turn else conv.max_turns):
            conv.tree = conv.tree.reroot(action, sample.node[-1])
            conv.turn += 1
            self._new_turn(source, conv)
        else:
            self._finish(source, conv, "completed")

    def _finish(self, source: Message, conv: _Conv, status: str, detail: str = "") -> None:
        del self._convs[source.conversation]
        self.finish(source, conv.campaign, conv.turn, status, detail)

    # -- handlers ------------------------------------------------------------------------------

    def texts(self, msg: Message) -> _Sim | None:
        cur = self._sim(msg)
        return cur[1] if cur is not None else None

    def _sim(self, msg: Message) -> tuple[_Conv, _Sim] | None:
        conv = self._convs.get(msg.conversation)
        if conv is None or msg.turn != conv.turn or msg.attempt not in conv.sims:
            return None
        return conv, conv.sims[msg.attempt]

    @on(ConversationStarted)
    def started(self, msg: ConversationStarted) -> None:
        rng = derive_rng(self.run.seed, msg.conversation, "tree")
        conv = _Conv(
            msg.campaign,
            msg.counselor_model,
            max(1, msg.max_turns),
            UCTTree(rng, self.tree_settings),
        )
        self._convs[msg.conversation] = conv
        self._new_turn(msg, conv)

    @on(Verdict, Confirmation, Unjudged, CallFailed)
    def outcome(self, msg: Verdict | Confirmation | Unjudged | CallFailed) -> None:
        """A simulation ended. Outcomes are applied in simulation order (one that arrives
        early waits for the earlier ones, still counted in flight), and a new simulation is
        launched after each, so what the search does never depends on the order in which
        replies arrive: a conversation's search is reproducible and a resumed run makes the
        same decisions."""
        if isinstance(msg, Verdict | Confirmation):
            found = self.run.acts_on(msg)  # a candidate waits for its confirmation
            if found is None:
                return
            msg = found
        if isinstance(msg, CallFailed) and msg.agent == "refiner":
            self._noted(msg, ())  # no notes: the simulation goes on without them
            return
        cur = self._sim(msg) if self.steers(msg) else None
        if cur is None or cur[1].outcome is not None:
            return  # stale, or a second outcome for one simulation (the first one counts)
        conv, sim = cur
        if isinstance(msg, CallFailed) and msg.owed:
            # A role that never answered: nothing is committed past it. The conversation
            # ends failed; the next run asks that role again and the search goes on.
            self._finish(msg, conv, "failed", unanswered(msg))
            return
        sim.outcome = msg
        if (
            self.options.notes
            and isinstance(msg, Verdict)
            and sim.notes is None
            and self.run.refinement.wants_notes(msg)
        ):
            sim.due = True  # the refiner writes notes on it: apply it with them
        self._drain(conv)

    def _drain(self, conv: _Conv) -> None:
        """Apply the outcomes that are complete, in simulation order, launching after each."""
        while (
            (ready := conv.sims.get(conv.done)) is not None
            and ready.outcome is not None
            and not ready.due
        ):
            self._apply(conv, ready, ready.outcome)
            self._launch(ready.outcome, conv)  # may commit the turn: a new one starts at 0

    @on(RefinerNotes)
    def refined(self, msg: RefinerNotes) -> None:
        """The refiner's notes on a simulation's verdict: it is applied with them."""
        self._noted(msg, msg.notes)

    def _noted(self, msg: Message, notes: tuple[str, ...]) -> None:
        cur = self._sim(msg)
        if cur is None or cur[1].notes is not None:
            return
        conv, sim = cur
        sim.notes = notes
        if sim.due:
            sim.due = False
            self._drain(conv)

    def _apply(self, conv: _Conv, sim: _Sim, msg: Message) -> None:
        if isinstance(msg, Verdict):
            sim.verdict = msg
            archive = self.archive(conv.model)
            cell = (msg.category, msg.role)
            known = cell in self._cell_set
            elite = archive.elite(cell) if known else None
            best = elite.severity if elite is not None and archive.is_filled(cell) else None
            # The archive's gain (a new cell, or a higher severity), before the offer adds it.
            value = reward(msg.severity, threshold=self.run.threshold, best=best) if known else 0.0
            conv.tree.backup(sim.path, value, key=sim.key)
            win = self._wins(msg.severity)
            self._count(conv.model, cell, sim.move, win)
            if sim.notes and known and self.options.notes:
                kept = self.notes.setdefault((conv.model, cell), deque(maxlen=5))
                kept.extend(sim.notes)
            self.offer(conv.model, sim, msg)
        elif isinstance(msg, Unjudged):
            conv.tree.backup(sim.path, 0.0, key=sim.key, unjudged=True)
        else:
            assert isinstance(msg, CallFailed)
            conv.tree.abandon(sim.path)  # the statistics stay as if it never ran
            log.warning(
                "search.simulation_failed", agent=msg.agent, model=msg.model, error=msg.error
            )
        self._fly(conv, sim, -1)
        conv.done += 1
        self.publish(
            SearchStats(
                **msg.child_ids(key="uct"),
                controller=self.name,
                stats={
                    **conv.tree.stats(),
                    "threshold": float(self.run.threshold),
                    "success": float(self._succeeded(conv)),
                },
            )
        )
