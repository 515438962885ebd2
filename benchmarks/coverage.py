"""Coverage of the reports' intervals and the family-wise error of ``compare``, on simulated
campaigns whose truth is known (issue 35; docs/statistics.md shows the tables).

1. **The overall ASR interval.** A campaign is ``G`` conversations of ``T`` judged turns. Each
   conversation's success probability is drawn from a beta distribution with mean the true
   rate and intra-class correlation ``icc`` (0: independent turns; 0.5: conversations differ
   strongly, as profiles and histories make them), each turn succeeds with it. The table gives
   the share of campaigns whose interval contains the true rate (target 0.95; at least 0.93
   wherever the report does not warn, i.e. from :data:`~mhsafeeval.stats.FEW_CONVERSATIONS`
   conversations on) and, in brackets, the share entirely *below* it.
2. **The difference interval** (``compare``'s change B - A), likewise: two independent
   campaigns of ``G`` conversations a side, true rates 0.3 and 0.3 (no change) or 0.3 and 0.5.
3. **compare's marks as a family**: pairs of campaigns of one counselor over the 28 cells
   (28 conversations x 10 turns a side, each turn in a random cell; a conversation's
   vulnerability shifts every rate on the logit scale by a normal of standard deviation 0 or
   1). With the same true rates a side, the share of pairs where *any* cell (or the overall
   ASR) is marked "beyond the noise" is the family-wise error (target <= 0.05). With every
   cell's rate 0.2 higher in B, the share of cells marked and of overall ASRs marked is the
   power.

The intervals are the reports' own: the benchmark computes them with the function the reports
use, and first checks on a few campaigns that it gives exactly what
:func:`~mhsafeeval.storage.compute_metrics` reports. The same script measures the code before
issue 35 (``PYTHONPATH=/path/to/old/src``: its percentile cluster bootstrap, widened to the
pooled Wilson interval) and after it. Everything is seeded: the same arguments print the same
table.

    python benchmarks/coverage.py [--runs 1000] [--pairs 200] [--jobs N] [--parts 1,2,3]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

import mhsafeeval.stats as stats
from mhsafeeval.messages import (
    CampaignStarted,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Message,
    TurnCommitted,
    Verdict,
)

CONVERSATIONS = (4, 5, 8, 12, 20, 50)
TURNS = (5, 10)
ICCS = (0.0, 0.1, 0.33, 0.5)
RATES = (0.1, 0.3, 0.5)  # the intervals are symmetric in p and 1 - p
DIFFERENCES = ((0.3, 0.3), (0.3, 0.5))
FEW = getattr(stats, "FEW_CONVERSATIONS", 0)  # before issue 35 nothing warned
AFTER = hasattr(stats, "clustered_interval")
Clusters = list[tuple[int, int]]


# --- the reports' intervals, as each version computes them ------------------------------------


def asr_interval(clusters: Clusters) -> tuple[float, float]:
    """The overall ASR interval the report prints for these (successes, turns) clusters."""
    if AFTER:
        return stats.clustered_interval([s for s, _ in clusters], [n for _, n in clusters])
    low, high = stats.cluster_bootstrap(clusters, resamples=stats.RESAMPLES, seed=stats.SEED)
    hits, total = sum(s for s, _ in clusters), sum(n for _, n in clusters)
    w_low, w_high = stats.wilson_interval(hits, total)
    return (min(low, w_low), max(high, w_high))


def difference(a: Clusters, b: Clusters) -> tuple[float, float]:
    """``compare``'s interval of rate(b) - rate(a) (the same call before and after)."""
    return stats.difference_interval(a, b)


# --- simulated campaigns --------------------------------------------------------------------


def simulate(rng: np.random.Generator, g: int, t: int, icc: float, rate: float) -> Clusters:
    """``g`` conversations of ``t`` turns; each conversation's success probability is a beta
    of mean ``rate`` and intra-class correlation ``icc`` (a + b = 1 / icc - 1)."""
    if icc == 0:
        p = np.full(g, rate)
    else:
        total = 1.0 / icc - 1.0
        p = rng.beta(rate * total, (1.0 - rate) * total, size=g)
    hits = rng.binomial(t, p)
    return [(int(h), t) for h in hits]


def events_of(clusters: Clusters, cell: tuple[str, str] = ("blaming", "enabler")) -> list[Message]:
    """The campaign's events: one model ``m``, one judged turn per unit, in one cell."""
    out: list[Message] = []
    for index, (hits, turns) in enumerate(clusters):
        where: dict[str, Any] = {"campaign": "c", "conversation": f"c/m/p/{index}"}
        out.append(ConversationStarted(**where, counselor_model="m", profile_id="p"))
        for turn in range(turns):
            said: dict[str, Any] = {**where, "turn": turn, "category": cell[0], "role": cell[1]}
            out += [
                ClientUtterance(**said, text="c"),
                CounselorReply(**said, text="r"),
                Verdict(**said, severity=3 if turn < hits else 1, label="", reasoning=""),
                TurnCommitted(**said, committed_attempt=0, client_text="c", counselor_text="r"),
            ]
    return out


def check_fidelity(campaigns: int = 12) -> None:
    """Raise unless :func:`asr_interval` is what ``compute_metrics`` reports."""
    from mhsafeeval.storage import compute_metrics

    rng = np.random.default_rng(7)
    for k in range(campaigns):
        g, t = CONVERSATIONS[k % len(CONVERSATIONS)], TURNS[k % len(TURNS)]
        clusters = simulate(rng, g, t, ICCS[k % len(ICCS)], RATES[k % len(RATES)])
        reported = compute_metrics(events_of(clusters), [("blaming", "enabler")])["m"]
        if reported.overall_asr_ci != asr_interval(clusters):
            raise SystemExit(
                f"the benchmark's interval {asr_interval(clusters)} is not the report's "
                f"{reported.overall_asr_ci} for {clusters}"
            )


# --- 1 and 2: coverage ----------------------------------------------------------------------


def _seed(*key: float) -> np.random.Generator:
    return np.random.default_rng([round(k * 1000) for k in key])


def asr_row(args: tuple[int, int, float, float, int]) -> tuple[float, float]:
    """(covered, entirely below the truth) shares of ``runs`` campaigns."""
    g, t, icc, rate, runs = args
    rng = _seed(1, g, t, icc, rate)
    covered = below = 0
    for _ in range(runs):
        low, high = asr_interval(simulate(rng, g, t, icc, rate))
        covered += low <= rate <= high
        below += high < rate
    return covered / runs, below / runs


def difference_row(args: tuple[int, int, float, tuple[float, float], int]) -> tuple[float, float]:
    """(covered, marked: the interval excludes 0) shares of ``runs`` pairs of campaigns."""
    g, t, icc, (ra, rb), runs = args
    rng = _seed(2, g, t, icc, ra, rb)
    covered = marked = 0
    for _ in range(runs):
        a, b = simulate(rng, g, t, icc, ra), simulate(rng, g, t, icc, rb)
        low, high = difference(a, b)
        covered += low <= rb - ra <= high
        marked += low > 0 or high < 0
    return covered / runs, marked / runs


def _grid_table(
    title: str,
    rows: Sequence[tuple[str, int]],
    cells: Sequence[Any],
    values: Sequence[tuple[float, float]],
    second: str,
) -> float:
    """Print a table, rows x ICC columns; returns the smallest coverage where nothing warns."""
    print(f"\n{title}")
    print(f"{'':<22}" + "".join(f"{'icc ' + format(icc, 'g'):>16}" for icc in ICCS))
    worst = 1.0
    it = iter(zip(cells, values, strict=True))
    for label, g in rows:
        line = f"{label:<22}"
        for _ in ICCS:
            _, (cov, other) = next(it)
            line += f"{cov:>9.3f} ({other:.3f})"
            if g >= FEW:
                worst = min(worst, cov)
        warned = g < FEW
        print(line + ("   warned: too few conversations" if warned else ""))
    print(f"(in brackets: {second})")
    return worst


def coverage(runs: int, pool: ProcessPoolExecutor, sizes: Sequence[int]) -> None:
    """Parts 1 and 2, over campaigns of ``sizes`` conversations."""
    rows = [(f"{g:>2} conv x {t:>2} turns p={r:g}", g) for g in sizes for t in TURNS for r in RATES]
    cells = [(g, t, icc, r, runs) for g in sizes for t in TURNS for r in RATES for icc in ICCS]
    values = list(pool.map(asr_row, cells, chunksize=1))
    worst = _grid_table(
        f"1. coverage of the overall ASR interval ({runs} campaigns each, target 0.95)",
        rows, cells, values, "share entirely below the truth",
    )  # fmt: skip
    print(f"smallest coverage where the report does not warn: {worst:.3f}")

    drows = [
        (f"{g:>2} conv x {t:>2} {a:g}->{b:g}", g)
        for g in sizes
        for t in TURNS
        for a, b in DIFFERENCES
    ]
    dcells = [
        (g, t, icc, d, runs) for g in sizes for t in TURNS for d in DIFFERENCES for icc in ICCS
    ]
    dvalues = list(pool.map(difference_row, dcells, chunksize=1))
    worst = _grid_table(
        f"2. coverage of the difference interval B - A ({runs} pairs each, target 0.95)",
        drows, dcells, dvalues, "share of pairs marked: the interval excludes 0",
    )  # fmt: skip
    print(f"smallest coverage where the report does not warn: {worst:.3f}")


# --- 3: compare's marks as a family ---------------------------------------------------------


def _compare_campaign(
    name: str, rates: dict[tuple[str, str], float], g: int, t: int, spread: float, seed: int
) -> list[Message]:
    rng = random.Random(seed)
    cells = sorted(rates)
    events: list[Message] = [CampaignStarted(campaign=name, cells=tuple(cells), threshold=2)]
    for index in range(g):
        conv = f"{name}/m/p{index % 7}/{index}"
        where: dict[str, Any] = {"campaign": name, "conversation": conv}
        events.append(ConversationStarted(**where, counselor_model="m", profile_id=f"p{index % 7}"))
        shift = rng.gauss(0.0, spread) if spread else 0.0
        for turn in range(t):
            cell = rng.choice(cells)
            logit = math.log(rates[cell] / (1 - rates[cell])) + shift
            hit = rng.random() < 1 / (1 + math.exp(-logit))
            said: dict[str, Any] = {**where, "turn": turn, "category": cell[0], "role": cell[1]}
            events += [
                ClientUtterance(**said, text="c"),
                CounselorReply(**said, text="r"),
                Verdict(**said, severity=3 if hit else 1, label="", reasoning=""),
                TurnCommitted(**said, committed_attempt=0, client_text="c", counselor_text="r"),
            ]
    return events


def compare_pair(args: tuple[int, float, float, int, int]) -> tuple[int, int, int, int]:
    """One pair of campaigns: (any cell marked, overall marked, cells marked, cells tested)."""
    k, spread, shift, g, t = args
    from mhsafeeval.reports.compare import compare
    from mhsafeeval.reports.text import report_of
    from mhsafeeval.storage import CampaignLog
    from mhsafeeval.taxonomy import builtin_taxonomy

    cells = sorted(builtin_taxonomy().cells)
    rng = random.Random(f"pair-{k}-{spread}-{shift}")
    high = 0.85 - shift
    rates_a = {cell: rng.uniform(0.15, high) for cell in cells}
    rates_b = {cell: r + shift for cell, r in rates_a.items()}
    sides = []
    for name, rates, seed in (("a", rates_a, 2 * k), ("b", rates_b, 2 * k + 1)):
        log = CampaignLog.of(_compare_campaign(name, rates, g, t, spread, seed))
        sides.append((report_of(log, name), log, ""))
    [m] = compare(sides[0], sides[1]).models
    marked = sum(c.asr.status == "beyond_noise" for c in m.cells)
    tested = sum(c.asr.status in ("beyond_noise", "within_noise") for c in m.cells)
    return int(marked > 0), int(m.asr.status == "beyond_noise"), marked, tested


def family(pairs: int, pool: ProcessPoolExecutor, g: int = 28, t: int = 10) -> None:
    """Part 3."""
    print(f"\n3. compare: {pairs} pairs of campaigns, {g} conversations x {t} turns a side")
    print(f"{'':<34}{'any cell':>10}{'overall':>10}{'cells marked':>14}{'cells tested':>14}")
    for label, spread, shift in (
        ("same rates, independent turns", 0.0, 0.0),
        ("same rates, vulnerability sd 1", 1.0, 0.0),
        ("B +0.2 everywhere, independent", 0.0, 0.2),
        ("B +0.2 everywhere, sd 1", 1.0, 0.2),
    ):
        found = list(pool.map(compare_pair, [(k, spread, shift, g, t) for k in range(pairs)]))
        any_cell = sum(f[0] for f in found) / pairs
        overall = sum(f[1] for f in found) / pairs
        marked = sum(f[2] for f in found)
        tested = sum(f[3] for f in found)
        share = marked / tested if tested else math.nan
        print(f"{label:<34}{any_cell:>10.3f}{overall:>10.3f}{share:>14.3f}{tested / pairs:>14.1f}")
    print(
        "(same rates: 'any cell' is the family-wise error, target <= 0.05; B +0.2: 'overall' "
        "and 'cells marked' (of those tested) are the power)"
    )


def main() -> None:
    """Check the benchmark's intervals against the report's, then print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="campaigns per coverage cell")
    parser.add_argument("--pairs", type=int, default=200, help="pairs per compare scenario")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--parts", default="1,3", help="1: coverage (and 2), 3: compare")
    parser.add_argument(
        "--conversations",
        default=",".join(map(str, CONVERSATIONS)),
        help="the campaigns' sizes in the coverage tables (the old code's bootstrap is slow)",
    )
    args = parser.parse_args()
    sizes = tuple(int(g) for g in args.conversations.split(","))
    parts = set(args.parts.split(","))
    start = time.perf_counter()
    check_fidelity()
    version = "after issue 35" if AFTER else "before issue 35"
    print(f"mhsafeeval from {os.path.dirname(stats.__file__)} ({version}); intervals checked "
          "against compute_metrics")  # fmt: skip
    with ProcessPoolExecutor(args.jobs) as pool:
        if parts & {"1", "2"}:
            coverage(args.runs, pool, sizes)
        if "3" in parts:
            family(args.pairs, pool)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
