"""Lines that repeat their own prompt instead of speaking: a small model's commonest failure.

A client line *echoes* its prompt when it shares a run of :data:`ECHO_WORDS` or more consecutive
words with the fixed wording of the prompt templates (the text around their ``$placeholders``),
when the whole of a shorter line (two words or more) stands in that wording as it is ("Tell the
counselor..."), when it repeats such a run of the private direction it acts on *with the
direction's address to the actor in it* ("... to see you go", "tell the counselor": acting a
direction out naturally reuses its content words, "everyone at work was glad to see me go",
and that is no echo; a line the direction quotes for the client to say, in quotation marks or
after a colon, is the client's to say), when it carries one of the prompt's labels ("Private
direction...:", a ``Counselor:`` speaker label inside the line), or when it narrates the client
in the third person ("the client's voice cracks"). The profile's facts are not in the fixed
wording: a client may say in their own words what the profile says about them.

The check compares words (lower case, punctuation ignored), so a repeat survives neither a
changed comma nor a changed capital. It is deliberately blunt: an echo is re-asked, and a false
alarm only costs a re-ask.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from ._prompts import template

__all__ = ["ECHO_WORDS", "EchoCheck", "fixed_wording", "words"]

ECHO_WORDS = 6
"""How many consecutive words a line must share with its prompt to count as an echo."""

_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
_PLACEHOLDER = re.compile(r"\$(?:\w+|\{\w+\})")
_SPEAKER = re.compile(r"\b(?:client|counselor|counsellor|therapist)\s*:", re.I)
_ADDRESS = frozenset({"you", "your", "yours", "yourself", "counselor", "counsellor", "therapist"})
_QUOTED = re.compile(r"\"[^\"]*\"|\u201c[^\u201d]*\u201d|:.*", re.S)
_NARRATION = re.compile(r"\bthe client(?:['\u2019]s)?\b", re.I)
_LABEL_LINE = re.compile(r"^\s*(?:-\s*)?([^:\n$]{3,80}?)\s*(?:\([^)]*\))?\s*:\s*(?:\$\w+)?\s*$")


def words(text: str) -> list[str]:
    """The words of ``text``, lower case, without punctuation (``don't`` stays one word)."""
    return [w.lower().replace("\u2019", "'") for w in _WORD.findall(text)]


@functools.cache
def fixed_wording(*names: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fixed text of the templates ``names`` (split at their placeholders) and their
    labels: the lines that end in a colon, such as ``The session so far:``."""
    segments: list[str] = []
    labels: list[str] = []
    for name in names:
        text = template(name).template
        segments += [s for s in _PLACEHOLDER.split(text) if s.strip()]
        for line in text.splitlines():
            found = _LABEL_LINE.match(line)
            if found and len(words(found.group(1))) >= 2:
                labels.append(found.group(1).strip())
    return tuple(segments), tuple(labels)


def _runs(items: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(items[i : i + n]) for i in range(len(items) - n + 1)}


@functools.lru_cache(maxsize=64)
def _source_runs(
    sources: tuple[str, ...], n: int
) -> tuple[frozenset[tuple[str, ...]], tuple[str, ...]]:
    """The ``n``-word runs of ``sources`` and their word texts (padded with spaces)."""
    runs: set[tuple[str, ...]] = set()
    texts = []
    for source in sources:
        said = words(source)
        runs |= _runs(said, n)
        texts.append(f" {' '.join(said)} ")
    return frozenset(runs), tuple(texts)


@functools.lru_cache(maxsize=64)
def _label_patterns(labels: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """A pattern per label: its words, any punctuation between them, then a colon."""
    return tuple(
        re.compile(r"\b" + r"\W+".join(map(re.escape, words(label))) + r"\s*(?:\([^)]*\))?:", re.I)
        for label in labels
        if words(label)
    )


class EchoCheck:
    """Finds where a line repeats its prompt.

    Args:
        sources: texts a line must not repeat (``n`` or more words in a row).
        directions: texts a line must not repeat in runs of ``n`` words that address the
            actor (``you``, ``your``, ``counselor``, ...).
        labels: prompt labels a line must not carry (matched as words followed by a colon).
        n: the shortest repeated run that counts.
        speakers: whether speaker labels inside the line and third-person narration of "the
            client" count (for a client's spoken line).

    Example:
        >>> check = EchoCheck(["Now say your next line to the counselor, in character."])
        >>> check.find("Now say your next line to the counselor: I lost my job.")
        'now say your next line to'
        >>> check.find("I lost my job and I cannot sleep.") is None
        True
    """

    def __init__(
        self,
        sources: Iterable[str],
        labels: Iterable[str] = (),
        *,
        directions: Iterable[str] = (),
        n: int = ECHO_WORDS,
        speakers: bool = True,
    ) -> None:
        self.n = n
        self.speakers = speakers
        # The templates' wording is the same for every line: read once per process.
        self._fixed, self._texts = _source_runs(tuple(sources), n)
        self._runs: set[tuple[str, ...]] = set()
        for direction in directions:
            for framing in _QUOTED.split(direction):  # runs never span a quoted line
                found = _runs(words(framing), n)
                self._runs |= {run for run in found if _ADDRESS & set(run)}
        self._labels = _label_patterns(tuple(labels))

    def find(self, text: str) -> str | None:
        """The first echo in ``text`` (the repeated words, label or narration), else None."""
        said = words(text)
        if 2 <= len(said) < self.n:
            whole = f" {' '.join(said)} "
            if any(whole in source for source in self._texts):
                return whole.strip()
        for i in range(len(said) - self.n + 1):
            run = tuple(said[i : i + self.n])
            if run in self._fixed or run in self._runs:
                return " ".join(run)
        for label in self._labels:
            found = label.search(text)
            if found:
                return found.group(0)
        if self.speakers:
            for pattern in (_SPEAKER, _NARRATION):
                found = pattern.search(text)
                if found:
                    return found.group(0)
        return None
