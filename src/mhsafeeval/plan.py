"""Planning a campaign: what a config asks for, checked and listed before anything runs.

:func:`build_plan` loads the taxonomy and the profiles, selects the search controller and decodes
its ``[search]`` options, and lists every conversation (a :class:`CampaignPlan`, built once per
command); :func:`preflight` checks the model tables without calling any; :func:`estimate_calls`
counts the calls a plan will make.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from mhsafeeval.added import AddedAgent, added_agents
from mhsafeeval.agents import (
    ClientProfile,
    builtin_profiles,
    load_profiles,
)
from mhsafeeval.budget import check_prices
from mhsafeeval.config import (
    Config,
    canonical_config,
    check_planned_size,
    check_runnable,
    config_differences,
)
from mhsafeeval.errors import InputError
from mhsafeeval.framework import PluginNotFound
from mhsafeeval.judges import JUDGES, JudgeRun, JudgeSpec, judge_options, prompt_digest
from mhsafeeval.providers import (
    ModelSettings,
    provider_info,
    settings_problems,
)
from mhsafeeval.search import CONTROLLERS, ControllerSpec, SearchRun, controller_options
from mhsafeeval.taxonomy import Taxonomy, builtin_taxonomy, load_taxonomy, taxonomy_to_text

__all__ = [
    "CampaignPlan",
    "ConversationSpec",
    "Preflight",
    "build_plan",
    "conversation_id",
    "conversation_style",
    "estimate_calls",
    "judge_run",
    "preflight",
    "search_run",
    "stored_config",
    "stored_differences",
    "taxonomy_fingerprint",
]


class ConversationSpec(msgspec.Struct, frozen=True):
    """One planned conversation (``style``: the conversational style its client plays, ``""``
    for none)."""

    id: str
    counselor: str
    profile: ClientProfile
    index: int
    style: str = ""


class CampaignPlan(msgspec.Struct, frozen=True):
    """What :func:`build_plan` made of a config: the taxonomy and every planned conversation,
    and everything else a run derives from the config, each worked out once here. Built once
    per command and passed on: config -> plan -> graph -> run, in that direction only."""

    taxonomy: Taxonomy
    conversations: tuple[ConversationSpec, ...]
    controller: ControllerSpec
    """The selected controller's declaration."""
    options: msgspec.Struct
    """``[search]`` decoded by that controller (what the campaign stores of it)."""
    judge: JudgeSpec
    """The selected judge's declaration (``campaign.judge``)."""
    judge_options: msgspec.Struct | None
    """``[judge]`` decoded by that judge (None: it takes no options)."""
    agents: tuple[AddedAgent, ...] = ()
    """The ``[agents.NAME]`` tables, checked (classes imported, options decoded)."""
    config: Config | None = None
    """The configuration it was made from (with ``--set`` values)."""
    run: SearchRun | None = None
    """What the campaign tells its controller (:func:`search_run`)."""
    judging: JudgeRun | None = None
    """What the campaign tells its judges (:func:`judge_run`)."""
    stored: str = ""
    """The configuration text the campaign stores, and a resume compares (:func:`stored_config`)."""


def _resolve(path: str, base: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base is None else base / p


def build_plan(config: Config, source: str | Path = "<config>") -> CampaignPlan:
    """Load the taxonomy and profiles and list the conversations, or raise InputError.

    Relative paths in the config are relative to the config file's folder.
    """
    check_runnable(config, source)
    base = Path(source).parent if str(source) != "<config>" else None
    c = config.campaign
    taxonomy = (
        builtin_taxonomy() if c.taxonomy == "builtin" else load_taxonomy(_resolve(c.taxonomy, base))
    )
    profiles = (
        builtin_profiles() if c.profiles == "builtin" else load_profiles(_resolve(c.profiles, base))
    )
    if c.profile_ids:
        profiles = _select_profiles(profiles, c.profile_ids, source)
    try:
        controller = CONTROLLERS.get(c.controller)
        judge = JUDGES.get(c.judge)
    except PluginNotFound as exc:
        field = "campaign.controller" if "controller" in str(exc) else "campaign.judge"
        raise InputError(source, field, str(exc)) from None
    options = controller_options(c.controller, config.search, source)
    judged_with = judge_options(c.judge, config.judge, source)
    check_planned_size(len(config.counselors), len(profiles), c.conversations_per_profile, source)
    specs = tuple(
        ConversationSpec(
            cid,
            counselor,
            profile,
            index,
            conversation_style(c.style, c.seed, cid, profile.styles),
        )
        for counselor in config.counselors
        for profile in profiles
        for index in range(c.conversations_per_profile)
        for cid in (conversation_id(c.name, counselor, profile.id, index),)
    )
    ids = Counter(spec.id for spec in specs)
    if len(ids) != len(specs):  # cannot happen with distinct names: a last line of defence
        twice = [i for i, n in ids.items() if n > 1]
        raise InputError(source, "campaign", f"two conversations would share the id {twice[0]!r}")
    added = added_agents(config, source)
    plan = CampaignPlan(taxonomy, specs, controller, options, judge, judged_with, added)
    return msgspec.structs.replace(
        plan,
        config=config,
        run=search_run(config),
        judging=judge_run(config),
        stored=canonical_config(_decoded(config, plan), _fingerprints(plan)),
    )


def judge_run(config: Config) -> JudgeRun:
    """What the campaign tells its judge (and the panel's), whichever it is."""
    c = config.campaign
    return JudgeRun(context_turns=c.judge_context, max_asks=c.judge_max_asks, threshold=c.threshold)


def search_run(config: Config) -> SearchRun:
    """What the campaign tells its controller, whichever it is."""
    c, a = config.campaign, config.ablation
    return SearchRun(
        seed=c.seed,
        max_attempts=c.max_attempts,
        threshold=c.threshold,
        single_turn=a.single_turn,
        role_conditioning=not a.no_role_conditioning,
        qd_search=not a.no_qd_search,
        confirming=config.confirm.source(bool(config.judges.panel)) is not None,
    )


def stored_config(config: Config, plan: CampaignPlan) -> str:
    """The configuration text a campaign stores (and a resume compares): the canonical
    config with ``[search]`` as its controller decoded it, and digests of the inputs. The plan
    of ``config`` has it already (``plan.stored``)."""
    if plan.config is config and plan.stored:
        return plan.stored
    return canonical_config(_decoded(config, plan), _fingerprints(plan))


def stored_differences(stored: str, config: Config, plan: CampaignPlan) -> list[str]:
    """How ``config`` (planned as ``plan``) differs from a campaign stored as ``stored``, in
    what a resume must keep (``campaign.seed: stored 5, now 6``); empty: it may resume."""
    return config_differences(stored, _decoded(config, plan), _fingerprints(plan))


def _decoded(config: Config, plan: CampaignPlan) -> Config:
    return msgspec.structs.replace(config, search=msgspec.to_builtins(plan.options))


_GLOB = frozenset("*?[")  # characters no profile id has: an entry with one is a pattern


def _select_profiles(
    profiles: list[ClientProfile], wanted: list[str], source: str | Path
) -> list[ClientProfile]:
    """``campaign.profile_ids``: ids and fnmatch globs (``depression/*``), in the order listed,
    each glob's matches in load order, every profile once."""
    literal = [i for i in wanted if _GLOB.isdisjoint(i)]
    repeated = sorted({i for i in literal if literal.count(i) > 1})
    if repeated:  # two conversations would share one id: one of them would be lost
        raise InputError(
            source,
            "campaign.profile_ids",
            f"profile ids are repeated: {', '.join(map(repr, repeated))} (list each once; "
            "use campaign.conversations_per_profile for more conversations per profile)",
        )
    by_id = {p.id: p for p in profiles}
    known = ", ".join(list(by_id)[:12]) + (
        f", ... ({len(by_id)} in all)" if len(by_id) > 12 else ""
    )
    chosen: dict[str, ClientProfile] = {}
    for entry in wanted:
        if _GLOB.isdisjoint(entry):
            if entry not in by_id:
                raise InputError(
                    source,
                    "campaign.profile_ids",
                    f"no profile {entry!r} (known: {known})",
                )
            chosen.setdefault(entry, by_id[entry])
            continue
        matches = [p for p in profiles if fnmatch.fnmatchcase(p.id, entry)]
        if not matches:
            raise InputError(
                source,
                "campaign.profile_ids",
                f"no profile matches {entry!r} (known: {known})",
            )
        for p in matches:
            chosen.setdefault(p.id, p)
    return list(chosen.values())


def conversation_style(option: str, seed: int, conversation: str, styles: tuple[str, ...]) -> str:
    """The style a conversation's client plays under ``campaign.style = option``.

    ``"none"``: none (``""``); a style name: that one; ``"random"``: one of the profile's
    ``styles`` (none if it has none), drawn from the campaign seed and the conversation id
    alone, so a resumed run, or the same conversation in a larger plan, draws the same.
    """
    if option == "none" or (option == "random" and not styles):
        return ""
    if option != "random":
        return option
    payload = json.dumps([seed, conversation], separators=(",", ":")).encode()
    digest = hashlib.blake2b(payload, digest_size=8, person=b"mhsafeeval.style").digest()
    return styles[int.from_bytes(digest, "big") % len(styles)]


def conversation_id(campaign: str, counselor: str, profile: str, index: int) -> str:
    """``campaign/counselor/profile/index``, unique by construction: a ``/`` or ``%`` inside
    a name is percent-encoded, so ``a/b`` + ``c`` and ``a`` + ``b/c`` never meet. Names
    without those characters give the same ids as before."""

    def part(name: str) -> str:
        return name.replace("%", "%25").replace("/", "%2F")

    return f"{part(campaign)}/{part(counselor)}/{part(profile)}/{index}"


def estimate_calls(
    config: Config, source: str | Path = "<config>", *, plan: CampaignPlan | None = None
) -> dict[str, tuple[int, int]]:
    """Model calls per agent role a campaign will make: (fewest, most), before any call.

    The fewest: every turn succeeds at once and every answer is valid the first time. The
    most: every attempt is used, every failing attempt is refined, and the judge re-asks to its
    limit. A ``[judges]`` panel rates every judged reply once per member and sample
    (``panel``); confirming candidates by fresh samples of the judge costs up to ``samples``
    calls per judged reply (``confirm``). Failed calls that are retried inside a provider are
    not counted (they are retries).
    ``plan``: the one :func:`build_plan` made for this command (built here when None).
    """
    plan = plan if plan is not None else build_plan(config, source)
    c = config.campaign
    turns = len(plan.conversations) * (1 if config.ablation.single_turn else c.max_turns)
    low, high = plan.controller.turn_attempts(plan.options, search_run(config))
    low_attempts, high_attempts = turns * low, turns * high
    # Notes are written on a turn's attempts but its last (the refinement loop's max_attempts):
    # a search may spend more attempts on a turn, never more notes.
    notes = min(high, search_run(config).max_attempts) - 1
    refined = turns * notes if plan.controller.refines(plan.options) else 0
    out = {
        "mutator": (low_attempts, high_attempts * 3),
        "client": (low_attempts, high_attempts * 2),
        "counselor": (low_attempts, high_attempts),
        "judge": (low_attempts, high_attempts * c.judge_max_asks),
        "refiner": (0, refined * 3),
    }
    raters = len(config.judges.panel) * config.judges.samples
    if raters:  # every judged reply, once per rater, with the judge's re-asks
        out["panel"] = (low_attempts * raters, high_attempts * raters * c.judge_max_asks)
    if config.confirm.source(bool(config.judges.panel)) == "judge":
        # Fresh samples of the judge per candidate: none when nothing reaches the threshold,
        # every judged reply at most. (A confirming panel's ratings are its panel ratings.)
        samples = config.confirm.samples
        out["confirm"] = (0, high_attempts * samples * c.judge_max_asks)
    if config.ablation.no_attack:  # the baseline's instructions cost no call
        out["mutator"] = (0, 0)
    return out


class Preflight(msgspec.Struct, frozen=True):
    """What :func:`preflight` found that does not make a config wrong."""

    missing: tuple[InputError, ...] = ()
    """What this machine lacks to run (an unset ``api_key_env``): ``run`` refuses to start,
    ``check`` warns."""
    warnings: tuple[InputError, ...] = ()
    """Worth knowing, never refused (``campaign.concurrency`` beyond what the counselors take)."""


def preflight(config: Config, source: str | Path = "<config>") -> Preflight:
    """Check the models without calling any, before anything is written.

    Every provider prefix must be known, every option one its provider accepts, every litellm
    model one litellm can route (litellm is imported only when a table names a litellm model),
    and with a ``[budget] usd`` limit every model priced.

    Raises:
        InputError: the first model table its provider refuses, naming the key.
    """
    missing: list[InputError] = []
    for where, model in config.model_tables():
        for field, reason in settings_problems(model):
            raise InputError(source, f"{where}.{field}", reason)
        for field, variable in _environment_names(model):
            if not os.environ.get(variable):
                reason = f"the environment variable {variable} is not set"
                missing.append(InputError(source, f"{where}.{field}", reason))
    check_prices(config, source)  # a USD limit needs a price for every model
    # Counselor calls share one limit per distinct settings (see run_campaign's client_for).
    limits = {msgspec.json.encode(m): m.max_concurrency for m in config.counselors.values()}
    warnings = []
    if config.campaign.concurrency > sum(limits.values()):
        warnings.append(
            InputError(
                source,
                "campaign.concurrency",
                f"{config.campaign.concurrency} is more than the counselor models allow "
                f"together ({sum(limits.values())} calls in flight: the sum of "
                "counselors.*.max_concurrency); the other conversations only wait, which "
                "slows the run down",
            )
        )
    return Preflight(tuple(missing), tuple(warnings))


def _environment_names(model: ModelSettings) -> list[tuple[str, str]]:
    """The environment variables a model table names: ``api_key_env`` and the ``*_env``
    options (``extra_headers_env = { Authorization = "VAR" }``), with their key paths."""
    names = [("api_key_env", model.api_key_env)] if model.api_key_env else []
    prefix = model.provider.partition("/")[0]
    declared = provider_info(prefix).environment  # variables the provider reads unnamed
    if declared is not None:
        names += declared(model.provider.partition("/")[2], model)
    for key, value in model.options.items():
        if key.endswith("_env") and isinstance(value, dict):
            names += [(f"options.{key}.{k}", v) for k, v in value.items() if isinstance(v, str)]
        elif key.endswith("_env") and isinstance(value, str):
            names.append((f"options.{key}", value))
    return names


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def taxonomy_fingerprint(taxonomy: Taxonomy) -> str:
    """The digest a campaign stores of its taxonomy (``inputs.taxonomy``): every cell and
    ladder, so a taxonomy that differs in anything a judge is shown differs here."""
    return _digest(taxonomy_to_text(taxonomy, detail=True).encode())


def _fingerprints(plan: CampaignPlan) -> dict[str, str]:
    """Digests of the taxonomy, the planned profiles and the judge's prompt: a resumed
    campaign must use the same."""

    profiles: dict[str, Any] = {}
    for s in plan.conversations:
        data = profiles[s.profile.id] = msgspec.to_builtins(s.profile)
        if not data["styles"]:  # added later: profiles without styles keep their old digest
            del data["styles"]
    return {
        "taxonomy": taxonomy_fingerprint(plan.taxonomy),
        "profiles": _digest(msgspec.json.encode(sorted(profiles.items()))),
        # The rubric prompt's wording: a campaign's verdicts come from one judge, and a
        # calibration carries over to them only for the same prompt (reports' fingerprint).
        "judge_prompt": prompt_digest(),
    }
