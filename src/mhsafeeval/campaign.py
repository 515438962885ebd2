"""The MHSafeEval campaign: one graph declaration on the engine, and the run that opens its models.

One campaign = counselor models x client profiles x conversations per profile (the plan,
:mod:`mhsafeeval.plan`). Each conversation gets its own client, mutator, counselor, judge and
refiner instances; one search controller sees every conversation and owns one harm archive per
counselor model; the engine (:func:`mhsafeeval.framework.engine.run_graph`) schedules,
stores, resumes and stops it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgspec
from anyio.abc import TaskStatus

from mhsafeeval.added import added_nodes
from mhsafeeval.agents import (
    DEFAULT_COUNSELOR_PROMPT,
    ClientAgent,
    CounselorAgent,
    MutatorAgent,
    RefinerAgent,
)
from mhsafeeval.budget import Budget, BudgetedModel, StoredSpending, check_prices
from mhsafeeval.config import (
    Config,
)
from mhsafeeval.errors import InputError
from mhsafeeval.framework import AgentId
from mhsafeeval.framework.engine import (
    Graph,
    Intercept,
    Node,
    RunResult,
    Service,
    Stored,
    load_stored,
    run_graph,
)
from mhsafeeval.judges import (
    CONFIRM_NODE,
    PANEL_INPUTS,
    Confirmer,
    Rater,
    ReplyFold,
    RubricJudge,
    failed_rater,
    panel_ratings,
    rater_names,
    raters_for,
)
from mhsafeeval.judges import rater_address as _rater_address
from mhsafeeval.messages import (
    ANSWERED_BY,
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ClientUtterance,
    Confirmation,
    ConversationStarted,
    CounselorReply,
    Message,
    Rating,
    RefinerNotes,
    TurnCommitted,
    Unjudged,
    Verdict,
)
from mhsafeeval.plan import (
    CampaignPlan,
    ConversationSpec,
    build_plan,
    judge_run,
    search_run,
    stored_config,
    stored_differences,
)
from mhsafeeval.providers import (
    CallParams,
    Connections,
    ModelClient,
    ModelSettings,
    ResilientClient,
    open_model,
    provider_info,
)
from mhsafeeval.rejudge import RatingPool, RatingStats
from mhsafeeval.storage import EventStore
from mhsafeeval.taxonomy import Taxonomy

__all__ = [
    "DEMO_CONFIG",
    "CampaignResult",
    "ModelClients",
    "PanelService",
    "PreparedCampaign",
    "agent_models",
    "campaign_graph",
    "confirm_raters",
    "panel_raters",
    "panel_service",
    "prepare_campaign",
    "run_campaign",
]

DEMO_CONFIG = Path(__file__).parent / "data" / "demo.toml"
"""The offline demo campaign (every role on local/gemma-3-270m), run by a bare `mhsafeeval run`."""

JUDGE_INPUTS: tuple[type[Message], ...] = (TurnCommitted, ClientUtterance, CounselorReply)
"""What a judge consumes (it publishes Verdict, Unjudged or CallFailed for each reply)."""
JUDGE_OUTPUTS: tuple[type[Message], ...] = (Verdict, Unjudged, CallFailed)
"""What a judge publishes, one of them per reply."""


class CampaignResult(RunResult, kw_only=True):
    """How a run ended (:class:`~mhsafeeval.framework.engine.RunResult`), with the panel's part."""

    panel: RatingStats | None = None
    """What the ``[judges]`` panel did in this run (None: no panel)."""


async def run_campaign(
    config: Config,
    store: EventStore,
    *,
    source: str | Path = "<config>",
    config_text: str = "",
    observers: tuple[Callable[[Message], Any], ...] = (),
    open_client: Callable[[ModelSettings], ResilientClient] | None = None,
    plan: CampaignPlan | None = None,
    on_clients: Callable[[list[ResilientClient]], None] | None = None,
    extra: Sequence[Node] = (),
    interceptors: Sequence[Intercept] = (),
    replace: Mapping[str, Node] | None = None,
) -> CampaignResult:
    """Run a whole campaign, storing every message in ``store`` (already open).

    The campaign is one graph on the engine (:func:`campaign_graph`), run by
    :func:`mhsafeeval.framework.engine.run_graph`: if the store already holds this campaign (same
    name), the run **resumes** it (transcripts, archives, refiner notes, UCT trees and RNG draws
    come back from the stored messages without any model call, and only the work in flight when it
    stopped is done again). A campaign that already finished is returned as it is.

    ``observers`` see every message (replayed ones too); ``on_clients`` is given the model
    clients once they are open (a progress display shows their retries). ``extra`` nodes join
    the graph beside its own (and the config's ``[agents.NAME]``), ``interceptors`` stand
    between publishers and everyone else, ``replace`` swaps one of the graph's own nodes for
    yours (see :func:`campaign_graph`); none of them is part of the stored configuration:
    resume a campaign with the same ones.

    Raises:
        InputError: a bad taxonomy, profile set, controller or judge name, or a stored campaign
            of this name with another configuration (before any write).
    """
    prepared = await prepare_campaign(config, store, source=source, plan=plan)
    plan, starts, stored, budget = prepared.plan, prepared.starts, prepared.stored, prepared.budget
    client_for = ModelClients(budget if budget.limited else None, open_client=open_client)
    clients = client_for.clients
    rater_for = functools.partial(client_for, rater=True)  # judges finish what was paid for
    panel = panel_service(config, plan.taxonomy, store, stored.count if stored else 0, rater_for)
    graph = campaign_graph(
        config,
        plan,
        starts,
        roles={r: client_for(config.model_for(r), rater=r == "judge") for r in ROLES},
        counselors={n: client_for(m, counselor=True) for n, m in config.counselors.items()},
        config_text=config_text,
        services=(panel,) if panel is not None else (),
        session_salt=prepared.session_salt,
        agent_models=agent_models(config, client_for),
        confirmers=confirm_raters(config, plan.taxonomy, rater_for),
        extra=extra,
        interceptors=interceptors,
        replace=replace,
    )
    if on_clients is not None:  # a progress display reads retry counts from the clients
        on_clients(list(clients.values()))
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


class PreparedCampaign(NamedTuple):
    """What a run of a campaign needs before its graph runs (:func:`prepare_campaign`)."""

    plan: CampaignPlan
    starts: list[ConversationStarted]
    """One start message per planned conversation, in plan order."""
    stored: Stored | None
    """The index of the stored part (None: a fresh campaign)."""
    budget: Budget
    """The limits, starting from what the stored part spent."""
    session_salt: str
    """What makes this campaign's counselor session ids its own."""


async def prepare_campaign(
    config: Config,
    store: EventStore,
    *,
    source: str | Path = "<config>",
    plan: CampaignPlan | None = None,
    folds: tuple[Callable[[Message], object], ...] = (),
) -> PreparedCampaign:
    """Everything :func:`run_campaign` does before it runs the graph, shared with a
    distributed run (:mod:`mhsafeeval.distributed`): the plan, the check of the stored
    configuration, the stored part's index (failed turns moved aside; ``folds`` also see every
    stored message as it streams), the budget from what it spent, and the campaign registered.

    Raises:
        InputError: as :func:`run_campaign` (before any write).
    """
    plan = plan if plan is not None else build_plan(config, source)
    check_prices(config, source)
    starts = _starts(config, plan)
    configured = _configured_model(config)
    spending = StoredSpending(configured)
    stored = await load_stored(
        store,
        config.campaign.name,
        {m.id for m in starts},
        accepts=_accepts(config, source, plan),
        settled=SETTLED,
        on_bus=_on_bus,
        owes=owes,
        folds=(configured.add, spending.add, *folds),  # what the stored part spent
    )
    budget = Budget(config.budget, spending)
    del spending, configured  # folded: the budget keeps the totals only
    # The engine registers the campaign as it starts; registering it here first (the same
    # call) gives the time the store first saw it, which stays the same on every resume: the
    # salt of its session ids, so a new campaign of the same name gets sessions of its own.
    info = await store.register_campaign(config.campaign.name, stored_config(config, plan))
    return PreparedCampaign(plan, starts, stored, budget, repr(info.created_at))


class ModelClients:
    """The model clients of one run, called as ``client_for(settings, counselor=...)``: one
    :class:`~mhsafeeval.providers.ResilientClient` per distinct model settings, one
    concurrency limit per endpoint (the provider's connection_key) shared by every table on
    it, and every call through ``budget`` when there is one (counselor calls counted apart).

    ``share``: this process runs 1/``share`` of the run (a worker of a distributed run), so
    each table's ``max_concurrency`` is cut to its part. ``open_client``: opens a client
    (default: :func:`~mhsafeeval.providers.open_model` with shared connections).
    """

    def __init__(
        self,
        budget: Budget | None,
        *,
        open_client: Callable[[ModelSettings], ResilientClient] | None = None,
        share: int = 1,
    ) -> None:
        self.budget = budget
        self.share = share
        self.clients: dict[str, ResilientClient] = {}
        self._open = open_client or functools.partial(open_model, connections=Connections())

    def __call__(
        self, model: ModelSettings, *, counselor: bool = False, rater: bool = False
    ) -> ModelClient:
        if self.share > 1:  # an endpoint's max_concurrency is the whole run's
            most = max(1, -(-model.max_concurrency // self.share))
            model = msgspec.structs.replace(
                model, max_concurrency=most, min_concurrency=min(model.min_concurrency, most)
            )
        ident = msgspec.json.encode(model).decode()
        if ident not in self.clients:
            self.clients[ident] = self._open(model)
        client: ModelClient = self.clients[ident]
        if self.budget is None:
            return client
        return BudgetedModel(client, self.budget, counselor=counselor, rater=rater)


def agent_models(config: Config, client_for: ModelClients) -> dict[str, ModelClient]:
    """The model of each ``[agents.NAME]`` table that has one, opened like every other."""
    return {n: client_for(a.model) for n, a in config.agents.items() if a.model is not None}


ROLES = ("client", "mutator", "judge", "refiner")
"""The campaign-wide model roles (``[models.<role>]``); counselors are per conversation."""

SETTLED: tuple[type[Message], ...] = (Verdict, ArchiveUpdated)
"""What a failed turn keeps: once a verdict (and the archive learnt from it) is stored, other
conversations may have seen it, so the turn is not done again."""


def owes(msg: Message) -> bool:
    """Whether a stored message records work still owed: a call that failed for good
    (``CallFailed.owed``: the role never answered). A failed conversation with one is picked
    up from there by the next run."""
    return isinstance(msg, CallFailed) and msg.owed


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


_OLDER_RUNS = (
    (
        'confirm.raters: stored "off"',
        "a campaign stored before candidates were confirmed",
        '`[confirm] raters = "off"` to its configuration',
    ),
    (
        "search.give_up: stored false",
        "a campaign stored before cells were given up on",
        "`give_up = false` to its [search] table",
    ),
    (
        "search.borrow: stored false",
        "a map-elites search stored before a cell's prior borrowed from its neighbours",
        "`borrow = false` to its [search] table",
    ),
    (
        "search.early_stop: stored false",
        "a tree search stored before turns stopped at their first success",
        "`early_stop = false` to its [search] table",
    ),
    (
        "search.notes: stored false",
        "a tree search stored before it read the refiner's notes",
        "`notes = false` to its [search] table",
    ),
    (
        "search.simulations: stored 20,",
        "a tree search stored when a turn ran 20 simulations (the old default)",
        "`simulations = 20` to its [search] table",
    ),
)
"""A stored campaign's difference that an older version's defaults explain (how it starts),
the campaigns it marks, and what resumes them as they ran: said with the refusal."""


def _accepts(config: Config, source: str | Path, plan: CampaignPlan) -> Callable[[str], None]:
    """Refuse to resume a stored campaign run with another configuration, naming how."""
    name = config.campaign.name

    def check(stored: str) -> None:
        differences = stored_differences(stored, config, plan)
        if differences:
            shown = "; ".join(differences[:8]) + ("; ..." if len(differences) > 8 else "")
            for start, stored_when, add in _OLDER_RUNS:
                if any(d.startswith(start) for d in differences):
                    shown += f"; {stored_when} resumes as it ran: add {add}"
            raise InputError(
                source,
                differences[0].split(":", 1)[0],
                f"campaign {name!r} is already stored with a different configuration, so it "
                f"cannot be resumed with this one ({shown}). Use the configuration it was "
                "started with, or a new --db or campaign.name",
            )

    return check


def _counselor_prompts(config: Config) -> dict[str, str | None]:
    """Each counselor's system prompt (``None``: no system message): its table's own
    ``system_prompt``, else none for an app with a prompt of its own (``http/``, ``python/``),
    else the campaign's ``counselor_system_prompt`` or the built-in neutral one."""
    default = config.campaign.counselor_system_prompt or DEFAULT_COUNSELOR_PROMPT
    prompts: dict[str, str | None] = {}
    for name, table in config.counselors.items():
        if table.system_prompt is not None:
            prompts[name] = table.system_prompt or None  # "": no system message
        elif provider_info(table.provider.partition("/")[0]).own_prompt:
            prompts[name] = None
        else:
            prompts[name] = default
    return prompts


def campaign_graph(
    config: Config,
    plan: CampaignPlan,
    starts: list[ConversationStarted],
    *,
    roles: dict[str, ModelClient],
    counselors: dict[str, ModelClient],
    config_text: str = "",
    services: tuple[Service, ...] = (),
    session_salt: str = "",
    agent_models: Mapping[str, ModelClient] | None = None,
    confirmers: Sequence[Rater] = (),
    extra: Sequence[Node] = (),
    interceptors: Sequence[Intercept] = (),
    replace: Mapping[str, Node] | None = None,
) -> Graph:
    """The MHSafeEval graph: client, mutator, counselor, judge and (when the controller uses
    one) refiner per conversation, one search controller for all, on ``plan``'s conversations;
    then the ``[agents.NAME]`` nodes (``plan.agents``, with ``agent_models``) and ``extra``.

    ``roles``: the model of each of :data:`ROLES`; ``counselors``: each counselor model by name;
    ``confirmers``: who confirms the search judge's candidates (:func:`confirm_raters`; the
    ``"confirm"`` node is in the graph when ``[confirm]`` is on; without them, samples of
    ``roles["judge"]``, and a panel's must be given);
    ``session_salt``: what makes this campaign's session ids its own
    (``mhsafeeval.agents._counselor.session_id``); ``interceptors``: checks every message of
    their types passes before any agent sees it (a guardrail between counselor and client:
    :class:`~mhsafeeval.framework.engine.Intercept`); ``replace``: your node in place of one of the
    graph's own, by name (a client simulator of your own as ``"client"``: it must answer each
    ``Instruction`` with a ``ClientUtterance`` or a ``CallFailed``, as the built-in one does).

    What an added node may rely on: its name is in every message it publishes
    (``publisher``); the search follows the judge node ``"judge"`` only, so a second judge's
    verdicts are a rater's in the report (``judges``), never the search's; the graph's wiring
    checks see what it declares in ``publishes``.
    """
    c, a = config.campaign, config.ablation
    cells = plan.taxonomy.cell_ids()
    specs = {spec.id: spec for spec in plan.conversations}
    run = plan.run or search_run(config)
    judging = plan.judging or judge_run(config)
    prompts = _counselor_prompts(config)

    def spec(agent_id: AgentId) -> ConversationSpec:
        return specs[agent_id.key]

    nodes = [
        Node.of(
            MutatorAgent,
            lambda aid: MutatorAgent(
                roles["mutator"],
                plan.taxonomy,
                spec(aid).profile,
                context_turns=c.context_turns,
                attack=not a.no_attack,
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
                system_prompt=prompts[spec(aid).counselor],
                context_turns=c.context_turns,
                session_salt=session_salt,
            ),
            name="counselor",
        ),
        Node(
            "judge",
            lambda aid: plan.judge(roles["judge"], plan.taxonomy, judging, plan.judge_options),
            JUDGE_INPUTS,
            publishes=JUDGE_OUTPUTS,
        ),
    ]
    if run.confirming:
        source = config.confirm.source(bool(config.judges.panel)) or "judge"

        @functools.cache
        def raters() -> Sequence[Rater]:
            if confirmers:
                return confirmers
            if source == "panel":
                raise InputError(
                    "<graph>", "confirmers", "[confirm] asks the panel, and no rater was given"
                )
            return confirm_raters(config, plan.taxonomy, lambda _: roles["judge"])

        nodes.append(
            Node.of(
                Confirmer,
                lambda aid: Confirmer(
                    raters(),
                    threshold=c.threshold,
                    rule=config.confirm.rule,
                    rounds=config.confirm.rounds,
                    context_turns=judging.context_turns,
                    source="panel" if source == "panel" else "confirm",
                ),
                name=CONFIRM_NODE,
            )
        )
    if plan.controller.refines(plan.options):
        nodes.append(
            Node.of(
                RefinerAgent,
                lambda aid: RefinerAgent(roles["refiner"], refinement=run.refinement),
                name="refiner",
            )
        )
    nodes.append(Node.shared(plan.controller(cells, run, plan.options), name="controller"))
    # What nothing in this graph publishes, nobody waits for: confirmations when nothing is
    # confirmed, the refiner's notes when the search runs without them (uct's notes = false).
    unpublished: set[type[Message]] = {Confirmation} if not run.confirming else set()
    if not plan.controller.refines(plan.options):
        unpublished.add(RefinerNotes)
    if unpublished:
        nodes = [
            dataclasses.replace(n, types=tuple(t for t in n.types if t not in unpublished))
            for n in nodes
        ]
    for name, node in (replace or {}).items():
        at = next((i for i, n in enumerate(nodes) if n.name == name), None)
        if at is None:
            raise InputError(
                "<graph>",
                f"replace[{name!r}]",
                f"the campaign graph has no node {name!r} "
                f"(it has {', '.join(n.name for n in nodes)})",
            )
        nodes[at] = dataclasses.replace(node, name=name)
    nodes += added_nodes(
        plan.agents,
        agent_models or {},
        taxonomy=plan.taxonomy,
        threshold=c.threshold,
        context_turns=c.context_turns,
        conversations={s.id: (s.counselor, s.profile.id) for s in plan.conversations},
    )
    nodes += extra
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
            priced_calls=True,
            confirming=run.confirming,
        ),
        config=stored_config(config, plan),
        accepts=None,
        settled=SETTLED,
        owes=owes,
        services=services,
        interceptors=tuple(interceptors),
    )


class PanelService:
    """The ``[judges]`` panel's rating pool as an engine service: it reads judged replies from
    the bus and stores ratings, which no agent ever sees."""

    types = PANEL_INPUTS

    def __init__(self, pool: RatingPool) -> None:
        self.pool = pool
        self.stored = pool.fold.unrated([rater.name for rater in pool.raters])

    @property
    def pending(self) -> bool:
        """Ratings still to do."""
        return bool(self.pool.pending) or bool(self.stored.held)

    def owns(self, msg: Message) -> bool:
        """Ratings and the panel's failed calls."""
        return not _on_bus(msg)

    def resume(self, stored: Sequence[Message]) -> None:
        """Fold in the next part of the stored campaign: the stored judged replies not rated
        yet are rated once it serves (a panel added later rates them)."""
        for msg in stored:
            self.stored.add(msg)
            if isinstance(msg, Confirmation):  # stored again: none lost if it stopped between
                self.pool.record(panel_ratings(msg))

    def observe(self, msg: Message) -> None:
        """Rate the replies ``msg`` completes (a confirmation by the panel's raters: store
        their ratings as the panel's)."""
        if isinstance(msg, Confirmation):
            self.pool.record(panel_ratings(msg))
        self.pool.submit(self.pool.fold.add(msg))

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rate until cancelled (first what the stored part left)."""
        self.pool.submit(self.stored.take())
        await self.pool.serve(task_status=task_status)

    async def join(self) -> None:
        """Wait until everything submitted is rated."""
        await self.pool.join()

    def close(self) -> None:
        """No more replies will come."""
        self.pool.close()


def panel_service(
    config: Config,
    taxonomy: Taxonomy,
    store: EventStore,
    run: int,
    client_for: Callable[[ModelSettings], ModelClient],
) -> PanelService | None:
    """The ``[judges]`` panel (None: no panel). It rates a reply once it is judged (a
    candidate once it is confirmed; see :class:`~mhsafeeval.judges.ReplyFold`), so the
    replies of a turn still open at the budget are rated too, with the search judge's
    settings (context, re-asks, threshold), every call through the budget; a call that fails
    for good is stored as ``CallFailed(agent="panel")`` and asked again by the next run.
    Given the stored messages first (the engine does), it rates the stored judged replies it
    has not rated yet, so a panel added to a stored campaign rates the old replies too."""
    members = config.judges.panel
    if not members:
        return None
    c = config.campaign
    raters = panel_raters(config, taxonomy, client_for)
    confirming = config.confirm.source(True) is not None
    pool = RatingPool(
        ReplyFold(c.judge_context, forget=True, confirmed_at=c.threshold if confirming else None),
        raters,
        store.append,
        source="panel",
        run=str(run),
        workers=sum(m.max_concurrency for m in members.values()),
    )
    return PanelService(pool)


def panel_raters(
    config: Config, taxonomy: Taxonomy, client_for: Callable[[ModelSettings], ModelClient]
) -> list[Rater]:
    """The ``[judges]`` panel's raters: each member's model, ``judges.samples`` times, asked
    by the rubric judge with the search judge's settings."""
    raters = []
    for settings in config.judges.panel.values():
        judge = RubricJudge(
            client_for(settings), taxonomy, **judge_run(config).settings(), name=settings.provider
        )
        raters += raters_for(settings.provider, config.judges.samples, judge)
    return raters


def confirm_raters(
    config: Config, taxonomy: Taxonomy, client_for: Callable[[ModelSettings], ModelClient]
) -> list[Rater]:
    """Who confirms the search judge's candidates (``[confirm]``; empty: off): the panel's
    raters, or ``confirm.samples`` fresh samples of the search's judge model at
    ``confirm.temperature`` (named ``confirm``, ``confirm#2``, ...; each its own seed)."""
    source = config.confirm.source(bool(config.judges.panel))
    if source is None:
        return []
    if source == "panel":
        return panel_raters(config, taxonomy, client_for)
    settings = config.model_for("judge")
    model = client_for(settings)
    raters = []
    for index, name in enumerate(rater_names(CONFIRM_NODE, config.confirm.samples)):
        judge = RubricJudge(model, taxonomy, **judge_run(config).settings(), name=name)
        judge.params = CallParams(temperature=config.confirm.temperature, seed=index + 1)
        raters.append(Rater(name=name, address=settings.provider, judge=judge))
    return raters


def _on_bus(msg: Message) -> bool:
    """Whether a stored message travelled on the bus (the panel's records never do)."""
    return not isinstance(msg, Rating) and not (
        isinstance(msg, CallFailed) and msg.agent == "panel"
    )


class _Configured:
    """The provider address configured for whoever answered a stored message; :meth:`add`
    learns each conversation's counselor as the stored messages stream by."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.counselor_of: dict[str, str] = {}
        self.priced = False

    def add(self, msg: Message) -> None:
        """Take note of a stored message (a conversation's start names its counselor, needed
        only where the run that stored it left its calls unpriced)."""
        if isinstance(msg, CampaignStarted):
            self.priced = msg.priced_calls
        elif isinstance(msg, ConversationStarted) and not self.priced:
            self.counselor_of[msg.conversation] = msg.counselor_model

    def __call__(self, msg: Message) -> str:
        config, counselor_of = self.config, self.counselor_of
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


def _configured_model(config: Config, messages: Iterable[Message] = ()) -> _Configured:
    """The provider address configured for whoever answered a stored message (``messages``:
    stored ones to learn the counselors from; more with its ``add``)."""
    configured = _Configured(config)
    for msg in messages:
        configured.add(msg)
    return configured
