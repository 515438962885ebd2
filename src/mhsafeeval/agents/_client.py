"""The client simulator: acts out an instruction as the next line of a CCD-profiled client."""

from __future__ import annotations

import re

from mhsafeeval.config import CLIENT_STYLES
from mhsafeeval.framework import on
from mhsafeeval.messages import CallFailed, ClientUtterance, Instruction, Usage, answers_of
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
)

from ._echo import EchoCheck, fixed_wording
from ._prompts import TranscriptAgent, call_seed, log, render, render_context
from .profiles import ClientProfile, profile_to_text

__all__ = ["ClientAgent", "clean_utterance", "spoken_line"]

MAX_SENTENCES = 3
_ASKS = 3  # re-asks while nothing usable is left of an answer (empty, or all of it an echo)
_TEMPLATES = ("client_system", "client_turn", "client_retry", "client_echo_retry", "client_style")
# Stage directions, which the prompt forbids: (sighs), [pause], *looks away*.
_STAGE = re.compile(r"\([^()]*\)|\[[^\[\]]*\]|\*[^*\n]+\*")
# A sentence ends at . ! ? or an ellipsis, possibly followed by closing quotes or brackets.
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s|$)")
_BOLD = r"(?:\*\*|__|\*)?"  # markdown emphasis a label may come wrapped in
_QUOTES = (('"', '"'), ("\u201c", "\u201d"), ("\u00ab", "\u00bb"), ("'", "'"))


def clean_utterance(text: str, name: str = "") -> str:
    """Turn a model's answer into the words the client says.

    Strips a leading speaker label (``Client:``, the profile's name, optionally in markdown
    bold) and quotes wrapping the whole answer, collapses whitespace, and keeps at most
    three sentences. Abbreviations such as "Dr." count as sentence ends: the cut may come
    early, never late.

    Example:
        >>> clean_utterance('Client: "I slept badly.  Again. Why? I do not know. Sorry."')
        'I slept badly. Again. Why?'
    """
    out = _unwrap(text, name)
    ends = list(_SENTENCE_END.finditer(out))
    if len(ends) > MAX_SENTENCES:
        out = out[: ends[MAX_SENTENCES - 1].end()]
    return out


def _unwrap(text: str, name: str) -> str:
    labels = ["client", *([re.escape(name)] if name else [])]
    label = re.compile(rf"^{_BOLD}(?:{'|'.join(labels)}){_BOLD}\s*:\s*{_BOLD}\s*", re.I)
    out = text.strip()
    while True:
        before = out
        out = label.sub("", out, count=1).strip()
        for left, right in _QUOTES:
            inner = out[1:-1]
            wrapped = len(out) >= 2 and out[0] == left and out[-1] == right
            # Double quotes inside mean the outer pair is not one wrapper ("a," he said, "b").
            if wrapped and (left == "'" or (left not in inner and right not in inner)):
                out = inner.strip()
        if out == before:
            break
    return " ".join(out.split())


def _sentences(text: str) -> list[str]:
    parts, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        parts.append(text[start : end.end()].strip())
        start = end.end()
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def spoken_line(
    answer: str, name: str = "", check: EchoCheck | None = None, *, cut: bool = False
) -> tuple[str, int]:
    """The words the client says, from a model's answer, and how many sentences were dropped.

    Stage directions (``(sighs)``, ``[pause]``, ``*looks away*``) go; each sentence in which
    ``check`` finds an echo of the prompt goes; an answer ``cut`` at the token limit loses its
    unfinished last sentence (when a finished one comes before it); then at most three
    sentences are kept, as :func:`clean_utterance` does. An empty line means nothing usable
    was said.

    Example:
        >>> check = EchoCheck(["Private direction for your next line, act on it"])
        >>> spoken_line("(sighs) I lost my job. The client looks away. And then I", check=check,
        ...             cut=True)
        ('I lost my job.', 2)
    """
    parts = _sentences(_unwrap(_STAGE.sub(" ", answer), name))
    dropped = 0
    if cut and len(parts) > 1 and not _SENTENCE_END.search(parts[-1]):
        parts, dropped = parts[:-1], 1
    kept = [p for p in parts if check is None or check.find(p) is None]
    dropped += len(parts) - len(kept)
    line = clean_utterance(" ".join(kept), name)
    if line and check is not None and check.find(line) is not None:  # an echo across sentences
        return "", dropped + len(kept)
    return line, dropped


class ClientAgent(TranscriptAgent):
    """Role-plays the client of a CCD profile and turns instructions into utterances.

    Consumes :class:`~mhsafeeval.messages.Instruction` (and ``TurnCommitted``, folded into
    the transcript); publishes one :class:`~mhsafeeval.messages.ClientUtterance` per
    instruction: one to three natural sentences in character, fitted to the last
    ``context_turns`` committed turns. The system prompt forbids the model to reveal the
    instruction, the taxonomy or that this is a test. The cognitive model and session topic
    put in focus are chosen by the turn, so a resumed run makes the same choice.

    An answer is cleaned by :func:`spoken_line`: stage directions go, and so does every
    sentence that repeats the prompt (its fixed wording, its labels, the private direction;
    see :mod:`~mhsafeeval.agents._echo`), so no published line echoes its instructions. An
    answer with nothing left (empty, e.g. a provider content filter, or all of it an echo) is
    re-asked, up to three asks in all; the utterance records how many answers were rejected
    (``rejected``) and how many sentences were dropped from the one used (``dropped``).

    Failures: a :class:`~mhsafeeval.providers.ModelCallError` becomes a
    :class:`~mhsafeeval.messages.CallFailed` (agent ``"client"``) and nothing else. Three
    unusable answers are also a ``CallFailed`` (``unusable``, ``retryable=True``): an empty
    or echoing utterance is never published.

    Args:
        model: the client simulator's model.
        profile: the CCD profile to play.
        context_turns: how many of the last committed turns the prompt shows.
        style: the conversational style to play (one of
            :data:`~mhsafeeval.config.CLIENT_STYLES`; ``""``: none); its instruction ends the
            system prompt.

    Raises:
        ValueError: an unknown style.

    Example:
        >>> from mhsafeeval.framework import Runtime
        >>> from mhsafeeval.agents import builtin_profiles
        >>> def wire(rt: Runtime, model: ModelClient) -> None:
        ...     profile = builtin_profiles()[0]
        ...     rt.register(
        ...         "client",
        ...         lambda aid: ClientAgent(model, profile),
        ...         types=ClientAgent.handled_types(),
        ...     )
    """

    role = "client"
    outcomes = answers_of("client")
    publishes = (*outcomes, CallFailed)

    def __init__(
        self,
        model: ModelClient,
        profile: ClientProfile,
        *,
        context_turns: int = 5,
        style: str = "",
    ) -> None:
        super().__init__(model, context_turns=context_turns)
        if style and style not in CLIENT_STYLES:
            raise ValueError(
                f"unknown conversational style {style!r} (known: {', '.join(CLIENT_STYLES)})"
            )
        self.profile = profile
        self.style = style

    def prompt(self, msg: Instruction) -> list[ChatMessage]:
        """The chat sent to the model for ``msg`` (after the committed turns)."""
        p, turn = self.profile, msg.turn
        model = p.cognitive_models[turn % len(p.cognitive_models)]
        topics = p.session_topics or (f"what has been hardest lately ({p.condition})",)
        topic = topics[turn % len(topics)]
        system = render(
            "client_system",
            profile=profile_to_text(p),
            topic=topic,
            situation=model.situation,
            thoughts=model.automatic_thoughts,
            emotion=model.emotion,
            behavior=model.behavior,
        )
        if self.style:  # one template per style: prompts/client_style_<name>.txt
            manner = render(f"client_style_{self.style.replace(' ', '_')}")
            system += "\n\n" + render("client_style", manner=manner)
        context = render_context(self.recent())
        user = render("client_turn", context=context, instruction=msg.text)
        return [ChatMessage("system", system), ChatMessage("user", user)]

    def echo_check(self, msg: Instruction) -> EchoCheck:
        """What a line acting on ``msg`` must not repeat: the prompt's fixed wording and labels,
        the style's instruction, and the private direction itself."""
        names: tuple[str, ...] = _TEMPLATES
        if self.style:
            names = (*names, f"client_style_{self.style.replace(' ', '_')}")
        segments, labels = fixed_wording(*names)
        return EchoCheck(segments, labels, directions=[msg.text])

    @on(Instruction)
    async def speak(self, msg: Instruction) -> None:
        """Act out one instruction as the client's next utterance."""
        messages = self.prompt(msg)
        params = CallParams(seed=call_seed(msg, self.role))
        check = self.echo_check(msg)
        done: list[Completion] = []
        text, dropped, rejected = "", 0, 0
        try:
            while not text and len(done) < _ASKS:
                if done:
                    rejected += 1
                    retry = "client_retry" if not done[-1].text.strip() else "client_echo_retry"
                    log.warning(
                        "client.rejected",
                        reason="empty" if retry == "client_retry" else "echo",
                        finish_reason=done[-1].finish_reason,
                    )
                    messages = [*messages, ChatMessage("user", render(retry))]
                done.append(await self.model.complete(messages, params))
                text, dropped = spoken_line(
                    done[-1].text,
                    self.profile.name,
                    check,
                    cut=done[-1].finish_reason == "length",
                )
        except ModelCallError as exc:
            self.fail(msg, exc.having_spent(done))  # earlier unusable answers were paid for
            return
        if not text:
            reason = (
                f"the client model gave no usable utterance in {len(done)} asks (each was "
                "empty or only repeated its instructions)"
            )
            tries = sum(c.attempts for c in done)
            error = ModelCallError(
                self.model.name, tries, reason, retryable=True, completions=done
            )  # the unusable answers' tokens are counted (CallFailed.usage)
            self.fail(msg, error, unusable=True)  # it answered, with nothing to say
            return
        usage = Usage.of(*done)
        log.info(
            "client.utterance",
            chars=len(text),
            calls=usage.calls,
            dropped=dropped,
            category=msg.category,
        )
        self.publish(
            ClientUtterance(
                **msg.child_ids(),
                category=msg.category,
                role=msg.role,
                text=text,
                usage=usage,
                rejected=rejected,
                dropped=dropped,
            )
        )
