"""llama.cpp's own log (model loading, KV cache notes, warnings) routed to our log at debug level.

llama.cpp writes to stderr unless a callback is set, and llama-cpp-python's ``verbose=False`` does
not silence it all, so a campaign's progress display would be broken by its lines.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import structlog

__all__ = ["mute_llama_logs", "route_llama_logs"]

log = structlog.get_logger("mhsafeeval.providers.local")

_LLAMA_LEVELS = {1: "debug", 2: "info", 3: "warn", 4: "error"}  # ggml_log_level; 5 continues
_llama_log: dict[str, Any] = {"callback": None, "line": "", "level": "info", "muted": False}
_llama_log_lock = threading.Lock()


def _on_llama_log(level: int, text: bytes | None, _user_data: Any) -> None:
    """llama.cpp's log, a line at a time, to our log at debug level (it is for developers)."""
    if _llama_log["muted"]:
        return
    try:
        with _llama_log_lock:
            if level in _LLAMA_LEVELS:
                _llama_log["level"] = _LLAMA_LEVELS[level]
            buffered = _llama_log["line"] + (text or b"").decode("utf-8", "replace")
            *lines, _llama_log["line"] = buffered.split("\n")
            severity = _llama_log["level"]
        for line in lines:
            if line.strip():
                log.debug("llama_cpp.log", line=line, severity=severity)
    except Exception:  # pragma: no cover - an exception must never cross into C
        return


def route_llama_logs() -> None:
    """Send llama.cpp's (and ggml's) log through :func:`_on_llama_log`, once per process.

    ``verbose=False`` is not enough: llama-cpp-python 0.3.36 maps ggml's levels off by one, so
    warnings such as ``llama_kv_cache_iswa: using full-size SWA cache`` still reach stderr.
    """
    import llama_cpp

    with _llama_log_lock:
        if _llama_log["callback"] is None:
            callback = llama_cpp.llama_log_callback(_on_llama_log)
            llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
            _llama_log["callback"] = callback  # llama.cpp keeps only a raw pointer: keep it alive


def mute_llama_logs() -> None:
    """Drop llama.cpp's log from now on (at exit, when nobody is left to read it)."""
    _llama_log["muted"] = True
