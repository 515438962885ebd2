"""What identifies a judge whose error rates can be carried over: its fingerprint.

A calibration (``mhsafeeval calibrate``) measures one judge's sensitivity and specificity at
one threshold. Those rates describe another judge's verdicts only if everything the verdicts
depend on is the same: the model, its sampling temperature, the rubric prompt, the taxonomy
(its cells and ladders, which the prompt shows) and the threshold (which the prompt states).
:class:`JudgeFingerprint` holds the five; two fingerprints that differ in any one of them are
two judges, and a report never corrects one's rates with the other's calibration.
"""

from __future__ import annotations

import hashlib

import msgspec

__all__ = ["JudgeFingerprint", "judge_fingerprint", "prompt_digest"]


def prompt_digest() -> str:
    """A digest of the rubric judge's prompt templates (system and user): it changes whenever
    the wording any judge is shown changes.

    Example:
        >>> len(prompt_digest())
        16
    """
    from . import _prompt  # read at call time: a patched template is a new prompt

    text = "\x00".join((_prompt._SYSTEM, _prompt._USER))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class JudgeFingerprint(msgspec.Struct, frozen=True, kw_only=True):
    """The judge a set of verdicts came from (see the module)."""

    model: str
    """The judge model's provider address."""
    temperature: float
    """Its sampling temperature (None in a config is greedy: 0.0)."""
    prompt: str
    """:func:`prompt_digest` of the rubric prompt ("unknown" for a campaign stored before
    fingerprints were kept)."""
    taxonomy: str
    """The taxonomy's digest (``inputs.taxonomy`` of a stored campaign)."""
    threshold: int

    @property
    def digest(self) -> str:
        """A short digest of all five, for printing beside the rates.

        Example:
            >>> a = JudgeFingerprint(model="m", temperature=0.0, prompt="p", taxonomy="t",
            ...                      threshold=2)
            >>> a.digest == msgspec.structs.replace(a, threshold=3).digest
            False
        """
        data = msgspec.json.encode(self)
        return hashlib.blake2b(data, digest_size=6).hexdigest()

    def differences(self, other: JudgeFingerprint) -> list[str]:
        """What differs from ``other``, one ``field: this, other`` item each."""
        return [
            f"{field}: {getattr(self, field)!r}, {getattr(other, field)!r}"
            for field in self.__struct_fields__
            if getattr(self, field) != getattr(other, field)
        ]

    def describe(self) -> str:
        """One line: the digest and what it stands for."""
        return (
            f"judge {self.digest} = {self.model} at temperature {self.temperature:g}, prompt "
            f"{self.prompt}, taxonomy {self.taxonomy}, threshold {self.threshold}"
        )


def judge_fingerprint(
    model: str, temperature: float | None, taxonomy: str, threshold: int
) -> JudgeFingerprint:
    """The fingerprint of the rubric judge on ``model`` as this version prompts it."""
    return JudgeFingerprint(
        model=model,
        temperature=0.0 if temperature is None else float(temperature),
        prompt=prompt_digest(),
        taxonomy=taxonomy,
        threshold=threshold,
    )
