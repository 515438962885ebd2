"""The CI gate on the command line (:mod:`mhsafeeval.reports.gate`): ``--fail-above``,
``--fail-above-ci`` and ``--junit`` of ``run`` and ``report``, the run's gate checked before
anything is written (``check`` too), and the decision once the results are in."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mhsafeeval.config import Config

from ._exits import EXIT_GATE

if TYPE_CHECKING:
    from mhsafeeval.config import GateSection
    from mhsafeeval.reports.text import CampaignReport
    from mhsafeeval.storage import CampaignLog, EventStore


def _gate_arguments(parser: argparse.ArgumentParser, *, stored: bool) -> None:
    """``--fail-above``, ``--fail-above-ci`` and ``--junit`` of ``run`` and ``report``."""
    parser.add_argument(
        "--fail-above",
        type=_rate,
        metavar="RATE",
        help=f"exit {EXIT_GATE} when a counselor model's overall ASR exceeds RATE (0 to 1; "
        "overrides gate.max_asr)",
    )
    parser.add_argument(
        "--fail-above-ci",
        action="store_true",
        help="read each gated rate as the upper end of its 95%% interval (gate.use_upper_ci)",
    )
    parser.add_argument(
        "--junit",
        type=Path,
        metavar="FILE",
        help="write the gate's results as JUnit XML, one test case per counselor model and "
        "cell (owner-only)"
        + (
            f"; checks each campaign against the [gate] stored with it; exit {EXIT_GATE} when "
            "a limit is exceeded"
            if stored
            else ""
        ),
    )


def _rate(text: str) -> float:
    """``--fail-above``: a rate from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return value


def _run_gate(
    args: argparse.Namespace | None,
    config: Config,
    cells: Sequence[tuple[str, str]],
    source: str | Path,
) -> GateSection:
    """The run's gate: ``[gate]`` with the command line's options (``args``; None: none) over
    it, its cell rules checked against the taxonomy (InputError naming the key, before
    anything is written)."""
    from mhsafeeval.reports.gate import check_gate, override

    gate = config.gate
    if args is not None:
        gate = override(gate, fail_above=args.fail_above, upper_ci=args.fail_above_ci)
    check_gate(gate, cells, source)
    return gate


def _decide_gate(
    args: argparse.Namespace,
    gate: GateSection,
    folded: Sequence[tuple[CampaignReport, CampaignLog]],
    *,
    finished: bool,
) -> bool:
    """Check the run's results against its gate (one stderr line per exceeded limit) and
    write ``--junit``; True when a limit is exceeded. A run that stopped before it finished
    (a budget) decides nothing: its own exit code says why."""
    from mhsafeeval.reports.gate import apply_gate, evaluate, write_junit

    if not gate.active and args.junit is None:
        return False
    rule = "gate.max_asr" if args.fail_above is None else "--fail-above"
    if finished:
        results = [(report, log, gate) for report, log in folded]
        return apply_gate(results, junit=args.junit, overall_rule=rule)
    if args.junit is not None:
        checks = [(r, log, evaluate(r, gate, log, overall_rule=rule)) for r, log in folded]
        write_junit(args.junit, checks)
        print(f"mhsafeeval: wrote {args.junit} (the results so far)", file=sys.stderr)
    print("mhsafeeval: gate: not decided, as the campaign did not finish", file=sys.stderr)
    return False


async def _report_gate(args: argparse.Namespace, store: EventStore) -> int:
    """``report --junit`` / ``--fail-above``: each campaign against its stored gate."""
    if args.junit is None and args.fail_above is None and not args.fail_above_ci:
        return 0
    from mhsafeeval.reports.gate import gate_stored

    exceeded = await gate_stored(
        store,
        args.campaign,
        source=args.db,
        fail_above=args.fail_above,
        upper_ci=args.fail_above_ci,
        junit=args.junit,
    )
    return EXIT_GATE if exceeded else 0
