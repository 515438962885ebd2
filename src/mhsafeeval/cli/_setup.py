"""Before a run: ``providers``, ``profiles`` and ``taxonomy`` (what can be named in a config),
``check`` (a config validated without running it) and ``init`` (a commented config to start
from)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsafeeval._terminal import visible

from ._gate import _run_gate


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


def _init(args: argparse.Namespace) -> int:
    from mhsafeeval.scaffold import next_steps, write_starter_config

    written = write_starter_config(args.dir, force=args.force)
    print(visible(next_steps(written), keep_newlines=True))
    return 0
