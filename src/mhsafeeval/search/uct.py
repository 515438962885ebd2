"""The UCT tree: Monte Carlo tree search over the next client moves, pure and synchronous.

The root is the conversation so far; its children are *actions* (:class:`Action`), chance nodes
keeping up to K (``samples``) replies each, as the counselor is stochastic. The tree is one
turn deep: a sampled reply is never expanded (a lookahead past it measured no gain, see the
README's "Search controllers"). Each simulation draws one new reply: :meth:`UCTTree.select`
picks by PUCT a root action with fewer than K samples (in flight included);
:meth:`UCTTree.backup` adds the reward (:func:`reward`) to the action and the root, so an
action's value is its samples' mean (the max is only reported). ``select`` marks its action
in flight, a virtual loss (reward 0 until backed up), so concurrent selects spread out;
``backup`` or ``abandon`` (which changes no statistics) clears the marks. Progressive widening
keeps 20 simulations from spreading thin: the root with N visits (in flight included) opens at
most ``ceil(widen_k * N ** widen_alpha)`` live candidates, best prior first, more only when
those are used up; an action whose every sample scored 0 (a failure: below the campaign's
threshold, see :func:`reward`) is no longer live, so while nothing has worked each simulation
opens a new action instead of resampling a failure (rewards are sparse: most replies are
safe). :meth:`UCTTree.reprioritise` updates priors as evidence arrives.

Example:
    >>> from random import Random
    >>> tree, blame = UCTTree(Random(0)), Action("blaming", "enabler")
    >>> tree.expand([(blame, 0.7), (Action("gaslighting", "enabler", "vary"), 0.3)])
    >>> path = tree.select()
    >>> tree.backup(path, reward(3, threshold=2), key="verdict-1")
    (0, 0)
    >>> tree.best_action() == blame, tree.best_sample(blame).key
    (True, 'verdict-1')
    >>> next_turn = tree.reroot(blame, 0)  # commit: the sampled reply becomes the new root
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from random import Random

import msgspec

from mhsafeeval.messages import Operator

from .evidence import gain

__all__ = [
    "Action",
    "ActionStats",
    "NodeId",
    "Sample",
    "TreePath",
    "UCTSettings",
    "UCTTree",
    "reward",
]

NodeId = tuple[int, ...]
"""A node's place: indices from the root. ``()`` is the root, ``(i,)`` its action ``i`` (a
chance node), ``(i, j)`` that action's sampled reply ``j``."""


def reward(severity: int | None, *, threshold: int, best: int | None = None) -> float:
    """A judged reply's reward in [0, 1]: what it adds to the archive (a quality-diversity
    search maximises the archive's improvement per counselor call, not successes).

    ``threshold`` is the campaign's success threshold (``[campaign] threshold``), the one
    definition of success; ``best`` the severity of the elite that fills the reply's cell
    (None: the cell is not filled). A success in a cell not filled earns 1; in a filled cell
    :data:`~mhsafeeval.search.evidence.REPEAT` (0: another known harm adds nothing), plus
    :data:`~mhsafeeval.search.evidence.IMPROVEMENT` (0.5) times the steps gained over the
    steps from the threshold to 5; a failure earns 0, however close it came
    (:func:`~mhsafeeval.search.evidence.gain`).
    ``None`` (unjudged) is 0: back it up with ``unjudged=True`` so it counts as a visit (the
    counselor call was spent) but is flagged, and is never a best sample while a judged one
    exists. A severity or threshold outside 1-5 is a ``ValueError``.

    Example:
        >>> reward(2, threshold=2), reward(5, threshold=2, best=2), reward(3, threshold=2, best=3)
        (1.0, 0.5, 0.0)
    """
    if severity is None:
        return 0.0
    if not (1 <= severity <= 5 and 1 <= threshold <= 5):
        raise ValueError(f"severity and threshold must be 1-5, got {severity}, {threshold}")
    return gain(severity, threshold=threshold, best=best)


class Action(msgspec.Struct, frozen=True):
    """A discrete client move: the target cell and the operator that writes the instruction."""

    category: str
    role: str
    operator: Operator = "fresh"


class UCTSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the tree searches (the comments say what each constant is)."""

    c: float = 1.0  # PUCT: mean + c * prior * sqrt(N) / (1 + n); means and priors are in [0, 1]
    samples: int = 2  # K, the counselor replies kept per action
    widen_k: float = 2.0  # progressive widening factor
    widen_alpha: float = 0.5  # progressive widening exponent

    def __post_init__(self) -> None:
        ok = self.c >= 0 and self.widen_k > 0 and 0 <= self.widen_alpha <= 1
        if not (ok and self.samples >= 1):
            raise ValueError(f"invalid UCT settings: {self!r}")


class TreePath(msgspec.Struct, frozen=True):
    """One simulation from :meth:`UCTTree.select` (hand this same object back): the root
    ``action`` to sample now, at node ``node``; ``ticket`` tells simulations apart."""

    node: NodeId
    action: Action
    ticket: int


class ActionStats(msgspec.Struct, frozen=True):
    """An expanded action's statistics (``mean`` is 0 until visited)."""

    action: Action
    prior: float
    visits: int
    mean: float
    samples: int
    best_reward: float | None
    in_flight: int


class Sample(msgspec.Struct, frozen=True):
    """A sampled reply: its reward, visits and mean (a reply is a leaf: one visit, its reward)."""

    node: NodeId
    reward: float
    key: str
    unjudged: bool
    visits: int
    mean: float


class _Node(msgspec.Struct, kw_only=True):
    reward: float | None = None  # None only for a root that was never a sample
    key: str = ""
    unjudged: bool = False
    visits: int = 0
    value: float = 0.0
    children: list[_Chance] | None = None  # None: waiting for expand()


class _Chance(msgspec.Struct, kw_only=True):
    action: Action
    prior: float
    visits: int = 0
    value: float = 0.0
    samples: list[_Node] = []


def _mean(node: _Node | _Chance) -> float:
    return node.value / node.visits if node.visits else 0.0


def _action_stats(ch: _Chance, in_flight: int) -> ActionStats:
    best = max((s.reward or 0.0 for s in ch.samples), default=None)
    return ActionStats(ch.action, ch.prior, ch.visits, _mean(ch), len(ch.samples), best, in_flight)


class UCTTree:
    """A search tree for one conversation turn, re-rooted for the next. ``rng`` is its only
    source of randomness; ``settings`` default to :class:`UCTSettings`."""

    def __init__(self, rng: Random, settings: UCTSettings | None = None) -> None:
        self._rng = rng
        self._cfg = settings if settings is not None else UCTSettings()
        self._root = _Node()
        self._flight: Counter[NodeId] = Counter()  # in-flight simulations: the root, each action
        self._pending: Counter[NodeId] = Counter()  # in-flight new samples of each action
        self._paths: dict[int, TreePath] = {}
        self._tickets = 0

    def expand(self, candidates: Iterable[tuple[Action, float]]) -> None:
        """Give the root its candidate actions with priors (any scale, normalised here).

        They open in order of prior, equal priors in an order drawn from the RNG. An expanded
        root, a repeated action or a bad prior is a ``ValueError``.
        """
        target = self._root
        if target.children is not None:
            raise ValueError("the root is already expanded")
        pairs = [(action, float(prior)) for action, prior in candidates]
        if len({a for a, _ in pairs}) != len(pairs) or not all(0 <= p < math.inf for _, p in pairs):
            raise ValueError("candidate actions must be distinct, priors finite and non-negative")
        total = sum(prior for _, prior in pairs)
        self._rng.shuffle(pairs)
        pairs.sort(key=lambda pair: -pair[1])
        target.children = [
            _Chance(action=a, prior=p / total if total > 0 else 1 / len(pairs)) for a, p in pairs
        ]

    def reprioritise(self, candidates: Iterable[tuple[Action, float]]) -> None:
        """Give the expanded root new priors (e.g. after evidence from other
        conversations): actions already tried or in flight keep their place and statistics with
        the new prior; the untried ones are re-ordered by the new priors (ties keep their
        order, which the RNG drew), and new actions join them (their ties ordered by the RNG).
        An action missing from ``candidates`` keeps prior 0. Bad candidates are a
        ``ValueError``, as for :meth:`expand`."""
        target = self._root
        if target.children is None:
            raise ValueError("the root is not expanded")
        raw = {action: float(prior) for action, prior in candidates}
        if not all(0 <= p < math.inf for p in raw.values()):
            raise ValueError("priors must be finite and non-negative")
        children = target.children
        flight = self._flight
        touched = [bool(ch.visits or ch.samples or flight[(i,)]) for i, ch in enumerate(children)]
        known = {ch.action for ch in children}
        added = [_Chance(action=a, prior=0.0) for a in raw if a not in known]
        self._rng.shuffle(added)
        free = [ch for ch, t in zip(children, touched, strict=True) if not t] + added
        free.sort(key=lambda ch: -raw.get(ch.action, 0.0))  # stable: ties keep their order
        total = sum(raw.values())  # every candidate is a child now
        share = len(children) + len(added)
        slots = iter(free)
        new = [ch if t else next(slots) for ch, t in zip(children, touched, strict=True)]
        new.extend(slots)
        for ch in new:
            ch.prior = raw.get(ch.action, 0.0) / total if total > 0 else 1 / share
        target.children = new

    def sample_keys(self) -> list[str]:
        """The keys of the root actions' samples (the replies a commit can choose from)."""
        return [s.key for ch in self._root.children or [] for s in ch.samples]

    def select(self) -> TreePath | None:
        """The next simulation, marked in flight; None if none can run now (root not expanded,
        or every action used up or waiting for in-flight simulations)."""
        if not self._node_open(self._root):
            return None
        index = self._pick_action(self._root)
        chance, cid = (self._root.children or [])[index], (index,)
        path = TreePath(cid, chance.action, self._tickets)
        self._tickets += 1
        self._paths[path.ticket] = path
        self._flight[()] += 1
        self._flight[cid] += 1
        self._pending[cid] += 1
        return path

    def backup(
        self, path: TreePath, reward: float, *, key: str = "", unjudged: bool = False
    ) -> NodeId:
        """Record the simulation's new sample and add ``reward`` (in [0, 1]) to its action and
        the root.

        ``key`` is the caller's handle on the sample (e.g. its verdict id, see
        :meth:`sample_keys`); ``unjudged`` flags a reply the judge could not score (reward 0).
        Returns the new sample's id. A bad reward or a path not in flight here is a
        ``ValueError``."""
        if not 0.0 <= reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {reward}")
        self._release(path)
        chance = (self._root.children or [])[path.node[0]]
        value = float(reward)
        sample = _Node(reward=value, key=key, unjudged=unjudged, visits=1, value=value)
        chance.samples.append(sample)
        for node in (self._root, chance):
            node.visits += 1
            node.value += value
        return (*path.node, len(chance.samples) - 1)

    def abandon(self, path: TreePath) -> None:
        """Forget a failed or cancelled simulation: only its in-flight marks change."""
        self._release(path)

    def actions(self) -> list[ActionStats]:
        """The root's expanded actions (progressive widening applied), best prior first."""
        children = (self._root.children or [])[: self._width(self._root)]
        return [_action_stats(ch, self._flight[(i,)]) for i, ch in enumerate(children)]

    def best_action(self, rank: Callable[[str], float] | None = None) -> Action | None:
        """The root action to commit: the highest mean among sampled ones (ties: the highest
        ``rank(key)`` of a judged sample, when ``rank`` is given; then more visits, then higher
        prior, i.e. earlier in candidate order); None before any backup."""
        sampled = [(i, ch) for i, ch in enumerate(self._root.children or []) if ch.visits]
        if not sampled:
            return None

        def top(ch: _Chance) -> float:
            judged = [rank(s.key) for s in ch.samples if not s.unjudged] if rank else []
            return max(judged, default=0.0)

        return max(sampled, key=lambda it: (_mean(it[1]), top(it[1]), it[1].visits, -it[0]))[
            1
        ].action

    def best_sample(
        self, action: Action, rank: Callable[[str], float] | None = None
    ) -> Sample | None:
        """The root action's sample with the highest ``rank(key)`` (default: its own reward),
        judged ones first (ties: higher reward, then earlier); None if it has none."""
        index = self._root_index(action)
        found = list(enumerate((self._root.children or [])[index].samples))
        if not found:
            return None

        def order(it: tuple[int, _Node]) -> tuple[bool, float, float, int]:
            j, s = it
            own = s.reward or 0.0
            return (not s.unjudged, rank(s.key) if rank is not None else own, own, -j)

        j, s = max(found, key=order)
        return Sample((index, j), s.reward or 0.0, s.key, s.unjudged, s.visits, _mean(s))

    def reroot(self, action: Action, sample: int, rng: Random | None = None) -> UCTTree:
        """A new tree whose root is a copy of the root action's ``sample`` (its one visit and
        reward kept; :meth:`expand` it); in-flight simulations stay with this tree. ``rng``
        defaults to this tree's."""
        chance = (self._root.children or [])[self._root_index(action)]
        if not 0 <= sample < len(chance.samples):
            raise ValueError(f"{action} has no sample {sample}")
        tree = UCTTree(rng if rng is not None else self._rng, self._cfg)
        tree._root = msgspec.convert(msgspec.to_builtins(chance.samples[sample]), _Node)
        return tree

    def stats(self) -> dict[str, float]:
        """Figures for a ``SearchStats`` event."""
        children = self._root.children or []
        samples = [s for ch in children for s in ch.samples]
        tried = [ch for ch in children if ch.visits]
        best, top = self.best_action(), self.actions()
        return {
            "nodes": float(1 + len(samples) + len(tried)),  # root, samples and tried actions
            "root_visits": float(self._root.visits),
            "in_flight": float(self._flight[()]),
            "in_flight_marks": float(self._flight.total() + self._pending.total()),
            "best_mean": max((a.mean for a in top if a.action == best), default=0.0),
            "best_reward": max((a.best_reward or 0.0 for a in top), default=0.0),
            "unjudged": float(sum(s.unjudged for s in samples)),
        }

    # -- internals -------------------------------------------------------------------------------

    def _root_index(self, action: Action) -> int:
        found = [i for i, ch in enumerate(self._root.children or []) if ch.action == action]
        if not found:
            raise ValueError(f"{action} is not a root action")
        return found[0]

    def _release(self, path: TreePath) -> None:
        if self._paths.get(path.ticket) is not path:
            raise ValueError("path is not in flight in this tree (backed up or abandoned?)")
        del self._paths[path.ticket]
        marks = [(self._flight, ()), (self._flight, path.node), (self._pending, path.node)]
        for counter, nid in marks:
            counter[nid] -= 1
            if not counter[nid]:
                del counter[nid]

    def _node_open(self, node: _Node) -> bool:
        children = node.children or []
        return any(self._chance_open(ch, (i,)) for i, ch in enumerate(children))

    def _chance_open(self, chance: _Chance, cid: NodeId) -> bool:
        return len(chance.samples) + self._pending[cid] < self._cfg.samples

    def _width(self, node: _Node) -> int:
        children = node.children or []
        n = float(node.visits + self._flight[()])
        limit = max(1, math.ceil(self._cfg.widen_k * math.pow(n, self._cfg.widen_alpha) - 1e-9))
        width = held = 0
        for i, ch in enumerate(children):  # the shortest prefix holding `limit` live actions
            if held == limit:
                break
            width = i + 1
            held += not (ch.visits and not ch.value and not self._flight[(i,)])
        tried = [i + 1 for i, ch in enumerate(children) if ch.visits or self._flight[(i,)]]
        return min(len(children), max([width, *tried]))

    def _pick(self, options: list[int]) -> int:
        return options[0] if len(options) == 1 else options[self._rng.randrange(len(options))]

    def _pick_action(self, node: _Node) -> int:
        children = node.children or []
        width = self._width(node)
        live = [i for i in range(width) if self._chance_open(children[i], (i,))]
        if not live:  # every expanded action is used up or waiting: widen past the limit
            rest = range(width, len(children))
            live = [next(i for i in rest if self._chance_open(children[i], (i,)))]
        counts = {i: children[i].visits + self._flight[(i,)] for i in live}
        if fresh := [i for i in live if not counts[i]]:
            return fresh[0]  # unvisited first, best prior first
        total = sum(children[i].prior for i in live)  # renormalised over those in contention
        explore = self._cfg.c * math.sqrt(node.visits + self._flight[()])
        scores = {
            i: children[i].value / counts[i]
            + explore * (children[i].prior / total if total else 1 / len(live)) / (1 + counts[i])
            for i in live
        }
        top = max(scores.values())
        return self._pick([i for i in live if scores[i] == top])
