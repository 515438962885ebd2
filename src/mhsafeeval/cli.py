"""The ``mhsafeeval`` command line. The composition root: the only module that knows every layer."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from mhsafeeval import __version__
from mhsafeeval.errors import InputError, MhSafeEvalError

__all__ = ["main"]

EXIT_INPUT = 2
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mhsafeeval",
        description="Red-team chatbots acting as mental-health counselors.",
    )
    parser.add_argument("--version", action="version", version=f"mhsafeeval {__version__}")
    parser.add_argument(
        "--log-level", default="warning", help="debug, info, warning (default), error"
    )
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("providers", help="list the model providers that can be addressed")

    check = sub.add_parser("check", help="validate a campaign config file without running it")
    check.add_argument("config", type=Path)

    events = sub.add_parser("events", help="print a stored campaign's events")
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
    events.add_argument("--limit", type=int, default=0, help="stop after N events")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    from mhsafeeval.runtime import configure_logging

    configure_logging(args.log_level, json=args.log_json)
    try:
        if args.command is None:
            parser.print_help()
            return 0
        if args.command == "providers":
            return _providers()
        if args.command == "check":
            return _check(args.config)
        if args.command == "events":
            return anyio.run(_events, args)
    except InputError as exc:
        print(f"mhsafeeval: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("mhsafeeval: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MhSafeEvalError as exc:
        print(f"mhsafeeval: error: {exc}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command!r}")
    return EXIT_INPUT  # pragma: no cover - parser.error exits


def _providers() -> int:
    from mhsafeeval.runtime.providers import available_providers

    for name, description in available_providers().items():
        print(f"{name + '/...':<16} {description}")
    return 0


def _check(path: Path) -> int:
    from mhsafeeval.config import load_config

    config = load_config(path)
    print(f"{path}: ok (campaign {config.campaign.name!r}, {len(config.models)} model(s))")
    for name, model in config.models.items():
        print(f"  {name:<12} {model.provider}")
    return 0


async def _events(args: argparse.Namespace) -> int:
    from mhsafeeval.storage import SqliteEventStore

    encoder = msgspec.json.Encoder()
    printed = 0
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
                if args.json:
                    sys.stdout.write(event.body.decode() + "\n")
                else:
                    body = msgspec.json.decode(event.body)
                    where = "/".join(
                        str(body.get(k, "")) for k in ("conversation", "turn", "attempt")
                    )
                    payload = {
                        k: v
                        for k, v in body.items()
                        if k
                        not in {
                            "type",
                            "campaign",
                            "conversation",
                            "turn",
                            "attempt",
                            "branch",
                            "key",
                            "causation",
                        }
                    }
                    text = encoder.encode(payload).decode()
                    if len(text) > 160:
                        text = text[:157] + "..."
                    print(f"{event.seq:>6} {event.type:<24} {campaign} {where:<20} {text}")
                printed += 1
                if args.limit and printed >= args.limit:
                    return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
