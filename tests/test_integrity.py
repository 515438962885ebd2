"""Integrity of the record: no campaign ends "finished" with work it never did.

Every role goes through the real litellm path to the fault server (tests/fake_openai.py), which
answers as the ``scripted/demo-*`` personas, one model name per role, so one role at a time can
be taken down and brought back.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import cli, stored
from mhsafeeval.campaign import run_campaign
from mhsafeeval.cli import main
from mhsafeeval.config import parse_config
from mhsafeeval.framework import Agent, on
from mhsafeeval.judges import judge
from mhsafeeval.messages import (
    CallFailed,
    Confirmation,
    ConversationFinished,
    CounselorReply,
    Message,
    TurnCommitted,
    Unjudged,
    Verdict,
)
from mhsafeeval.providers import CallParams, ChatMessage
from mhsafeeval.search import controller
from mhsafeeval.storage import MemoryEventStore, SqliteEventStore
from mhsafeeval.testing import register_script, scripted_models
from mhsafeeval.testing._demo import (
    demo_client,
    demo_counselor,
    demo_judge,
    demo_mutator,
    demo_refiner,
)

ROOT = Path(__file__).resolve().parents[1]
PERSONAS: dict[str, Callable[[Sequence[ChatMessage], CallParams], str]] = {
    "client": demo_client,
    "mutator": demo_mutator,
    "counselor": demo_counselor,
    "judge": demo_judge,
    "refiner": demo_refiner,
}


def persona(role: str) -> Reply:
    """The fault server answering as the demo persona of ``role``."""
    script = PERSONAS[role]

    def answer(body: Any) -> str:
        messages = [ChatMessage(m["role"], m["content"]) for m in body["messages"]]
        return script(messages, CallParams(seed=body.get("seed")))

    return Reply.computed(answer)


def hosted_config(path: Path, url: str, *, extra: str = "") -> Path:
    """Every role hosted on the fault server, as model ``<role>-x``; no provider retries."""

    def table(role: str) -> str:
        name = "counselors.bot" if role == "counselor" else f"models.{role}"
        return (
            f'\n[{name}]\nprovider = "litellm/openai/{role}-x"\napi_base = "{url}/v1"\n'
            'api_key_env = "MHS_FAKE_KEY"\nmax_attempts = 1\nbreaker_threshold = 1000\n'
            "timeout = 20.0\n"
        )

    tables = "".join(table(role) for role in PERSONAS)
    path.write_text(
        """
[campaign]
name = "outage"
seed = 5
max_turns = 3
max_attempts = 3
conversations_per_profile = 1
concurrency = 2
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]
"""
        + extra
        + tables
    )
    return path


def requests_for(fake: FakeOpenAI, model: str) -> int:
    return sum(isinstance(r.body, dict) and r.body.get("model") == model for r in fake.requests)


@pytest.mark.parametrize(
    ("down", "controller"),
    [
        ("judge", "map-elites"),
        ("client", "map-elites"),
        ("mutator", "map-elites"),
        ("refiner", "map-elites"),
        ("judge", "uct"),
        ("client", "uct"),
    ],
)
def test_a_role_that_never_answers_leaves_turns_open_and_a_rerun_continues_them(
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    down: str,
    controller: str,
) -> None:
    monkeypatch.setenv("MHS_FAKE_KEY", "sk-test-fake-0000000000")
    for role in PERSONAS:
        fake_openai.always(f"{role}-x", persona(role))
    fake_openai.always(f"{down}-x", Reply.error(503))
    search = f'controller = "{controller}"\n\n[search]\nsimulations = 5\nin_flight = 3\n'
    config = hosted_config(tmp_path / "c.toml", fake_openai.url, extra=search)
    db = tmp_path / "c.db"

    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "2/2 conversations finished (2 failed)" in err, err
    named = [line for line in err.splitlines() if "did not complete" in line]
    assert len(named) == 2
    assert all(f"the {down} (litellm/openai/{down}-x) did not answer" in line for line in named), (
        named
    )
    first = stored(db)
    # Nothing was committed past the role that never answered: every committed turn was
    # judged, and no turn of a failed conversation was committed after its failure.
    failures = [m for m in first if isinstance(m, CallFailed) and m.agent == down]
    assert failures and all(not f.unusable for f in failures)
    for commit in (m for m in first if isinstance(m, TurnCommitted)):
        assert commit.best_severity is not None, commit
    ends = {m.conversation: m for m in first if isinstance(m, ConversationFinished)}
    for failure in failures:
        assert ends[failure.conversation].turn == failure.turn
        assert not any(
            isinstance(m, TurnCommitted)
            and m.conversation == failure.conversation
            and m.turn >= failure.turn
            for m in first
        )
    replies_before = {m.id for m in first if isinstance(m, CounselorReply)}
    counselor_calls_before = requests_for(fake_openai, "counselor-x")
    assert counselor_calls_before == len(replies_before)

    fake_openai.always(f"{down}-x", persona(down))  # the role is back
    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "2/2 conversations finished (0 failed)" in err, err
    events = stored(db)
    replies = [m for m in events if isinstance(m, CounselorReply)]
    # Each stored reply was kept, and the counselor was called once per reply, ever: the
    # replies stored before the outage were judged without calling the counselor again.
    assert replies_before <= {r.id for r in replies}
    assert requests_for(fake_openai, "counselor-x") == len(replies)
    outcomes = Counter(
        m.causation for m in events if isinstance(m, Verdict | Unjudged | CallFailed)
    )
    assert all(outcomes[r.id] == 1 for r in replies)
    commits = Counter((m.conversation, m.turn) for m in events if isinstance(m, TurnCommitted))
    assert len(commits) == 2 * 3 and set(commits.values()) == {1}
    assert not any(isinstance(m, CallFailed) for m in events)  # moved aside, not deleted
    statuses = [m.status for m in events if isinstance(m, ConversationFinished)]
    assert statuses == ["completed", "completed"]


# --- repeated profile ids -------------------------------------------------------------------


def test_repeated_profile_ids_are_refused_by_check_and_run(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        """
[campaign]
name = "dup"
max_turns = 1
profile_ids = ["grief-widower", "panic-disorder-bus-driver", "grief-widower"]
"""
        + scripted_models()
    )
    db = tmp_path / "c.db"
    for command in (["check", str(config)], ["run", str(config), "--db", str(db)]):
        done = cli(*command, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "campaign.profile_ids" in done.stderr and "'grief-widower'" in done.stderr
        assert "Traceback" not in done.stderr
    assert not db.exists() and not Path(f"{db}.lock").exists()


# --- stalls ---------------------------------------------------------------------------------


class SilentJudge(Agent):
    """A judge plugin that forgets to publish: it takes every reply and says nothing."""

    @on(CounselorReply)
    async def rate(self, msg: CounselorReply) -> None:
        await anyio.lowlevel.checkpoint()


@judge("silent-test", replace=True)
def silent_judge(model: object, taxonomy: object, run: object, options: object) -> SilentJudge:
    return SilentJudge()


@controller("idle-test", uses_refiner=False, replace=True)
class IdleController(Agent):
    """A controller plugin that never directs anything. (It takes the judge's answers and the
    failures a controller must handle, so that the graph's wiring check lets it run: what
    stalls is the search.)"""

    def __init__(self, cells: object, run: object, options: object) -> None:
        super().__init__()

    @on(ConversationFinished, Verdict, Confirmation, Unjudged, CallFailed)
    def ignore(self, msg: Message) -> None:
        pass


STALL_CONFIG = """
[campaign]
name = "stall"
max_turns = 2
max_attempts = 2
concurrency = 2
profile_ids = ["grief-widower", "panic-disorder-bus-driver", "depression-laid-off-engineer"]
"""


@pytest.mark.parametrize(
    ("setting", "last"),
    [('judge = "silent-test"', "counselor.reply"), ('controller = "idle-test"', "conversation")],
)
@pytest.mark.anyio
async def test_a_plugin_that_never_answers_stalls_its_conversations_never_the_run(
    setting: str, last: str
) -> None:
    text = STALL_CONFIG.replace("[campaign]\n", f"[campaign]\n{setting}\n") + scripted_models()
    cfg = parse_config(text, "stall.toml")
    async with MemoryEventStore() as store:
        with anyio.fail_after(60):  # today: waits forever
            result = await run_campaign(cfg, store)
        events = [e.message async for e in store.events("stall") if e.message is not None]
        assert (result.status, result.finished, result.failed) == (
            "completed_with_failures",
            3,
            3,
        )
        ends = [m for m in events if isinstance(m, ConversationFinished)]
        assert len(ends) == 3 and {m.status for m in ends} == {"stalled"}
        assert all(f"the last message it got was {last}" in m.detail for m in ends), ends
        # Run again: the stalled conversations are picked up where they stopped (their end
        # records moved aside) and, the plugin being as silent as before, stall again.
        with anyio.fail_after(60):
            again = await run_campaign(cfg, store)
        assert (again.finished, again.failed, again.resumed_from > 0) == (3, 3, True)
        events = [e.message async for e in store.events("stall") if e.message is not None]
        assert len([m for m in events if isinstance(m, ConversationFinished)]) == 3
        assert await store.superseded("stall") >= 3


# --- every controller with every ablation ---------------------------------------------------

ABLATION_CONFIG = """
[campaign]
name = "abl"
seed = 9
max_turns = 4
max_attempts = 3
concurrency = 2
controller = "{controller}"
profile_ids = ["grief-widower", "panic-disorder-bus-driver"]

[search]
simulations = 20
in_flight = 3

[ablation]
{ablation}
"""


_FLAKY: dict[bytes, bool] = {}


def flaky_judge(messages: Sequence[ChatMessage], params: CallParams) -> str:
    """The demo judge, but every third reply it is asked about (the first one included;
    its re-asks alike) gets answers that never parse, so every campaign meets unjudged
    replies. (A hash of the prompt chose them once: a change of message ids moved them, and a
    single-turn campaign of few replies then met none.)"""
    prompt = "".join(m.content for m in messages[:2])  # re-asks only add to the end
    digest = hashlib.blake2b(prompt.encode(), digest_size=16).digest()
    if _FLAKY.setdefault(digest, len(_FLAKY) % 3 == 0):
        return "I would rather not say."
    return demo_judge(messages, params)


register_script("flaky-judge", flaky_judge)


@pytest.mark.parametrize("ablation", ["", "single_turn", "no_role_conditioning", "no_qd_search"])
@pytest.mark.parametrize("controller", ["map-elites", "uct", "random", "single-turn"])
@pytest.mark.anyio
async def test_every_controller_runs_with_every_ablation(controller: str, ablation: str) -> None:
    _FLAKY.clear()  # this campaign's first reply is unjudged
    text = ABLATION_CONFIG.format(
        controller=controller, ablation=f"{ablation} = true" if ablation else ""
    )
    cfg = parse_config(text + scripted_models(judge="flaky-judge"), "abl.toml")
    async with MemoryEventStore() as store:
        with anyio.fail_after(120):
            result = await run_campaign(cfg, store)
        events = [e.message async for e in store.events("abl") if e.message is not None]
    assert (result.status, result.failed) == ("completed", 0), [
        m for m in events if isinstance(m, ConversationFinished)
    ]
    assert any(isinstance(m, Unjudged) for m in events)
    turns = 1 if ablation == "single_turn" or controller == "single-turn" else 4
    commits = Counter((m.conversation, m.turn) for m in events if isinstance(m, TurnCommitted))
    assert len(commits) == 2 * turns and set(commits.values()) == {1}


# --- signals and output errors --------------------------------------------------------------


def test_a_closed_stdout_is_not_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    cli("run", str(ROOT / "examples" / "campaign.toml"), "--db", str(db), "--quiet", check=True)
    for command in (["report", str(db)], ["events", str(db)], ["export", str(db)]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "mhsafeeval.cli", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # like `| head -0`: the reader is gone before anything is written
        err = proc.stderr.read()
        proc.wait(timeout=60)
        proc.stderr.close()
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert proc.returncode == 141, (command, proc.returncode, err)


def test_a_store_that_cannot_write_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills up mid-campaign: the store (a critical observer) raises inside the
    runtime's task group, and the error reaches the user as one line, exit 1."""
    appended = 0
    real_append = SqliteEventStore.append

    async def filling_up(self: SqliteEventStore, message: Message) -> None:
        nonlocal appended
        appended += 1
        if appended > 20:
            raise OSError(28, "No space left on device")
        await real_append(self, message)

    monkeypatch.setattr(SqliteEventStore, "append", filling_up)
    config = ROOT / "examples" / "campaign.toml"
    code = main(["run", str(config), "--db", str(tmp_path / "full.db"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and "ExceptionGroup" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("mhsafeeval: error:")]
    assert "No space left on device" in line


def test_check_and_progress_show_names_with_escapes_made_visible(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[campaign]\nname = "esc"\nmax_turns = 1\nmax_attempts = 1\n'
        'profile_ids = ["grief-widower"]\n'
        + scripted_models().replace("[counselors.demo]", '[counselors."do\\u001b[2Jwn"]')
    )
    checked = cli("check", str(config), timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert "\x1b" not in checked.stdout and "do\\x1b[2Jwn" in checked.stdout
    run = cli("run", str(config), "--db", str(tmp_path / "c.db"), "--progress-every", "0")
    assert run.returncode == 0, run.stderr
    progress = [line for line in run.stderr.splitlines() if line.startswith("progress:")]
    assert progress and "do\\x1b[2Jwn" in progress[-1]
    assert "\x1b" not in run.stderr + run.stdout
