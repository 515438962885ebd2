"""Structured logs for people (console) or machines (JSON), with secrets scrubbed.

Logs are for people; the durable record is the event store. The campaign, conversation, turn,
attempt and agent are bound through contextvars by the runtime, so every line says where it
came from.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog

from ._redact import MASK, redact, register_secret
from ._text import visible

__all__ = ["configure_logging", "redact", "register_secret"]

_SECRET_KEYS = re.compile(r"(api[_-]?key|authorization|secret|password|token|x-api-key)$", re.I)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(k, str) and _SECRET_KEYS.search(k) else _scrub(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    return value


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if _SECRET_KEYS.search(key):
            event[key] = MASK
        else:
            event[key] = _scrub(event[key])
    return event


def _visible_processor(
    _: Any, __: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    # Console lines reach a terminal: names from a config and model text in them must not
    # emit escape sequences. Tracebacks keep their line breaks.
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = visible(value, keep_newlines=key == "exception")
    return event


def configure_logging(
    level: str = "info", *, json: bool = False, stream: TextIO | None = None
) -> None:
    """Set up structlog (and the stdlib root logger, for libraries) once per process.

    Args:
        level: minimum level name (debug, info, warning, error).
        json: one JSON object per line instead of the coloured console format.
        stream: where lines go (default: whatever ``sys.stderr`` is at each line, so that a
            live display that redirects stderr prints them above itself).
    """
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    out = stream or cast(TextIO, _CurrentStderr())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,  # render tracebacks before scrubbing them
            _redact_processor,
            *(() if json else (_visible_processor,)),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Libraries that use the stdlib (litellm, httpx) go through the same scrubbing.
    handler = logging.StreamHandler(out)
    handler.setFormatter(_RedactingFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))


class _CurrentStderr:
    # sys.stderr looked up at each write, not once at configure time.
    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))
