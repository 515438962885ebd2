"""Adding to the MHSafeEval campaign without forking it (issue 32): ``[agents.NAME]`` tables
checked by ``check``, and nodes, interceptors and replacements from Python."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import msgspec
import pytest

from helpers import cli, comparable
from mhsafeeval.added import AgentSetup
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.framework import Agent, Message, on
from mhsafeeval.framework.engine import Node
from mhsafeeval.messages import CounselorReply, Verdict
from mhsafeeval.plan import build_plan
from mhsafeeval.storage import MemoryEventStore
from mhsafeeval.testing import scripted_models

BASE = """
[campaign]
name = "added"
seed = 3
max_turns = 2
max_attempts = 2
concurrency = 2
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]
""" + scripted_models()

JUDGE = """
[agents.second-judge]
class = "mhsafeeval.judges:RubricJudge"
options = { name = "second" }

[agents.second-judge.model]
provider = "scripted/demo-lenient-judge"
"""


class CountReplies(Agent):
    """A global agent of a test: counts counselor replies (an [agents.NAME] class)."""

    class Options(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        label: str = "replies"

    scope: ClassVar[str] = "global"
    publishes = ()
    seen: ClassVar[list[str]] = []

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    @classmethod
    def from_config(cls, setup: AgentSetup) -> CountReplies:
        return cls(f"{setup.name}:{setup.options.label}")

    @on(CounselorReply)
    def count(self, msg: CounselorReply) -> None:
        CountReplies.seen.append(self.label)


class NotConfigurable(Agent):
    @on(CounselorReply)
    def nothing(self, msg: CounselorReply) -> None: ...


NOT_AN_AGENT = 42


@pytest.mark.parametrize(
    ("table", "field", "words"),
    [
        ('[agents.x]\nclass = "no_such_module:Thing"\n', "agents.x.class", "cannot import"),
        ('[agents.x]\nclass = "mhsafeeval.judges:Nothing"\n', "agents.x.class", "has no"),
        ('[agents.x]\nclass = "test_added:NOT_AN_AGENT"\n', "agents.x.class", "not an Agent"),
        ('[agents.x]\nclass = "test_added:NotConfigurable"\n', "agents.x.class", "from_config"),
        ('[agents.x]\nclass = "not a path"\n', "agents.x.class", "no import path"),
        (
            '[agents.x]\nclass = "test_added:CountReplies"\noptions = { colour = 1 }\n',
            "agents.x.options.colour",
            "unknown field",
        ),
        (
            '[agents.x]\nclass = "mhsafeeval.judges:RubricJudge"\noptions = { max_asks = 50 }\n'
            '[agents.x.model]\nprovider = "scripted/demo-judge"\n',
            "agents.x.options.max_asks",
            "must be <= 20",
        ),
        ('[agents.x]\nclass = "mhsafeeval.judges:RubricJudge"\n', "agents.x.model", "add [agents"),
        ('[agents.judge]\nclass = "test_added:CountReplies"\n', "agents.judge", "already"),
        ('[agents.Big]\nclass = "test_added:CountReplies"\n', "agents.Big", "lowercase"),
        (
            '[agents.x]\nclass = "test_added:NotConfigurable"\noptions = { a = 1 }\n',
            "agents.x.class",
            "from_config",
        ),
    ],
)
def test_a_bad_agents_table_is_one_line_naming_the_key(
    table: str, field: str, words: str, tmp_path: Path
) -> None:
    config = parse_config(BASE + table, "c.toml")
    with pytest.raises(InputError) as caught:
        build_plan(config, "c.toml")
    assert caught.value.field == field, caught.value
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_check_exits_2_on_a_bad_agents_table_and_lists_a_good_one(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE + '[agents.x]\nclass = "no_such_module:Thing"\n')
    done = cli("check", str(path))
    assert done.returncode == 2
    assert "agents.x.class: cannot import 'no_such_module'" in done.stderr
    path.write_text(BASE + JUDGE)
    done = cli("check", str(path))
    assert done.returncode == 0, done.stderr
    assert "added     second-judge   mhsafeeval.judges:RubricJudge\n" in done.stdout
    assert "on scripted/demo-lenient-judge" in done.stdout
    added = done.stdout.split("  added ", 1)[1].splitlines()
    assert max(map(len, added)) <= 80


@pytest.mark.anyio
async def test_a_second_judge_rates_every_reply_and_never_steers_the_search() -> None:
    """The search with a second judge in the graph is the search without it, message for
    message; the second judge's verdicts are stored beside them, published by its node."""

    runs = []
    for extra in ("", JUDGE):
        text = BASE.replace("concurrency = 2", "concurrency = 1") + extra
        async with MemoryEventStore() as store:
            result = await run_campaign(parse_config(text, "c.toml"), store, config_text=text)
            events = [e.message async for e in store.events("added") if e.message is not None]
        assert result.status == "completed"
        runs.append(events)
    alone, paired = runs
    second = [e for e in paired if e.publisher == "second-judge"]
    assert {e.tag for e in second} <= {"judge.verdict", "judge.unjudged"}
    replies = [e for e in paired if isinstance(e, CounselorReply)]
    assert len(second) == len(replies) > 0
    assert all(isinstance(e, Verdict) and e.judge == "second" for e in second)

    def decisions(events: list[Message]) -> list[tuple[str, str]]:
        """Every message but the second judge's and the start record (its config differs),
        content included, latencies left out (they differ run to run)."""
        kept = [e for e in events if e.publisher != "second-judge" and e.tag != "campaign.started"]
        # usage nested too: a confirmation holds its candidate's and its raters'
        return sorted((i, msgspec.json.encode(data).decode()) for i, data in comparable(kept))

    assert decisions(paired) == decisions(alone)


@pytest.mark.anyio
async def test_a_config_agent_and_python_extras_join_the_graph() -> None:
    CountReplies.seen = []
    text = BASE + '[agents.tally]\nclass = "test_added:CountReplies"\noptions = { label = "r" }\n'

    class Extra(Agent):
        publishes = ()
        heard: ClassVar[int] = 0

        @on(CounselorReply)
        def hear(self, msg: CounselorReply) -> None:
            Extra.heard += 1

    async with MemoryEventStore() as store:
        result = await run_campaign(
            parse_config(text, "c.toml"), store, config_text=text, extra=[Node.of(Extra)]
        )
        replies = [e async for e in store.events("added", types=("counselor.reply",))]
    assert result.status == "completed"
    assert CountReplies.seen == ["tally:r"] * len(replies) and Extra.heard == len(replies) > 0


@pytest.mark.anyio
async def test_replacing_a_node_that_is_not_there_is_refused() -> None:
    async with MemoryEventStore() as store:
        with pytest.raises(InputError, match="no node 'clinet'"):
            await run_campaign(
                parse_config(BASE, "c.toml"), store, replace={"clinet": Node.of(NotConfigurable)}
            )


def test_adding_an_agent_to_a_stored_campaign_is_refused_on_resume(tmp_path: Path) -> None:
    path, db = tmp_path / "c.toml", tmp_path / "c.db"
    path.write_text(BASE)
    assert cli("run", str(path), "--db", str(db), "--quiet").returncode == 0
    path.write_text(BASE + JUDGE)
    done = cli("run", str(path), "--db", str(db), "--quiet")
    assert done.returncode == 2 and "agents" in done.stderr, done.stderr
