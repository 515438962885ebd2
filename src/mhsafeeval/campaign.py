"""The campaign builder: the composition root that wires every layer into one run.

One campaign = counselor models x client profiles x conversations per profile. Each
conversation gets its own client, mutator, counselor, judge and refiner instances (one per
conversation, created on first message); one search controller sees every conversation and owns
one harm archive per counselor model; a scheduler keeps ``concurrency`` conversations going; the
event store records every message.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from mhsafeeval.agents import (
    DEFAULT_COUNSELOR_PROMPT,
    ClientAgent,
    ClientProfile,
    CounselorAgent,
    MutatorAgent,
    RefinerAgent,
    builtin_profiles,
    load_profiles,
)
from mhsafeeval.budget import Budget, BudgetedModel, check_prices
from mhsafeeval.config import (
    Config,
    canonical_config,
    check_planned_size,
    check_runnable,
    config_differences,
)
from mhsafeeval.engine import Graph, Node, RunResult, Service, load_stored, run_graph
from mhsafeeval.errors import InputError
from mhsafeeval.judges import JUDGES, PANEL_INPUTS, ReplyFold, RubricJudge, failed_rater
from mhsafeeval.judges import rater_address as _rater_address
from mhsafeeval.messages import (
    ANSWERED_BY,
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Message,
    Rating,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.rejudge import RatingPool, RatingStats, raters_for
from mhsafeeval.runtime import AgentId, PluginNotFound
from mhsafeeval.runtime.providers import (
    Connections,
    ModelClient,
    ModelSettings,
    ResilientClient,
    open_model,
)
from mhsafeeval.runtime.providers._registry import settings_problems
from mhsafeeval.search import CONTROLLERS, ControllerSpec, SearchRun, controller_options
from mhsafeeval.storage import EventStore
from mhsafeeval.taxonomy import Taxonomy, builtin_taxonomy, load_taxonomy, taxonomy_to_text

__all__ = [
    "CampaignPlan",
    "CampaignResult",
    "ConversationSpec",
    "Preflight",
    "build_plan",
    "estimate_calls",
    "preflight",
    "run_campaign",
    "taxonomy_fingerprint",
]

log = structlog.get_logger("mhsafeeval.campaign")

DEMO_CONFIG = Path(__file__).parent / "data" / "demo.toml"
"""The offline demo campaign (every role on local/gemma-3-270m), run by a bare `mhsafeeval run`."""

JUDGE_INPUTS: tuple[type[Message], ...] = (TurnCommitted, ClientUtterance, CounselorReply)
"""What a judge consumes (it publishes Verdict, Unjudged or CallFailed for each reply)."""


class ConversationSpec(msgspec.Struct, frozen=True):
    """One planned conversation (``style``: the conversational style its client plays, ``""``
    for none)."""

    id: str
    counselor: str
    profile: ClientProfile
    index: int
    style: str = ""


class CampaignResult(RunResult, kw_only=True):
    """How a run ended (:class:`~mhsafeeval.engine.RunResult`), with the panel's part."""

    panel: RatingStats | None = None
    """What the ``[judges]`` panel did in this run (None: no panel)."""


class CampaignPlan(msgspec.Struct, frozen=True):
    """What :func:`build_plan` made of a config: the taxonomy and every planned conversation.
    Built once per command and passed on."""

    taxonomy: Taxonomy
    conversations: tuple[ConversationSpec, ...]
    controller: ControllerSpec
    """The selected controller's declaration."""
    options: msgspec.Struct
    """``[search]`` decoded by that controller (what the campaign stores of it)."""


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
        JUDGES.get(c.judge)
    except PluginNotFound as exc:
        field = "campaign.controller" if "controller" in str(exc) else "campaign.judge"
        raise InputError(source, field, str(exc)) from None
    options = controller_options(c.controller, config.search, source)
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
    return CampaignPlan(taxonomy, specs, controller, options)


def _search_run(config: Config) -> SearchRun:
    """What the campaign tells its controller, whichever it is."""
    c, a = config.campaign, config.ablation
    return SearchRun(
        seed=c.seed,
        max_attempts=c.max_attempts,
        threshold=c.threshold,
        single_turn=a.single_turn,
        role_conditioning=not a.no_role_conditioning,
        qd_search=not a.no_qd_search,
    )


def _stored(config: Config, plan: CampaignPlan) -> Config:
    """``config`` as the campaign stores it: ``[search]`` as its controller decoded it."""
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
    (``panel``). Failed calls that are retried inside a provider are not counted (they are retries).
    ``plan``: the one :func:`build_plan` made for this command (built here when None).
    """
    plan = plan if plan is not None else build_plan(config, source)
    c = config.campaign
    turns = len(plan.conversations) * (1 if config.ablation.single_turn else c.max_turns)
    low, high = plan.controller.turn_attempts(plan.options, _search_run(config))
    low_attempts, high_attempts = turns * low, turns * high
    refined = turns * (high - 1) if plan.controller.uses_refiner else 0
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
    model one litellm can route (litellm is imported only when a table names a litellm model).

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
    """Digests of the taxonomy and the planned profiles: a resumed campaign must use the same."""

    profiles: dict[str, Any] = {}
    for s in plan.conversations:
        data = profiles[s.profile.id] = msgspec.to_builtins(s.profile)
        if not data["styles"]:  # added later: profiles without styles keep their old digest
            del data["styles"]
    return {
        "taxonomy": taxonomy_fingerprint(plan.taxonomy),
        "profiles": _digest(msgspec.json.encode(sorted(profiles.items()))),
    }


async def run_campaign(
    config: Config,
    store: EventStore,
    *,
    source: str | Path = "<config>",
    config_text: str = "",
    observers: tuple[Callable[[Message], Any], ...] = (),
    open_client: Callable[[ModelSettings], ResilientClient] | None = None,
    plan: CampaignPlan | None = None,
) -> CampaignResult:
    """Run a whole campaign, storing every message in ``store`` (already open).

    The campaign is one graph on the engine (:func:`campaign_graph`), run by
    :func:`mhsafeeval.engine.run_graph`: if the store already holds this campaign (same name),
    the run **resumes** it (transcripts, archives, refiner notes, UCT trees and RNG draws come
    back from the stored messages without any model call, and only the work in flight when it
    stopped is done again). A campaign that already finished is returned as it is.

    Raises:
        InputError: a bad taxonomy, profile set, controller or judge name, or a stored campaign
            of this name with another configuration (before any write).
    """
    plan = plan if plan is not None else build_plan(config, source)
    check_prices(config, source)
    starts = _starts(config, plan)
    stored = await load_stored(
        store,
        config.campaign.name,
        {m.id for m in starts},
        accepts=_accepts(config, source, plan),
        settled=SETTLED,
        on_bus=_on_bus,
    )
    messages = stored.messages if stored is not None else []
    budget = Budget(config.budget, messages, _configured_model(config, messages))
    clients: dict[str, ResilientClient] = {}
    # One client per distinct model settings, one concurrency limit per endpoint (the
    # provider's connection_key) shared by every table on it.
    opener = open_client or functools.partial(open_model, connections=Connections())

    def client_for(model: ModelSettings, *, counselor: bool = False) -> ModelClient:
        # Every call goes through the budget when it has a limit, counselor calls counted apart.
        ident = msgspec.json.encode(model).decode()
        if ident not in clients:
            clients[ident] = opener(model)
        client: ModelClient = clients[ident]
        return BudgetedModel(client, budget, counselor=counselor) if budget.limited else client

    panel = _panel(config, plan.taxonomy, store, len(messages), client_for)
    graph = campaign_graph(
        config,
        plan,
        starts,
        roles={r: client_for(config.model_for(r)) for r in ROLES},
        counselors={n: client_for(m, counselor=True) for n, m in config.counselors.items()},
        config_text=config_text,
        services=(panel,) if panel is not None else (),
    )
    for observer in observers:  # a progress display reads retry counts from the clients
        attach = getattr(observer, "attach_clients", None)
        if attach is not None:
            attach(clients.values())
    result = await run_graph(
        graph,
        store,
        limits=budget,
        observers=observers,
        closing=tuple(clients.values()),
        stored=stored,
    )
    return CampaignResult(
        **msgspec.structs.asdict(result), panel=panel.pool.stats if panel is not None else None
    )


ROLES = ("client", "mutator", "judge", "refiner")
"""The campaign-wide model roles (``[models.<role>]``); counselors are per conversation."""

SETTLED: tuple[type[Message], ...] = (Verdict, ArchiveUpdated)
"""What a failed turn keeps: once a verdict (and the archive learnt from it) is stored, other
conversations may have seen it, so the turn is not done again."""


def _starts(config: Config, plan: CampaignPlan) -> list[ConversationStarted]:
    """One ConversationStarted per planned conversation, in plan order."""
    c = config.campaign
    return [
        ConversationStarted(
            campaign=c.name,
            conversation=spec.id,
            counselor_model=spec.counselor,
            profile_id=spec.profile.id,
            index=spec.index,
            max_turns=1 if config.ablation.single_turn else c.max_turns,
            style=spec.style,
        )
        for spec in plan.conversations
    ]


def _accepts(config: Config, source: str | Path, plan: CampaignPlan) -> Callable[[str], None]:
    """Refuse to resume a stored campaign run with another configuration, naming how."""
    name = config.campaign.name

    def check(stored: str) -> None:
        differences = config_differences(stored, _stored(config, plan), _fingerprints(plan))
        if differences:
            shown = "; ".join(differences[:8]) + ("; ..." if len(differences) > 8 else "")
            raise InputError(
                source,
                differences[0].split(":", 1)[0],
                f"campaign {name!r} is already stored with a different configuration, so it "
                f"cannot be resumed with this one ({shown}). Use the configuration it was "
                "started with, or a new --db or campaign.name",
            )

    return check


def campaign_graph(
    config: Config,
    plan: CampaignPlan,
    starts: list[ConversationStarted],
    *,
    roles: dict[str, ModelClient],
    counselors: dict[str, ModelClient],
    config_text: str = "",
    services: tuple[Service, ...] = (),
) -> Graph:
    """The MHSafeEval graph: client, mutator, counselor, judge and (when the controller uses
    one) refiner per conversation, one search controller for all, on ``plan``'s conversations.

    ``roles``: the model of each of :data:`ROLES`; ``counselors``: each counselor model by name.
    """
    c, a = config.campaign, config.ablation
    cells = plan.taxonomy.cell_ids()
    specs = {spec.id: spec for spec in plan.conversations}
    run = _search_run(config)
    make_judge = JUDGES.get(c.judge)
    system_prompt = c.counselor_system_prompt or DEFAULT_COUNSELOR_PROMPT

    def spec(agent_id: AgentId) -> ConversationSpec:
        return specs[agent_id.key]

    nodes = [
        Node.of(
            MutatorAgent,
            lambda aid: MutatorAgent(
                roles["mutator"], plan.taxonomy, spec(aid).profile, context_turns=c.context_turns
            ),
            name="mutator",
        ),
        Node.of(
            ClientAgent,
            lambda aid: ClientAgent(
                roles["client"],
                spec(aid).profile,
                context_turns=c.context_turns,
                style=spec(aid).style,
            ),
            name="client",
        ),
        Node.of(
            CounselorAgent,
            lambda aid: CounselorAgent(
                counselors[spec(aid).counselor],
                system_prompt=system_prompt,
                context_turns=c.context_turns,
            ),
            name="counselor",
        ),
        Node(
            "judge",
            lambda aid: make_judge(
                roles["judge"],
                plan.taxonomy,
                context_turns=c.context_turns,
                max_asks=c.judge_max_asks,
                threshold=c.threshold,
            ),
            JUDGE_INPUTS,
        ),
    ]
    if plan.controller.uses_refiner:
        nodes.append(
            Node.of(
                RefinerAgent,
                lambda aid: RefinerAgent(roles["refiner"], refinement=run.refinement),
                name="refiner",
            )
        )
    nodes.append(Node.shared(plan.controller(cells, run, plan.options), name="controller"))
    return Graph(
        campaign=c.name,
        nodes=nodes,
        conversations=starts,
        concurrency=c.concurrency,
        opening=CampaignStarted(
            campaign=c.name,
            key="start",
            config=config_text,
            cells=tuple(cells),
            threshold=c.threshold,
            planned_conversations=len(starts),
            max_turns=1 if a.single_turn else c.max_turns,
        ),
        config=canonical_config(_stored(config, plan), _fingerprints(plan)),
        accepts=None,
        settled=SETTLED,
        services=services,
    )


class _PanelService:
    """The ``[judges]`` panel's rating pool as an engine service: it reads judged replies from
    the bus and stores ratings, which no agent ever sees."""

    types = PANEL_INPUTS

    def __init__(self, pool: RatingPool) -> None:
        self.pool = pool

    @property
    def pending(self) -> bool:
        """Ratings still to do."""
        return bool(self.pool.pending)

    def owns(self, msg: Message) -> bool:
        """Ratings and the panel's failed calls."""
        return not _on_bus(msg)

    def resume(self, stored: Sequence[Message]) -> None:
        """Rate the stored judged replies not rated yet (a panel added later rates them)."""
        self.pool.submit([item for m in stored for item in self.pool.fold.add(m)])

    def observe(self, msg: Message) -> None:
        """Rate the replies ``msg`` completes."""
        self.pool.submit(self.pool.fold.add(msg))

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rate until cancelled."""
        await self.pool.serve(task_status=task_status)

    async def join(self) -> None:
        """Wait until everything submitted is rated."""
        await self.pool.join()

    def close(self) -> None:
        """No more replies will come."""
        self.pool.close()


def _panel(
    config: Config,
    taxonomy: Taxonomy,
    store: EventStore,
    run: int,
    client_for: Callable[[ModelSettings], ModelClient],
) -> _PanelService | None:
    """The ``[judges]`` panel (None: no panel). It rates a reply once its turn is committed
    (or its conversation has ended), with the search judge's settings (context, re-asks,
    threshold), every call through the budget; a call that fails for good is stored as
    ``CallFailed(agent="panel")`` and asked again by the next run. Given the stored messages
    first (the engine does), it rates the stored judged replies it has not rated yet, so a
    panel added to a stored campaign rates the old replies too."""
    members = config.judges.panel
    if not members:
        return None
    c = config.campaign
    raters = []
    for settings in members.values():
        judge = RubricJudge(
            client_for(settings),
            taxonomy,
            context_turns=c.context_turns,
            max_asks=c.judge_max_asks,
            name=settings.provider,
            threshold=c.threshold,
        )
        raters += raters_for(settings.provider, config.judges.samples, judge)
    pool = RatingPool(
        ReplyFold(c.context_turns),
        raters,
        store.append,
        source="panel",
        run=str(run),
        workers=sum(m.max_concurrency for m in members.values()),
    )
    return _PanelService(pool)


def _on_bus(msg: Message) -> bool:
    """Whether a stored message travelled on the bus (the panel's records never do)."""
    return not isinstance(msg, Rating) and not (
        isinstance(msg, CallFailed) and msg.agent == "panel"
    )


def _configured_model(config: Config, messages: list[Message]) -> Callable[[Message], str]:
    """The provider address configured for whoever answered a stored message."""
    counselor_of = {
        m.conversation: m.counselor_model for m in messages if isinstance(m, ConversationStarted)
    }

    def configured(msg: Message) -> str:
        role = msg.agent if isinstance(msg, CallFailed) else ANSWERED_BY.get(type(msg))
        if role == "panel":  # a rater is named by its judge's address (and a sample number)
            rater = msg.rater if isinstance(msg, Rating) else ""
            if isinstance(msg, CallFailed):
                rater = failed_rater(msg)
            return _rater_address(rater)
        if role == "counselor":
            model = config.counselors.get(counselor_of.get(msg.conversation, ""))
            return model.provider if model is not None else ""
        return config.model_for(role).provider if role is not None else ""

    return configured
