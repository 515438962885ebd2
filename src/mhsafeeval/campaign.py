"""The campaign builder: the composition root that wires every layer into one run.

One campaign = counselor models x client profiles x conversations per profile. Each
conversation gets its own client, mutator, counselor, judge and refiner instances (one per
conversation, created on first message); one search controller sees every conversation and owns
one harm archive per counselor model; a scheduler keeps ``concurrency`` conversations going; the
event store records every message.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

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
from mhsafeeval.errors import InputError
from mhsafeeval.judges import JUDGES, PANEL_INPUTS, ReplyFold, RubricJudge, failed_rater
from mhsafeeval.judges import rater_address as _rater_address
from mhsafeeval.messages import (
    ANSWERED_BY,
    ArchiveUpdated,
    CallFailed,
    CampaignFinished,
    CampaignStarted,
    ClientUtterance,
    ConversationFinished,
    ConversationStarted,
    CounselorReply,
    Message,
    Rating,
    TurnCommitted,
    Verdict,
)
from mhsafeeval.rejudge import RatingPool, RatingStats, raters_for
from mhsafeeval.runtime import AgentId, HandlerFailed, PluginNotFound, Runtime
from mhsafeeval.runtime.providers import (
    ModelClient,
    ModelSettings,
    ResilientClient,
    open_model,
)
from mhsafeeval.runtime.providers._registry import settings_problems
from mhsafeeval.search import CONTROLLERS, LoopSettings
from mhsafeeval.storage import EventStore
from mhsafeeval.taxonomy import Taxonomy, builtin_taxonomy, load_taxonomy, taxonomy_to_text

__all__ = [
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


class CampaignResult(msgspec.Struct, kw_only=True):
    """How a run ended."""

    campaign: str
    status: str
    conversations: int
    finished: int
    failed: int
    events_written: int
    resumed_from: int = 0
    """Events already stored when this run started (0: a fresh campaign)."""
    redone: int = 0
    """Stored messages whose unfinished work this run did again (the calls in flight when the
    previous run stopped)."""
    budget: str | None = None
    """The ``[budget]`` limit that stopped the run (status ``stopped_budget``), else None."""
    spent: str = ""
    """Counselor calls, tokens and USD spent by the whole campaign so far, against the limits."""
    panel: RatingStats | None = None
    """What the ``[judges]`` panel did in this run (None: no panel)."""


class _Plan(msgspec.Struct, frozen=True):
    taxonomy: Taxonomy
    conversations: tuple[ConversationSpec, ...]


def _resolve(path: str, base: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base is None else base / p


def build_plan(config: Config, source: str | Path = "<config>") -> _Plan:
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
        CONTROLLERS.get(c.controller)
        JUDGES.get(c.judge)
    except PluginNotFound as exc:
        field = "campaign.controller" if "controller" in str(exc) else "campaign.judge"
        raise InputError(source, field, str(exc)) from None
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
    return _Plan(taxonomy, specs)


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
    config: Config, source: str | Path = "<config>", *, plan: _Plan | None = None
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
    factory = CONTROLLERS.get(c.controller)
    if getattr(factory, "uses_refiner", True):
        low_attempts, high_attempts = turns, turns * c.max_attempts
        refined = turns * (c.max_attempts - 1)
    else:  # tree search: a fixed number of simulations per turn, no refiner
        low_attempts = high_attempts = turns * config.search.simulations
        refined = 0
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


class _History:
    """What a store already holds of a campaign: the input of a resumed run."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.ids = {m.id for m in messages}
        self.children: dict[str, list[Message]] = {}
        for m in messages:
            if m.causation:
                self.children.setdefault(m.causation, []).append(m)
        self.started = [m.conversation for m in messages if isinstance(m, ConversationStarted)]
        self.finished = {
            m.conversation: m.status for m in messages if isinstance(m, ConversationFinished)
        }
        self.broken = {m.conversation: m for m in messages if isinstance(m, HandlerFailed)}
        self.outcome = next(
            (
                m
                for m in reversed(messages)
                if isinstance(m, CampaignFinished) and m.key == "finish"
            ),
            None,
        )


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def taxonomy_fingerprint(taxonomy: Taxonomy) -> str:
    """The digest a campaign stores of its taxonomy (``inputs.taxonomy``): every cell and
    ladder, so a taxonomy that differs in anything a judge is shown differs here."""
    return _digest(taxonomy_to_text(taxonomy, detail=True).encode())


def _fingerprints(plan: _Plan) -> dict[str, str]:
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


async def _history(
    store: EventStore, config: Config, source: str | Path, plan: _Plan
) -> _History | None:
    """The stored part of this campaign, or None if the store has none; a stored campaign
    with a different config is an InputError naming the differences."""
    name = config.campaign.name
    info = next((c for c in await store.list_campaigns() if c.id == name), None)
    if info is None or info.event_count == 0:
        return None
    differences = config_differences(info.config, config, _fingerprints(plan))
    if differences:
        shown = "; ".join(differences[:8]) + ("; ..." if len(differences) > 8 else "")
        raise InputError(
            source,
            differences[0].split(":", 1)[0],
            f"campaign {name!r} is already stored with a different configuration, so it cannot "
            f"be resumed with this one ({shown}). Use the configuration it was started with, "
            "or a new --db or campaign.name",
        )
    messages = [e.message async for e in store.events(name) if e.message is not None]
    retry = _failed_turns(messages)
    if retry:
        moved = await store.supersede(name, {m.id for m in retry})
        log.info("campaign.retrying_failed_turns", superseded=moved)
        gone = {m.id for m in retry}
        messages = [m for m in messages if m.id not in gone]
    return _History(messages)


def _failed_turns(messages: list[Message]) -> list[Message]:
    """What to move aside so that each failed conversation picks up where it stopped.

    * A role that never answered (a judge, client, mutator or refiner call that failed for
      good: :attr:`CallFailed.owed`), or a conversation that stalled: only those failure
      records and the conversation's end record. The replay then finds the messages they
      answered unanswered and hands them to their agents again, so a stored counselor reply
      is judged without calling the counselor again, and the turn goes on from there.
    * Otherwise, a turn that changed nothing shared (no verdict: usually no counselor call of
      the turn got an answer): that turn's events, so the turn is retried from its start.
    * A failure after verdicts (a crashed handler, say) stays as it is, since the archive
      already learnt from that turn.

    The campaign's end record goes too whenever anything is moved.
    """
    ended = {
        m.conversation: m
        for m in messages
        if isinstance(m, ConversationFinished) and m.status in ("failed", "stalled")
    }
    if not ended:
        return []
    tails: dict[str, list[Message]] = {c: [] for c in ended}
    for m in messages:
        end = ended.get(m.conversation)
        if end is not None and m.turn >= end.turn and not isinstance(m, ConversationStarted):
            tails[m.conversation].append(m)
    out: list[Message] = []
    for conversation, tail in tails.items():
        owed = [m for m in tail if isinstance(m, CallFailed) and m.owed and m.agent != "panel"]
        if owed or ended[conversation].status == "stalled":
            out += owed
            out += [m for m in tail if isinstance(m, ConversationFinished)]
        elif not any(isinstance(m, Verdict | ArchiveUpdated) for m in tail):
            out += tail
    if out:
        out += [m for m in messages if isinstance(m, CampaignFinished) and m.key == "finish"]
    return out


class Scheduler:
    """Keeps ``concurrency`` conversations running; sets ``done`` when the last one ends.

    It is an observer, not an agent, so that it also sees the events of a conversation the
    runtime cancelled after a handler failed: such a conversation is finished as ``failed``
    (its ConversationFinished is stored) and the campaign goes on with the next one.
    """

    def __init__(
        self,
        specs: tuple[ConversationSpec, ...],
        campaign: str,
        max_turns: int,
        concurrency: int,
        history: _History | None = None,
    ) -> None:
        done = history.finished if history is not None else {}
        started = set(history.started) if history is not None else set()
        self.pending = [s for s in reversed(specs) if s.id not in started]
        self.campaign = campaign
        self.max_turns = max_turns
        self.concurrency = concurrency
        self.running: set[str] = {s.id for s in specs if s.id in started and s.id not in done}
        self.finished = len(done)
        self.failed = sum(status != "completed" for status in done.values())
        self.total = len(specs)
        self.done = anyio.Event()
        self._runtime: Runtime | None = None
        self._failing: set[str] = set()
        self.pending_failures: list[HandlerFailed] = []  # stored, not yet closed (resume)
        self._started = False

    def attach(self, runtime: Runtime) -> None:
        """Subscribe to the runtime. Do it before a resumed run replays its history: the
        replay publishes what the stored decisions lead to, a conversation's
        ConversationFinished among them, and one missed would be waited for forever."""
        self._runtime = runtime
        runtime.subscribe(self, name="scheduler", types=(ConversationFinished, HandlerFailed))

    def start(self) -> None:
        """Close conversations a stored handler failure left open; start the first ones."""
        self._started = True
        for failure in self.pending_failures:
            self(failure)
        self._start_more()

    def _start_more(self) -> None:
        assert self._runtime is not None
        if not self._started:
            return
        while self.pending and len(self.running) < self.concurrency:
            spec = self.pending.pop()
            self.running.add(spec.id)
            self._runtime.publish(
                ConversationStarted(
                    campaign=self.campaign,
                    conversation=spec.id,
                    counselor_model=spec.counselor,
                    profile_id=spec.profile.id,
                    index=spec.index,
                    max_turns=self.max_turns,
                    style=spec.style,
                )
            )
        if not self.running and not self.pending:
            self.done.set()

    def stall(self) -> int:
        """Close every running conversation as ``stalled``: call it when the runtime is idle
        with conversations open (no message queued, no handler running: nothing will ever
        move them, e.g. a plugin that forgot to publish). Returns how many were closed."""
        assert self._runtime is not None
        stalled = sorted(self.running - self._failing)
        for conversation in stalled:
            self._failing.add(conversation)
            last = self._runtime.last_message(conversation)
            seen = (
                f"{last.tag} (turn {last.turn}, attempt {last.attempt}"
                + (f", branch {last.branch}" if last.branch else "")
                + ")"
                if last is not None
                else "nothing"
            )
            log.error("campaign.conversation_stalled", conversation=conversation, last=seen)
            self._runtime.publish(
                ConversationFinished(
                    campaign=self.campaign,
                    conversation=conversation,
                    turn=last.turn if last is not None else 0,
                    key="stalled",
                    causation=last.id if last is not None else "",
                    turns=last.turn if last is not None else 0,
                    status="stalled",
                    detail=(
                        "stalled: every agent went idle with the conversation open (an agent "
                        f"or controller that never answered); the last message it got was {seen}"
                    ),
                )
            )
        return len(stalled)

    def __call__(self, msg: Message) -> None:
        assert self._runtime is not None
        if msg.conversation not in self.running:
            return
        if isinstance(msg, HandlerFailed):
            if msg.conversation in self._failing:
                return  # one failed ConversationFinished per conversation
            self._failing.add(msg.conversation)
            self._runtime.publish(
                ConversationFinished(
                    **msg.child_ids(key="scheduler"),
                    turns=msg.turn,
                    status="failed",
                    detail=f"{msg.agent} failed: {msg.error_type}: {msg.error}",
                )
            )
            return
        assert isinstance(msg, ConversationFinished)
        self.running.discard(msg.conversation)
        self.finished += 1
        self.failed += msg.status != "completed"
        self._runtime.end_conversation(msg.conversation)
        self._start_more()


async def run_campaign(
    config: Config,
    store: EventStore,
    *,
    source: str | Path = "<config>",
    config_text: str = "",
    observers: tuple[Callable[[Message], Any], ...] = (),
    open_client: Callable[[ModelSettings], ResilientClient] = open_model,
    plan: _Plan | None = None,
) -> CampaignResult:
    """Run a whole campaign, storing every message in ``store`` (already open).

    If the store already holds this campaign (same name), the run **resumes** it: the stored
    messages are replayed into the agents' and the controller's state (transcripts, archives,
    refiner notes, UCT trees, RNG draws), in stored order, without any model call; decisions
    the stopped run made but had not stored are published again, and each stored message whose
    answer is missing (the calls in flight when it stopped) is handed to its agent again.
    Finished conversations are left alone and the others continue. A campaign that already
    finished is returned as it is.

    Raises:
        InputError: a bad taxonomy, profile set, controller or judge name, or a stored campaign
            of this name with another configuration (before any write).
    """
    plan = plan if plan is not None else build_plan(config, source)
    check_prices(config, source)
    history = await _history(store, config, source, plan)
    c, a = config.campaign, config.ablation
    cells = plan.taxonomy.cell_ids()
    settings = LoopSettings(
        seed=c.seed,
        max_attempts=c.max_attempts,
        threshold=c.threshold,
        single_turn=a.single_turn,
        role_conditioning=not a.no_role_conditioning,
        qd_search=not a.no_qd_search,
        simulations=config.search.simulations,
        in_flight=config.search.in_flight,
        samples_per_action=config.search.samples_per_action,
        exploration=config.search.exploration,
        empty_bonus=config.search.empty_bonus,
        early_stop=config.search.early_stop,
    )
    specs = {spec.id: spec for spec in plan.conversations}
    clients: dict[str, ResilientClient] = {}

    def client_for(key: str, model: ModelSettings) -> ResilientClient:
        # One client (one concurrency limit) per distinct model settings.
        ident = msgspec.json.encode(model).decode()
        if ident not in clients:
            clients[ident] = open_client(model)
        return clients[ident]

    budget = Budget(
        config.budget,
        history.messages if history is not None else (),
        _configured_model(config, history.messages if history is not None else []),
    )
    roles: dict[str, ModelClient] = {
        role: client_for(role, config.model_for(role))
        for role in ("client", "mutator", "judge", "refiner")
    }
    counselors: dict[str, ModelClient] = {
        name: client_for(name, m) for name, m in config.counselors.items()
    }
    if budget.limited:  # every call goes through the budget, counselor calls counted apart
        roles = {r: BudgetedModel(m, budget, counselor=False) for r, m in roles.items()}
        counselors = {n: BudgetedModel(m, budget, counselor=True) for n, m in counselors.items()}
    for observer in observers:  # a progress display reads retry counts from the clients
        attach = getattr(observer, "attach_clients", None)
        if attach is not None:
            attach(clients.values())
    make_judge = JUDGES.get(c.judge)
    make_controller = CONTROLLERS.get(c.controller)
    system_prompt = c.counselor_system_prompt or DEFAULT_COUNSELOR_PROMPT

    def spec(agent_id: AgentId) -> ConversationSpec:
        return specs[agent_id.key]

    resumed_from = len(history.messages) if history is not None else 0
    panel = _panel(config, plan.taxonomy, store, history, resumed_from, client_for, budget)
    if history is not None and history.outcome is not None:
        finished = len(history.finished)
        failed = sum(status != "completed" for status in history.finished.values())
        log.info("campaign.already_finished", status=history.outcome.status, events=resumed_from)
        if panel is not None and panel.pending:  # a panel added later, or failed ratings
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(panel.serve)
                    await _until_rated(panel, budget.stop)
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    for model in clients.values():
                        await model.aclose()
                    await store.flush()
        return CampaignResult(
            campaign=c.name,
            status=history.outcome.status,
            conversations=len(specs),
            finished=finished,
            failed=failed,
            events_written=store.stats.written,
            resumed_from=resumed_from,
            panel=panel.stats if panel is not None else None,
            budget=budget.reached,
            spent=budget.spent(),
        )
    if budget.reached is not None:  # the stored part already spent a limit: start nothing
        done = history.finished if history is not None else {}
        return CampaignResult(
            campaign=c.name,
            status="stopped_budget",
            conversations=len(specs),
            finished=len(done),
            failed=sum(status != "completed" for status in done.values()),
            events_written=0,
            resumed_from=resumed_from,
            budget=budget.reached,
            spent=budget.spent(),
        )
    await store.register_campaign(c.name, canonical_config(config, _fingerprints(plan)))
    scheduler = Scheduler(
        plan.conversations, c.name, 1 if a.single_turn else c.max_turns, c.concurrency, history
    )
    status = "interrupted"
    redone = 0
    try:
        async with Runtime() as rt, anyio.create_task_group() as panel_tasks:
            rt.subscribe(store.append, name="store", critical=True)
            if panel is not None:  # ratings go to the store only: nothing on the bus sees them
                await panel_tasks.start(panel.serve)
                rt.subscribe(
                    lambda m: panel.submit(panel.fold.add(m)), name="panel", types=PANEL_INPUTS
                )
            for i, observer in enumerate(observers):
                rt.subscribe(observer, name=f"observer{i}", replay=True)
            rt.register(
                "mutator",
                lambda aid: MutatorAgent(
                    roles["mutator"],
                    plan.taxonomy,
                    spec(aid).profile,
                    context_turns=c.context_turns,
                ),
                types=MutatorAgent.handled_types(),
            )
            rt.register(
                "client",
                lambda aid: ClientAgent(
                    roles["client"],
                    spec(aid).profile,
                    context_turns=c.context_turns,
                    style=spec(aid).style,
                ),
                types=ClientAgent.handled_types(),
            )
            rt.register(
                "counselor",
                lambda aid: CounselorAgent(
                    counselors[spec(aid).counselor],
                    system_prompt=system_prompt,
                    context_turns=c.context_turns,
                ),
                types=CounselorAgent.handled_types(),
            )
            rt.register(
                "judge",
                lambda aid: make_judge(
                    roles["judge"],
                    plan.taxonomy,
                    context_turns=c.context_turns,
                    max_asks=c.judge_max_asks,
                    threshold=c.threshold,
                ),
                types=JUDGE_INPUTS,
            )
            if getattr(make_controller, "uses_refiner", True):
                rt.register(
                    "refiner",
                    lambda aid: RefinerAgent(roles["refiner"], refinement=settings.refinement),
                    types=RefinerAgent.handled_types(),
                )
            rt.add(make_controller(cells, settings), name="controller")
            scheduler.attach(rt)
            if history is not None:
                redone = _resume(rt, history, scheduler)
            else:
                rt.publish(
                    CampaignStarted(
                        campaign=c.name,
                        key="start",
                        config=config_text,
                        cells=tuple(cells),
                        threshold=c.threshold,
                        planned_conversations=len(specs),
                        max_turns=1 if a.single_turn else c.max_turns,
                    )
                )
            scheduler.start()
            await _until_done(rt, scheduler, budget.stop)
            if not scheduler.done.is_set():
                # A limit was reached: no call starts any more. Let the calls in flight finish
                # (up to a minute) and their messages reach the store, then stop everything.
                with anyio.move_on_after(60):
                    await budget.drained()
                await rt.observers_caught_up()
                raise _BudgetReached(budget.reached or "budget")
            await rt.run_until_idle()
            if panel is not None and not await _until_rated(panel, budget.stop):
                raise _BudgetReached(budget.reached or "budget")
            status = "completed" if scheduler.failed == 0 else "completed_with_failures"
            rt.publish(
                CampaignFinished(
                    campaign=c.name,
                    key="finish",
                    status=status,
                    detail=f"{scheduler.failed} conversation(s) failed",
                )
            )
            await rt.run_until_idle()
            if panel is not None:
                panel.close()
    except BaseException as exc:
        budget_stop = _is_budget_stop(exc)  # stopped cleanly at a limit: not an error
        if budget_stop:
            status, detail = "stopped_budget", f"{budget.reached} reached: {budget.spent()}"
        else:  # Ctrl-C or a crash: say so in the record
            status = "interrupted" if not isinstance(exc, Exception) else "failed"
            detail = f"{type(exc).__name__}: {exc}"[:500]
        with anyio.CancelScope(shield=True):
            await store.append(
                CampaignFinished(
                    campaign=c.name,
                    # Not "finish": a resumed run still records how it ends.
                    key=f"stopped:{resumed_from}+{store.stats.appended}",
                    status=status,
                    detail=detail,
                )
            )
        if not budget_stop:
            raise
    finally:
        with anyio.CancelScope(shield=True):
            for model in clients.values():
                await model.aclose()
            await store.flush()
    return CampaignResult(
        campaign=c.name,
        status=status,
        conversations=len(specs),
        finished=scheduler.finished,
        failed=scheduler.failed,
        events_written=store.stats.written,
        resumed_from=resumed_from,
        redone=redone,
        budget=budget.reached,
        spent=budget.spent(),
        panel=panel.stats if panel is not None else None,
    )


def _panel(
    config: Config,
    taxonomy: Taxonomy,
    store: EventStore,
    history: _History | None,
    run: int,
    client_for: Callable[[str, ModelSettings], ModelClient],
    budget: Budget,
) -> RatingPool | None:
    """The ``[judges]`` panel's rating pool (None: no panel), with the stored judged replies
    it has not rated yet (a panel added to a stored campaign rates the old replies too)
    already submitted. It rates a reply once its turn is committed (or its conversation has
    ended), with the search judge's settings (context, re-asks, threshold), every call
    through the budget; a call that fails for good is stored as ``CallFailed(agent="panel")``
    and asked again by the next run."""
    members = config.judges.panel
    if not members:
        return None
    c = config.campaign
    fold = ReplyFold(c.context_turns)
    backlog = [item for m in (history.messages if history else ()) for item in fold.add(m)]
    raters = []
    for name, settings in members.items():
        model = client_for(f"judges.panel.{name}", settings)
        if budget.limited:
            model = BudgetedModel(model, budget, counselor=False)
        judge = RubricJudge(
            model,
            taxonomy,
            context_turns=c.context_turns,
            max_asks=c.judge_max_asks,
            name=settings.provider,
            threshold=c.threshold,
        )
        raters += raters_for(settings.provider, config.judges.samples, judge)
    pool = RatingPool(
        fold,
        raters,
        store.append,
        source="panel",
        run=str(run),
        workers=sum(m.max_concurrency for m in members.values()),
    )
    pool.submit(backlog)
    return pool


async def _until_rated(pool: RatingPool, stop: anyio.Event) -> bool:
    """Wait until ``pool`` has done what was submitted (True) or a budget limit is reached
    first (False: its calls would wait for ever)."""
    done = False
    async with anyio.create_task_group() as tg:

        async def rated() -> None:
            nonlocal done
            await pool.join()
            done = True
            tg.cancel_scope.cancel()

        async def stopped() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(rated)
        tg.start_soon(stopped)
    return done


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


class _BudgetReached(Exception):
    """Raised inside the runtime to cancel what is in flight when a budget limit is reached."""


def _is_budget_stop(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):  # the runtime's task group wraps it
        return all(_is_budget_stop(e) for e in exc.exceptions)
    return isinstance(exc, _BudgetReached)


async def _until_done(rt: Runtime, scheduler: Scheduler, stop: anyio.Event) -> None:
    """Return once every conversation has ended or ``stop`` (a budget limit) is set.

    A runtime that goes idle while conversations are open will never move them again: those
    conversations are closed as ``stalled`` (naming the last message each one got), never
    waited for forever.
    """
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while not scheduler.done.is_set():
                await rt.run_until_idle()
                if scheduler.done.is_set() or stop.is_set():
                    return
                if not scheduler.stall():
                    # Idle, not done, nothing to close: the scheduler itself stopped
                    # hearing ends (it failed and was detached). Never wait forever.
                    raise RuntimeError(
                        f"the runtime went idle with {len(scheduler.running)} conversation(s) "
                        "open that the scheduler had already closed"
                    )

        tg.start_soon(wait, scheduler.done)
        tg.start_soon(wait, stop)
        tg.start_soon(watch)


def _resume(rt: Runtime, history: _History, scheduler: Scheduler) -> int:
    """Replay a stored campaign into the runtime's agents and restart its unfinished work;
    returns how many stored messages were handed to an agent again."""
    started = time.perf_counter()
    rt.begin_replay(history.ids)
    for msg in history.messages:
        if _on_bus(msg):
            rt.replay(msg)
    suppressed, fresh = rt.end_replay()
    replay_s = time.perf_counter() - started
    live = scheduler.running - set(history.broken)
    redone = 0
    for msg in history.messages:
        if msg.conversation in live and _on_bus(msg):
            children = [m for m in history.children.get(msg.id, ()) if _on_bus(m)]
            redone += bool(rt.redo(msg, children))
    log.info(
        "campaign.resumed",
        stored=len(history.messages),
        finished=len(history.finished),
        continuing=len(live),
        republished=len(fresh),
        redone=redone,
        replayed_decisions=suppressed,
        replay_s=round(replay_s, 2),
    )
    for conversation in scheduler.running & set(history.broken):
        # A handler failed and the run stopped before the conversation was closed: close it.
        rt.cancel_conversation(conversation)
        scheduler.pending_failures.append(history.broken[conversation])
    return redone
