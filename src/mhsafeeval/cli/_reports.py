"""Reading a stored campaign: ``report`` (text, JSON or HTML, with its gate), ``compare`` (two
campaigns), ``export`` (one record per attempt, or the archive), ``events`` (the stored
events themselves) and ``view`` (the HTML report in a browser)."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import TYPE_CHECKING, TextIO

import msgspec

from mhsafeeval._files import check_distinct, check_output, open_private_atomic
from mhsafeeval._terminal import visible, visible_json
from mhsafeeval.errors import InputError

from ._gate import _report_gate

if TYPE_CHECKING:
    from mhsafeeval.reports.corrected import JudgeCorrection
    from mhsafeeval.reports.kept import Fresh
    from mhsafeeval.reports.text import CampaignReport
    from mhsafeeval.storage import EventStore


async def _report(args: argparse.Namespace) -> int:
    from mhsafeeval.reports.corrected import correction_json, correction_lines
    from mhsafeeval.reports.kept import HTML_KIND, KIND, keep_in_file, load_kept
    from mhsafeeval.reports.text import render_text, report_json
    from mhsafeeval.storage import SqliteEventStore

    if args.baseline is not None and args.html is None:
        raise InputError(None, "--baseline", "compares in the HTML report only: add --html OUT")
    for option, out in (("--html", args.html), ("--junit", args.junit)):
        check_output(out, option, (args.db, args.baseline))  # never over what it reads
    check_distinct(("--html", args.html), ("--junit", args.junit))
    async with SqliteEventStore(args.db, read_only=True) as store:
        code = await _report_gate(args, store)  # 0, or EXIT_GATE: only when a gate is asked for
        if args.html is None:
            reports, fresh = await load_kept(
                store, args.campaign, source=args.db, refold=args.refold
            )
            corrections = await _corrections(args, store, reports)
        else:
            fresh = await _report_html(args, store)
    # What was folded here is kept, when the file can be written: the next report reads it.
    await keep_in_file(args.db, KIND if args.html is None else HTML_KIND, fresh)
    if args.html is not None:
        return code
    if args.json:
        data = report_json(reports)
        for campaign, correction in corrections.items():
            if campaign in data:
                data[campaign]["judge"] = correction_json(correction)
        sys.stdout.write(visible_json(msgspec.json.encode(data).decode()) + "\n")
    else:
        texts = [
            "\n".join([render_text(r), "", *correction_lines(corrections[r.campaign])])
            if r.campaign in corrections
            else render_text(r)
            for r in reports
        ]
        print(visible("\n\n".join(texts), keep_newlines=True))
    return code


async def _report_html(args: argparse.Namespace, store: EventStore) -> Fresh:
    """``report --html OUT``: write it; what was read from the events, for keeping."""
    from mhsafeeval.reports.html import pages_folder, write_html

    comparison = None
    if args.baseline is not None:
        from mhsafeeval.reports.compare import compare_files

        comparison = await compare_files(
            args.baseline, args.db, campaign_a=args.baseline_campaign, campaign_b=args.campaign
        )
    fresh: Fresh = {}
    pages = await write_html(
        store,
        args.campaign,
        args.html,
        source=args.db,
        comparison=comparison,
        fresh=None if args.refold else fresh,
    )
    side = f" and {len(pages)} page(s) of transcripts in {pages_folder(args.html)}"
    print(f"mhsafeeval: wrote {args.html}{side if pages else ''}", file=sys.stderr)
    return fresh


async def _corrections(
    args: argparse.Namespace, store: EventStore, reports: list[CampaignReport]
) -> dict[str, JudgeCorrection]:
    """Per stored campaign, its judge's fingerprint and, with ``--calibration``, its rates
    corrected for that judge's error (mhsafeeval.reports.corrected)."""
    from mhsafeeval.reports.corrected import judge_correction, load_calibration
    from mhsafeeval.reports.text import load_reports_and_logs

    calibration = None if args.calibration is None else load_calibration(args.calibration)
    configs = {c.id: c.config for c in await store.list_campaigns()}
    out: dict[str, JudgeCorrection] = {}
    if calibration is None:  # the fingerprint only: no log needed
        from mhsafeeval.storage import CampaignLog

        for report in reports:
            stored = configs.get(report.campaign, "")
            out[report.campaign] = judge_correction(CampaignLog(), stored, report.threshold, None)
        return out
    for report, log in await load_reports_and_logs(store, args.campaign, source=args.db):
        stored = configs.get(report.campaign, "")
        out[report.campaign] = judge_correction(log, stored, report.threshold, calibration)
    return out


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
    if args.ratings:
        return await _export_ratings(args)
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


async def _export_ratings(args: argparse.Namespace) -> int:
    """``export --ratings``: the review's events, as ``review --export-ratings`` writes them."""
    from mhsafeeval.review import export_ratings
    from mhsafeeval.storage import SqliteEventStore

    if args.out is None or args.archive or args.format != "jsonl":
        raise InputError(
            None, "--ratings", "writes JSONL to a file: give --out FILE (no --archive, no csv)"
        )
    async with SqliteEventStore(args.db, read_only=True) as store:
        name, count = await export_ratings(store, args.out, args.campaign, source=args.db)
    print(f"mhsafeeval: wrote {count} review event(s) of {name} to {args.out}", file=sys.stderr)
    return 0


_ENVELOPE: dict[str, type] = {
    "campaign": str, "conversation": str, "turn": int, "attempt": int, "branch": str,
    "key": str, "causation": str,
}  # fmt: skip
_HIDDEN = {"type", *_ENVELOPE}  # shown in their own columns, or not at all


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


async def _view(args: argparse.Namespace) -> int:
    from mhsafeeval.scaffold import view_report

    await view_report(args.db, args.campaign, browser=not args.no_browser)
    return 0
