"""Schema-guided JSON generation for small local models: fast, and valid by construction.

A full JSON-schema grammar checks every one of the vocabulary's tokens at every step; with
Gemma 3's 262k-token vocabulary that costs more than the model itself (about 8 tokens/s against
about 36 free). Instead, for the object schemas our agents use, the JSON skeleton is written by
us and the model only fills it in:

* a string value is generated freely, stopping at the closing quote (and at a newline), then
  cut to its ``maxLength`` and JSON-escaped by us;
* an enum, a boolean or a small integer range is one token chosen among the allowed ones (a
  large logit bias on their first tokens);
* an array of strings asks, after each item, whether another one follows (``,`` or ``]``),
  within ``minItems``/``maxItems``.

Any other shape returns ``None`` and the caller falls back to the full grammar.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

__all__ = ["GuidedResult", "guided_json", "supported"]

_MAX_CHOICES_RANGE = 20


def _choices(prop: dict[str, Any]) -> list[str] | None:
    if "enum" in prop:
        return [json.dumps(v) for v in prop["enum"]]
    kind = prop.get("type")
    if kind == "boolean":
        return ["true", "false"]
    if kind == "integer" and "minimum" in prop and "maximum" in prop:
        low, high = int(prop["minimum"]), int(prop["maximum"])
        if 0 <= high - low < _MAX_CHOICES_RANGE:
            return [str(v) for v in range(low, high + 1)]
    return None


def _supported_value(prop: Any) -> bool:
    if not isinstance(prop, dict):
        return False
    if _choices(prop) is not None:
        return True
    kind = prop.get("type")
    if kind == "string":
        return True
    if kind == "array":
        items = prop.get("items", {})
        return isinstance(items, dict) and items.get("type") == "string" and "enum" not in items
    if kind == "object":
        return supported(prop)
    return False


def supported(schema: Any) -> bool:
    """Whether :func:`guided_json` can fill this schema (an object of simple values)."""
    return (
        isinstance(schema, dict)
        and schema.get("type") == "object"
        and isinstance(schema.get("properties"), dict)
        and all(_supported_value(p) for p in schema["properties"].values())
    )


class GuidedResult:
    """The filled JSON text and what it cost."""

    def __init__(self) -> None:
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.finish_reason = "stop"


Generate = Callable[..., dict[str, Any]]
"""``llama.create_completion``-like: (prompt, max_tokens=, stop=, logit_bias=, seed=, ...)."""


class _Filler:
    def __init__(
        self,
        generate: Generate,
        first_token: Callable[[str], int],
        prompt: str,
        *,
        temperature: float,
        seed: int,
        string_cap: int,
        array_cap: int,
    ) -> None:
        self.generate = generate
        self.first_token = first_token
        self.text = prompt
        self.start = len(prompt)
        self.temperature = temperature
        self.seed = seed
        self.string_cap = string_cap
        self.array_cap = array_cap
        self.result = GuidedResult()

    def _call(self, **kwargs: Any) -> str:
        self.seed += 1
        out = self.generate(
            prompt=self.text, temperature=self.temperature, seed=self.seed, **kwargs
        )
        usage = out.get("usage", {})
        if not self.result.prompt_tokens:
            self.result.prompt_tokens = int(usage.get("prompt_tokens", 0))
        self.result.completion_tokens += int(usage.get("completion_tokens", 0))
        return str(out["choices"][0]["text"])

    def choose(self, options: list[str]) -> str:
        ids = [self.first_token(o) for o in options]
        if len(set(ids)) != len(ids):  # options share a first token: take the first listed
            self.text += options[0]
            return options[0]
        token = self._call(max_tokens=1, logit_bias={i: 100.0 for i in ids})
        for option, _ in sorted(zip(options, ids, strict=True), key=lambda p: -len(p[0])):
            if token and (option.startswith(token.strip()) or token.strip().startswith(option)):
                self.text += option
                return option
        self.text += options[0]  # the bias makes this unreachable in practice
        return options[0]

    def string(self, prop: dict[str, Any]) -> str:
        cap = min(int(prop.get("maxLength", self.string_cap)), self.string_cap)
        cap = max(cap, int(prop.get("minLength", 0)))
        raw = self._call(max_tokens=max(4, math.ceil(cap / 2.5)), stop=['"', "\n"])
        value = raw[:cap].strip()
        self.text += json.dumps(value)[1:]  # the opening quote is already written
        return value

    def value(self, prop: dict[str, Any]) -> None:
        options = _choices(prop)
        if options is not None:
            self.choose(options)
            return
        kind = prop["type"]
        if kind == "string":
            self.text += '"'
            self.string(prop)
        elif kind == "array":
            self.array(prop)
        else:
            self.object(prop)

    def array(self, prop: dict[str, Any]) -> None:
        items = prop["items"]
        low = int(prop.get("minItems", 0))
        high = max(min(int(prop.get("maxItems", self.array_cap)), self.array_cap), low)
        self.text += "["
        for count in range(high):
            if count < low:  # an item must follow
                self.text += ', "' if count else '"'
            elif self.choose(['"', "]"] if count == 0 else [",", "]"]) == "]":
                return
            elif count:
                self.text += ' "'
            self.string(items)
        self.text += "]"

    def object(self, schema: dict[str, Any]) -> None:
        self.text += "{"
        for i, (name, prop) in enumerate(schema["properties"].items()):
            self.text += ("" if i == 0 else ", ") + json.dumps(name) + ": "
            self.value(prop)
        self.text += "}"


def guided_json(
    generate: Generate,
    first_token: Callable[[str], int],
    prompt: str,
    schema: dict[str, Any],
    *,
    temperature: float,
    seed: int,
    string_cap: int = 240,
    array_cap: int = 3,
) -> tuple[str, GuidedResult] | None:
    """Fill ``schema`` after ``prompt``; returns the JSON text, or None if unsupported.

    Every property of the schema is written, in the schema's order (required or not).
    """
    if not supported(schema):
        return None
    filler = _Filler(
        generate,
        first_token,
        prompt,
        temperature=temperature,
        seed=seed,
        string_cap=string_cap,
        array_cap=array_cap,
    )
    filler.object(schema)
    return filler.text[filler.start :], filler.result
