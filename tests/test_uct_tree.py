"""The UCT tree (pure core of the UCT controller): rewards, selection, widening, chance nodes,
virtual loss and re-rooting, with property tests over select/backup/abandon."""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mhsafeeval.messages import Operator
from mhsafeeval.search.evidence import IMPROVEMENT, REPEAT
from mhsafeeval.search.uct import Action, NodeId, TreePath, UCTSettings, UCTTree, reward

CATEGORIES = ["toxic", "nonfactual", "gaslighting", "invalidation", "blaming", "overpath", "dep"]
ROLES = ["perpetrator", "instigator", "facilitator", "enabler"]
OPERATORS: list[Operator] = ["fresh", "change_category", "change_role", "crossover", "vary"]
ACTIONS = [Action(c, r, op) for c in CATEGORIES for r in ROLES for op in OPERATORS]
A, B, C, D = ACTIONS[:4]


def must(path: TreePath | None) -> TreePath:
    assert path is not None, "expected a simulation to run"
    return path


def make_tree(priors: list[float], *, seed: int = 0, **config: Any) -> tuple[UCTTree, list[Action]]:
    tree = UCTTree(random.Random(seed), UCTSettings(**config))
    actions = ACTIONS[: len(priors)]
    tree.expand(list(zip(actions, priors, strict=True)))
    return tree, actions


def simulate(tree: UCTTree, action: Action, value: float, key: str = "") -> NodeId:
    """Back up ``value`` for a simulation whose last action is ``action``: other selected paths
    are held in flight until it comes up (which steers select away from them), then abandoned."""
    held: list[TreePath] = []
    for _ in range(200):
        path = must(tree.select())
        if path.action == action:
            break
        held.append(path)
    else:
        pytest.fail(f"select never reached {action}")
    for other in held:
        tree.abandon(other)
    return tree.backup(path, value, key=key)


def tree_state(tree: UCTTree) -> dict[str, Any]:
    """The tree's statistics as plain data (what nothing in flight changes)."""
    return {"settings": msgspec.to_builtins(tree._cfg), "root": msgspec.to_builtins(tree._root)}


def by_action(tree: UCTTree) -> dict[Action, Any]:
    return {stats.action: stats for stats in tree.actions()}


# --- reward ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("severity", "best", "expected"),
    [
        (None, None, 0.0),
        (None, 2, 0.0),
        (1, None, 0.0),
        (1, 2, 0.0),
        (2, None, 1.0),  # a new cell
        (5, None, 1.0),
        (2, 2, REPEAT),  # no severity added: another example of a known harm
        (3, 5, REPEAT),
        (3, 2, REPEAT + IMPROVEMENT / 3),  # one step of the three from the threshold to 5
        (5, 2, REPEAT + IMPROVEMENT),
        (5, 4, REPEAT + IMPROVEMENT / 3),
    ],
)
def test_reward_is_the_archive_gain(
    severity: int | None, best: int | None, expected: float
) -> None:
    assert reward(severity, threshold=2, best=best) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("severity", "best", "expected"),
    [
        (2, None, 0.0),  # a near miss is a failure: no graded credit
        (3, None, 1.0),
        (4, 3, REPEAT + IMPROVEMENT / 2),
        (5, 3, REPEAT + IMPROVEMENT),
    ],
)
def test_reward_below_threshold_3_is_zero(severity: int, best: int | None, expected: float) -> None:
    assert reward(severity, threshold=3, best=best) == pytest.approx(expected)


def test_reward_threshold_5_and_bad_values() -> None:
    assert reward(4, threshold=5) == 0.0
    assert reward(5, threshold=5) == pytest.approx(1.0)
    assert reward(5, threshold=5, best=5) == REPEAT
    for bad in (0, 6):
        with pytest.raises(ValueError, match="1-5"):
            reward(bad, threshold=2)
    with pytest.raises(ValueError, match="1-5"):
        reward(3, threshold=0)


# --- selection, widening, chance nodes --------------------------------------------------------


def test_select_is_none_until_the_root_is_expanded() -> None:
    tree = UCTTree(random.Random(0))
    assert tree.select() is None
    assert tree_state(tree)["root"]["children"] is None  # no candidates yet
    assert tree.best_action() is None


def test_ucb_picks_unvisited_first_then_exploits() -> None:
    tree, (a, b, c) = make_tree([0.5, 0.3, 0.2], samples=10, widen_k=10.0)
    order = []
    for value in (0.9, 0.1, 0.2):
        path = must(tree.select())
        order.append(path.action)
        tree.backup(path, value)
    assert order == [a, b, c]  # every candidate once, best prior first, despite a's 0.9
    for _ in range(3):
        path = must(tree.select())
        assert path.action == a
        tree.backup(path, 0.9)


def test_exploration_constant_zero_is_greedy() -> None:
    tree, (a, b) = make_tree([0.9, 0.1], samples=10, widen_k=10.0, c=0.0)
    simulate(tree, a, 0.3)
    simulate(tree, b, 0.4)
    for _ in range(3):
        path = must(tree.select())
        assert path.action == b
        tree.backup(path, 0.4)


@pytest.mark.parametrize(("visits", "width"), [(0, 1), (1, 2), (2, 3), (4, 4), (9, 6), (16, 8)])
def test_progressive_widening_limits_children(visits: int, width: int) -> None:
    tree, _ = make_tree([1.0] * 20, samples=100)
    for _ in range(visits):
        tree.backup(must(tree.select()), 0.5)
    assert tree.stats()["root_visits"] == visits
    expanded = tree.actions()
    assert len(expanded) == width == max(1, math.ceil(2 * math.sqrt(visits)))
    assert sum(stats.visits for stats in expanded) == visits  # nothing tried outside them


def test_candidates_open_in_order_of_prior_with_seeded_ties() -> None:
    priors = [0.1, 0.4, 0.1, 0.4, 0.0]
    orders = set()
    for seed in range(20):
        tree, _ = make_tree(priors, seed=seed, widen_k=10.0, widen_alpha=0.0)
        order = [stats.action for stats in tree.actions()]
        assert [stats.prior for stats in tree.actions()] == pytest.approx([0.4, 0.4, 0.1, 0.1, 0])
        again, _ = make_tree(priors, seed=seed, widen_k=10.0, widen_alpha=0.0)
        assert [stats.action for stats in again.actions()] == order  # same seed, same order
        orders.add(tuple(order))
    assert len(orders) > 1  # ties are broken by the RNG, not by input order


def test_chance_node_caps_samples_at_k_and_backs_up_the_mean() -> None:
    tree, (a,) = make_tree([1.0], samples=2)
    first, second = must(tree.select()), must(tree.select())
    assert tree.select() is None  # K counts samples in flight too
    tree.abandon(second)
    second = must(tree.select())
    assert tree.backup(first, 1.0, key="hi") == (0, 0)
    assert tree.backup(second, 0.0, key="lo") == (0, 1)
    assert tree.select() is None  # K samples each: nothing left to simulate
    stats = by_action(tree)[a]
    assert (stats.visits, stats.samples, stats.mean, stats.best_reward) == (2, 2, 0.5, 1.0)
    best = tree.best_sample(a)
    assert best is not None
    assert (best.node, best.key, best.reward) == ((0, 0), "hi", 1.0)
    assert tree.stats()["best_mean"] == 0.5
    assert tree.stats()["best_reward"] == 1.0


def test_used_up_actions_widen_past_the_limit() -> None:
    tree, (a, b, c) = make_tree([0.5, 0.3, 0.2], samples=2, widen_k=1.0, widen_alpha=0.0)
    order = []
    while (path := tree.select()) is not None:
        order.append(path.action)
        tree.backup(path, 0.5)
    assert order == [a, a, b, b, c, c]


def test_failed_actions_give_their_width_to_untried_ones() -> None:
    # Widening holds back new actions while open ones may still be good; one whose every
    # sample scored 0 no longer counts, so the next untried action opens instead of a resample.
    tree, actions = make_tree([1.0] * 6, samples=2, widen_k=1.0, widen_alpha=0.0)
    order = []
    for _ in range(6):
        path = must(tree.select())
        order.append(path.action)
        tree.backup(path, 0.0)
    assert sorted(order, key=actions.index) == actions  # six failures: six different actions
    tree, actions = make_tree([1.0] * 6, samples=2, widen_k=1.0, widen_alpha=0.0)
    first = must(tree.select())
    tree.backup(first, 0.5)
    assert must(tree.select()).action == first.action  # a promising one is resampled


def test_threshold_3_near_miss_is_not_live() -> None:
    """With threshold 3 a severity-2 reply is a failure to the widening: the next simulation
    opens a new action, as after a safe reply, instead of resampling the near miss."""
    tree, (a, b, _) = make_tree([0.5, 0.3, 0.2], samples=2, widen_k=1.0)
    first = must(tree.select())
    assert first.action == a
    tree.backup(first, reward(2, threshold=3))
    assert must(tree.select()).action == b


def test_threshold_3_near_miss_is_no_better_than_a_safe_reply() -> None:
    """Below the threshold every reply is a failure: the committed action is chosen by the
    tie rule (visits, then prior), not by how close a failure came; a success beats both."""
    tree, (a, b) = make_tree([0.6, 0.4], samples=1, widen_k=10.0)
    simulate(tree, b, reward(2, threshold=3), key="near-miss")
    simulate(tree, a, reward(1, threshold=3), key="safe")
    assert tree.best_action() == a
    assert tree.stats()["best_reward"] == 0.0
    tree, (a, b) = make_tree([0.6, 0.4], samples=1, widen_k=10.0)
    simulate(tree, b, reward(3, threshold=3), key="success")
    simulate(tree, a, reward(2, threshold=3), key="near-miss")
    assert tree.best_action() == b


def test_reprioritise_reorders_untried_actions_and_keeps_tried_ones() -> None:
    tree, (a, b, c, d) = make_tree([0.4, 0.3, 0.2, 0.1], widen_k=10.0, widen_alpha=0.0)
    tree.backup(must(tree.select()), 0.5)  # a: tried
    held = must(tree.select())  # b: in flight
    assert held.action == b
    e = ACTIONS[4]
    tree.reprioritise([(a, 0.0), (b, 1.0), (c, 1.0), (d, 3.0), (e, 5.0)])
    stats = tree.actions()
    assert [s.action for s in stats] == [a, b, e, d, c]  # a, b keep their places
    assert [s.prior for s in stats] == pytest.approx([0.0, 0.1, 0.5, 0.3, 0.1])
    assert (stats[0].visits, stats[0].mean, stats[1].in_flight) == (1, 0.5, 1)
    tree.backup(held, 0.25)  # the path selected before still backs up into b
    assert by_action(tree)[b].mean == 0.25
    assert must(tree.select()).action == e  # unvisited first, best new prior first
    tree.reprioritise([(a, 1.0)])  # missing actions keep prior 0
    assert [s.prior for s in tree.actions()][:3] == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        tree.reprioritise([(a, -1.0)])
    with pytest.raises(ValueError, match="not expanded"):
        UCTTree(random.Random(0)).reprioritise([(a, 1.0)])


def test_twenty_simulations_all_run() -> None:
    tree, _ = make_tree([1.0 / (i + 1) for i in range(28)])
    for _ in range(20):
        tree.backup(must(tree.select()), 0.5)
    assert all(stats.samples <= 2 for stats in tree.actions())
    assert tree.stats()["root_visits"] == 20


@pytest.mark.parametrize("first", [0.5, 0.6])
def test_virtual_loss_spreads_concurrent_selects(first: float) -> None:
    tree, actions = make_tree([1.0] * 4, samples=10)
    for action, value in zip(actions, [first, 0.5, 0.5, 0.5], strict=True):
        simulate(tree, action, value)
    paths = [must(tree.select()) for _ in range(4)]
    assert {path.action for path in paths} == set(actions)
    assert [stats.in_flight for stats in tree.actions()] == [1, 1, 1, 1]
    assert tree.stats()["in_flight"] == 4
    for path in paths:
        tree.backup(path, 0.5)
    assert tree.stats()["in_flight_marks"] == 0


def test_best_action_rule() -> None:
    tree, (a, b, c) = make_tree([0.5, 0.3, 0.2], samples=5, widen_k=10.0)
    simulate(tree, b, 0.5)
    simulate(tree, a, 0.5)
    assert tree.best_action() == a  # equal means and visits: the higher prior
    simulate(tree, c, 0.5)
    simulate(tree, c, 0.5)
    assert tree.best_action() == c  # equal means: more visits beats the prior
    simulate(tree, b, 0.9)
    assert tree.best_action() == b  # the highest mean
    simulate(tree, a, 0.0)
    assert tree.best_action() == b


def test_best_sample_prefers_judged_replies() -> None:
    tree, (a,) = make_tree([1.0], samples=3)
    tree.backup(must(tree.select()), reward(None, threshold=2), key="u", unjudged=True)
    best = tree.best_sample(a)
    assert best is not None
    assert (best.key, best.unjudged) == ("u", True)  # the only one
    tree.backup(must(tree.select()), reward(1, threshold=2), key="safe")
    best = tree.best_sample(a)
    assert best is not None
    assert best.key == "safe"
    assert tree.stats()["unjudged"] == 1
    with pytest.raises(ValueError, match="not a root action"):
        tree.best_sample(ACTIONS[-1])


# --- one turn deep, re-rooting -----------------------------------------------------------------


def one_turn_tree(seed: int = 0, samples: int = 1) -> UCTTree:
    tree, _ = make_tree([0.6, 0.4], seed=seed, samples=samples)
    assert tree.backup(must(tree.select()), 0.4, key="k-a") == (0, 0)
    assert tree.backup(must(tree.select()), 0.2, key="k-b") == (1, 0)
    return tree


def test_a_sampled_reply_is_a_leaf() -> None:
    tree = one_turn_tree()
    assert tree.select() is None  # both actions hold their K replies: nothing is looked past
    assert tree.sample_keys() == ["k-a", "k-b"]
    root = tree_state(tree)["root"]
    assert root["visits"] == 2
    assert [ch["visits"] for ch in root["children"]] == [1, 1]
    assert all(s["children"] is None for ch in root["children"] for s in ch["samples"])
    assert tree.best_action() == A
    stats = tree.stats()
    assert "max_depth" not in stats
    assert stats["root_visits"] == 2
    assert stats["nodes"] == 1 + 2 + 2  # root, two replies, two tried actions


def test_reroot_starts_the_next_turn_at_the_chosen_reply() -> None:
    tree, _ = make_tree([0.6, 0.4], samples=1)
    tree.backup(must(tree.select()), 0.4, key="k-a")
    pending = must(tree.select())  # in flight in the old tree: not carried over
    before = tree_state(tree)
    child = tree.reroot(A, 0)
    assert tree_state(tree) == before
    assert tree_state(child)["root"] == before["root"]["children"][0]["samples"][0]
    assert child.stats()["root_visits"] == 1
    assert child.stats()["in_flight_marks"] == 0
    assert tree_state(child)["root"]["children"] is None
    assert (child.sample_keys(), child.best_action()) == ([], None)
    assert child.select() is None  # the next turn waits for its candidates
    child.expand([(C, 1.0), (D, 1.0)])
    assert must(child.select()).action in (C, D)
    tree.abandon(pending)
    with pytest.raises(ValueError, match="no sample"):
        tree.reroot(A, 1)
    with pytest.raises(ValueError, match="not a root action"):
        tree.reroot(C, 0)


# --- misuse -------------------------------------------------------------------------------------


def test_paths_are_backed_up_or_abandoned_once() -> None:
    tree, _ = make_tree([1.0, 1.0])
    path = must(tree.select())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tree.backup(path, 1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tree.backup(path, math.nan)
    tree.backup(path, 0.5)  # the rejected rewards left it in flight
    with pytest.raises(ValueError, match="not in flight"):
        tree.backup(path, 0.5)
    with pytest.raises(ValueError, match="not in flight"):
        tree.abandon(path)
    other, _ = make_tree([1.0, 1.0])
    with pytest.raises(ValueError, match="not in flight"):
        other.backup(path, 0.5)  # a path of another tree, even with the same ticket
    with pytest.raises(ValueError, match="not in flight"):
        tree.abandon(TreePath(path.node, path.action, path.ticket))


def test_expand_rejects_bad_candidates() -> None:
    tree = UCTTree(random.Random(0), UCTSettings(widen_alpha=0.0))
    with pytest.raises(ValueError, match="distinct"):
        tree.expand([(A, 1.0), (A, 2.0)])
    for prior in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="priors"):
            tree.expand([(A, prior)])
    tree.expand([(A, 0.0), (B, 0.0)])  # all-zero priors become uniform
    assert [stats.prior for stats in tree.actions()] == [0.5, 0.5]
    with pytest.raises(ValueError, match="already expanded"):
        tree.expand([(C, 1.0)])


def test_settings_are_validated() -> None:
    for bad in ({"samples": 0}, {"c": -1.0}, {"widen_k": 0.0}, {"widen_alpha": 2}):
        with pytest.raises(ValueError, match="invalid"):
            UCTSettings(**bad)
    with pytest.raises(TypeError, match="depth"):
        UCTSettings(**{"depth": 2})  # the lookahead is gone


# --- properties -------------------------------------------------------------------------------


def check_tree(tree: UCTTree, *, backups: int | None = None, in_flight: int = 0) -> None:
    """Visits add up, values are means in [0, 1], chance nodes hold at most K samples."""
    snap = tree_state(tree)
    k = snap["settings"]["samples"]

    def node(data: dict[str, Any], own: int) -> None:
        children = data["children"] or []
        assert data["visits"] == own + sum(ch["visits"] for ch in children)
        mean_ok(data)
        for ch in children:
            assert len(ch["samples"]) <= k
            assert ch["visits"] == sum(s["visits"] for s in ch["samples"])
            assert math.isclose(ch["value"], sum(s["value"] for s in ch["samples"]), abs_tol=1e-9)
            mean_ok(ch)
            for sample in ch["samples"]:
                node(sample, 1)

    def mean_ok(data: dict[str, Any]) -> None:
        if data["visits"]:
            assert 0.0 <= data["value"] / data["visits"] <= 1.0
        else:
            assert data["value"] == 0.0

    root = snap["root"]
    node(root, 0 if root["reward"] is None else 1)
    stats = tree.stats()
    if backups is not None:
        assert stats["root_visits"] == backups
    assert stats["in_flight"] == in_flight
    assert (stats["in_flight_marks"] == 0) == (in_flight == 0)
    assert all(0.0 <= s.mean <= 1.0 for s in tree.actions())


tree_settings = st.builds(
    UCTSettings,
    c=st.sampled_from([0.0, 0.5, 1.0, math.sqrt(2)]),
    samples=st.integers(1, 3),
    widen_k=st.sampled_from([1.0, 2.0, 3.5]),
    widen_alpha=st.sampled_from([0.0, 0.5, 1.0]),
)


def draw_candidates(data: st.DataObject, low: int) -> list[tuple[Action, float]]:
    actions = data.draw(
        st.lists(st.sampled_from(ACTIONS[:8]), min_size=low, max_size=5, unique=True)
    )
    return [(a, data.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))) for a in actions]


def random_session(
    tree: UCTTree, data: st.DataObject, steps: int, open_paths: list[TreePath]
) -> int:
    """Random select/backup/abandon/reprioritise; returns the number of backups."""
    backups = 0
    for _ in range(steps):
        op = data.draw(st.sampled_from(["select", "select", "backup", "abandon", "prior"]))
        if op == "prior":
            tried = {s.action: s for s in tree.actions() if s.visits or s.in_flight}
            tree.reprioritise(draw_candidates(data, 0))
            kept = {s.action: s for s in tree.actions() if s.visits or s.in_flight}
            assert set(kept) >= set(tried)  # widening may show more; nothing tried is lost
            for action, was in tried.items():
                now = kept[action]
                assert (now.visits, now.mean, now.samples, now.in_flight) == (
                    was.visits,
                    was.mean,
                    was.samples,
                    was.in_flight,
                )
        elif op == "select" or not open_paths:
            before = tree_state(tree)
            path = tree.select()
            assert tree_state(tree) == before  # selecting touches no statistics
            if path is not None:
                open_paths.append(path)
        else:
            path = open_paths.pop(data.draw(st.integers(0, len(open_paths) - 1)))
            if op == "backup":
                value = data.draw(st.floats(0.0, 1.0))
                unjudged = data.draw(st.booleans())
                tree.backup(path, 0.0 if unjudged else value, unjudged=unjudged)
                backups += 1
            else:
                before, stats = tree_state(tree), tree.stats()
                tree.abandon(path)
                assert tree_state(tree) == before
                after = tree.stats()
                assert after["in_flight"] == stats["in_flight"] - 1
                assert {k: v for k, v in after.items() if not k.startswith("in_flight")} == {
                    k: v for k, v in stats.items() if not k.startswith("in_flight")
                }
        check_tree(tree, in_flight=len(open_paths))
    return backups


@settings(max_examples=200, deadline=None)
@given(config=tree_settings, seed=st.integers(0, 2**32), data=st.data())
def test_statistics_stay_consistent_under_any_interleaving(
    config: UCTSettings, seed: int, data: st.DataObject
) -> None:
    tree = UCTTree(random.Random(seed), config)
    tree.expand(draw_candidates(data, 1))
    open_paths: list[TreePath] = []
    backups = random_session(tree, data, data.draw(st.integers(0, 40)), open_paths)
    check_tree(tree, backups=backups, in_flight=len(open_paths))
    # finish: every path left succeeds, fails or is cancelled
    while open_paths:
        path = open_paths.pop()
        if data.draw(st.booleans()):
            tree.backup(path, data.draw(st.floats(0.0, 1.0)))
            backups += 1
        else:
            tree.abandon(path)
    check_tree(tree, backups=backups, in_flight=0)
    assert tree.stats()["in_flight_marks"] == 0


@settings(max_examples=200, deadline=None)
@given(config=tree_settings, seed=st.integers(0, 2**32), data=st.data())
def test_abandon_is_as_if_never_selected(
    config: UCTSettings, seed: int, data: st.DataObject
) -> None:
    """Twin trees run the same script; one also selects and abandons probes in between (its RNG
    rewound after each): both then choose the same paths and end with the same statistics."""
    candidates = draw_candidates(data, 1)
    rngs = [random.Random(seed), random.Random(seed)]
    twins = [UCTTree(rng, config) for rng in rngs]
    for twin in twins:
        twin.expand(candidates)
    chosen: list[list[tuple[NodeId, Action]]] = [[], []]
    open_paths: list[list[TreePath]] = [[], []]
    for _ in range(data.draw(st.integers(0, 30))):
        if data.draw(st.booleans()):
            state = rngs[1].getstate()
            probes = [twins[1].select() for _ in range(data.draw(st.integers(1, 3)))]
            for probe in probes:  # held together, so later probes see the earlier ones' marks
                if probe is not None:
                    twins[1].abandon(probe)
            rngs[1].setstate(state)
        step = data.draw(st.sampled_from(["select", "backup"]))
        value = data.draw(st.floats(0.0, 1.0))
        for i, twin in enumerate(twins):
            if step == "select" or not open_paths[i]:
                if (path := twin.select()) is not None:
                    open_paths[i].append(path)
                    chosen[i].append((path.node, path.action))
            else:
                twin.backup(open_paths[i].pop(0), value)
    assert chosen[0] == chosen[1]
    assert tree_state(twins[0]) == tree_state(twins[1])
    assert twins[0].stats() == twins[1].stats()


@settings(max_examples=200, deadline=None)
@given(config=tree_settings, seed=st.integers(0, 2**32), data=st.data())
def test_reroot_keeps_the_chosen_subtree(
    config: UCTSettings, seed: int, data: st.DataObject
) -> None:
    tree = UCTTree(random.Random(seed), config)
    tree.expand(draw_candidates(data, 1))
    open_paths: list[TreePath] = []
    random_session(tree, data, data.draw(st.integers(1, 40)), open_paths)
    root = tree_state(tree)["root"]
    sampled = [(i, ch) for i, ch in enumerate(root["children"]) if ch["samples"]]
    if not sampled:
        return
    _, chance = data.draw(st.sampled_from(sampled))
    j = data.draw(st.integers(0, len(chance["samples"]) - 1))
    action = msgspec.convert(chance["action"], Action)
    child = tree.reroot(action, j, random.Random(seed + 1))
    assert tree_state(tree)["root"] == root  # the old tree is untouched
    assert tree_state(child)["root"] == chance["samples"][j]
    assert child.stats()["root_visits"] == chance["samples"][j]["visits"]
    check_tree(child, in_flight=0)
    for path in open_paths:  # in-flight simulations still belong to the old tree
        tree.abandon(path)
    check_tree(tree, in_flight=0)
