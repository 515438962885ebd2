"""The command line: help, providers, events, and exit codes for bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli
from mhsafeeval.cli import main
from mhsafeeval.messages import ClientUtterance, CounselorReply
from mhsafeeval.storage import SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    commands = ("providers", "check", "events", "run", "report", "profiles", "taxonomy")
    for command in (*commands, "calibrate"):
        assert command in out


def test_console_script_runs() -> None:
    done = cli("providers", check=True)
    assert "scripted/..." in done.stdout and "litellm/..." in done.stdout


async def _make_db(path: Path) -> None:
    async with SqliteEventStore(path) as store:
        await store.register_campaign("c1")
        for turn in range(3):
            base = dict(
                campaign="c1",
                conversation="c1/m/p/0",
                turn=turn,
                category="blaming",
                role="enabler",
            )
            await store.append(ClientUtterance(**base, text=f"client {turn}"))  # type: ignore[arg-type]
            await store.append(CounselorReply(**base, text=f"counselor {turn}"))  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_events_lists_filters_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "c.db"
    await _make_db(db)

    # The CLI runs its own event loop: call it in a subprocess.
    listing = cli("events", str(db))
    assert listing.returncode == 0
    assert listing.stdout.count("client.utterance") == 3
    assert listing.stdout.count("counselor.reply") == 3
    only = cli("events", str(db), "--type", "counselor.reply", "--json")
    rows = [json.loads(line) for line in only.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["counselor 0", "counselor 1", "counselor 2"]
    limited = cli("events", str(db), "--limit", "2")
    assert len(limited.stdout.splitlines()) == 2
    missing = cli("events", str(db), "--campaign", "nope")
    assert missing.returncode == 2
    assert "no campaign 'nope' (stored: c1)" in missing.stderr


def test_events_on_a_missing_or_bad_database_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", str(tmp_path / "absent.db")]) == 2
    assert "absent.db" in capsys.readouterr().err
    bad = tmp_path / "notes.db"
    bad.write_text("not a database")
    assert main(["events", str(bad)]) == 2
    assert "not a SQLite database" in capsys.readouterr().err
    assert bad.read_text() == "not a database"


def test_example_graph_runs_and_stores(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_graph.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "example.flagged      3" in done.stdout
    assert db.exists()


def test_run_refuses_missing_keys_and_unknown_providers_before_writing(tmp_path: Path) -> None:
    base = (ROOT / "examples" / "campaign.toml").read_text()
    for change, expected, check_code in [
        (
            '[counselors.hosted]\nprovider = "litellm/openai/gpt-4o-mini"\n'
            'api_key_env = "MHS_TEST_SURELY_UNSET"\n',
            "counselors.hosted.api_key_env: the environment variable MHS_TEST_SURELY_UNSET "
            "is not set",
            0,  # a key set where the run happens is fine: check warns
        ),
        (
            '[counselors.odd]\nprovider = "nosuch/model"\n',
            "counselors.odd.provider: unknown provider",
            2,  # no machine can run it: check refuses it too
        ),
    ]:
        config = tmp_path / "c.toml"
        config.write_text(base + "\n" + change)
        db = tmp_path / "never.db"
        done = cli("run", str(config), "--db", str(db))
        assert done.returncode == 2, done.stderr
        assert expected in done.stderr
        assert not db.exists()
        checked = cli("check", str(config))
        assert checked.returncode == check_code, checked.stderr
        word = "warning: " if check_code == 0 else "error: "
        assert word in checked.stderr and expected in checked.stderr


def test_profiles_and_taxonomy_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "grief-widower" in out and "14 profile(s) ok (built-in)" in out
    assert main(["taxonomy"]) == 0
    out = capsys.readouterr().out
    assert "R-MHSafe" in out and "Gaslighting" in out

    broken = tmp_path / "client.json"
    broken.write_text('{"life_history": "x", "core_beliefs": ["y"]}')
    assert main(["profiles", str(broken)]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "missing required field" in err

    tax = tmp_path / "tax.toml"
    tax.write_text('name = "t"\nversion = "1"\ndescription = "d"\n[categories]\n')
    assert main(["taxonomy", str(tax)]) == 2
    assert str(tax) in capsys.readouterr().err


@pytest.mark.parametrize(("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_stops_cleanly_and_keeps_what_was_stored(
    tmp_path: Path, signal_name: str, code: int
) -> None:
    """Ctrl-C (exit 130) and SIGTERM (exit 143, what service managers and `kill` send) both
    cancel the calls in flight, flush the store and record the run as interrupted."""
    import signal

    config = tmp_path / "long.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml")
        .read_text()
        .replace("max_turns = 4", "max_turns = 1000")
    )
    db = tmp_path / "long.db"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mhsafeeval.cli",
            "run",
            str(config),
            "--db",
            str(db),
            "--progress-every",
            "0",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until turns are being committed, then interrupt
        if line.startswith("progress:") and " turns 0/" not in line:
            break
    proc.send_signal(getattr(signal, signal_name))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    events = cli("events", str(db), "--type", "campaign.finished", "--json", check=True)
    [finished] = [json.loads(line) for line in events.stdout.splitlines()]
    assert finished["status"] == "interrupted"
    report = cli("report", str(db), "--json", check=True)
    assert json.loads(report.stdout)["scripted-demo"]["models"]["demo-counselor"]["turns"] >= 1


def test_api_keys_never_reach_the_database_logs_or_reports(tmp_path: Path) -> None:
    key = "sk-planted-0123456789abcdefXYZ"
    config = tmp_path / "keyed.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + '\n[counselors.hosted]\nprovider = "litellm/openai/gpt-4o-mini"\n'
        'api_key_env = "MHS_PLANTED_KEY"\noptions = { mock_response = "I hear you." }\n'
    )
    db = tmp_path / "keyed.db"
    env = {**os.environ, "MHS_PLANTED_KEY": key, "LITELLM_LOG": "DEBUG"}
    outputs = []
    for args in (
        ["--log-level", "debug", "--log-json", "run", str(config), "--db", str(db)],
        ["report", str(db)],
        ["report", str(db), "--json"],
        ["events", str(db), "--json"],
    ):
        done = cli(*args, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs += [done.stdout, done.stderr]
    assert "hosted" in outputs[2]  # the keyed counselor really ran
    for text in outputs:
        assert key not in text
    for path in tmp_path.iterdir():
        assert key.encode() not in path.read_bytes(), path


def test_estimate_prints_calls_per_role_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    config = str(ROOT / "examples" / "campaign.toml")
    assert main(["run", config, "--db", str(db), "--estimate"]) == 0
    out = capsys.readouterr().out
    # 3 conversations x 4 turns, 1 to 3 attempts per turn: 12 to 36 counselor calls.
    assert re.search(r"counselor\s+scripted/demo-counselor\s+12\s+36", out)
    assert re.search(r"refiner\s+scripted/demo-refiner\s+0\s+72", out)
    assert main(["run", config, "--db", str(db), "--estimate", "--controller", "uct"]) == 0
    out = capsys.readouterr().out
    # 5 simulations a turn, the first 4 at once (a turn may stop at its first success); the
    # refiner writes notes on the first max_attempts - 1 = 2 of them (3 calls each, at most)
    assert re.search(r"counselor\s+scripted/demo-counselor\s+48\s+60", out)
    assert re.search(r"refiner\s+scripted/demo-refiner\s+0\s+72", out)
    args = ["run", config, "--db", str(db), "--estimate", "--controller", "uct"]
    assert main([*args, "--set", "search.notes=false"]) == 0
    assert re.search(r"refiner\s+scripted/demo-refiner\s+0\s+0\n", capsys.readouterr().out)
    assert not db.exists()


def test_export_command_writes_owner_only_files(tmp_path: Path) -> None:
    import csv
    import stat

    db = tmp_path / "demo.db"
    cli("run", str(ROOT / "examples" / "campaign.toml"), "--db", str(db), "--quiet", check=True)
    out = tmp_path / "attempts.csv"
    cli("export", str(db), "--format", "csv", "--out", str(out), check=True)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    lines = cli("export", str(db), check=True).stdout.splitlines()
    assert len(rows) == len(lines) > 0
    assert {r["outcome"] for r in rows} <= {"verdict", "unjudged", "failed", "incomplete"}
    archive = json.loads(cli("export", str(db), "--archive", check=True).stdout)
    assert set(archive) == {"demo-counselor"}


def test_a_failing_counselor_is_named_and_the_exit_code_is_1(tmp_path: Path) -> None:
    config = tmp_path / "down.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + '\n[counselors.down]\nprovider = "litellm/openai/gpt-4o-mini"\n'
        'api_key_env = "MHS_DOWN_KEY"\nmax_attempts = 1\nbreaker_threshold = 2\n'
        'options = { mock_response = "litellm.InternalServerError" }\n'
    )
    done = cli(
        "run",
        str(config),
        "--db",
        str(tmp_path / "d.db"),
        env={**os.environ, "MHS_DOWN_KEY": "sk-test-down-000000"},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "3/3 conversations" not in done.stderr
    named = [line for line in done.stderr.splitlines() if "did not complete" in line]
    assert len(named) == 3 and all("/down/" in line for line in named)
    assert "counselor (litellm/openai/gpt-4o-mini)" in named[0]
    assert "/demo-counselor/" not in "\n".join(named)  # the other model's conversations went on


def test_the_demo_ends_by_saying_what_its_numbers_are_and_where_to_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mhsafeeval.campaign

    # The demo's own flow (no config given), on scripted models so that it takes seconds.
    scripted = (
        (ROOT / "examples" / "campaign.toml").read_text().replace("max_turns = 4", "max_turns = 1")
    )
    stand_in = tmp_path / "demo.toml"
    stand_in.write_text(scripted)
    monkeypatch.setattr(mhsafeeval.campaign, "DEMO_CONFIG", stand_in)
    db = tmp_path / "demo.db"
    assert main(["run", "--db", str(db), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "ASR" in out  # the report came first
    assert "This was the offline demo" in err and "not a verdict on any model" in err
    assert f"the whole record:  {db}" in err
    assert f"mhsafeeval report {db} --html demo.html" in err
    assert f"mhsafeeval view {db}" in err and "`mhsafeeval init`" in err
    assert "mhsafeeval check CONFIG" in err
    # with a config of one's own, no demo epilogue
    assert main(["run", str(stand_in), "--db", str(tmp_path / "own.db"), "--quiet"]) == 0
    assert "This was the offline demo" not in capsys.readouterr().err
