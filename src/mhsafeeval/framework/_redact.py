"""One redaction step for text that came from outside: keys never stored, logged or shown.

Two things are masked. The *values* of the environment variables a model table names as
secrets (``api_key_env``, ``extra_headers_env`` and any other ``*_env`` option), registered
when the model is opened (:func:`register_env_secrets`) or a provider reads them
(:func:`register_secret`); and strings shaped like keys (:data:`KEY_SHAPES`), whoever wrote
them. Error bodies and messages of failed calls, log lines and file excerpts quoted in error
lines pass :func:`redact`; the config's literal-credential check uses the same
:data:`KEY_SHAPES`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "KEY_SHAPES",
    "MASK",
    "excerpt",
    "redact",
    "register_env_secrets",
    "register_secret",
    "secret_variables",
]

MASK = "***"
KEY_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{16,}"  # OpenAI sk-/sk-proj-, Anthropic sk-ant-
    r"|AIza[0-9A-Za-z_-]{30,}"  # Google
    r"|gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}\b"  # AWS access key ids
    r"|gsk_[A-Za-z0-9]{20,}"  # Groq
    r"|r8_[A-Za-z0-9]{20,}"  # Replicate
    r"|xai-[A-Za-z0-9]{20,}"  # xAI
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r"|Bearer\s+[A-Za-z0-9._~+/=-]{16,})"
)
"""Strings shaped like API keys and tokens (one set: redaction and the config check)."""
# In text being redacted (an echoed header, an error body), whatever follows "Bearer" is a
# credential, however short; a config may still mention the word.
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.I)
_secrets: set[str] = set()
EXCERPT_CHARS = 80


def register_secret(value: str | None) -> None:
    """Mask this exact value in everything :func:`redact` sees from now on."""
    if value and len(value) >= 4:
        _secrets.add(value)


def secret_variables(api_key_env: str | None, options: Mapping[str, Any]) -> list[str]:
    """The environment variables a model table names as holding secrets: ``api_key_env`` and
    every ``*_env`` option (a variable name, or a table of them such as ``extra_headers_env``).

    Example:
        >>> secret_variables("MY_KEY", {"extra_headers_env": {"X-Token": "MY_TOKEN"}, "n": 1})
        ['MY_KEY', 'MY_TOKEN']
    """
    names = [api_key_env] if api_key_env else []
    for key, value in options.items():
        if not str(key).endswith("_env"):
            continue
        values = value.values() if isinstance(value, Mapping) else [value]
        names += [v for v in values if isinstance(v, str) and v]
    return names


def register_env_secrets(variables: Iterable[str]) -> None:
    """Register the current values of these environment variables (unset ones are skipped)."""
    for name in variables:
        register_secret(os.environ.get(name))


def redact(text: str) -> str:
    """``text`` with registered secrets, bearer tokens and key-shaped strings masked.

    Example:
        >>> redact("Authorization: Bearer abc123, key " + "sk-" + "x" * 20)
        'Authorization: Bearer ***, key ***'
    """
    for secret in sorted(_secrets, key=len, reverse=True):  # longest first: no partial masks
        if secret in text:
            text = text.replace(secret, MASK)
    text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    return KEY_SHAPES.sub(MASK, text)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """What an error line may quote of a file's contents: redacted, at most ``limit`` chars.

    Example:
        >>> excerpt("a" * 100, 10)
        'aaaaaaaaa…'
    """
    shown = redact(text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
