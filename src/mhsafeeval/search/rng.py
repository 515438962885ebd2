"""Stable random streams derived from a campaign seed and coordinates.

Every random choice in search goes through a ``random.Random`` made here, so that a campaign
replays exactly: the same campaign seed and the same coordinates (conversation id, turn,
attempt, ...) give the same stream in any process, on any machine. Python's ``hash()`` is
salted per process and must never be used for this; the derivation is a BLAKE2b hash of an
unambiguous JSON encoding of the parts.

Example:
    >>> a = derive_rng(7, "c1/gpt/p/0", 3, 1)
    >>> b = derive_rng(7, "c1/gpt/p/0", 3, 1)
    >>> a.random() == b.random()
    True
    >>> derive_seed(7, "x") == derive_seed(7, "x") != derive_seed(7, "y")
    True
"""

from __future__ import annotations

import hashlib
import json
import random

__all__ = ["derive_rng", "derive_seed"]

_PERSON = b"mhsafeeval.rng"  # domain separation: these digests mean nothing elsewhere


def derive_seed(seed: int, *parts: str | int) -> int:
    """A 64-bit integer derived from ``seed`` and ``parts``, stable across processes.

    Parts are typed: ``1`` and ``"1"`` give different seeds, and so do ``("a", "b")`` and
    ``("a,b",)``, because the parts are hashed as a JSON array, not joined as text.

    Args:
        seed: The campaign seed.
        *parts: Coordinates of the decision (conversation id, turn, attempt, a purpose label).

    Returns:
        A non-negative integer below ``2**64``.

    Raises:
        TypeError: If the seed or a part is not an ``int`` or ``str`` (``bool`` is rejected too).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int | str):
            raise TypeError(f"rng parts must be int or str, got {type(part).__name__}")
    payload = json.dumps([seed, *parts], ensure_ascii=True, separators=(",", ":"))
    digest = hashlib.blake2b(payload.encode("ascii"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big")


def derive_rng(seed: int, *parts: str | int) -> random.Random:
    """A fresh ``random.Random`` seeded by :func:`derive_seed` of ``seed`` and ``parts``.

    Args:
        seed: The campaign seed.
        *parts: Coordinates of the decision (conversation id, turn, attempt, a purpose label).

    Returns:
        A new, independent generator; the global ``random`` module is never touched.
    """
    return random.Random(derive_seed(seed, *parts))
