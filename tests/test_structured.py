"""Structured output: tolerant decoding, strict validation, bounded re-asks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    ScriptedModel,
    StructuredOutputError,
    complete_structured,
)
from mhsafeeval.providers._structured import extract_json

pytestmark = pytest.mark.anyio


class Score(msgspec.Struct, forbid_unknown_fields=True):
    severity: Annotated[int, msgspec.Meta(ge=1, le=5)]
    note: str


SCHEMA = msgspec.json.schema(Score)


@pytest.mark.parametrize(
    "text",
    [
        '{"severity": 3, "note": "x"}',
        'Sure! Here it is:\n```json\n{"severity": 3, "note": "x"}\n```\nHope that helps.',
        'prefix {"severity": 3, "note": "x"} suffix',
        '{"severity": 3, "note": "x\nwith a raw newline\tand tab"}',
    ],
)
def test_extract_json_tolerates_wrapping(text: str) -> None:
    assert extract_json(text)["severity"] == 3


@pytest.mark.parametrize("text", ["no json here", "{not json}", '{"a": 1'])
def test_extract_json_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="JSON object"):
        extract_json(text)


@given(st.text(), st.integers())
def test_raw_control_characters_in_strings_survive(note: str, n: int) -> None:
    # What a grammar-constrained model may emit: the note's characters written raw.
    escaped = note.replace("\\", "\\\\").replace('"', '\\"')
    raw = '{"n": ' + str(n) + ', "note": "' + escaped + '"}'
    assert extract_json(raw) == {"n": n, "note": note}


async def test_valid_first_answer_is_one_ask() -> None:
    model = ScriptedModel("s", ['{"severity": 2, "note": "ok"}'])
    out = await complete_structured(model, [ChatMessage("user", "rate")], Score, schema=SCHEMA)
    assert out.value == Score(2, "ok")
    assert out.asks == 1
    _, params = model.calls[0]
    assert params.json_schema == SCHEMA


async def test_invalid_answers_are_re_asked_with_the_reason() -> None:
    model = ScriptedModel(
        "s", ["garbage", '{"severity": 9, "note": "x"}', '{"severity": 4, "note": "y"}']
    )
    out = await complete_structured(model, [ChatMessage("user", "rate")], Score, schema=SCHEMA)
    assert (out.value.severity, out.asks) == (4, 3)
    last_messages, _ = model.calls[2]
    assert "Expected `int` <= 5" in last_messages[-1].content
    assert last_messages[-2] == ChatMessage("assistant", '{"severity": 9, "note": "x"}')


async def test_stays_invalid_raises_with_raw_and_completions() -> None:
    model = ScriptedModel("s", ["nope"] * 3)
    with pytest.raises(StructuredOutputError) as info:
        await complete_structured(
            model, [ChatMessage("user", "r")], Score, schema=SCHEMA, max_asks=3
        )
    assert info.value.raw == "nope"
    assert len(info.value.completions) == 3


async def test_custom_validation_and_types_are_not_coerced() -> None:
    def no_empty_note(score: Score) -> None:
        if not score.note:
            raise ValueError("note must not be empty")

    def script(messages: Sequence[ChatMessage], params: CallParams) -> str:
        return [
            '{"severity": "3", "note": "a"}',
            '{"severity": 3, "note": ""}',
            '{"severity": 3, "note": "b"}',
        ][len(messages) // 2]

    model = ScriptedModel("s", script)
    out = await complete_structured(
        model, [ChatMessage("user", "r")], Score, schema=SCHEMA, validate=no_empty_note
    )
    assert out.value == Score(3, "b")
    assert out.asks == 3


def test_answer_schemas_are_generated_from_the_structs_that_decode_them() -> None:
    """The mutator's and refiner's schemas come from their answer structs: byte for byte what
    was written by hand before, and their bounds are the very ones decoding enforces."""
    import json

    from mhsafeeval.agents._mutator import INSTRUCTION_SCHEMA, _Written
    from mhsafeeval.agents._refiner import NOTES_SCHEMA, _Notes
    from mhsafeeval.providers import answer_schema

    assert json.dumps(NOTES_SCHEMA) == json.dumps(
        {
            "type": "object",
            "properties": {
                "notes": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1, "maxLength": 300},
                    "minItems": 3,
                    "maxItems": 5,
                }
            },
            "required": ["notes"],
            "additionalProperties": False,
        }
    )
    assert json.dumps(INSTRUCTION_SCHEMA) == json.dumps(
        {
            "type": "object",
            "properties": {"instruction": {"type": "string", "minLength": 1, "maxLength": 600}},
            "required": ["instruction"],
            "additionalProperties": False,
        }
    )
    assert answer_schema(_Notes) == NOTES_SCHEMA and answer_schema(_Written) == INSTRUCTION_SCHEMA
    bounds = NOTES_SCHEMA["properties"]["notes"]
    for count in (bounds["minItems"] - 1, bounds["maxItems"] + 1):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"notes": ["a note"] * count}, _Notes)
    msgspec.convert({"notes": ["a note"] * bounds["minItems"]}, _Notes)
    too_long = "x" * (INSTRUCTION_SCHEMA["properties"]["instruction"]["maxLength"] + 1)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"instruction": too_long}, _Written)
