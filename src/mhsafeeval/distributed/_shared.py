"""What every worker of a distributed run shares: the budget, the harm archives and UCT's
learned rates.

Both are plain classes; the driver runs each as one Ray actor (``ray.remote(cls)``), so their
methods run one at a time in call order and nothing here needs a lock.
"""

from __future__ import annotations

from mhsafeeval.budget import Budget
from mhsafeeval.config import BudgetSection
from mhsafeeval.messages import Elite

__all__ = ["ArchiveHub", "BudgetLedger", "Spent"]

Spent = tuple[int, int, float]
"""What the whole run spent so far: (counselor calls, tokens, USD)."""

Rates = dict[str, dict[object, list[int]]]
"""UCT's learned rates: per counselor model, ``[wins, tries]`` by key (category, role, cell,
move), as the UCT controller's ``learned()`` gives them."""


class BudgetLedger:
    """The one :class:`~mhsafeeval.budget.Budget` of a distributed run.

    Workers reserve a place before each model call (:meth:`admit`: exact for counselor calls,
    as in one process: the ledger counts them one at a time) and count the answer after
    (:meth:`settle`). Once a limit is reached every later :meth:`admit` is refused, so every
    worker stops starting calls.

    Example:
        >>> ledger = BudgetLedger(BudgetSection(counselor_calls=2), (0, 0, 0.0))
        >>> [ledger.admit(True)[0] for _ in range(3)]
        [True, True, False]
        >>> ledger.reached()
        'budget.counselor_calls'
    """

    def __init__(self, limits: BudgetSection, spent: Spent) -> None:
        self.budget = Budget(limits)
        self.budget.counselor_calls, self.budget.tokens, self.budget.usd = spent
        self.budget.add(0, 0.0)  # a limit the stored part already reached is reached now

    def admit(self, counselor: bool, rater: bool = False) -> tuple[bool, str | None, Spent]:
        """Reserve one call: (admitted, the limit reached or None, what was spent)."""
        admitted = self.budget.reserve(counselor, rater=rater)
        return admitted, self.budget.reached, self.spent()

    def settle(self, tokens: int, usd: float) -> None:
        """Count one admitted call's answer (zeros: it failed or was cancelled)."""
        self.budget.in_flight -= 1
        self.budget.add(tokens, usd)

    def reached(self) -> str | None:
        """The limit reached, or None."""
        return self.budget.reached

    def spent(self) -> Spent:
        """What the whole run spent so far."""
        b = self.budget
        return b.counselor_calls, b.tokens, b.usd

    def state(self) -> tuple[str | None, Spent, str]:
        """The limit reached, what was spent, and the same for people."""
        return self.budget.reached, self.spent(), self.budget.spent()


class ArchiveHub:
    """The best elite per counselor model and cell across all workers, version-stamped.

    MAP-Elites insertion keeps a cell's most severe elite (the first on ties), so merging is
    a per-cell maximum and the order workers offer in does not change what a cell ends with
    (only which of two equally severe elites stays). Each worker offers the elites its own
    controller published and takes in what changed since it last asked (:meth:`exchange`).

    Example:
        >>> hub = ArchiveHub([])
        >>> weak = Elite(category="blaming", role="enabler", severity=2, counselor_model="m")
        >>> hub.exchange([weak], 0)[0]
        1
        >>> strong = Elite(category="blaming", role="enabler", severity=4, counselor_model="m")
        >>> version, changed = hub.exchange([strong, weak], 1)
        >>> version, [e.severity for e in changed]
        (2, [4])
    """

    def __init__(self, elites: list[Elite]) -> None:
        self.version = 0
        self.best: dict[tuple[str, str, str], tuple[int, Elite]] = {}
        self.rates: dict[int, Rates] = {}
        self._offer(elites)

    def _offer(self, elites: list[Elite]) -> None:
        for elite in elites:
            key = (elite.counselor_model, elite.category, elite.role)
            current = self.best.get(key)
            if current is None or elite.severity > current[1].severity:
                self.version += 1
                self.best[key] = (self.version, elite)

    def exchange(self, offered: list[Elite], since: int) -> tuple[int, list[Elite]]:
        """Merge ``offered``; return the version now and every cell's best elite that changed
        after version ``since`` (0: all of them)."""
        self._offer(offered)
        return self.version, [e for v, e in self.best.values() if v > since]

    def elites(self) -> list[Elite]:
        """Every cell's best elite."""
        return [e for _, e in self.best.values()]

    def share_rates(self, shard: int, learned: Rates) -> Rates:
        """Keep what one shard's UCT controller learned (its totals: a shard's replaced
        worker sends its own again) and return the sum of every other shard's.

        Example:
            >>> hub = ArchiveHub([])
            >>> hub.share_rates(0, {"m": {"cell": [1, 2]}})
            {}
            >>> hub.share_rates(1, {"m": {"cell": [0, 3]}})
            {'m': {'cell': [1, 2]}}
        """
        self.rates[shard] = learned
        others: Rates = {}
        for other, rates in self.rates.items():
            if other == shard:
                continue
            for model, levels in rates.items():
                into = others.setdefault(model, {})
                for key, (wins, tries) in levels.items():
                    slot = into.setdefault(key, [0, 0])
                    slot[0] += wins
                    slot[1] += tries
        return others
