"""The paper's ablation study: one config run as five campaigns (arms) in one database.

The arms are the full method, the method without each of its three parts, as ``[ablation]``
switches them off, and the no-attack baseline (:data:`ARMS`). Each arm is an ordinary campaign
whose id is the config's ``[campaign] name`` with the arm's key after a dot (``paper.full``,
``paper.single_turn``, ``paper.no_role_conditioning``, ``paper.no_qd_search``,
``paper.no_attack``), so
``mhsafeeval report DB --campaign paper.no_qd_search`` shows one arm in full, and running the
same ablation again resumes it: finished arms are left as they are, unfinished ones continue.

The table (:func:`ablation_table`) reads each arm's overall ASR, with its 95% interval, from
the arm's report (:func:`mhsafeeval.reports.text.load_report`), per counselor model, then the
full arm's attack lift over the baseline (:mod:`mhsafeeval.reports.lift`); the paper's
published figures (:data:`PUBLISHED`) are printed under it for reference.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec

from mhsafeeval.campaign import CampaignResult, run_campaign
from mhsafeeval.config import AblationSection, Config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import Message
from mhsafeeval.plan import CampaignPlan, build_plan
from mhsafeeval.providers import ResilientClient
from mhsafeeval.reports.lift import ModelLift, campaign_lift, lift_lines
from mhsafeeval.reports.text import load_reports_and_logs
from mhsafeeval.storage import CampaignLog, EventStore

__all__ = [
    "ARMS",
    "PUBLISHED",
    "AblationTable",
    "Arm",
    "ArmFigures",
    "ArmRun",
    "ArmStatus",
    "Outcome",
    "ablate_command",
    "ablation_json",
    "ablation_table",
    "arm_campaign",
    "arm_configs",
    "fresh_config",
    "fresh_name",
    "render_text",
    "run_ablation",
]


class Arm(msgspec.Struct, frozen=True):
    """One arm of the ablation: its key (the ``[ablation]`` switch it turns on, or ``full``),
    the column name the paper gives it, and the switches it runs with."""

    key: str
    label: str
    ablation: AblationSection


ARMS: tuple[Arm, ...] = (
    Arm("full", "full", AblationSection()),
    Arm("single_turn", "w/o multi-turn", AblationSection(single_turn=True)),
    Arm(
        "no_role_conditioning",
        "w/o role conditioning",
        AblationSection(no_role_conditioning=True),
    ),
    Arm("no_qd_search", "w/o QD search", AblationSection(no_qd_search=True)),
    Arm("no_attack", "no attack (baseline)", AblationSection(no_attack=True)),
)
"""The paper's four arms, in its column order, then the no-attack baseline (the judge's
false-positive floor plus the counselor's unprompted harm; see :mod:`mhsafeeval.reports.lift`)."""

PUBLISHED: dict[str, dict[str, float | None]] = {
    "GPT-3.5": {
        "full": 0.978,
        "single_turn": 0.504,
        "no_role_conditioning": 0.858,
        "no_qd_search": None,
        "no_attack": None,
    },
    "Llama 3.1": {
        "full": 0.916,
        "single_turn": 0.145,
        "no_role_conditioning": 0.283,
        "no_qd_search": 0.624,
        "no_attack": None,
    },
    "Gemini 2.5": {
        "full": 0.980,
        "single_turn": 0.160,
        "no_role_conditioning": 0.775,
        "no_qd_search": 0.856,
        "no_attack": None,
    },
}
"""The paper's ablation table (arXiv 2604.17730): overall ASR per counselor model and arm, as
published (None: not published). Their models, judge and profiles: a reference, not a target
a run here must meet."""


def arm_campaign(name: str, arm: Arm | str) -> str:
    """The campaign id of an arm of the ablation of campaign ``name``.

    Example:
        >>> arm_campaign("paper", ARMS[3])
        'paper.no_qd_search'
    """
    return f"{name}.{arm.key if isinstance(arm, Arm) else arm}"


def fresh_name(
    name: str, taken: Collection[str], *, ids: Callable[[str], Collection[str]] | None = None
) -> str:
    """``name``, or when any of its ids (``ids(name)``, default ``[name]``) is in ``taken``
    the first of ``name-2``, ``name-3``, ... whose ids are all free (``run --fresh``,
    ``ablate --fresh``).

    Example:
        >>> fresh_name("paper", ["other"])
        'paper'
        >>> fresh_name("paper", ["paper", "paper-2"])
        'paper-3'
    """
    candidate, n = name, 1
    while any(i in taken for i in (ids(candidate) if ids is not None else [candidate])):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def fresh_config(config: Config, taken: Collection[str]) -> Config:
    """``config`` itself when no campaign in ``taken`` has its name, else a copy named with
    :func:`fresh_name` (what ``run --fresh`` runs: a new campaign beside the stored one)."""
    name = fresh_name(config.campaign.name, taken)
    if name == config.campaign.name:
        return config
    return _named(config, name)


def _named(config: Config, name: str) -> Config:
    return msgspec.structs.replace(
        config, campaign=msgspec.structs.replace(config.campaign, name=name)
    )


def arm_configs(config: Config, source: str | Path = "<config>") -> list[tuple[Arm, Config]]:
    """Each arm with the config it runs: ``config`` under the arm's campaign id, with the
    arm's ``[ablation]`` switches.

    Raises:
        InputError: ``config`` already turns an ablation switch on (the arms set them).
    """
    on = [k for k, v in msgspec.structs.asdict(config.ablation).items() if v]
    if on:
        raise InputError(
            source,
            f"ablation.{on[0]}",
            "ablate runs every arm itself (full and each [ablation] switch on its own), so the "
            "config must leave [ablation] off: delete the key or set it to false",
        )
    return [
        (
            arm,
            msgspec.structs.replace(
                _named(config, arm_campaign(config.campaign.name, arm)), ablation=arm.ablation
            ),
        )
        for arm in ARMS
    ]


class ArmRun(msgspec.Struct, kw_only=True):
    """What running one arm did (its campaign's :class:`~mhsafeeval.campaign.CampaignResult`)."""

    arm: Arm
    campaign: str
    result: CampaignResult
    stored_before: int
    """Events the arm's campaign had stored before this run (0: it started now)."""


async def run_ablation(
    arms: Sequence[tuple[Arm, Config, CampaignPlan | None]],
    store: EventStore,
    *,
    source: str | Path = "<config>",
    config_text: str = "",
    observers: Callable[[Arm], tuple[Callable[[Message], Any], ...]] = lambda arm: (),
    on_clients: Callable[[Arm], Callable[[list[ResilientClient]], None] | None] = (
        lambda arm: None
    ),
    on_arm: Callable[[Arm, str, int], None] | None = None,
) -> list[ArmRun]:
    """Run the arms (from :func:`arm_configs`, each with its plan when built already) one
    after the other in ``store``, each as a campaign that resumes what is stored of it.

    A finished arm comes back as it is, without a model call; an arm stopped by a budget
    limit (each arm counts against ``[budget]`` on its own) does not stop the next one.
    Cancellation (Ctrl-C) stops the whole ablation, the arm in flight recorded as
    interrupted by its campaign.

    ``observers`` and ``on_clients`` give each arm's observers (a progress display) and the
    callback that is handed its model clients; ``on_arm(arm, campaign, stored_events)`` is
    called as each arm starts. ``config_text`` (the config file's text) is stored with each
    arm, after a comment line naming the arm.
    """
    stored = {c.id: c.event_count for c in await store.list_campaigns()}
    runs = []
    for arm, config, plan in arms:
        name = config.campaign.name
        before = stored.get(name, 0)
        if on_arm is not None:
            on_arm(arm, name, before)
        switch = "" if arm.key == "full" else f", [ablation] {arm.key} = true"
        text = f"# mhsafeeval ablate: arm {arm.key!r} (campaign {name!r}{switch})\n{config_text}"
        result = await run_campaign(
            config,
            store,
            source=source,
            config_text=text,
            observers=observers(arm),
            on_clients=on_clients(arm),
            plan=plan if plan is not None else build_plan(config, source),
        )
        runs.append(ArmRun(arm=arm, campaign=name, result=result, stored_before=before))
    return runs


_Interval = tuple[float, float]  # (low, high), as the reports give them


class ArmFigures(msgspec.Struct, kw_only=True):
    """One counselor model's figures in one arm (from the arm's report)."""

    overall_asr: float | None = None
    overall_asr_ci: _Interval | None = None
    turns: int = 0
    successes: int = 0
    conversations: int = 0


class ArmStatus(msgspec.Struct, kw_only=True):
    """One arm of the table: its campaign id and how its campaign stands."""

    arm: str
    label: str
    campaign: str
    status: str
    """The arm's last run status (``completed``, ``stopped_budget``, ...), or ``not stored``."""


class AblationTable(msgspec.Struct, kw_only=True):
    """The ablation table: per counselor model, each arm's figures."""

    campaign: str
    """The config's campaign name (the arms' ids derive from it)."""
    threshold: int
    arms: list[ArmStatus]
    models: dict[str, dict[str, ArmFigures]]
    """Counselor model -> arm key -> figures (an arm not stored has none)."""
    lift: dict[str, ModelLift] = {}
    """Counselor model -> the full arm's attack lift over the no-attack arm (both stored)."""


async def ablation_table(
    store: EventStore,
    name: str,
    *,
    threshold: int = 2,
    runs: Sequence[ArmRun] = (),
    source: str | Path | None = None,
) -> AblationTable:
    """The table of the ablation of campaign ``name`` as ``store`` holds it: each stored arm's
    report, read through :func:`mhsafeeval.reports.text.load_report`. ``runs``: this run's results,
    for each arm's status."""
    known = {c.id for c in await store.list_campaigns()}
    statuses = {r.arm.key: r.result.status for r in runs}
    arms: list[ArmStatus] = []
    models: dict[str, dict[str, ArmFigures]] = {}
    logs: dict[str, CampaignLog] = {}
    for arm in ARMS:
        campaign = arm_campaign(name, arm)
        stored = campaign in known
        arms.append(
            ArmStatus(
                arm=arm.key,
                label=arm.label,
                campaign=campaign,
                status=statuses.get(arm.key, "stored" if stored else "not stored"),
            )
        )
        if not stored:
            continue
        for report, log in await load_reports_and_logs(store, campaign, source=source):
            threshold = report.threshold
            if arm.key in ("full", "no_attack"):
                logs[arm.key] = log
            for model, m in report.models.items():
                models.setdefault(model, {})[arm.key] = ArmFigures(
                    overall_asr=m.overall_asr,
                    overall_asr_ci=m.overall_asr_ci,
                    turns=m.turns,
                    successes=m.successes,
                    conversations=m.conversations,
                )
    lift = campaign_lift(logs["full"], logs["no_attack"], threshold) if len(logs) == 2 else {}
    return AblationTable(campaign=name, threshold=threshold, arms=arms, models=models, lift=lift)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _interval(ci: _Interval | None) -> str:
    return "-" if ci is None else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}"


def render_text(table: AblationTable, *, source: str | Path | None = None) -> str:
    """The table as text: the arms and their campaigns, then per counselor model each arm's
    ASR in percent with its 95% interval, then the paper's figures."""
    where = f" in {source}" if source is not None else ""
    lines = [  # 80 columns, for names of ordinary length
        f"ablation of campaign {table.campaign!r}{where}",
        f"ASR: turns with a reply of severity >= {table.threshold}, in percent",
        "",
        f"  {'arm':<23}{'campaign':<40} status",
        *(f"  {a.label:<23}{a.campaign:<40} {a.status}" for a in table.arms),
    ]
    for model, figures in table.models.items():
        lines += [
            "",
            f"counselor {model}",
            f"  {'arm':<23}{'ASR %':>6}  {'95% interval':<13}{'turns':>7}{'convs':>7}",
        ]
        for arm in ARMS:
            f = figures.get(arm.key)
            if f is None:
                lines.append(f"  {arm.label:<23}{'-':>6}  (not run)")
                continue
            lines.append(
                f"  {arm.label:<23}{_pct(f.overall_asr):>6}  {_interval(f.overall_asr_ci):<13}"
                f"{f.turns:>7}{f.conversations:>7}"
            )
    if table.lift:
        lines += ["", *lift_lines(table.lift, arm_campaign(table.campaign, "no_attack"))]
    lines += [
        "",
        "published ASR % (arXiv 2604.17730), for reference only:",
        "their models, judge and profiles, not this campaign's",
        f"  {'arm':<23}" + "".join(f"{model:>12}" for model in PUBLISHED),
        *(
            f"  {arm.label:<23}"
            + "".join(f"{_pct(row[arm.key]):>12}" for row in PUBLISHED.values())
            for arm in ARMS
            if any(row[arm.key] is not None for row in PUBLISHED.values())
        ),
    ]
    return "\n".join(lines)


def ablation_json(table: AblationTable) -> Any:
    """The table as JSON data: ``campaign``, ``threshold``, ``arms`` (key, label, campaign,
    status), ``models`` (model -> arm key -> ``overall_asr``, ``overall_asr_ci``, ``turns``,
    ``successes``, ``conversations``; rates as fractions) and ``published`` (the paper's
    figures, fractions, ``null`` where it published none)."""
    data = msgspec.to_builtins(table)
    data["published"] = PUBLISHED
    return data


def _planned(config: Config, path: Path) -> list[tuple[Arm, Config, CampaignPlan | None]]:
    """Each arm with its config and plan (built once, as ``run`` does)."""
    return [(arm, cfg, build_plan(cfg, path)) for arm, cfg in arm_configs(config, path)]


Outcome = Literal["ok", "failed", "budget"]
"""How ``mhsafeeval ablate`` ended: every arm completed, some conversation did not complete,
or a budget limit stopped some arm (the command line's exit codes 0, 1 and 3)."""


async def ablate_command(
    path: Path,
    db: Path | None,
    *,
    as_json: bool = False,
    fresh: bool = False,
    quiet: bool = False,
    progress_every: float = 30.0,
    overrides: Sequence[str] = (),
) -> Outcome:
    """``mhsafeeval ablate CONFIG --db FILE``: run (or resume) every arm of ``path``'s
    ablation in ``db`` (default ``./<campaign name>.ablation.db``), then print the table
    (JSON with ``as_json``) on stdout and what was done on stderr. ``fresh``: a new set of
    arms (``NAME-2.full``, ...) when the file already holds this ablation. ``overrides``:
    ``--set KEY=VALUE`` values applied over the file's (:func:`mhsafeeval.config.read_config`).

    Raises:
        InputError: a bad config (one that sets ``[ablation]`` too) or a model table the
            providers refuse, before anything is written; a stored arm run with another
            configuration.
    """
    from mhsafeeval._terminal import visible, visible_json
    from mhsafeeval.config import blame_overrides, read_config
    from mhsafeeval.plan import preflight
    from mhsafeeval.progress import Progress
    from mhsafeeval.storage import SqliteEventStore

    text, config = read_config(path, overrides)
    # Every input error is raised here, before the database is created.
    with blame_overrides(path, overrides):
        plans = _planned(config, path)  # refuses [ablation] switches
        found = preflight(config, path)
    if found.missing:
        raise found.missing[0]
    for warning in found.warnings:
        print(visible(f"mhsafeeval: warning: {warning}"), file=sys.stderr)
    db = db if db is not None else Path(f"{config.campaign.name}.ablation.db")
    progress: dict[str, Progress] = {}

    def observers(arm: Arm) -> tuple[Callable[[Message], Any], ...]:
        if quiet:
            return ()
        progress[arm.key] = Progress(every_s=progress_every)
        return (progress[arm.key],)

    def clients(arm: Arm) -> Callable[[list[ResilientClient]], None] | None:
        shown = progress.get(arm.key)
        return shown.attach_clients if shown is not None else None

    def starting(arm: Arm, campaign: str, stored: int) -> None:
        state = (
            f"resuming ({stored} events stored; a finished arm is left as it is)"
            if stored
            else "starting"
        )
        print(
            visible(f"mhsafeeval: arm {arm.label!r}: campaign {campaign!r} -> {db}: {state}"),
            file=sys.stderr,
        )

    async with SqliteEventStore(db) as store:
        name = config.campaign.name
        if fresh:
            known = {c.id for c in await store.list_campaigns()}
            new = fresh_name(name, known, ids=lambda n: [arm_campaign(n, a) for a in ARMS])
            if new != name:
                print(
                    visible(
                        f"mhsafeeval: {db} already holds the ablation {name!r}: starting a new "
                        f"one, {new!r} (campaigns {arm_campaign(new, ARMS[0])!r}, ...; the old "
                        "one is kept)"
                    ),
                    file=sys.stderr,
                )
                renamed = msgspec.structs.replace(
                    config, campaign=msgspec.structs.replace(config.campaign, name=new)
                )
                name = new
                plans = [
                    (arm, cfg, build_plan(cfg, path)) for arm, cfg in arm_configs(renamed, path)
                ]
        try:
            runs = await run_ablation(
                plans,
                store,
                source=path,
                config_text=text,
                observers=observers,
                on_clients=clients,
                on_arm=starting,
            )
        except anyio.get_cancelled_exc_class():
            print(
                f"mhsafeeval: the arms run so far are kept in {db}; run the same command to "
                "continue (finished arms are not run again)",
                file=sys.stderr,
            )
            raise
        table = await ablation_table(
            store, name, threshold=config.campaign.threshold, runs=runs, source=db
        )
    if as_json:
        sys.stdout.write(visible_json(msgspec.json.encode(ablation_json(table)).decode()) + "\n")
    else:
        print(visible(render_text(table, source=db), keep_newlines=True))
    stopped = [r for r in runs if r.result.status == "stopped_budget"]
    failed = sum(r.result.failed for r in runs)
    for r in stopped:
        print(
            visible(
                f"mhsafeeval: stopped: arm {r.arm.label!r} ({r.campaign}): {r.result.budget} "
                f"reached ({r.result.spent}); each arm has the [budget] limits to itself: "
                "raise them and run the same command to continue"
            ),
            file=sys.stderr,
        )
    for r in runs:
        before = f", {r.stored_before} stored before" if r.stored_before else ""
        print(
            visible(
                f"mhsafeeval: arm {r.arm.label!r} ({r.campaign}): {r.result.status}, "
                f"{r.result.events_written} events written now{before}"
            ),
            file=sys.stderr,
        )
    written = sum(r.result.events_written for r in runs)
    print(
        f"mhsafeeval: {len(runs)} arms, {failed} conversation(s) failed, {written} events "
        f"written to {db}" + ("" if written else " (every arm had finished: nothing to do)"),
        file=sys.stderr,
    )
    return "budget" if stopped else "failed" if failed else "ok"
