"""The counselor: the model under test, answering the client with a neutral system prompt."""

from __future__ import annotations

from typing import Final

from mhsafeeval.messages import ClientUtterance, CounselorReply, Usage, answers_of
from mhsafeeval.runtime import on
from mhsafeeval.runtime.providers import CallParams, ChatMessage, ModelCallError, ModelClient

from ._prompts import TranscriptAgent, call_seed, log, render

__all__ = ["DEFAULT_COUNSELOR_PROMPT", "CounselorAgent"]

DEFAULT_COUNSELOR_PROMPT: Final[str] = render("counselor_system")
"""A neutral counselor system prompt: supportive, and silent about any safety testing."""


class CounselorAgent(TranscriptAgent):
    """Puts the model under test in the counselor's chair.

    Consumes :class:`~mhsafeeval.messages.ClientUtterance` (and ``TurnCommitted``, folded
    into the transcript); publishes one :class:`~mhsafeeval.messages.CounselorReply` per
    utterance, carrying the utterance's category and role through for the judge.

    The model sees exactly what a counselor in a real session would: ``system_prompt``, the
    last ``context_turns`` committed turns as user/assistant pairs, then the utterance as the
    user turn. It never sees the target cell, the instruction or other uncommitted attempts.

    A provider's content-filter answer (``finish_reason="content_filter"``, possibly with
    empty text) is still a reply and is published as such: blocking is the deployed model's
    behaviour, and the judge scores it. So is a reply with no text (``length`` reached before
    any text, an empty answer): it is what the user would have seen. Both keep their finish
    reason in the reply, and metrics count them apart (``filtered_replies``,
    ``empty_replies``), so they never pass for ordinary replies. Only a
    :class:`~mhsafeeval.runtime.providers.ModelCallError` becomes a
    :class:`~mhsafeeval.messages.CallFailed` (agent ``"counselor"``), and nothing else.

    The reply's ``usage.latency_s`` is the whole call's: every attempt and backoff wait.

    Args:
        model: the model under test.
        system_prompt: the counselor's system prompt (keep it neutral: a prompt that mentions
            safety testing measures a different model).
        context_turns: how many of the last committed turns the model sees.

    Example:
        >>> from mhsafeeval.runtime import Runtime
        >>> def wire(rt: Runtime, model: ModelClient) -> None:
        ...     rt.register(
        ...         "counselor",
        ...         lambda aid: CounselorAgent(model, context_turns=5),
        ...         types=CounselorAgent.handled_types(),
        ...     )
    """

    role = "counselor"
    outcomes = answers_of("counselor")

    def __init__(
        self,
        model: ModelClient,
        *,
        system_prompt: str = DEFAULT_COUNSELOR_PROMPT,
        context_turns: int = 5,
    ) -> None:
        super().__init__(model, context_turns=context_turns)
        self.system_prompt = system_prompt

    def prompt(self, msg: ClientUtterance) -> list[ChatMessage]:
        """The chat sent to the model under test for ``msg``."""
        messages = [ChatMessage("system", self.system_prompt)]
        for ex in self.recent():
            messages += [ChatMessage("user", ex.client), ChatMessage("assistant", ex.counselor)]
        messages.append(ChatMessage("user", msg.text))
        return messages

    @on(ClientUtterance)
    async def reply(self, msg: ClientUtterance) -> None:
        """Answer one client utterance."""
        try:
            done = await self.model.complete(
                self.prompt(msg), CallParams(seed=call_seed(msg, self.role))
            )
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
