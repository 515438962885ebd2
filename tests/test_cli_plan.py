"""The CLI is one composition root: a command reads and parses its config file once, builds
the campaign's plan once and passes it on, and opens the event database once."""

from __future__ import annotations

import builtins
import io
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mhsafeeval.campaign
import mhsafeeval.config
import mhsafeeval.plan
from mhsafeeval.cli import main
from mhsafeeval.storage import SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]


def _counting(counts: Counter[str], key: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return function(*args, **kwargs)

    return counted


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The scripted example campaign, one turn long so that a run takes a second."""
    path = tmp_path / "c.toml"
    text = (ROOT / "examples" / "campaign.toml").read_text(encoding="utf-8")
    path.write_text(text.replace("max_turns = 4", "max_turns = 1"), encoding="utf-8")
    return path


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch, config: Path) -> Counter[str]:
    """Calls of build_plan and parse_config, opens of the config file and of the database."""
    found: Counter[str] = Counter()
    campaign, settings, plan = mhsafeeval.campaign, mhsafeeval.config, mhsafeeval.plan
    build_plan = _counting(found, "build_plan", plan.build_plan)
    monkeypatch.setattr(plan, "build_plan", build_plan)  # where the CLI finds it
    monkeypatch.setattr(campaign, "build_plan", build_plan)  # run_campaign's own, without plan=
    monkeypatch.setattr(settings, "parse_config", _counting(found, "parse", settings.parse_config))
    monkeypatch.setattr(
        SqliteEventStore, "open", _counting(found, "db open", SqliteEventStore.open)
    )
    real_open = io.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and Path(os.fspath(file)) == config:
            found["config read"] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)  # what Path.read_text opens through
    monkeypatch.setattr(builtins, "open", counting_open)
    return found


def test_check_reads_and_plans_once(config: Path, counts: Counter[str]) -> None:
    assert main(["check", str(config)]) == 0
    assert dict(counts) == {"config read": 1, "parse": 1, "build_plan": 1}


def test_estimate_reads_and_plans_once(
    config: Path, counts: Counter[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    assert main(["run", str(config), "--db", str(db), "--estimate"]) == 0
    assert "3 conversation(s) x 1 turn(s)" in capsys.readouterr().out
    assert dict(counts) == {"config read": 1, "parse": 1, "build_plan": 1}
    assert not db.exists()


@pytest.mark.parametrize("demo", [False, True], ids=["config", "demo"])
def test_a_run_and_its_resume_read_plan_and_open_the_database_once(
    config: Path,
    counts: Counter[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    demo: bool,
) -> None:
    if demo:  # the demo's own flow (no config given), on the scripted stand-in
        monkeypatch.setattr(mhsafeeval.campaign, "DEMO_CONFIG", config)
    argv = ["run", *([] if demo else [str(config)]), "--db", str(tmp_path / "r.db"), "--quiet"]
    assert main(argv) == 0
    assert dict(counts) == {"config read": 1, "parse": 1, "build_plan": 1, "db open": 1}
    counts.clear()
    assert main(argv) == 0  # the stored campaign: resumed, already finished
    assert "resuming" in capsys.readouterr().err
    assert dict(counts) == {"config read": 1, "parse": 1, "build_plan": 1, "db open": 1}
