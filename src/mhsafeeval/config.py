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

import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from mhsafeeval.errors import InputError, convert
from mhsafeeval.runtime.providers import ModelSettings

__all__ = ["CampaignSection", "Config", "LoggingSection", "load_config", "parse_config"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CampaignSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[campaign]``: what the campaign is called and the seed all its randomness derives from."""

    name: str = "campaign"
    seed: int = 0


class LoggingSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[logging]``: level and format of log lines (stderr)."""

    level: str = "info"
    json: bool = False

    def __post_init__(self) -> None:
        if self.level.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError("must be one of debug, info, warning, error, critical - at `$.level`")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole campaign config file."""

    campaign: CampaignSection = CampaignSection()
    models: dict[str, ModelSettings] = {}
    logging: LoggingSection = LoggingSection()


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


def _convert(data: dict[str, Any], source: str | Path) -> Config:
    models = data.get("models", {})
    if isinstance(models, dict):
        # Validate each table on its own: msgspec's paths do not name dict keys.
        for name, table in models.items():
            settings = convert(table, ModelSettings, source, f"models.{name}")
            _check_model(settings, source, f"models.{name}")
    return convert(data, Config, source)


def _check_model(settings: ModelSettings, source: str | Path, where: str) -> None:
    env = settings.api_key_env
    if env is not None and not _ENV_NAME.match(env):
        raise InputError(
            source,
            f"{where}.api_key_env",
            "must be the NAME of an environment variable holding the key (e.g. OPENAI_API_KEY), "
            "not the key itself",
        )
