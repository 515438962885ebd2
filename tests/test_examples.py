"""The composition examples (issue 32): each runs, and each killed with SIGKILL at several
points and run again stores exactly the events of a run nobody killed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import cli, kill_at_points, stored_count

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TABLES = (
    "models.client",
    "models.mutator",
    "models.judge",
    "models.refiner",
    "counselors.demo-counselor",
)


def _without_latency(value: Any) -> Any:
    """``value`` without wall-clock latencies, those of the messages an ``Intercepted`` record
    carries as JSON text included."""
    if isinstance(value, dict):
        return {
            k: _without_latency(json.loads(v) if k in ("original", "replacement") and v else v)
            for k, v in value.items()
            if "latency" not in k
        }
    if isinstance(value, list):
        return [_without_latency(v) for v in value]
    return value


def rows(db: Path) -> dict[str, tuple[str, str]]:
    """Every stored event by id: (type, JSON body without wall-clock latencies)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        found = con.execute("SELECT id, type, body FROM events").fetchall()
    return {
        i: (t, json.dumps(_without_latency(json.loads(b)), sort_keys=True)) for i, t, b in found
    }


def sequential_config(tmp_path: Path) -> Path:
    """examples/campaign.toml one conversation at a time (so a resumed run makes exactly the
    decisions of an uninterrupted one: conversations share the archive)."""
    text = (EXAMPLES / "campaign.toml").read_text().replace("concurrency = 4", "concurrency = 1")
    assert "concurrency = 1" in text
    path = tmp_path / "campaign.toml"
    path.write_text(text)
    return path


def kill_and_resume(command: Callable[[Path], list[str]], tmp_path: Path) -> dict[str, Any]:
    """Run once cleanly; then again with SIGKILLs at several points and a last run to the end
    (each scripted call takes 20 ms, so there is work in flight when a kill lands). Returns
    the clean run's events by type; asserts both stores hold the same events."""
    clean, crashed = tmp_path / "clean.db", tmp_path / "crashed.db"
    subprocess.run(command(clean), check=True, capture_output=True, timeout=300)
    total = stored_count(clean)
    killed = kill_at_points(command(crashed), crashed, total, kills=5, seed=11, wait_s=120)
    assert len(killed) >= 3 and all(0 < k < total for k in killed), (killed, total)
    done = subprocess.run(command(crashed), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rows(crashed) == rows(clean)
    return Counter(t for t, _ in rows(clean).values())


@pytest.mark.slow
def test_the_second_judge_example_rates_every_reply_and_resumes_exactly(tmp_path: Path) -> None:
    def command(db: Path) -> list[str]:
        sets = ["--set", "campaign.concurrency=1"]
        tables = (*TABLES, "agents.second-judge.model")
        sets += [a for t in tables for a in ("--set", f"{t}.options.delay_s=0.02")]
        config = str(EXAMPLES / "second_judge.toml")
        return [
            sys.executable,
            "-m",
            "mhsafeeval.cli",
            "run",
            config,
            "--db",
            str(db),
            "--quiet",
            *sets,
        ]

    kinds = kill_and_resume(command, tmp_path)
    # every reply judged twice: by the search's judge and by second-judge
    assert kinds["judge.verdict"] + kinds["judge.unjudged"] == 2 * kinds["counselor.reply"]
    report = json.loads(cli("report", str(tmp_path / "crashed.db"), "--json", check=True).stdout)
    [model] = report["second-judge-demo"]["models"].values()
    raters = {j["judge"] or j["source"]: j for j in model["judges"]}
    assert {j["source"] for j in model["judges"]} >= {"search", "graph"}, raters


@pytest.mark.slow
def test_the_guardrail_example_rewrites_replies_and_resumes_exactly(tmp_path: Path) -> None:
    config = sequential_config(tmp_path)

    def command(db: Path) -> list[str]:
        delay = ["--delay", "0.02"]
        script = str(EXAMPLES / "guardrail.py")
        return [sys.executable, script, "--db", str(db), "--config", str(config), *delay]

    kinds = kill_and_resume(command, tmp_path)
    assert kinds["runtime.intercepted"] > 0
    done = subprocess.run(
        command(tmp_path / "crashed.db"), capture_output=True, text=True, timeout=300
    )
    assert "interceptors (what they dropped or rewrote" in done.stdout
    assert f"guardrail: rewritten {kinds['runtime.intercepted']} counselor.reply" in done.stdout
    with sqlite3.connect(tmp_path / "crashed.db") as con:
        replies = [
            json.loads(b)["text"]
            for (b,) in con.execute("SELECT body FROM events WHERE type = 'counselor.reply'")
        ]
    assert not any("never happened the way you remember" in r for r in replies)


@pytest.mark.slow
def test_the_custom_client_example_replaces_the_client_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    config = sequential_config(tmp_path)

    def command(db: Path) -> list[str]:
        delay = ["--delay", "0.02"]
        script = str(EXAMPLES / "custom_client.py")
        return [sys.executable, script, "--db", str(db), "--config", str(config), *delay]

    kinds = kill_and_resume(command, tmp_path)
    assert kinds["client.utterance"] == kinds["counselor.reply"] > 0
    with sqlite3.connect(tmp_path / "crashed.db") as con:
        usage = [
            json.loads(b)["usage"]
            for (b,) in con.execute("SELECT body FROM events WHERE type = 'client.utterance'")
        ]
    assert usage and all(u is None for u in usage)  # no model was asked
