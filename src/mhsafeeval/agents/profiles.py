"""Client profiles: the cognitive conceptualization diagrams (CCD) the client agent role-plays.

A profile describes one simulated client: life history, core beliefs, intermediate beliefs
(and how they shift under distress), coping strategies, a few situation -> automatic thought
-> emotion -> behaviour examples, and topics the client may raise in a session.

Three shapes load, one profile object or a list of them per JSON file (detected per object):

* the native shape, whose keys are exactly the fields of :class:`ClientProfile` (``id`` may be
  left out: it then comes from the file name);
* the per-patient CCD shape of the Patient-Psi reference folders: ``life_history``,
  ``core_beliefs`` (a string or a list), ``core_belief_description``, ``intermediate_beliefs``,
  ``intermediate_beliefs_during_<condition>``, ``coping_strategies``, ``cognitive_models``;
  ``id``, ``name``, ``condition`` and ``session_topics`` are optional; the ``<condition>``
  word becomes the condition when no ``condition`` key is given;
* the record shape of the released Patient-Psi-CM dataset (one file, a list of records):
  ``id``, ``name``, ``type`` (the conversational styles, out of
  :data:`~mhsafeeval.config.CLIENT_STYLES`), ``history``, ``helpless_belief_current``,
  ``unlovable_belief_current``, ``worthless_belief_current`` (lists, possibly empty: the
  non-empty ones become ``core_beliefs``, their items ``core_belief_description``),
  ``intermediate_belief``, ``intermediate_belief_<condition>`` (the beliefs under distress;
  the word becomes the condition), ``coping_strategies`` and one cognitive model:
  ``situation``, ``auto_thought``, ``emotion``, ``behavior``.

In the imported shapes text fields may be lists of strings (joined with ``"; "``) and unknown
keys are kept in ``extra``. Beliefs under distress and core beliefs may be empty (an empty
list is an empty field); every other text must say something.

Every problem is an :class:`~mhsafeeval.errors.InputError` naming the file and the key, e.g.
``clients.json: [1].cognitive_models[0].emotion: expected str, got int``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from mhsafeeval.config import CLIENT_STYLES, style_name
from mhsafeeval.errors import InputError, convert, decode_json, join_path, read_input_bytes

__all__ = [
    "ClientProfile",
    "CognitiveModel",
    "builtin_profiles",
    "load_profiles",
    "profile_from_mapping",
    "profile_to_text",
]

_T = TypeVar("_T")
_DURING = "intermediate_beliefs_during_"
_DISTRESS = "intermediate_beliefs_under_distress"
_ID = re.compile(r"[a-z0-9][a-z0-9_-]*(?:/[a-z0-9][a-z0-9_-]*)*\Z")
_TEXT_FIELDS = (
    "condition",
    "life_history",
    "core_belief_description",
    "intermediate_beliefs",
    _DISTRESS,
    "coping_strategies",
)
_MAY_BE_EMPTY = ("core_belief_description", _DISTRESS)
_MODEL_FIELDS = ("situation", "automatic_thoughts", "emotion", "behavior")
# The released dataset's record keys: text fields, the cognitive model's, and the core beliefs.
_RECORD_BELIEF = "intermediate_belief_"
_RECORD_TEXT = {
    "history": "life_history",
    "intermediate_belief": "intermediate_beliefs",
    "coping_strategies": "coping_strategies",
}
_RECORD_MODEL = {
    "situation": "situation",
    "auto_thought": "automatic_thoughts",
    "emotion": "emotion",
    "behavior": "behavior",
}
_RECORD_CORE = {
    "helpless_belief_current": "Helpless belief",
    "unlovable_belief_current": "Unlovable belief",
    "worthless_belief_current": "Worthless belief",
}
_RECORD_MARKERS = {"history", "auto_thought", "intermediate_belief", *_RECORD_CORE}


class CognitiveModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One worked example of the client's thinking: what happened, what they thought, felt, did."""

    situation: str
    automatic_thoughts: str
    emotion: str
    behavior: str
    extra: dict[str, Any] = {}
    """Keys of an imported cognitive model that this struct does not know."""


class ClientProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A simulated client, as a cognitive conceptualization diagram.

    ``id`` is lowercase letters, digits, ``-`` and ``_``, in ``/``-separated parts (a profile
    loaded from a subfolder has the subfolder's path in front); ``condition`` is the presenting
    problem in a few words (``"depression"``, ``"panic disorder"``). ``styles`` are the
    conversational styles (:data:`~mhsafeeval.config.CLIENT_STYLES`) the client can be played
    in: ``campaign.style = "random"`` draws one of them per conversation. ``extra`` keeps keys
    of an imported file that have no field here.
    """

    id: str
    condition: str
    life_history: str
    core_beliefs: tuple[str, ...]
    core_belief_description: str
    intermediate_beliefs: str
    intermediate_beliefs_under_distress: str
    coping_strategies: str
    cognitive_models: tuple[CognitiveModel, ...]
    session_topics: tuple[str, ...]
    name: str = ""
    extra: dict[str, Any] = {}
    styles: tuple[str, ...] = ()


def load_profiles(path: str | Path) -> list[ClientProfile]:
    """Load client profiles from a JSON file or from every ``*.json`` file under a directory.

    Each file holds one profile object or a list of them, in any of the shapes above
    (detected per object). A profile without ``id`` gets one from its file name, plus
    ``-<index>`` when the file holds a list. A file in a subfolder of ``path`` has the
    subfolder's relative path in front of its ids, so the tree ``CCD/depression/patient1.json``,
    ``CCD/psychosis/patient1.json`` loaded from ``CCD`` gives ``depression/patient1`` and
    ``psychosis/patient1``; files directly in ``path`` (and a single file) keep plain ids.

    Args:
        path: a ``.json`` file or a directory, searched recursively (names starting with ``.``
            are skipped).

    Returns:
        The profiles, in order of relative path and then in order within each file.

    Raises:
        InputError: unreadable or invalid JSON, a missing, empty or mistyped key, a directory
            without JSON files, or an id defined twice (the message names both places).
    """
    root = Path(path)
    if root.is_dir():
        found = (p.relative_to(root).parts for p in root.rglob("*.json") if p.is_file())
        parts = sorted(p for p in found if not any(part.startswith(".") for part in p))
        if not parts:
            raise InputError(root, None, "no *.json profile files in this directory (or below)")
        files = [(root.joinpath(*p), "".join(f"{_slug(d)}/" for d in p[:-1])) for p in parts]
    elif root.is_file():
        files = [(root, "")]
    else:
        raise InputError(root, None, "no such file or directory")
    return _collect((str(f), f.stem, _read(f), prefix) for f, prefix in files)


@functools.cache
def _builtin() -> tuple[ClientProfile, ...]:
    folder = resources.files(__package__ or "mhsafeeval.agents") / "data" / "profiles"
    entries = sorted(
        (e.name, e.name.removesuffix(".json"), e.read_bytes())
        for e in folder.iterdir()
        if e.name.endswith(".json")
    )
    found = _collect((f"<builtin>/profiles/{name}", stem, data, "") for name, stem, data in entries)
    return tuple(sorted(found, key=lambda p: p.id))


def builtin_profiles() -> list[ClientProfile]:
    """The client profiles shipped with the package, sorted by id (read once, then cached).

    Returns:
        A new list each call; the profiles themselves are immutable.
    """
    return list(_builtin())


def profile_from_mapping(
    obj: Any,
    source: str | Path,
    *,
    default_id: str | None = None,
    at: str = "",
) -> ClientProfile:
    """Build and check one profile from a decoded JSON object (any of the shapes above).

    Args:
        obj: the decoded object.
        source: where it came from, for error messages (usually the file path).
        default_id: the id to use when the object has none.
        at: key path of the object inside its file (``"[2]"`` for a list item), prefixed to
            the fields named in errors.

    Returns:
        The profile.

    Raises:
        InputError: a missing, empty or mistyped key, or an invalid id.
    """
    if not isinstance(obj, dict):
        raise InputError(source, at, f"expected a JSON object, got {_json_type(obj)}")
    psi_cm = any(str(k).startswith(_DURING) for k in obj)
    record = not psi_cm and not _RECORD_MARKERS.isdisjoint(obj)
    if psi_cm:
        data = _from_psi_cm(obj, source, at)
    elif record:
        data = _from_record(obj, source, at)
    else:
        data = dict(obj)
    if not (psi_cm or record) and _DISTRESS not in data:
        raise InputError(
            source,
            join_path(at, _DISTRESS),
            f"missing required field (Patient-Psi-CM files use {_DURING}<condition> instead)",
        )
    if "id" not in data and default_id is not None:
        data["id"] = default_id
    profile = convert(data, ClientProfile, source, at)
    _check(profile, source, at, topics_required=not (psi_cm or record))
    return profile


def _from_psi_cm(obj: dict[str, Any], source: str | Path, at: str) -> dict[str, Any]:
    """Map a Patient-Psi-CM object onto the native keys; unknown keys go to ``extra``."""
    during = [k for k in obj if k.startswith(_DURING)]
    if len(during) > 1:
        raise InputError(
            source,
            join_path(at, during[1]),
            f"only one {_DURING}<condition> key is allowed (also found {during[0]})",
        )
    key = during[0]
    word = key.removeprefix(_DURING).replace("_", " ").strip()
    if not word:
        raise InputError(
            source, join_path(at, key), "the key needs a condition word after 'during_'"
        )
    data: dict[str, Any] = {"condition": word, "session_topics": []}
    extra: dict[str, Any] = {}
    for k, value in obj.items():
        if k == key:
            data[_DISTRESS] = _flat(value, source, join_path(at, k))
        elif k in _TEXT_FIELDS:
            data[k] = _flat(value, source, join_path(at, k))
        elif k == "core_beliefs" and not isinstance(value, list):
            data[k] = [_flat(value, source, join_path(at, k))]
        elif k == "cognitive_models" and isinstance(value, list):
            data[k] = [
                _psi_model(m, source, join_path(at, f"{k}[{i}]")) for i, m in enumerate(value)
            ]
        elif k == "id" and isinstance(value, str | int) and not isinstance(value, bool):
            data[k] = _slug(str(value))
        elif k in ("id", "name", "core_beliefs", "cognitive_models", "session_topics"):
            data[k] = value  # wrong types are reported by msgspec
        else:
            extra[k] = value
    data["extra"] = extra
    return data


def _psi_model(model: Any, source: str | Path, at: str) -> Any:
    if not isinstance(model, dict):
        return model  # msgspec names the wrong type
    data: dict[str, Any] = {"extra": {}}
    for k, value in model.items():
        if k in _MODEL_FIELDS:
            data[k] = _flat(value, source, join_path(at, k))
        else:
            data["extra"][k] = value
    return data


def _from_record(obj: dict[str, Any], source: str | Path, at: str) -> dict[str, Any]:
    """Map a record of the released Patient-Psi-CM dataset onto the native keys."""
    for key in (*_RECORD_TEXT, *_RECORD_MODEL):
        if key not in obj:
            raise InputError(source, join_path(at, key), "missing required field")
    during = [k for k in obj if k.startswith(_RECORD_BELIEF)]
    if not during:
        raise InputError(
            source,
            join_path(at, f"{_RECORD_BELIEF}<condition>"),
            "missing required field (e.g. intermediate_belief_depression)",
        )
    if len(during) > 1:
        raise InputError(
            source,
            join_path(at, during[1]),
            f"only one {_RECORD_BELIEF}<condition> key is allowed (also found {during[0]})",
        )
    word = during[0].removeprefix(_RECORD_BELIEF).replace("_", " ").strip()
    data: dict[str, Any] = {
        "condition": word,
        "session_topics": [],
        _DISTRESS: _flat(obj[during[0]], source, join_path(at, during[0])),
    }
    model: dict[str, Any] = {}
    labels: list[str] = []
    beliefs: list[str] = []
    extra: dict[str, Any] = {}
    for k, value in obj.items():
        path = join_path(at, k)
        if k in _RECORD_TEXT or k in _RECORD_MODEL:
            text = _flat(value, source, path)
            _nonempty(text, source, path)  # named by the record's key, not the native one
            if k in _RECORD_TEXT:
                data[_RECORD_TEXT[k]] = text
            else:
                model[_RECORD_MODEL[k]] = text
        elif k in _RECORD_CORE:
            items = _strings(value, source, path, "strings")
            beliefs += items
            labels += [_RECORD_CORE[k]] if items else []
        elif k == "type":
            data["styles"] = _styles(value, source, path)
        elif k == "id" and isinstance(value, str | int) and not isinstance(value, bool):
            data[k] = _slug(str(value))
        elif k in ("id", "name", "condition"):
            data[k] = value  # wrong types are reported by msgspec
        elif k not in during:
            extra[k] = value
    data["core_beliefs"] = labels
    data["core_belief_description"] = "; ".join(beliefs)
    data["cognitive_models"] = [model]
    data["extra"] = extra
    return data


def _strings(value: Any, source: str | Path, path: str, what: str) -> list[str]:
    if not isinstance(value, list):
        raise InputError(source, path, f"expected a list of {what}, got {_json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InputError(source, f"{path}[{i}]", f"expected a string, got {_json_type(item)}")
    return value


def _styles(value: Any, source: str | Path, path: str) -> list[str]:
    """The record's ``type``: known style names, each once, in the record's order."""
    out: list[str] = []
    for i, item in enumerate(_strings(value, source, path, "style names")):
        name = style_name(item)
        if name not in CLIENT_STYLES:
            known = ", ".join(map(repr, CLIENT_STYLES))
            raise InputError(
                source, f"{path}[{i}]", f"unknown conversational style {item!r} (known: {known})"
            )
        out += [name] if name not in out else []
    return out


def _flat(value: Any, source: str | Path, path: str) -> str:
    """A string, or a list of strings joined with '; ' (Patient-Psi data often uses lists)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "; ".join(value)
    raise InputError(
        source, path, f"expected a string or a list of strings, got {_json_type(value)}"
    )


def _check(profile: ClientProfile, source: str | Path, at: str, *, topics_required: bool) -> None:
    """Reject empty texts and lists, and malformed ids (msgspec checks only types)."""
    if not _ID.match(profile.id):
        raise InputError(
            source,
            join_path(at, "id"),
            f"{profile.id!r} is not a valid id (use a-z, 0-9, '-' and '_')",
        )
    for name in _TEXT_FIELDS:
        if name not in _MAY_BE_EMPTY:
            _nonempty(getattr(profile, name), source, join_path(at, name))
    lists: dict[str, tuple[str, ...]] = {"core_beliefs": profile.core_beliefs}
    if topics_required or profile.session_topics:
        lists["session_topics"] = profile.session_topics
    for name, items in lists.items():
        if not items and name == "session_topics":
            raise InputError(source, join_path(at, name), "must not be empty")
        for i, item in enumerate(items):
            _nonempty(item, source, join_path(at, f"{name}[{i}]"))
    for i, style in enumerate(profile.styles):
        if style not in CLIENT_STYLES:
            raise InputError(
                source,
                join_path(at, f"styles[{i}]"),
                f"unknown conversational style {style!r} (known: {', '.join(CLIENT_STYLES)})",
            )
    if not profile.cognitive_models:
        raise InputError(source, join_path(at, "cognitive_models"), "must not be empty")
    for i, model in enumerate(profile.cognitive_models):
        for name in _MODEL_FIELDS:
            _nonempty(getattr(model, name), source, join_path(at, f"cognitive_models[{i}].{name}"))


def _nonempty(text: str, source: str | Path, path: str) -> None:
    if not text.strip():
        raise InputError(source, path, "must not be empty")


def _read(path: Path) -> bytes:
    try:
        return read_input_bytes(path)
    except OSError as exc:
        raise InputError(path, None, f"cannot read profile file: {exc}") from exc


def _collect(files: Iterable[tuple[str, str, bytes, str]]) -> list[ClientProfile]:
    """Parse ``(source, file stem, bytes, id prefix)`` entries; ids must be unique across all
    of them (after the prefix)."""
    profiles: list[ClientProfile] = []
    seen: dict[str, str] = {}
    for source, stem, data, prefix in files:
        for where, found in _parse_file(source, stem, data):
            profile = msgspec.structs.replace(found, id=prefix + found.id) if prefix else found
            if not _ID.match(profile.id):
                raise InputError(
                    source, join_path(where, "id"), f"{profile.id!r} is not a valid id"
                )
            if profile.id in seen:
                raise InputError(
                    source,
                    join_path(where, "id"),
                    f"duplicate profile id {profile.id!r} (already defined in {seen[profile.id]})",
                )
            seen[profile.id] = f"{source} {where}".strip()
            profiles.append(profile)
    return profiles


def _parse_file(source: str, stem: str, data: bytes) -> list[tuple[str, ClientProfile]]:
    try:
        doc = decode_json(data, source)
    except msgspec.DecodeError as exc:
        raise InputError(source, None, f"invalid JSON: {exc}") from None
    base = _slug(stem)
    if isinstance(doc, list):
        if not doc:
            raise InputError(source, None, "the file holds an empty list of profiles")
        return [
            (f"[{i}]", profile_from_mapping(item, source, default_id=f"{base}-{i}", at=f"[{i}]"))
            for i, item in enumerate(doc)
        ]
    if isinstance(doc, dict):
        return [("", profile_from_mapping(doc, source, default_id=base))]
    raise InputError(
        source, None, f"expected a profile object or a list of them, got {_json_type(doc)}"
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


_TEXTS: dict[int, tuple[ClientProfile, str]] = {}  # id(profile) -> (profile, its text)


def profile_to_text(profile: ClientProfile) -> str:
    """Render a profile's CCD as plain text (for prompts and for people).

    Every prompt of a conversation's client and mutator carries it, so each profile object's
    text is made once (profiles are frozen); the cache holds the profile with its text, so its
    id is not reused while the entry lives, and is emptied at 1,024 profiles.

    Args:
        profile: the profile.

    Returns:
        One labelled item per line (empty fields left out); cognitive models numbered.
    """
    hit = _TEXTS.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    if len(_TEXTS) >= 1024:
        _TEXTS.clear()
    text = _profile_text(profile)
    _TEXTS[id(profile)] = (profile, text)
    return text


def _profile_text(profile: ClientProfile) -> str:
    p = profile
    title = f"{p.name} ({p.id})" if p.name else p.id
    items = [
        ("Life history", p.life_history),
        ("Core beliefs", "; ".join(b.rstrip(".") for b in p.core_beliefs)),
        ("Core belief description", p.core_belief_description),
        ("Intermediate beliefs", p.intermediate_beliefs),
        ("Intermediate beliefs under distress", p.intermediate_beliefs_under_distress),
        ("Coping strategies", p.coping_strategies),
    ]
    lines = [f"Client: {title}; presenting problem: {p.condition}"]
    lines += [f"{label}: {text}" for label, text in items if text]  # empty fields say nothing
    for i, m in enumerate(p.cognitive_models, 1):
        lines.append(
            f"Example {i}: situation: {m.situation} | automatic thoughts: {m.automatic_thoughts} "
            f"| emotion: {m.emotion} | behavior: {m.behavior}"
        )
    if p.session_topics:
        lines.append(f"Session topics: {'; '.join(p.session_topics)}")
    return "\n".join(lines)
