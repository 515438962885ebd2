"""``review``: the clinician review workbench of a stored campaign (mhsafeeval.review)."""

from __future__ import annotations

import argparse
import sys

from mhsafeeval._terminal import visible


async def _move_ratings(args: argparse.Namespace) -> int:
    """``--export-ratings FILE`` / ``--import-ratings FILE``: no server."""
    import anyio

    from mhsafeeval.errors import InputError
    from mhsafeeval.review import export_ratings, import_ratings
    from mhsafeeval.storage import SqliteEventStore

    if not await anyio.Path(args.db).is_file():
        raise InputError(args.db, None, "no such event store")
    if args.export_ratings is not None:
        async with SqliteEventStore(args.db, read_only=True) as store:
            name, lines = await export_ratings(
                store, args.export_ratings, args.campaign, source=args.db
            )
        print(
            visible(f"mhsafeeval: {lines} review event(s) of {name!r} -> {args.export_ratings}"),
            file=sys.stderr,
        )
        return 0
    async with SqliteEventStore(args.db) as store:
        counts = await import_ratings(store, args.import_ratings, args.campaign, source=args.db)
    print(
        visible(
            f"mhsafeeval: {args.import_ratings} -> campaign {counts.campaign!r}: {counts.stored} "
            f"review event(s) stored, {counts.present} already present"
        ),
        file=sys.stderr,
    )
    return 0


async def _review(args: argparse.Namespace) -> int:
    if args.export_ratings is not None or args.import_ratings is not None:
        return await _move_ratings(args)
    from mhsafeeval.review import ReviewServer, serve
    from mhsafeeval.taxonomy import load_taxonomy

    taxonomy = None if args.taxonomy is None else load_taxonomy(args.taxonomy)

    def started(server: ReviewServer) -> None:
        print(
            f"mhsafeeval: reviewing campaign {server.campaign}; open this URL (it holds the "
            "access token; Ctrl-C stops the server):",
            file=sys.stderr,
        )
        print(server.url, flush=True)

    await serve(
        args.db,
        campaign=args.campaign,
        port=args.port,
        open_browser=not args.no_browser,
        raters_per_item=args.raters_per_item,
        safe_sample=args.safe_sample,
        seed=args.seed,
        taxonomy=taxonomy,
        started=started,
    )
    return 0
