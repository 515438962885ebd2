"""The counselor: the model under test, answering the client with a neutral system prompt."""

from __future__ import annotations

import hashlib
import json
from typing import Final

from mhsafeeval.framework import on
from mhsafeeval.messages import CallFailed, ClientUtterance, CounselorReply, Usage, answers_of
from mhsafeeval.providers import CallParams, ChatMessage, ModelCallError, ModelClient

from ._prompts import TranscriptAgent, call_seed, log, render

__all__ = ["DEFAULT_COUNSELOR_PROMPT", "CounselorAgent", "session_id"]

DEFAULT_COUNSELOR_PROMPT: Final[str] = render("counselor_system")
"""A neutral counselor system prompt: supportive, and silent about any safety testing."""

_SESSION = b"mhsafeeval.sess"  # domain separation from call seeds


def session_id(msg: ClientUtterance, salt: str = "") -> str:
    """The session id of the conversation ``msg`` belongs to: the same for every call of one
    conversation of one campaign (in every run, so a resumed campaign goes on in the same
    session), and different across conversations, campaign names and ``salt``.

    A campaign passes a salt of its own (:func:`mhsafeeval.campaign.run_campaign`: the time the
    store first registered it), so two campaigns of the same name, e.g. one per release in CI,
    never continue each other's sessions in a stateful app.

    Example:
        >>> ids = {"campaign": "c", "conversation": "c/bot/p1/0", "category": "x", "role": "y"}
        >>> a, b = ClientUtterance(**ids, turn=1, text="hi"), ClientUtterance(**ids, text="so")
        >>> session_id(a) == session_id(b), session_id(a)[:4], len(session_id(a))
        (True, 'mhs-', 28)
        >>> session_id(a, "run-1") == session_id(a, "run-2")
        False
    """
    payload = json.dumps([msg.campaign, msg.conversation, salt], separators=(",", ":")).encode()
    return "mhs-" + hashlib.blake2b(payload, digest_size=12, person=_SESSION).hexdigest()


class CounselorAgent(TranscriptAgent):
    """Puts the model under test in the counselor's chair.

    Consumes :class:`~mhsafeeval.messages.ClientUtterance` (and ``TurnCommitted``, folded
    into the transcript); publishes one :class:`~mhsafeeval.messages.CounselorReply` per
    utterance, carrying the utterance's category and role through for the judge.

    The model sees exactly what a counselor in a real session would: ``system_prompt`` (no
    system message when it is ``None``), the last ``context_turns`` committed turns as
    user/assistant pairs, then the utterance as the user turn. It never sees the target cell,
    the instruction or other uncommitted attempts. Every call carries the conversation's
    :func:`session_id` (``CallParams.session_id``), which a stateful app uses to find its own
    history of the conversation.

    A provider's content-filter answer (``finish_reason="content_filter"``, possibly with
    empty text) is still a reply and is published as such: blocking is the deployed model's
    behaviour, and the judge scores it. So is a reply with no text (``length`` reached before
    any text, an empty answer): it is what the user would have seen. Both keep their finish
    reason in the reply, and metrics count them apart (``filtered_replies``,
    ``empty_replies``), so they never pass for ordinary replies. Only a
    :class:`~mhsafeeval.providers.ModelCallError` becomes a
    :class:`~mhsafeeval.messages.CallFailed` (agent ``"counselor"``), and nothing else.

    The reply's ``usage.latency_s`` is the whole call's: every attempt and backoff wait.

    Args:
        model: the model under test.
        system_prompt: the counselor's system prompt (keep it neutral: a prompt that mentions
            safety testing measures a different model); ``None``: no system message (an app
            under test that has a prompt of its own).
        context_turns: how many of the last committed turns the model sees.
        session_salt: mixed into every call's :attr:`CallParams.session_id`
            (:func:`session_id`).

    Example:
        >>> from mhsafeeval.framework import Runtime
        >>> def wire(rt: Runtime, model: ModelClient) -> None:
        ...     rt.register(
        ...         "counselor",
        ...         lambda aid: CounselorAgent(model, context_turns=5),
        ...         types=CounselorAgent.handled_types(),
        ...     )
    """

    role = "counselor"
    outcomes = answers_of("counselor")
    publishes = (*outcomes, CallFailed)

    def __init__(
        self,
        model: ModelClient,
        *,
        system_prompt: str | None = DEFAULT_COUNSELOR_PROMPT,
        context_turns: int = 5,
        session_salt: str = "",
    ) -> None:
        super().__init__(model, context_turns=context_turns)
        self.system_prompt = system_prompt
        self.session_salt = session_salt

    def prompt(self, msg: ClientUtterance) -> list[ChatMessage]:
        """The chat sent to the model under test for ``msg``."""
        prompt = self.system_prompt
        messages = [] if prompt is None else [ChatMessage("system", prompt)]
        for ex in self.recent():
            messages += [ChatMessage("user", ex.client), ChatMessage("assistant", ex.counselor)]
        messages.append(ChatMessage("user", msg.text))
        return messages

    @on(ClientUtterance)
    async def reply(self, msg: ClientUtterance) -> None:
        """Answer one client utterance."""
        try:
            params = CallParams(
                seed=call_seed(msg, self.role), session_id=session_id(msg, self.session_salt)
            )
            done = await self.model.complete(self.prompt(msg), params)
        except ModelCallError as exc:
            self.fail(msg, exc)
            return
        if done.finish_reason == "content_filter" or not done.text.strip():
            log.warning(
                "counselor.odd_reply", chars=len(done.text), finish_reason=done.finish_reason
            )
        else:
            log.info("counselor.reply", chars=len(done.text), finish_reason=done.finish_reason)
        self.publish(
            CounselorReply(
                **msg.child_ids(),
                category=msg.category,
                role=msg.role,
                text=done.text,
                finish_reason=done.finish_reason,
                usage=Usage.of(done),
            )
        )
