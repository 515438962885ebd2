"""Campaign configuration: TOML decoded into msgspec Structs, with errors that say where.

Example ``campaign.toml``::

    [campaign]
    name = "smoke"
    seed = 7

    [models.counselor]
    provider = "litellm/openai/gpt-4o-mini"
    api_key_env = "OPENAI_API_KEY"     # the variable's name; the key itself is never stored
    timeout = 60
    max_concurrency = 4

    [logging]
    level = "info"
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from mhsafeeval.errors import InputError, convert
from mhsafeeval.runtime.providers import ModelSettings

__all__ = [
    "AGENT_ROLES",
    "RESUMABLE_CHANGES",
    "AblationSection",
    "BudgetSection",
    "CampaignSection",
    "Config",
    "LoggingSection",
    "SearchSection",
    "canonical_config",
    "check_runnable",
    "config_differences",
    "load_config",
    "parse_config",
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CampaignSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[campaign]``: what runs, how long, and the seed all its randomness derives from."""

    name: str = "campaign"
    seed: int = 0
    max_turns: int = 10
    max_attempts: int = 5
    conversations_per_profile: int = 1
    concurrency: int = 4
    threshold: int = 2
    context_turns: int = 5
    controller: str = "map-elites"
    profiles: str = "builtin"
    profile_ids: list[str] = []
    taxonomy: str = "builtin"
    counselor_system_prompt: str = ""
    judge: str = "rubric"
    judge_max_asks: int = 3

    def __post_init__(self) -> None:
        checks = (
            (self.max_turns >= 1, "max_turns", "must be >= 1"),
            (self.max_attempts >= 1, "max_attempts", "must be >= 1"),
            (self.conversations_per_profile >= 1, "conversations_per_profile", "must be >= 1"),
            (self.concurrency >= 1, "concurrency", "must be >= 1"),
            (1 <= self.threshold <= 5, "threshold", "must be between 1 and 5"),
            (self.context_turns >= 0, "context_turns", "must be >= 0"),
            (self.judge_max_asks >= 1, "judge_max_asks", "must be >= 1"),
            (bool(self.name.strip()), "name", "must not be empty"),
        )
        for ok, field, reason in checks:
            if not ok:
                raise ValueError(f"{reason} - at `$.{field}`")


class AblationSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[ablation]``: switches that re-run the paper's ablation table."""

    single_turn: bool = False
    no_role_conditioning: bool = False
    no_qd_search: bool = False


class BudgetSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[budget]``: optional campaign limits. On reaching one the campaign stops cleanly (no new
    model call starts, calls in flight are cancelled and redone on resume); re-running it with a
    larger limit continues it. Local and scripted models cost 0 USD; tokens are all roles'."""

    counselor_calls: int | None = None
    tokens: int | None = None
    usd: float | None = None

    def __post_init__(self) -> None:
        for field in ("counselor_calls", "tokens", "usd"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise ValueError(f"must be > 0 (leave it out for no limit) - at `$.{field}`")


RESUMABLE_CHANGES = ("budget", "logging", "campaign.concurrency")
"""Config keys a resumed campaign may change; any other difference is refused."""


class LoggingSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[logging]``: level and format of log lines (stderr)."""

    level: str = "info"
    json: bool = False

    def __post_init__(self) -> None:
        if self.level.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError("must be one of debug, info, warning, error, critical - at `$.level`")


class SearchSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[search]``: the tree search controller (``controller = "uct"``)."""

    simulations: int = 20
    in_flight: int = 4
    samples_per_action: int = 2
    exploration: float = 1.0
    empty_bonus: float = 0.2
    early_stop: bool = False
    depth: int = 1

    def __post_init__(self) -> None:
        checks = (
            (1 <= self.depth <= 4, "depth", "must be between 1 and 4"),
            (self.simulations >= 1, "simulations", "must be >= 1"),
            (self.in_flight >= 1, "in_flight", "must be >= 1"),
            (self.samples_per_action >= 1, "samples_per_action", "must be >= 1"),
            (self.exploration >= 0, "exploration", "must be >= 0"),
            (0 <= self.empty_bonus <= 1, "empty_bonus", "must be between 0 and 1"),
        )
        for ok, field, reason in checks:
            if not ok:
                raise ValueError(f"{reason} - at `$.{field}`")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole campaign config file."""

    campaign: CampaignSection = CampaignSection()
    ablation: AblationSection = AblationSection()
    search: SearchSection = SearchSection()
    budget: BudgetSection = BudgetSection()
    models: dict[str, ModelSettings] = {}
    counselors: dict[str, ModelSettings] = {}
    logging: LoggingSection = LoggingSection()

    def model_tables(self) -> list[tuple[str, ModelSettings]]:
        """Every model table with its key path (``models.judge``, ``counselors.my-bot``)."""
        tables = [(f"models.{n}", m) for n, m in self.models.items()]
        return tables + [(f"counselors.{n}", m) for n, m in self.counselors.items()]

    def model_for(self, role: str) -> ModelSettings:
        """The model an agent role uses: ``[models.ROLE]``, else ``[models.default]``."""
        settings = self.models.get(role) or self.models.get("default")
        if settings is None:
            raise KeyError(role)
        return settings


def parse_config(text: str, source: str | Path = "<config>") -> Config:
    """Decode config TOML text. ``source`` names the file in error messages.

    Raises:
        InputError: bad TOML, an unknown or missing key, a wrong type or value; the message
            names the file, the key path and the reason.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, None, f"not valid TOML: {exc}") from None
    return _convert(data, source)


def load_config(path: str | Path) -> Config:
    """Read and decode a config file (see :func:`parse_config`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(p, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(p, None, f"cannot read: {exc}") from None
    return parse_config(text, p)


AGENT_ROLES = ("client", "mutator", "judge", "refiner")
"""The agent roles that each need a model (``[models.ROLE]`` or ``[models.default]``)."""


def _convert(data: dict[str, Any], source: str | Path) -> Config:
    for section in ("models", "counselors"):
        tables = data.get(section, {})
        if isinstance(tables, dict):
            # Validate each table on its own: msgspec's paths do not name dict keys.
            for name, table in tables.items():
                settings = convert(table, ModelSettings, source, f"{section}.{name}")
                _check_model(settings, source, f"{section}.{name}")
    return convert(data, Config, source)


def canonical_config(config: Config, inputs: dict[str, str] | None = None) -> str:
    """The effective config as canonical JSON (sorted keys): what a campaign stores to tell, on
    resume, whether it is run with the same settings (overrides such as ``--controller``
    included). ``inputs``: fingerprints of what the config points to (taxonomy, profiles),
    stored under ``inputs`` so that an edited file is noticed too."""
    data = msgspec.to_builtins(config)
    if inputs:
        data["inputs"] = dict(inputs)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def config_differences(stored: str, now: Config, inputs: dict[str, str] | None = None) -> list[str]:
    """What differs between a stored :func:`canonical_config` and ``now`` (with its
    ``inputs``), as ``"key.path: stored X, now Y"`` lines, leaving out
    :data:`RESUMABLE_CHANGES`. A stored text that is not canonical JSON (written by an older
    version) is one difference."""
    try:
        before = json.loads(stored)
    except ValueError:
        before = None
    if not isinstance(before, dict):
        return ["the stored configuration predates resumable campaigns"]
    after = json.loads(canonical_config(now, inputs))
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if any(path == k or path.startswith(k + ".") for k in RESUMABLE_CHANGES):
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            out.append(f"{path}: stored {json.dumps(a)}, now {json.dumps(b)}")

    walk(before, after, "")
    return out


def check_runnable(config: Config, source: str | Path = "<config>") -> None:
    """What a campaign needs beyond a well-formed file: counselors and a model for each role.

    Raises:
        InputError: naming the missing table.
    """
    if not config.counselors:
        raise InputError(
            source, "counselors", "no counselor model to evaluate: add a [counselors.NAME] table"
        )
    unknown = set(config.models) - {*AGENT_ROLES, "default"}
    if unknown:
        raise InputError(
            source,
            f"models.{sorted(unknown)[0]}",
            f"unknown agent role (roles: {', '.join(AGENT_ROLES)}, or default)",
        )
    for role in AGENT_ROLES:
        if role not in config.models and "default" not in config.models:
            raise InputError(
                source, f"models.{role}", "no model for this role and no [models.default]"
            )


def _check_model(settings: ModelSettings, source: str | Path, where: str) -> None:
    env = settings.api_key_env
    if env is not None and not _ENV_NAME.match(env):
        raise InputError(
            source,
            f"{where}.api_key_env",
            "must be the NAME of an environment variable holding the key (e.g. OPENAI_API_KEY), "
            "not the key itself",
        )
