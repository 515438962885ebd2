"""The ``mhsafeeval`` command line. The composition root: the only module that knows every layer."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import msgspec

from mhsafeeval import __version__
from mhsafeeval._files import check_distinct, check_output, open_private_atomic
from mhsafeeval._terminal import visible, visible_json
from mhsafeeval.config import Config
from mhsafeeval.errors import InputError, MhSafeEvalError
from mhsafeeval.framework import redact

if TYPE_CHECKING:
    from mhsafeeval.config import GateSection
    from mhsafeeval.providers import ModelSettings
    from mhsafeeval.reports.text import CampaignReport
    from mhsafeeval.storage import CampaignLog, EventStore

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int] | Callable[[argparse.Namespace], Awaitable[int]]
"""What a subcommand runs with the parsed arguments; an ``async`` one runs in its own event
loop (see :func:`_dispatch`)."""

EXIT_INPUT = 2
EXIT_BUDGET = 3
EXIT_GATE = 4  # the campaign finished and a [gate] / --fail-above limit is exceeded
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141  # stdout closed by its reader (128 + SIGPIPE, as a shell reports it)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mhsafeeval",
        description="Red-team chatbots acting as mental-health counselors.",
        epilog="exit codes: 0 done, 1 some conversations failed, 2 bad input, 3 budget stop, "
        f"{EXIT_GATE} gate exceeded (run/report --fail-above, [gate]), 130 interrupted, "
        "141 stdout closed, 143 SIGTERM",
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
    calibrate.add_argument(
        "--labels", type=Path, help="a labelled set (.jsonl or .csv; default: the built-in set)"
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
        default=2,
        metavar="N",
        help="smallest severity that counts as an attack success (default 2)",
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
    return parser


def _ablate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``ablate``: the paper's four arms as campaigns in one database (mhsafeeval.ablate)."""
    ablate = _command(
        sub,
        "ablate",
        _ablate,
        help="run the ablation (full, w/o multi-turn, w/o role conditioning, w/o QD search) as "
        "four campaigns NAME.full, NAME.single_turn, ... in one database and print the table; "
        "run it again to continue unfinished arms",
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


async def _ablate(args: argparse.Namespace) -> int:
    """Exit 0, 1 (some conversation failed) or 3 (a budget stopped an arm), as ``run``."""
    from mhsafeeval.ablate import ablate_command

    outcome = await ablate_command(
        args.config,
        args.db,
        as_json=args.json,
        fresh=args.fresh,
        quiet=args.quiet,
        progress_every=args.progress_every,
        overrides=args.overrides,
    )
    return {"ok": 0, "failed": 1, "budget": EXIT_BUDGET}[outcome]


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    *,
    help: str,
) -> argparse.ArgumentParser:
    """Subcommand ``name``, run by ``handler`` (one parser entry and one function a command)."""
    parser = sub.add_parser(name, help=help)
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


def _init(args: argparse.Namespace) -> int:
    from mhsafeeval.scaffold import next_steps, write_starter_config

    written = write_starter_config(args.dir, force=args.force)
    print(visible(next_steps(written), keep_newlines=True))
    return 0


async def _view(args: argparse.Namespace) -> int:
    from mhsafeeval.scaffold import view_report

    await view_report(args.db, args.campaign, browser=not args.no_browser)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code (see the README's list): 0
    done, 1 some conversations failed, 2 bad input, 3 budget stop, 4 a finished campaign
    exceeded its gate (``[gate]``, ``--fail-above``), 130 interrupted, 141 stdout closed,
    143 SIGTERM."""
    previous = _sigterm.install()
    try:
        code = _main(argv)
    except _Terminated:  # between two steps of the command, or while it printed its last lines
        print("mhsafeeval: terminated (SIGTERM)", file=sys.stderr)
        code = EXIT_TERMINATED
    finally:
        if argv is None:  # the console script: the interpreter ends next
            _sigterm.finished = True
        else:  # a caller in the same process gets its own handler back
            _sigterm.restore(previous)
    if code == EXIT_TERMINATED and argv is None:
        # Everything is stored and closed: skip tearing down the interpreter's modules (half a
        # second with litellm loaded), as the signal's default action would.
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from mhsafeeval.framework import configure_logging

    configure_logging(args.log_level, json=args.log_json)
    try:
        code = _dispatch(parser, args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return code
    except BaseException as exc:  # groups from task groups, SIGTERM and Ctrl-C too
        if isinstance(exc, SystemExit):
            raise
        return _failed(exc, debug=args.log_level.lower() == "debug")


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


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the subcommand's handler: an ``async`` one in its own event loop, where SIGTERM
    stops it as Ctrl-C does."""
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:  # no subcommand
        parser.print_help()
        return 0
    if inspect.iscoroutinefunction(handler):
        code: int = anyio.run(_until_sigterm, handler, args)
        return code
    return handler(args)  # type: ignore[return-value]  # not a coroutine function


class _Terminated(BaseException):
    """SIGTERM arrived: the command was cancelled like on Ctrl-C. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on its way takes it for an error."""


class _Sigterm:
    """SIGTERM at any moment: one line, exit 143, within a second or two.

    A Python-level handler, installed first thing in :func:`main`, runs in the main thread at
    the next bytecode, even while that thread is busy in synchronous work (an import of a
    provider SDK, a model file's checksum, a test generation). Outside an event loop it raises
    :class:`_Terminated` right there: nothing is open yet. Inside one (:func:`_until_sigterm`)
    it asks the loop to cancel the command's task, exactly as Ctrl-C does (calls in flight are
    cancelled; the store, still running, records the run as ``interrupted`` and is flushed).
    If the loop has not taken that request within :data:`GRACE_S` (it is blocked in
    synchronous work), the signal is sent to the main thread again and the handler raises in
    that work instead.

    (asyncio's ``add_signal_handler`` would wait for the loop: 15-19 s behind a litellm import
    on a loaded machine. Cancelling a cancel scope around the command would not do either: it
    would cancel the store's writer before the store could record how the run ended.)
    """

    GRACE_S = 0.5

    def __init__(self) -> None:
        self.loop: Any = None
        self.task: Any = None
        self.asked_at: float | None = None
        self.taken = False
        self.finished = False

    def install(self) -> Any:
        """Handle SIGTERM from now on (main thread only); returns the handler it replaced."""
        self.loop = self.task = self.asked_at = None
        self.taken = self.finished = False
        if threading.current_thread() is not threading.main_thread():
            return None
        return signal.signal(signal.SIGTERM, self.handle)

    def restore(self, previous: Any) -> None:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)

    def handle(self, _signum: int, _frame: object) -> None:
        if self.finished:  # main() returned: the interpreter is ending, nothing is open
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                print("mhsafeeval: terminated (SIGTERM)", file=sys.stderr, flush=True)
            os._exit(EXIT_TERMINATED)
        loop, task = self.loop, self.task
        if loop is None or task is None or loop.is_closed() or self.asked_at is not None:
            if not self.taken:  # no loop, or a loop that did not answer in time
                raise _Terminated
            return  # the cancellation is under way: let it finish
        self.asked_at = time.monotonic()
        loop.call_soon_threadsafe(self._cancel, task)
        timer = threading.Timer(self.GRACE_S, self._remind)
        timer.daemon = True
        timer.start()

    def _cancel(self, task: Any) -> None:
        self.taken = True
        if not task.done():  # else the command ended meanwhile (it raised in blocked work)
            task.cancel()

    def _remind(self) -> None:
        if not self.taken:  # a real signal: it also cuts a blocking system call (a sleep)
            main = threading.main_thread().ident
            if main is not None:
                signal.pthread_kill(main, signal.SIGTERM)  # handle() again, in the main thread


_sigterm = _Sigterm()


async def _until_sigterm(
    command: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace
) -> int:
    """Run ``command``; on SIGTERM cancel it as Ctrl-C does and raise :class:`_Terminated`
    (see :class:`_Sigterm`)."""
    import asyncio

    task = asyncio.current_task()
    if task is None or threading.current_thread() is not threading.main_thread():
        return await command(args)  # signals reach the main thread only
    _sigterm.loop, _sigterm.task = asyncio.get_running_loop(), task
    try:
        return await command(args)
    except asyncio.CancelledError:
        if _sigterm.taken:
            raise _Terminated from None
        raise
    finally:
        _sigterm.loop = _sigterm.task = None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _failed(exc: BaseException, *, debug: bool) -> int:
    """One line on stderr and the exit code for what ended a command; never a traceback
    (unless ``--log-level debug``). Exception groups from task groups are looked inside."""

    leaves = _leaves(exc)

    def first(kind: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
        return next((e for e in leaves if isinstance(e, kind)), None)

    if first(KeyboardInterrupt) is not None:
        print("mhsafeeval: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if first(_Terminated) is not None:
        print("mhsafeeval: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    if first(BrokenPipeError) is not None:
        # The reader went away (`mhsafeeval report DB | head`): nothing more can be shown.
        # Point stdout at /dev/null so the interpreter's last flush stays quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    shown = first(InputError) or first(MhSafeEvalError) or leaves[0]
    ours = isinstance(shown, MhSafeEvalError)
    text = str(shown) if ours else f"{type(shown).__name__}: {shown}"
    # Error text may quote what came from outside (a file, an app's answer): no key in it.
    print(f"mhsafeeval: error: {visible(redact(text))}", file=sys.stderr)
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    elif not isinstance(shown, MhSafeEvalError):
        print("mhsafeeval: (run with --log-level debug for the traceback)", file=sys.stderr)
    return EXIT_INPUT if isinstance(shown, InputError) else 1


def _providers(args: argparse.Namespace) -> int:
    from mhsafeeval.providers import available_providers

    for name, description in available_providers().items():
        print(f"{name + '/...':<16} {description}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from mhsafeeval.config import blame_overrides, load_config
    from mhsafeeval.plan import build_plan, preflight

    path: Path = args.config
    config = load_config(path, args.overrides)  # the file is read once
    with blame_overrides(path, args.overrides):  # a value given by --set is named so
        plan = build_plan(config, path)  # once: what run would build
        found = preflight(config, path)  # raises what run would refuse too
        _run_gate(None, config, plan.taxonomy.cell_ids(), path)  # its cells named as run does
    for problem in found.missing:
        print(visible(f"mhsafeeval: warning: {problem} (needed to run)"), file=sys.stderr)
    for warning in found.warnings:
        print(visible(f"mhsafeeval: warning: {warning}"), file=sys.stderr)
    c = config.campaign
    print(
        visible(
            f"{path}: ok (campaign {c.name!r}: {len(plan.conversations)} conversation(s) x "
            f"{c.max_turns} turn(s), up to {c.max_attempts} attempt(s) per turn, "
            f"{len(plan.taxonomy.cell_ids())} cells)"
        )
    )
    for name, model in config.models.items():
        print(visible(f"  agent     {name:<14} {model.provider}"))
    for name, model in config.counselors.items():
        print(visible(f"  counselor {name:<14} {model.provider}"))
    samples = f" x {config.judges.samples} samples" if config.judges.samples > 1 else ""
    for name, model in config.judges.panel.items():
        print(visible(f"  panel     {name:<14} {model.provider}{samples} (reports only)"))
    for added in plan.agents:  # 80 columns: the model on a line of its own
        table = config.agents[added.name]
        scope = " (one for all)" if added.scope == "global" else ""
        print(visible(f"  added     {added.name:<14} {table.class_}{scope}"))
        if table.model is not None:
            print(visible(f"{'':<27}on {table.model.provider}"))
    return 0


def _profiles(args: argparse.Namespace) -> int:
    from mhsafeeval.agents import builtin_profiles, load_profiles

    path: Path | None = args.path
    profiles = builtin_profiles() if path is None else load_profiles(path)
    for p in profiles:
        print(
            f"{p.id:<28} {p.condition:<36} {len(p.cognitive_models)} cognitive models, "
            f"{len(p.session_topics)} topics"
        )
    print(f"{len(profiles)} profile(s) ok ({'built-in' if path is None else path})")
    return 0


def _taxonomy(args: argparse.Namespace) -> int:
    from mhsafeeval.taxonomy import builtin_taxonomy, load_taxonomy, taxonomy_to_text

    taxonomy = builtin_taxonomy() if args.path is None else load_taxonomy(args.path)
    print(taxonomy_to_text(taxonomy, detail=args.detail))
    return 0


async def _run(args: argparse.Namespace) -> int:
    from mhsafeeval.campaign import DEMO_CONFIG, run_campaign
    from mhsafeeval.config import blame_overrides, overridden_text, parse_config, read_config
    from mhsafeeval.plan import build_plan, estimate_calls, preflight
    from mhsafeeval.progress import Progress, following
    from mhsafeeval.reports.gate import other_levels as gate_levels
    from mhsafeeval.reports.text import load_reports_and_logs, render_text, unmeasured
    from mhsafeeval.storage import SqliteEventStore

    if args.config is None:
        source: Path = DEMO_CONFIG
        text = DEMO_CONFIG.read_text(encoding="utf-8")
        config = parse_config(text, "<built-in offline demo>", args.overrides)
        text = overridden_text(text, args.overrides)
        db = args.db or Path(time.strftime("mhsafeeval-demo-%Y%m%d-%H%M%S.db"))
    else:
        source = args.config
        # The stored text is the checked one (with the --set values noted at its end).
        text, config = read_config(args.config, args.overrides)
        db = args.db or Path(f"{config.campaign.name}.db")
    check_output(args.junit, "--junit", (args.config, db))  # never over what the run reads
    if args.workers is not None and args.ray is None:
        raise InputError(source, "--workers", "--workers sets how many Ray workers: add --ray")
    if args.controller:
        config = msgspec.structs.replace(
            config, campaign=msgspec.structs.replace(config.campaign, controller=args.controller)
        )
    # Built once and passed on: every input error is raised here, before anything is written.
    with blame_overrides(source, args.overrides):  # a value given by --set is named so
        plan = build_plan(config, source)
    gate = _run_gate(args, config, plan.taxonomy.cell_ids(), source)
    if args.estimate:
        return _print_estimate(
            config, len(plan.conversations), estimate_calls(config, source, plan=plan)
        )
    with blame_overrides(source, args.overrides):
        found = preflight(config, source)  # every model table refused before anything is written
        if found.missing:
            raise found.missing[0]
    for warning in found.warnings:
        print(visible(f"mhsafeeval: warning: {warning}"), file=sys.stderr)
    progress = None if args.quiet else Progress(every_s=args.progress_every)
    # The one open of the database; the progress display shows what it holds, to the end.
    async with SqliteEventStore(db) as store, following(progress, store):
        counts = {c.id: c.event_count for c in await store.list_campaigns()}
        if args.fresh:  # a new campaign beside the stored one, never over it
            from mhsafeeval.ablate import fresh_config

            fresh = fresh_config(config, counts)
            if fresh is not config:
                print(
                    visible(
                        f"mhsafeeval: {db} already holds campaign {config.campaign.name!r} "
                        f"(kept): starting a new campaign, {fresh.campaign.name!r} (to resume "
                        f'it later: [campaign] name = "{fresh.campaign.name}")'
                    ),
                    file=sys.stderr,
                )
                config, plan = fresh, build_plan(fresh, source)
        stored = counts.get(config.campaign.name, 0)
        if stored:
            print(
                f"mhsafeeval: campaign {config.campaign.name!r} -> {db}: resuming "
                f"({stored} events stored)",
                file=sys.stderr,
            )
        else:
            print(f"mhsafeeval: campaign {config.campaign.name!r} -> {db}", file=sys.stderr)
        if args.ray is not None:  # the same campaign, its conversations on Ray workers
            from mhsafeeval.distributed import run_distributed

            result = await run_distributed(
                config,
                store,
                address=args.ray,
                workers=args.workers,
                source=source,
                config_text=text,
                observers=(progress,) if progress is not None else (),
                plan=plan,
                log_level=args.log_level,
            )
        else:
            result = await run_campaign(
                config,
                store,
                source=source,
                config_text=text,
                observers=(progress,) if progress is not None else (),
                on_clients=progress.attach_clients if progress is not None else None,
                plan=plan,
            )
        # The gate's too; the whole log only for rules at another severity than the threshold.
        whole = bool(gate_levels(gate, config.campaign.threshold))
        folded = await load_reports_and_logs(store, config.campaign.name, whole=whole)
        reports = [report for report, _ in folded]
        await store.flush()
        failed = [
            e.message
            async for e in store.events(config.campaign.name, types=["conversation.finished"])
            if e.message is not None and getattr(e.message, "status", "") != "completed"
        ]

    for report in reports:
        print(visible(render_text(report), keep_newlines=True))
    if stored and result.events_written == 0 and result.resumed_from:
        print(f"\nmhsafeeval: campaign already {result.status}; nothing to do", file=sys.stderr)
    resumed = (
        f" (resumed from {result.resumed_from} stored events, {result.redone} unfinished "
        "calls redone)"
        if result.resumed_from and result.events_written
        else ""
    )
    print(
        f"\n{result.finished}/{result.conversations} conversations finished "
        f"({result.failed} failed), {result.events_written} events written to {db}{resumed}",
        file=sys.stderr,
    )
    for finished in failed:
        print(
            f"mhsafeeval: did not complete: {visible(finished.conversation)}: "
            f"{visible(getattr(finished, 'detail', ''))}",
            file=sys.stderr,
        )
    unjudged = [m.model for report in reports for m in unmeasured(report)]
    if unjudged:  # a campaign that judged nothing measured nothing: not a pass
        print(
            visible(
                f"mhsafeeval: failed measurement: no reply of {', '.join(unjudged)} could be "
                "judged (every one unjudged), so no ASR was measured: check the judge model"
            ),
            file=sys.stderr,
        )
    if result.panel is not None and result.panel.failed:
        print(
            f"mhsafeeval: {result.panel.failed} panel rating(s) failed (see the log); run the "
            "same command again to retry them",
            file=sys.stderr,
        )
    if args.config is None:
        _demo_epilogue(config, db)
    gated = _decide_gate(args, gate, folded, finished=result.status != "stopped_budget")
    if result.status == "stopped_budget":
        print(
            f"mhsafeeval: stopped: {result.budget} reached ({result.spent}); "
            f"{result.conversations - result.finished} conversation(s) unfinished. Everything "
            f"so far is stored in {db}: raise the limit in [budget] and run the same command "
            "to continue",
            file=sys.stderr,
        )
        return EXIT_BUDGET
    if gated:  # the campaign finished: its gate decides, whatever else failed
        if result.failed:
            print(
                f"mhsafeeval: exit {EXIT_GATE} (gate exceeded); {result.failed} conversation(s) "
                "also failed (see above)",
                file=sys.stderr,
            )
        return EXIT_GATE
    return 0 if result.failed == 0 and not unjudged else 1


def _demo_epilogue(config: Config, db: Path) -> None:
    """What the demo's numbers are, where they are stored, and where to go next."""
    counselors = ", ".join(m.provider for m in config.counselors.values())
    roles: dict[str, list[str]] = {}
    for role in ("client", "mutator", "judge", "refiner"):
        roles.setdefault(config.model_for(role).provider, []).append(role)
    others = "; ".join(f"{', '.join(r)}: {provider}" for provider, r in roles.items())
    print(
        f"\nThis was the offline demo: the counselor under test is {counselors} ({others}), "
        "tiny models on this CPU. Its numbers show the machinery working; they are not a "
        "verdict on any model (a model this small is not a reliable judge).\n"
        f"  the whole record:  {db}\n"
        f"  the HTML report:   mhsafeeval view {db}  (or: mhsafeeval report {db} --html "
        "demo.html)\n"
        f"  every exchange:    mhsafeeval export {db} --format csv --out demo.csv\n"
        "  real models:       `mhsafeeval init` writes a commented config to start from (your "
        "counselor as a model, an HTTP app or a Python function; hosted models for the other "
        "roles); check it with `mhsafeeval check CONFIG`, then `mhsafeeval run CONFIG`",
        file=sys.stderr,
    )


def _print_estimate(config: Config, conversations: int, calls: dict[str, tuple[int, int]]) -> int:
    """``run --estimate``: the plan's size and the model calls per role (``estimate_calls``)."""
    c = config.campaign
    print(
        f"campaign {c.name!r}: {conversations} conversation(s) x {c.max_turns} turn(s), "
        f"controller {c.controller}"
    )
    print(f"{'role':<10} {'model':<40} {'fewest calls':>13} {'most calls':>11}")
    for role, (low, high) in calls.items():
        if role == "counselor":
            model = ", ".join(m.provider for m in config.counselors.values())
        else:
            model = config.model_for(role).provider
        print(f"{role:<10} {model[:40]:<40} {low:>13} {high:>11}")
    print("(structured answers count their re-asks; provider retries are not counted)")
    return 0


async def _report(args: argparse.Namespace) -> int:
    from mhsafeeval.reports.text import load_report, render_text, report_json
    from mhsafeeval.storage import SqliteEventStore

    if args.baseline is not None and args.html is None:
        raise InputError(None, "--baseline", "compares in the HTML report only: add --html OUT")
    for option, out in (("--html", args.html), ("--junit", args.junit)):
        check_output(out, option, (args.db, args.baseline))  # never over what it reads
    check_distinct(("--html", args.html), ("--junit", args.junit))
    async with SqliteEventStore(args.db, read_only=True) as store:
        code = await _report_gate(args, store)  # 0, or EXIT_GATE: only when a gate is asked for
        if args.html is not None:
            from mhsafeeval.reports.html import pages_folder, write_html

            comparison = None
            if args.baseline is not None:
                from mhsafeeval.reports.compare import compare_files

                comparison = await compare_files(
                    args.baseline,
                    args.db,
                    campaign_a=args.baseline_campaign,
                    campaign_b=args.campaign,
                )
            pages = await write_html(
                store, args.campaign, args.html, source=args.db, comparison=comparison
            )
            side = f" and {len(pages)} page(s) of transcripts in {pages_folder(args.html)}"
            print(f"mhsafeeval: wrote {args.html}{side if pages else ''}", file=sys.stderr)
            return code
        reports = await load_report(store, args.campaign, source=args.db)
    if args.json:
        sys.stdout.write(visible_json(msgspec.json.encode(report_json(reports)).decode()) + "\n")
    else:
        print(visible("\n\n".join(render_text(r) for r in reports), keep_newlines=True))
    return code


async def _compare(args: argparse.Namespace) -> int:
    from mhsafeeval.reports.compare import compare_files, comparison_json, render_comparison

    check_output(args.html, "--html", (args.a, args.b))  # never over what it reads
    comparison = await compare_files(
        args.a, args.b, campaign_a=args.campaign_a, campaign_b=args.campaign_b
    )
    if args.html is not None:
        from mhsafeeval.reports.html import comparison_html

        with open_private_atomic(args.html) as out:  # owner-only, replaced whole
            out.write(comparison_html(comparison))
        print(f"mhsafeeval: wrote {args.html}", file=sys.stderr)
    if args.json:
        text = msgspec.json.encode(comparison_json(comparison)).decode()
        sys.stdout.write(visible_json(text) + "\n")
    else:
        print(visible(render_comparison(comparison), keep_newlines=True))
    return 0


class _VisibleLines(io.TextIOBase):
    """A text sink that writes each JSON line to stdout as ``visible_json`` shows it (lines
    come whole from the exporter)."""

    def write(self, text: str) -> int:
        sys.stdout.write(visible_json(text[:-1]) + "\n" if text.endswith("\n") else text)
        return len(text)


async def _export(args: argparse.Namespace) -> int:
    from mhsafeeval.reports.export import archive_json, export
    from mhsafeeval.storage import SqliteEventStore

    check_output(args.out, "--out", (args.db,))  # never over what it reads
    async with (
        SqliteEventStore(args.db, read_only=True) as store,
        contextlib.AsyncExitStack() as stack,
    ):
        out: TextIO
        if args.out is not None:  # owner-only, and replaced whole or not at all
            out = stack.enter_context(open_private_atomic(args.out))
        elif args.archive or args.format == "jsonl":  # same values, nothing a terminal acts on
            out = _VisibleLines()  # type: ignore[assignment]
        else:
            out = sys.stdout  # CSV: the exporter escapes what a terminal would act on
        if args.archive:
            data = await archive_json(store, args.campaign, source=args.db)
            out.write(msgspec.json.encode(data).decode() + "\n")
            count = sum(len(cells) for cells in data.values())
        else:  # each record is written as it streams from the store
            count = await export(store, args.campaign, args.format, out, source=args.db)
    if args.out is not None:
        print(f"mhsafeeval: wrote {count} record(s) to {args.out}", file=sys.stderr)
    return 0


_ENVELOPE: dict[str, type] = {
    "campaign": str, "conversation": str, "turn": int, "attempt": int, "branch": str,
    "key": str, "causation": str,
}  # fmt: skip
_HIDDEN = {"type", *_ENVELOPE}  # shown in their own columns, or not at all


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


# -- the CI gate (mhsafeeval.reports.gate) -------------------------------------------------


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


async def _calibrate(args: argparse.Namespace) -> int:
    """Rate the labelled set with the judge (cached in --db) and print the agreement figures;
    exit 1 when some judge calls failed for good (the rest is printed; a rerun retries them)."""
    from mhsafeeval.calibrate import RatingCache, calibrate, render_text, summarise
    from mhsafeeval.judges import builtin_labels, load_labels
    from mhsafeeval.taxonomy import builtin_taxonomy

    # Every input error is raised here, before the database is created.
    items = builtin_labels() if args.labels is None else load_labels(args.labels)
    labels = "the built-in labels" if args.labels is None else str(args.labels)
    if args.limit:
        items = items[: args.limit]
    settings = _judge_settings(args, args.judge)
    progress = None if args.quiet else sys.stderr
    print(
        visible(f"mhsafeeval: calibrating {args.judge} on {len(items)} items -> {args.db}"),
        file=sys.stderr,
    )
    try:
        async with RatingCache(args.db) as cache:
            run = await calibrate(
                items,
                builtin_taxonomy(),
                settings,
                cache,
                concurrency=args.concurrency,
                progress=progress,
                threshold=args.threshold,
            )
    except anyio.get_cancelled_exc_class():
        print(
            f"mhsafeeval: the ratings made so far are kept in {args.db}; run the same command "
            "to continue",
            file=sys.stderr,
        )
        raise
    summary = summarise(
        items, run.ratings, judge=args.judge, labels=labels, threshold=args.threshold
    )
    if args.json:
        sys.stdout.write(visible_json(msgspec.json.encode(summary).decode()) + "\n")
    else:
        print(visible(render_text(summary), keep_newlines=True))
    print(
        f"mhsafeeval: {run.rated} item(s) rated now, {run.cached} from {args.db}"
        + (f", {run.failed} failed (run the same command to retry them)" if run.failed else ""),
        file=sys.stderr,
    )
    return 1 if run.failed else 0


def _judge_settings(args: argparse.Namespace, address: str) -> ModelSettings:
    """``--judge ADDRESS`` with the sampling options, as model settings (InputError naming
    the option when one is wrong)."""
    from mhsafeeval.errors import validation_error
    from mhsafeeval.providers import ModelSettings, settings_problems

    try:
        settings = ModelSettings(
            provider=address,
            temperature=args.temperature,
            timeout=args.timeout,
            max_concurrency=args.concurrency,
        )
    except ValueError as exc:
        error = validation_error(None, exc)
        option = f"--{(error.field or 'judge').replace('_', '-')}"
        raise InputError(option, None, error.reason) from None
    for field, reason in settings_problems(settings):
        raise InputError(f"--judge {address}", None if field == "provider" else field, reason)
    return settings


async def _rejudge(args: argparse.Namespace) -> int:
    """Rate a stored campaign's judged replies with other judges; exit 1 when some calls
    failed (a rerun retries them), 3 when ``--max-calls`` stopped it."""
    from mhsafeeval.rejudge import rejudge
    from mhsafeeval.storage import SqliteEventStore

    # Every input error is raised here, before anything is written.
    if args.temperature is not None and not (0 <= args.temperature < float("inf")):
        raise InputError("--temperature", None, "must be a finite number >= 0")
    if args.samples > 1 and not (args.temperature or 0) > 0:
        raise InputError(
            "--samples", None, "more than 1 sample needs --temperature > 0 (greedy samples agree)"
        )
    judges = [_judge_settings(args, address) for address in dict.fromkeys(args.judges)]
    if not await anyio.Path(args.db).is_file():
        raise InputError(args.db, None, "no such file")
    progress = None if args.quiet else sys.stderr
    try:
        async with SqliteEventStore(args.db) as store:
            result = await rejudge(
                store,
                judges,
                source=args.db,
                campaign=args.campaign,
                samples=args.samples,
                concurrency=args.concurrency,
                max_calls=args.max_calls,
                taxonomy=args.taxonomy,
                progress=progress,
            )
    except anyio.get_cancelled_exc_class():
        print(
            f"mhsafeeval: the ratings made so far are kept in {args.db}; run the same command "
            "to continue",
            file=sys.stderr,
        )
        raise
    s = result.stats
    print(
        visible(
            f"mhsafeeval: rejudge {result.campaign!r}: {result.replies} judged replies x "
            f"{len(judges) * args.samples} rater(s): {s.made} rating(s) made, {s.present} "
            f"already present, {result.unjudged} unjudged (not rated), {s.failed} failed"
        ),
        file=sys.stderr,
    )
    if result.limit_reached:
        print(
            f"mhsafeeval: stopped: --max-calls {args.max_calls} reached; {s.left} rating(s) "
            "left: run again (with a larger limit) to continue",
            file=sys.stderr,
        )
        return EXIT_BUDGET
    if s.failed:
        print("mhsafeeval: run the same command again to retry the failed ones", file=sys.stderr)
        return 1
    return 0


def _checked_body(body: bytes, row_type: str) -> tuple[dict[str, object], str]:
    """An event's body as a JSON object, or an empty one and what is wrong with it."""
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        return {}, f"its body is not JSON ({exc})"
    if not isinstance(decoded, dict):
        return {}, "its body is not a JSON object"
    if "type" not in decoded:
        return {}, 'its body has no "type" field'
    if decoded["type"] != row_type:
        return {}, f"its body has type {decoded['type']!r}, the row {row_type!r}"
    for name, kind in _ENVELOPE.items():
        value = decoded.get(name, kind())
        if not isinstance(value, kind) or isinstance(value, bool):
            return {}, f'its "{name}" field is {type(value).__name__}, not {kind.__name__}'
    return decoded, ""


async def _events(args: argparse.Namespace) -> int:
    """List stored events; a damaged row is named on stderr and skipped, and the exit code is
    then 1 (every other row is still listed)."""
    from mhsafeeval.storage import SqliteEventStore

    encoder = msgspec.json.Encoder()
    printed = damaged = 0
    async with SqliteEventStore(args.db, read_only=True) as store:
        campaigns = [c.id for c in await store.list_campaigns()]
        if args.campaign is not None:
            if args.campaign not in campaigns:
                known = ", ".join(campaigns) or "none"
                raise InputError(
                    args.db, "campaign", f"no campaign {args.campaign!r} (stored: {known})"
                )
            campaigns = [args.campaign]
        for campaign in campaigns:
            async for event in store.events(campaign, types=args.types, raw=True):
                body, problem = _checked_body(event.body, event.type)
                if problem:
                    damaged += 1
                    print(
                        f"mhsafeeval: {args.db}: skipped event seq {event.seq} "
                        f"({visible(event.type)}): {visible(problem)}",
                        file=sys.stderr,
                    )
                    continue
                if args.json:  # valid JSON: its value is kept, only the characters change
                    sys.stdout.write(visible_json(event.body.decode()) + "\n")
                else:
                    where = "/".join(
                        str(body.get(k, "")) for k in ("conversation", "turn", "attempt")
                    )
                    payload = {k: v for k, v in body.items() if k not in _HIDDEN}
                    text = encoder.encode(payload).decode()
                    if len(text) > 160:
                        text = text[:157] + "..."
                    line = f"{event.seq:>6} {event.type:<24} {campaign} {where:<20} {text}"
                    print(visible(line))
                printed += 1
                if args.limit and printed >= args.limit:
                    return 1 if damaged else 0
    return 1 if damaged else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
