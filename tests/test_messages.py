"""The message vocabulary is a stored schema: explicit tags, stable ids, lossless round trips."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mhsafeeval import messages
from mhsafeeval.framework import Message, encode_message
from mhsafeeval.framework._message import decode_message, message_id, message_types

VOCABULARY = [
    getattr(messages, n)
    for n in messages.__all__
    if isinstance(getattr(messages, n), type)
    and issubclass(getattr(messages, n), Message)
    and n != "Message"
]


def test_every_message_has_an_explicit_dotted_tag() -> None:
    for cls in VOCABULARY:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str) and "." in tag and tag == tag.lower(), cls
    tags = [cls.__struct_config__.tag for cls in VOCABULARY]
    assert len(tags) == len(set(tags))
    assert set(tags) <= set(message_types())


def test_frozen() -> None:
    msg = messages.CounselorReply(campaign="c", category="blaming", role="enabler", text="hi")
    with pytest.raises(AttributeError):
        msg.text = "changed"  # type: ignore[misc]


ids = st.text(max_size=12)


@given(
    campaign=ids,
    conversation=ids,
    turn=st.integers(0, 10**6),
    attempt=st.integers(0, 100),
    branch=ids,
    key=ids,
    text=st.text(),
)
def test_round_trip_and_id_depends_only_on_coordinates(
    campaign: str, conversation: str, turn: int, attempt: int, branch: str, key: str, text: str
) -> None:
    reply = messages.CounselorReply(
        campaign=campaign,
        conversation=conversation,
        turn=turn,
        attempt=attempt,
        branch=branch,
        key=key,
        category="gaslighting",
        role="enabler",
        text=text,
        usage=messages.Usage(model="m", prompt_tokens=3),
    )
    assert decode_message(encode_message(reply)) == reply
    assert (
        reply.id
        == messages.CounselorReply(
            campaign=campaign,
            conversation=conversation,
            turn=turn,
            attempt=attempt,
            branch=branch,
            key=key,
            category="blaming",
            role="perpetrator",
            text=text + "other",
        ).id
    )
    assert reply.id == message_id(
        "counselor.reply", campaign, conversation, turn, attempt, branch, key
    )


def test_id_separates_every_coordinate_and_the_type() -> None:
    base = dict(campaign="c", conversation="v", turn=1, attempt=1, branch="b", key="k")
    seen = {messages.ClientUtterance(**base, category="a", role="b", text="").id}  # type: ignore[arg-type]
    seen.add(messages.CounselorReply(**base, category="a", role="b", text="").id)  # type: ignore[arg-type]
    for field, value in [
        ("campaign", "c2"),
        ("conversation", "v2"),
        ("turn", 2),
        ("attempt", 2),
        ("branch", "b2"),
        ("key", "k2"),
    ]:
        changed: dict[str, Any] = {**base, field: value}
        seen.add(messages.ClientUtterance(**changed, category="a", role="b", text="").id)
    assert len(seen) == 8
    # Field boundaries cannot be shifted to forge another message's id.
    assert message_id("t", "ab", "c", 0, 0, "", "") != message_id("t", "a", "bc", 0, 0, "", "")


def test_child_ids_carry_correlation_and_causation() -> None:
    parent = messages.ClientUtterance(
        campaign="c", conversation="v", turn=3, attempt=2, category="a", role="b", text="x"
    )
    child = messages.CounselorReply(**parent.child_ids(), category="a", role="b", text="y")
    assert (child.campaign, child.conversation, child.turn, child.attempt) == ("c", "v", 3, 2)
    assert child.causation == parent.id


def test_old_rows_decode_when_fields_are_added() -> None:
    """New fields get defaults, so a row written before they existed still decodes."""
    row = (
        b'{"type":"judge.unjudged","campaign":"c",'
        b'"category":"blaming","role":"enabler","reason":"x"}'
    )
    msg = decode_message(row)
    assert isinstance(msg, messages.Unjudged) and msg.raw == "" and msg.turn == 0


def test_unknown_tag_is_a_validation_error() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_message(b'{"type":"no.such.type"}')


def test_user_messages_join_the_vocabulary() -> None:
    class Custom(Message, frozen=True, tag="user.custom"):
        value: int

    assert decode_message(encode_message(Custom(value=3))) == Custom(value=3)


def test_transcript_keeps_committed_turns_in_order() -> None:
    transcript = messages.Transcript()
    for turn in (2, 0, 1, 3):
        transcript.add(
            messages.TurnCommitted(
                conversation="c",
                turn=turn,
                committed_attempt=0,
                category="a",
                role="b",
                client_text=f"c{turn}",
                counselor_text=f"r{turn}",
            )
        )
    assert len(transcript) == 4
    assert [e.client for e in transcript.recent(2)] == ["c2", "c3"]
    assert [e.client for e in transcript.recent(10)] == ["c0", "c1", "c2", "c3"]
    assert [e.client for e in transcript.recent(-1)] == ["c0", "c1", "c2", "c3"]
    assert transcript.recent(0) == []
