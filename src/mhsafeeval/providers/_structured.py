"""Structured output: ask for JSON matching a schema, decode tolerantly, validate strictly,
re-ask (bounded) with the reason when the answer does not fit."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from mhsafeeval.framework import redact

from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelCallError,
    ModelClient,
    ProviderError,
)

__all__ = [
    "Structured",
    "StructuredOutputError",
    "answer_schema",
    "complete_structured",
    "extract_json",
]

T = TypeVar("T")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)


def answer_schema(kind: type[Any]) -> dict[str, Any]:
    """The JSON schema a model answers in, generated from the msgspec Struct that decodes the
    answer (``msgspec.json.schema``), in the one shape every structured-output path accepts:
    OpenAI's strict mode and llama.cpp's grammar converter alike. ``$ref``s are inlined,
    titles and struct docstrings dropped (they are for developers, not the model), and every
    object lists all its properties as required, in field order (constrained decoders emit
    keys in schema order), with no additional properties. Field constraints (``Meta``) become
    the schema's bounds, so the schema and the validation cannot drift apart.

    Example:
        >>> from typing import Annotated
        >>> text = Annotated[str, msgspec.Meta(min_length=1, max_length=50)]
        >>> Answer = msgspec.defstruct("Answer", [("text", text)])
        >>> answer_schema(Answer)["properties"]
        {'text': {'type': 'string', 'minLength': 1, 'maxLength': 50}}
        >>> answer_schema(Answer)["required"], answer_schema(Answer)["additionalProperties"]
        (['text'], False)
    """
    raw = msgspec.json.schema(kind)
    defs: dict[str, Any] = raw.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return walk(defs[node["$ref"].rsplit("/", 1)[-1]])
        if node.get("type") == "object" and "properties" in node:
            properties = {name: walk(sub) for name, sub in node["properties"].items()}
            return {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            }
        kept = {key: walk(value) for key, value in node.items() if key != "title"}
        return dict(sorted(kept.items(), key=lambda item: _KEY_ORDER.get(item[0], 99)))

    out: dict[str, Any] = walk(raw)
    return out


# The order keywords are written in, lower bounds first (schemas end up in prompts as text too,
# so one order everywhere keeps every prompt byte-identical from run to run).
_KEY_ORDER = {
    key: i
    for i, key in enumerate(
        ("type", "enum", "description", "items", "minLength", "maxLength", "minItems", "maxItems")
    )
}


class StructuredOutputError(ProviderError):
    """The model never produced a valid structured answer within the allowed asks.

    Attributes:
        reason: why the last answer was rejected.
        raw: the last answer's text.
        completions: every completion spent on the attempt (for token accounting).
    """

    def __init__(self, reason: str, raw: str, completions: list[Completion]) -> None:
        reason = redact(reason)  # both quote the model's answer, which is stored
        super().__init__(f"no valid structured answer after {len(completions)} ask(s): {reason}")
        self.reason = reason
        self.raw = redact(raw)
        self.completions = completions


class Structured(Generic[T]):
    """A validated value and the completions it took (one per ask)."""

    __slots__ = ("completions", "value")

    def __init__(self, value: T, completions: list[Completion]) -> None:
        self.value = value
        self.completions = completions

    @property
    def asks(self) -> int:
        """How many times the model was asked."""
        return len(self.completions)


def extract_json(text: str) -> Any:
    """Decode the JSON object in a model's answer, tolerating what models add around it.

    Accepts code fences, prose before or after the object, and raw newlines or tabs inside
    strings (llama.cpp's schema grammars allow them; strict JSON does not). Types are *not*
    coerced: validation stays strict.

    Raises:
        ValueError: no decodable JSON object in the text.
    """
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise ValueError("the answer contains no JSON object")
    candidate = body[start : end + 1]
    try:
        return msgspec.json.decode(candidate)
    except msgspec.DecodeError:
        pass
    try:
        return msgspec.json.decode(_escape_controls_in_strings(candidate))
    except msgspec.DecodeError as exc:
        raise ValueError(f"the JSON object does not decode: {exc}") from None


def _escape_controls_in_strings(text: str) -> str:
    out: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            elif ch < " ":
                out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\u{ord(ch):04x}"))
                continue
        elif ch == '"':
            in_string = True
        out.append(ch)
    return "".join(out)


async def complete_structured(
    model: ModelClient,
    messages: Sequence[ChatMessage],
    kind: type[T],
    *,
    schema: dict[str, Any],
    schema_name: str = "output",
    params: CallParams | None = None,
    max_asks: int = 3,
    validate: Callable[[T], None] | None = None,
) -> Structured[T]:
    """Ask ``model`` for a JSON object of type ``kind`` (a msgspec Struct), re-asking on failure.

    Each ask sends ``schema`` as a constraint (providers that support it enforce it; one whose
    server refuses it drops it and answers unconstrained, never retrying the refusal); the answer
    is decoded with :func:`extract_json`, converted strictly with msgspec, then passed to
    ``validate`` (which raises ``ValueError`` to reject it). A rejected answer is followed by a
    message naming the problem, up to ``max_asks`` asks in all.

    Raises:
        StructuredOutputError: still invalid after ``max_asks`` asks.
        ModelCallError: a call failed for good (from the model client); its ``completions``
            hold the answers of the earlier asks, so their tokens are still counted.
    """
    if max_asks < 1:
        raise ValueError("max_asks must be >= 1")
    base = params or CallParams()
    call_params = msgspec.structs.replace(base, json_schema=schema, schema_name=schema_name)
    conversation = list(messages)
    completions: list[Completion] = []
    reason = ""
    for _ in range(max_asks):
        try:
            done = await model.complete(conversation, call_params)
        except ModelCallError as exc:
            if not completions:
                raise
            raise exc.having_spent(completions) from exc
        completions.append(done)
        try:
            value = msgspec.convert(extract_json(done.text), kind)
            if validate is not None:
                validate(value)
        except (ValueError, msgspec.ValidationError) as exc:
            reason = str(exc) or type(exc).__name__
            conversation += [
                ChatMessage("assistant", done.text),
                ChatMessage(
                    "user",
                    f"That answer could not be used: {reason}. Reply again with only one JSON "
                    "object that follows the schema, and nothing else.",
                ),
            ]
            continue
        return Structured(value, completions)
    raise StructuredOutputError(reason, completions[-1].text if completions else "", completions)
