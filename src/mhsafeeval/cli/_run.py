"""Running campaigns: ``run`` (a campaign from its config, resumed on the same database, or
the offline demo; ``--estimate`` counts the calls instead) and ``ablate`` (the paper's four
arms as campaigns in one database)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

from mhsafeeval._files import check_output
from mhsafeeval._terminal import visible
from mhsafeeval.config import Config
from mhsafeeval.errors import InputError

from ._exits import EXIT_BUDGET, EXIT_GATE
from ._gate import _decide_gate, _run_gate


async def _run(args: argparse.Namespace) -> int:
    from mhsafeeval.campaign import DEMO_CONFIG, run_campaign
    from mhsafeeval.config import blame_overrides, overridden_text, parse_config, read_config
    from mhsafeeval.plan import build_plan, estimate_calls, preflight
    from mhsafeeval.progress import Progress, following
    from mhsafeeval.reports.gate import other_levels as gate_levels
    from mhsafeeval.reports.kept import KIND, keep, log_position
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
    attacked = config.campaign.name  # --baseline: the campaign its lift is measured against
    if args.baseline:
        from mhsafeeval.ablate import arm_campaign

        config = msgspec.structs.replace(
            config,
            campaign=msgspec.structs.replace(
                config.campaign, name=arm_campaign(attacked, "no_attack")
            ),
            ablation=msgspec.structs.replace(config.ablation, no_attack=True),
        )
        text += f"\n# mhsafeeval run --baseline: [ablation] no_attack = true, of {attacked!r}\n"
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
        whole = bool(gate_levels(gate, config.campaign.threshold)) or args.baseline
        await store.flush()
        position = await log_position(store, config.campaign.name)
        folded = await load_reports_and_logs(store, config.campaign.name, whole=whole)
        reports = [report for report, _ in folded]
        if not whole:  # what `report` folds: the next one reads it (mhsafeeval.reports.kept)
            body = msgspec.msgpack.encode(reports[0])
            await keep(store, KIND, {config.campaign.name: (position, body)})
        lift: list[str] = []
        if args.baseline and attacked in counts and folded:
            from mhsafeeval.reports.lift import campaign_lift, lift_lines

            for report, log in await load_reports_and_logs(store, attacked, whole=True):
                lifts = campaign_lift(log, folded[0][1], report.threshold)
                lift = lift_lines(lifts, config.campaign.name)
        await store.flush()
        failed = [
            e.message
            async for e in store.events(config.campaign.name, types=["conversation.finished"])
            if e.message is not None and getattr(e.message, "status", "") != "completed"
        ]

    for report in reports:
        print(visible(render_text(report), keep_newlines=True))
    if lift:
        print(visible("\n" + "\n".join(lift), keep_newlines=True))
    elif args.baseline:
        print(
            f"mhsafeeval: no campaign {attacked!r} in {db} to measure the attack lift against: "
            "run it (without --baseline) into the same database",
            file=sys.stderr,
        )
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
        elif role == "panel":
            model = ", ".join(m.provider for m in config.judges.panel.values())
        elif role == "confirm":  # fresh samples of the search's judge
            model = config.model_for("judge").provider
        else:
            model = config.model_for(role).provider
        print(f"{role:<10} {model[:40]:<40} {low:>13} {high:>11}")
    print("(structured answers count their re-asks; provider retries are not counted)")
    return 0


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
