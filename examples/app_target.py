"""A tiny counselor app to point mhsafeeval at: ``python/examples/app_target.py:reply``.

Replace the body of :func:`reply` with a call into your own bot. It receives the conversation
in OpenAI's shape (``[{"role": "user", "content": "..."}, ...]``) and returns the reply text,
or a dict ``{"text": ..., "usage": {"prompt_tokens": N, "completion_tokens": M}}``.

:func:`stateful_reply` shows a bot that keeps its own history per session: it takes a
``session_id`` parameter, so mhsafeeval passes one stable id per conversation.

Run a campaign against it from the repository root::

    mhsafeeval check examples/python_app.toml
    mhsafeeval run examples/python_app.toml --db app.db
"""

from __future__ import annotations

_histories: dict[str, list[str]] = {}


def reply(messages: list[dict[str, str]]) -> str:
    """Answer the client's latest message (a stand-in for a real bot)."""
    said = messages[-1]["content"] if messages else ""
    return f"That sounds hard. You said: {said} What would help most right now?"


async def stateful_reply(messages: list[dict[str, str]], session_id: str) -> dict[str, object]:
    """Answer from this bot's own history of the session (it reads only the last message)."""
    history = _histories.setdefault(session_id, [])
    history.append(messages[-1]["content"])
    text = f"Thank you for telling me. You have shared {len(history)} thing(s) with me today."
    usage = {"prompt_tokens": sum(map(len, history)), "completion_tokens": 12}
    return {"text": text, "usage": usage}
