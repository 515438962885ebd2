"""Asking judge models again: ``calibrate`` (a judge's agreement with a labelled set) and
``rejudge`` (a stored campaign's judged replies rated by other judges); both keep what they
rated, so a rerun continues."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import anyio
import msgspec

from mhsafeeval._terminal import visible, visible_json
from mhsafeeval.errors import InputError

from ._exits import EXIT_BUDGET

if TYPE_CHECKING:
    from pathlib import Path

    from mhsafeeval.judges import LabelledExchange
    from mhsafeeval.providers import ModelSettings


async def _calibrate(args: argparse.Namespace) -> int:
    """Rate the labelled set with the judge (cached in --db) and print the agreement figures;
    exit 1 when some judge calls failed for good (the rest is printed; a rerun retries them)."""
    from mhsafeeval.calibrate import RatingCache, calibrate, render_text, summarise
    from mhsafeeval.judges import builtin_labels, judge_fingerprint, load_labels
    from mhsafeeval.plan import taxonomy_fingerprint
    from mhsafeeval.taxonomy import builtin_taxonomy

    taxonomy = builtin_taxonomy()

    # Every input error is raised here, before the database is created.
    if args.campaign is not None and args.labels_from is None:
        raise InputError("--campaign", None, "goes with --labels-from DB")
    if args.labels_from is not None:
        items, labels, threshold = await _reviewed_labels(args.labels_from, args.campaign)
        if args.threshold is None:
            args.threshold = threshold
    else:
        items = builtin_labels() if args.labels is None else load_labels(args.labels)
        labels = "the built-in labels" if args.labels is None else str(args.labels)
    if args.threshold is None:
        args.threshold = 2
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
                taxonomy,
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
    # What a report needs to apply these error rates to a campaign's judge, and only to one
    # that is the same judge (mhsafeeval.reports.corrected).
    fingerprint = judge_fingerprint(
        settings.provider, settings.temperature, taxonomy_fingerprint(taxonomy), args.threshold
    )
    summary["fingerprint"] = msgspec.to_builtins(fingerprint)
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


async def _reviewed_labels(
    db: Path, campaign: str | None
) -> tuple[list[LabelledExchange], str, int]:
    """``--labels-from DB``: the replies a campaign's raters settled, as labels (with what to
    call them in the report, and the campaign's threshold)."""
    from mhsafeeval.review import reviewed_labels
    from mhsafeeval.storage import SqliteEventStore

    if not await anyio.Path(db).is_file():
        raise InputError(db, None, "no such event store")
    async with SqliteEventStore(db, read_only=True) as store:
        found = await reviewed_labels(store, campaign, source=db)
    waiting = f", {found.pending} still waiting" if found.pending else ""
    print(
        visible(
            f"mhsafeeval: {len(found.labels)} reviewed replies of campaign {found.campaign!r} "
            f"as labels{waiting}"
        ),
        file=sys.stderr,
    )
    return found.labels, f"the reviewed replies of {found.campaign} in {db}", found.threshold


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
