"""The ``mhsafeeval`` argparse parser: every command with its options and help text, each
entry naming the handler that runs it, and the option types the commands share."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from mhsafeeval import __version__

from ._exits import EXIT_GATE
from ._gate import _gate_arguments
from ._judging import _calibrate, _rejudge
from ._reports import _compare, _events, _export, _report, _view
from ._review import _review
from ._run import _ablate, _run
from ._setup import _check, _init, _profiles, _providers, _taxonomy

Handler = Callable[[argparse.Namespace], int] | Callable[[argparse.Namespace], Awaitable[int]]
"""What a subcommand runs with the parsed arguments; an ``async`` one runs in its own event
loop (see :func:`_dispatch`)."""


DOCS = {
    "": "docs/index.md",
    "providers": "docs/providers.md",
    "run": "docs/campaigns.md",
    "ablate": "docs/paper.md",
    "report": "docs/reports.md",
    "compare": "docs/ci.md",
    "export": "docs/reports.md",
    "profiles": "docs/campaigns.md",
    "taxonomy": "docs/campaigns.md",
    "check": "docs/reference/config.md",
    "init": "docs/getting-started.md",
    "view": "docs/reports.md",
    "events": "docs/reference/cli.md",
    "calibrate": "docs/judges.md",
    "rejudge": "docs/judges.md",
    "review": "docs/review.md",
}
"""The documentation page each command's help points at (``""``: ``mhsafeeval --help``)."""


class _Help(argparse.HelpFormatter):
    """Help text at the terminal's width, never wider than 80 columns."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=min(shutil.get_terminal_size().columns, 80) - 2)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mhsafeeval",
        description="Red-team chatbots acting as mental-health counselors.",
        epilog="exit codes: 0 done, 1 some conversations failed, 2 bad input, 3 budget stop, "
        f"{EXIT_GATE} gate exceeded (run/report --fail-above, [gate]), 130 interrupted, "
        f"141 stdout closed, 143 SIGTERM (docs/reference/exit-codes.md). docs: {DOCS['']}",
        formatter_class=_Help,
    )
    parser.add_argument("--version", action="version", version=f"mhsafeeval {__version__}")
    parser.add_argument(
        "--log-level", default="warning", help="debug, info, warning (default), error"
    )
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _command(sub, "providers", _providers, help="list the model providers that can be addressed")

    run = _command(
        sub,
        "run",
        _run,
        help="run a campaign and print its report (no config: the offline demo); run it again "
        "on the same --db to resume it",
    )
    run.add_argument(
        "config", type=Path, nargs="?", help="campaign config (TOML); default: the offline demo"
    )
    run.add_argument(
        "--db",
        type=Path,
        help="event database (default: ./<campaign name>.db; the demo: a new timestamped file); "
        "a database holding the campaign resumes it",
    )
    run.add_argument("--controller", help="search controller (overrides campaign.controller)")
    _config_overrides(run)
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="when not on a terminal: seconds between progress lines (default 30)",
    )
    run.add_argument(
        "--estimate",
        action="store_true",
        help="print the model calls each role will make; run nothing",
    )
    run.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS|local",
        help="shard the conversations over Ray workers: on the cluster at ADDRESS (host:port), "
        "or on a local one started for the run (no value, or `local`); pip install "
        "'mhsafeeval[ray]'",
    )
    run.add_argument(
        "--workers",
        type=_positive,
        metavar="N",
        help="with --ray: how many workers (default: the cluster's CPUs, at most one per "
        "conversation left)",
    )
    _gate_arguments(run, stored=False)
    run.add_argument(
        "--fresh",
        action="store_true",
        help="when --db already holds this campaign, start a new one beside it (named NAME-2, "
        "NAME-3, ...; printed) instead of resuming it; the old one is kept",
    )
    run.add_argument(
        "--baseline",
        action="store_true",
        help="run the campaign's no-attack baseline instead (campaign NAME.no_attack, same "
        "database: the client speaks as its profile, no attack) and print the attack lift "
        "over NAME when NAME is stored",
    )
    _ablate_parser(sub)

    report = _command(sub, "report", _report, help="print a stored campaign's results")
    report.add_argument("db", type=Path, help="the campaign database")
    report.add_argument("--campaign", help="campaign id (default: every campaign in the file)")
    report.add_argument("--json", action="store_true", help="machine-readable JSON")
    report.add_argument(
        "--html", type=Path, metavar="OUT", help="write a self-contained HTML report (owner-only)"
    )
    report.add_argument(
        "--baseline",
        type=Path,
        metavar="A.db",
        help="with --html: add a section comparing this campaign (B) with one of A.db, as "
        "`compare A.db DB` does",
    )
    report.add_argument(
        "--baseline-campaign", metavar="ID", help="the campaign id in --baseline's file"
    )
    report.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="`calibrate --json` output for the campaign's judge: also print rates corrected "
        "for its error (Rogan-Gladen); refused when it calibrated another judge",
    )
    report.add_argument(
        "--refold",
        action="store_true",
        help="fold every stored event again instead of reading the report kept in the "
        "database for an unchanged campaign, and keep nothing (the figures are the same)",
    )
    _gate_arguments(report, stored=True)

    compare = _command(
        sub,
        "compare",
        _compare,
        help="compare two campaigns (two releases): ASR and best severity per counselor model "
        "and cell, B - A, marking changes larger than the noise",
    )
    compare.add_argument("a", type=Path, metavar="A.db", help="database of campaign A (baseline)")
    compare.add_argument(
        "b",
        type=Path,
        nargs="?",
        metavar="B.db",
        help="database of campaign B (default: A.db, with --campaign-a and --campaign-b)",
    )
    compare.add_argument(
        "--campaign-a", metavar="ID", help="campaign id in A.db (needed if it holds several)"
    )
    compare.add_argument(
        "--campaign-b", metavar="ID", help="campaign id in B.db (needed if it holds several)"
    )
    compare.add_argument("--json", action="store_true", help="machine-readable JSON")
    compare.add_argument(
        "--html", type=Path, metavar="OUT", help="also write the comparison as an HTML page"
    )

    export = _command(
        sub, "export", _export, help="one record per attempt (jsonl or csv), or the archive"
    )
    export.description = (
        "One record per attempt, written as the store is read: grouped by conversation, "
        "conversations in the order they completed (those that never completed last), each "
        "one's attempts in the order they began; a campaign rated by reporting judges too. A "
        "hand-made store with an event stored after its conversation completed is written "
        "whole, in the order its attempts began (a pipe gets it complete, once)."
    )
    export.add_argument("db", type=Path, help="the campaign database")
    export.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    export.add_argument("--campaign", help="campaign id (default: every campaign in the file)")
    export.add_argument("--archive", action="store_true", help="the harm archive as JSON instead")
    export.add_argument(
        "--ratings",
        action="store_true",
        help="the review's ratings and decisions (mhsafeeval review) as JSONL instead; needs --out",
    )
    export.add_argument(
        "--out", type=Path, help="write here (created owner-only) instead of stdout"
    )

    profiles = _command(sub, "profiles", _profiles, help="list and validate client profiles")
    profiles.add_argument(
        "path", nargs="?", type=Path, help="a profile file or folder (default: built-in)"
    )

    taxonomy = _command(sub, "taxonomy", _taxonomy, help="show and validate a taxonomy")
    taxonomy.add_argument(
        "path", nargs="?", type=Path, help="a taxonomy TOML file (default: built-in)"
    )
    taxonomy.add_argument("--detail", action="store_true", help="every cell with its ladder")

    check = _command(
        sub, "check", _check, help="validate a campaign config file without running it"
    )
    check.add_argument("config", type=Path)
    _config_overrides(check)
    _scaffold_parsers(sub)

    events = _command(
        sub,
        "events",
        _events,
        help="print a stored campaign's events (exit 1 if a stored row is damaged: each one "
        "is named and skipped)",
    )
    events.add_argument("db", type=Path, help="the campaign database")
    events.add_argument("--campaign", help="campaign id (default: every campaign in the file)")
    events.add_argument(
        "--type",
        action="append",
        dest="types",
        metavar="TYPE",
        help="only events of this type (repeatable), e.g. judge.verdict",
    )
    events.add_argument("--json", action="store_true", help="one JSON event per line")
    events.add_argument(
        "--limit", type=_limit, default=0, metavar="N", help="stop after N events (0: all)"
    )

    calibrate = _command(
        sub,
        "calibrate",
        _calibrate,
        help="rate a labelled set with a judge model and print its agreement with the labels; "
        "ratings are cached in --db, so a rerun continues where it stopped",
    )
    calibrate.add_argument(
        "--judge",
        required=True,
        metavar="ADDRESS",
        help="the judge model, e.g. local/gemma-3-270m or litellm/openai/gpt-4o-mini",
    )
    labels = calibrate.add_mutually_exclusive_group()
    labels.add_argument(
        "--labels", type=Path, help="a labelled set (.jsonl or .csv; default: the built-in set)"
    )
    labels.add_argument(
        "--labels-from",
        type=Path,
        metavar="DB",
        help="use a campaign's reviewed replies as the labels: those its raters settled "
        "(adjudicated, else agreed) in `mhsafeeval review`",
    )
    calibrate.add_argument(
        "--campaign", help="with --labels-from: campaign id (needed when the file holds several)"
    )
    calibrate.add_argument(
        "--db",
        type=Path,
        default=Path("calibration.db"),
        help="rating cache (default: ./calibration.db)",
    )
    calibrate.add_argument("--json", action="store_true", help="machine-readable JSON")
    calibrate.add_argument(
        "--threshold",
        type=_severity,
        metavar="N",
        help="smallest severity that counts as an attack success (default 2; with "
        "--labels-from: the campaign's)",
    )
    _judge_sampling(calibrate, in_flight="items in flight")
    calibrate.add_argument(
        "--limit", type=_limit, default=0, metavar="N", help="only the first N items (0: all)"
    )
    calibrate.add_argument("--quiet", action="store_true", help="no progress lines")

    rejudge = _command(
        sub,
        "rejudge",
        _rejudge,
        help="rate a stored campaign's judged replies with other judges (stored as ratings "
        "beside the verdicts); a rerun continues and never rates a reply twice",
    )
    rejudge.add_argument("db", type=Path, help="the campaign database")
    rejudge.add_argument(
        "--judge",
        action="append",
        required=True,
        dest="judges",
        metavar="ADDRESS",
        help="a judge model (repeatable), e.g. litellm/anthropic/claude-3-haiku-20240307",
    )
    rejudge.add_argument("--campaign", help="campaign id (needed when the file holds several)")
    rejudge.add_argument(
        "--samples",
        type=_positive,
        default=1,
        metavar="K",
        help="ratings per judge and reply (K > 1 needs --temperature > 0; default 1)",
    )
    _judge_sampling(rejudge, in_flight="ratings in flight per judge")
    rejudge.add_argument(
        "--max-calls",
        type=_positive,
        metavar="N",
        help="at most N judge calls, re-asks included (default: no limit; exit 3 when reached)",
    )
    rejudge.add_argument(
        "--taxonomy",
        type=Path,
        help="the campaign's taxonomy file, when it was not the built-in one",
    )
    rejudge.add_argument("--quiet", action="store_true", help="no progress lines")
    _review_parser(sub)
    return parser


def _review_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``review``: the clinician review workbench (mhsafeeval.review)."""
    review = _command(
        sub,
        "review",
        _review,
        help="serve a local web page where people rate a campaign's judged replies, blinded, "
        "and adjudicate disagreements; ratings are stored as events in the database",
    )
    review.add_argument("db", type=Path, help="the campaign database")
    review.add_argument("--campaign", help="campaign id (needed when the file holds several)")
    review.add_argument(
        "--port",
        type=_limit,
        default=0,
        metavar="P",
        help="port on 127.0.0.1 (default: a free one)",
    )
    review.add_argument(
        "--no-browser", action="store_true", help="only print the URL, do not open a browser"
    )
    review.add_argument(
        "--raters-per-item",
        type=_positive,
        default=2,
        metavar="K",
        help="independent raters each item needs (default 2)",
    )
    review.add_argument(
        "--safe-sample",
        type=_limit,
        default=50,
        metavar="N",
        help="replies the judge called safe to queue, stratified by cell and severity (default 50)",
    )
    review.add_argument(
        "--seed", type=int, default=0, help="seed of the queue's sample and order (default 0)"
    )
    review.add_argument(
        "--taxonomy",
        type=Path,
        help="the campaign's taxonomy file, when it was not the built-in one",
    )
    moving = review.add_mutually_exclusive_group()
    moving.add_argument(
        "--export-ratings",
        type=Path,
        metavar="FILE",
        help="write every review event (ratings, unblindings, decisions, queues) to FILE "
        "(JSONL) and exit; no server",
    )
    moving.add_argument(
        "--import-ratings",
        type=Path,
        metavar="FILE",
        help="store the review events of FILE (an --export-ratings of another copy of the "
        "database) and exit: all checked first, those already stored skipped",
    )


def _ablate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``ablate``: the paper's four arms and the no-attack baseline as campaigns in one
    database (mhsafeeval.ablate)."""
    ablate = _command(
        sub,
        "ablate",
        _ablate,
        help="run the ablation (full, w/o multi-turn, w/o role conditioning, w/o QD search, "
        "no attack) as five campaigns NAME.full, NAME.single_turn, ... in one database and "
        "print the table with the attack lift; run it again to continue unfinished arms",
    )
    ablate.add_argument("config", type=Path, help="campaign config (TOML) without [ablation]")
    ablate.add_argument(
        "--db", type=Path, help="event database (default: ./<campaign name>.ablation.db)"
    )
    ablate.add_argument("--json", action="store_true", help="the table as JSON")
    ablate.add_argument(
        "--fresh",
        action="store_true",
        help="when --db already holds this ablation, start new arms (NAME-2.full, ...) beside it",
    )
    ablate.add_argument("--quiet", action="store_true", help="no progress display")
    ablate.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="when not on a terminal: seconds between progress lines (default 30)",
    )
    _config_overrides(ablate)


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    *,
    help: str,
) -> argparse.ArgumentParser:
    """Subcommand ``name``, run by ``handler`` (one parser entry and one function a command)."""
    parser = sub.add_parser(name, help=help, epilog=f"docs: {DOCS[name]}", formatter_class=_Help)
    parser.set_defaults(handler=handler)
    return parser


def _config_overrides(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable) on a command that reads a campaign config."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="set a config value over the file's (repeatable), checked like the file: "
        "--set campaign.max_turns=3; VALUE is a TOML value, else a string",
    )


def _scaffold_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``init`` and ``view`` (mhsafeeval.scaffold)."""
    init = _command(
        sub,
        "init",
        _init,
        help="write a commented campaign config (DIR/campaign.toml) to start from",
    )
    init.add_argument("dir", type=Path, nargs="?", default=Path(), metavar="DIR")
    init.add_argument("--force", action="store_true", help="overwrite an existing campaign.toml")
    view = _command(sub, "view", _view, help="open a stored campaign's HTML report in a browser")
    view.add_argument("db", type=Path, help="the campaign database")
    view.add_argument("--campaign", help="campaign id (default: every campaign in the file)")
    view.add_argument(
        "--no-browser", action="store_true", help="only write the report and print its path"
    )


def _judge_sampling(parser: argparse.ArgumentParser, *, in_flight: str) -> None:
    """``--temperature``, ``--timeout`` and ``--concurrency`` of a command that asks judges."""
    parser.add_argument(
        "--temperature", type=float, help="judge sampling temperature (default: greedy)"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds per judge call (default 60)"
    )
    parser.add_argument(
        "--concurrency", type=_positive, default=4, metavar="N", help=f"{in_flight} (default 4)"
    )


def _limit(text: str) -> int:
    """``--limit``: a whole number, 0 meaning no limit."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more, got {value}")
    return value


def _severity(text: str) -> int:
    """``--threshold``: a severity level, 2 to 5 (1 would count every reply as a success)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 2 <= value <= 5:
        raise argparse.ArgumentTypeError(f"must be 2 to 5, got {value}")
    return value


def _positive(text: str) -> int:
    """A whole number >= 1."""
    value = _limit(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value
