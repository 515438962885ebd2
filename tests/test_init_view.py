"""Getting started and looking: `init`, `view`, and `--set` overrides of config values."""

from __future__ import annotations

import json
import os
import webbrowser
from pathlib import Path

import anyio
import pytest

from helpers import cli, stored
from mhsafeeval.cli import main
from mhsafeeval.config import load_config, parse_config, parse_override, read_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import CampaignStarted
from mhsafeeval.scaffold import INIT_TEMPLATE
from mhsafeeval.storage import SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]
SCRIPTED = ROOT / "examples" / "campaign.toml"

# Every model table of the `init` config replaced whole by a scripted stand-in (a whole table,
# so that its api_key_env goes too).
STAND_INS = [
    "--set",
    'models.default={ provider = "scripted/demo-mutator" }',
    "--set",
    'models.client={ provider = "scripted/demo-client" }',
    "--set",
    'models.refiner={ provider = "scripted/demo-refiner" }',
    "--set",
    'models.judge={ provider = "scripted/demo-judge" }',
    "--set",
    'counselors.gpt-4o-mini={ provider = "scripted/demo-counselor" }',
]


def _without_keys() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return env | {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _stored_config(db: Path) -> dict[str, object]:
    async def read() -> dict[str, object]:
        async with SqliteEventStore(db, read_only=True) as store:
            [info] = await store.list_campaigns()
            data: dict[str, object] = json.loads(info.config)
            return data

    return anyio.run(read, backend="asyncio")


def test_init_writes_the_template_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "study"  # created by init
    assert main(["init", str(folder)]) == 0
    written = folder / "campaign.toml"
    assert written.read_text() == INIT_TEMPLATE.read_text()
    out = capsys.readouterr().out
    assert f"mhsafeeval check {written}" in out and f"mhsafeeval view {folder}" in out

    written.write_text("# my edits\n")
    assert main(["init", str(folder)]) == 2
    err = capsys.readouterr().err
    assert str(written) in err and "--force" in err
    assert written.read_text() == "# my edits\n"  # kept
    assert main(["init", str(folder), "--force"]) == 0
    assert written.read_text() == INIT_TEMPLATE.read_text()
    assert sorted(p.name for p in folder.iterdir()) == ["campaign.toml"]  # no temporary left

    a_file = tmp_path / "plain"
    a_file.write_text("")
    assert main(["init", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_check_accepts_the_init_config_warning_about_unset_keys(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path)]) == 0
    done = cli("check", str(tmp_path / "campaign.toml"), env=_without_keys(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ok (campaign 'campaign'" in done.stdout
    assert "the environment variable OPENAI_API_KEY is not set (needed to run)" in done.stderr


def _uncommented(template: str) -> str:
    """The template with each commented-out EXAMPLE block's TOML lines (from its first
    ``# [table]`` line to the blank line ending the block) uncommented."""
    lines, inside, tables = [], False, False
    for line in template.splitlines():
        inside = (inside or line.startswith("# ---- EXAMPLE")) and bool(line.strip())
        tables = inside and (tables or line.startswith("# ["))
        lines.append(line.removeprefix("# ") if tables else line)
    return "\n".join(lines) + "\n"


def test_the_commented_out_examples_are_valid_once_uncommented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _uncommented(INIT_TEMPLATE.read_text())
    function = ROOT / "examples" / "app_target.py"
    text = text.replace("python/my_bot.app:reply", f"python/{function}:reply")
    for table in ("[counselors.my-app]", "[counselors.my-function]", "[gate]", "[[gate.cells]]"):
        assert any(line.startswith(table) for line in text.splitlines())  # uncommented
    config = tmp_path / "campaign.toml"
    config.write_text(text)
    monkeypatch.setenv("OPENAI_API_KEY", "set-for-this-check")
    assert main(["check", str(config)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "counselor my-app" in out and "counselor my-function" in out


def test_the_init_config_runs_on_scripted_stand_ins(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path)]) == 0
    config, db = tmp_path / "campaign.toml", tmp_path / "campaign.db"
    turns = ["--set", "campaign.max_turns=2", "--set", "campaign.max_attempts=2"]
    done = cli("run", str(config), "--db", str(db), "--quiet", *STAND_INS, *turns, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "3/3 conversations finished (0 failed)" in done.stderr
    assert "gpt-4o-mini" in done.stdout  # the counselor's name in the report
    started = [m for m in stored(db) if isinstance(m, CampaignStarted)]
    assert started[0].max_turns == 2


def test_set_values_are_typed_and_checked_like_the_file() -> None:
    base = SCRIPTED.read_text()
    config = parse_config(
        base,
        "c.toml",
        [
            "campaign.max_turns=3",
            "campaign.name=nightly run",
            "campaign.profile_ids=['grief-widower']",
            "models.judge.temperature=0.25",
            "ablation.single_turn=true",
        ],
    )
    assert config.campaign.max_turns == 3
    assert config.campaign.name == "nightly run"  # no TOML value: taken as a string
    assert config.campaign.profile_ids == ["grief-widower"]
    assert config.models["judge"].temperature == 0.25
    assert config.models["judge"].provider == "scripted/demo-judge"  # the rest of the table kept
    assert config.ablation.single_turn is True
    assert parse_override('counselors."bot.v2".provider=x').path == (
        "counselors",
        "bot.v2",
        "provider",
    )
    assert parse_config(base, "c.toml", ["campaign.seed=1", "campaign.seed=5"]).campaign.seed == 5

    # The same bad value, in the file and on the command line: the same reason, named apart.
    for key, value in [("threshold", "9"), ("context_turns", "-1"), ("judge_max_asks", '"3"')]:
        with pytest.raises(InputError) as in_file:
            parse_config(base.replace("[campaign]\n", f"[campaign]\n{key} = {value}\n"), "c.toml")
        with pytest.raises(InputError) as on_line:
            parse_config(base, "c.toml", [f"campaign.{key}={value}"])
        assert in_file.value.field == f"campaign.{key}" and in_file.value.source == "c.toml"
        assert on_line.value.source == f"--set campaign.{key}" and on_line.value.field is None
        assert on_line.value.reason == in_file.value.reason


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("campaign.max_turnz=3", "--set campaign.max_turnz: unknown field"),
        ("nosuch.key=1", "--set nosuch.key: nosuch: unknown field"),
        ("campaign", "--set: expected KEY=VALUE"),
        ("two words=1", "--set two words: not a key path"),
        ("campaign.seed.x=1", "--set campaign.seed.x: campaign.seed is a value, not a table"),
        ("models.nosuch.timeout=5", "--set models.nosuch.timeout: models.nosuch.provider: missing"),
        ("models.judge.api_key=abc", "--set models.judge.api_key: not allowed"),
        (
            "models.judge.options.note=sk-abcdefghijklmnopqrstuvwx",  # would be stored
            "--set models.judge.options.note: looks like an API key",
        ),
        ("search.depth=2", "--set search.depth: the uct controller's lookahead"),
        ("campaign.controller=nosuch", "--set campaign.controller: unknown controller 'nosuch'"),
    ],
)
def test_a_bad_set_exits_2_naming_it(
    override: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(SCRIPTED), "--set", override]) == 2
    err = capsys.readouterr().err
    assert f"mhsafeeval: error: {expected}" in err, err


def test_a_problem_with_the_file_itself_still_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(SCRIPTED.read_text().replace("seed = 7", "seed = 7\nmax_turnz = 1"))
    with pytest.raises(InputError) as info:
        load_config(config, ["campaign.max_turns=2"])
    assert info.value.source == str(config) and info.value.field == "campaign.max_turnz"


def test_set_values_are_stored_and_a_resume_compares_them(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    first = cli("run", str(SCRIPTED), "--db", str(db), "--quiet", "--set", "campaign.max_turns=2")
    assert first.returncode == 0, first.stderr
    campaign = _stored_config(db)["campaign"]
    assert isinstance(campaign, dict) and campaign["max_turns"] == 2  # not the file's 4
    [started] = {m.config for m in stored(db) if isinstance(m, CampaignStarted)}
    assert started == read_config(SCRIPTED, ["campaign.max_turns=2"])[0]
    assert started.startswith(SCRIPTED.read_text()) and "--set campaign.max_turns=2" in started

    pacing = ["--set", "campaign.concurrency=1"]  # a key a resumed campaign may change
    again = cli(
        "run", str(SCRIPTED), "--db", str(db), "--quiet", "--set", "campaign.max_turns=2", *pacing
    )
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stderr
    for different in (["--set", "campaign.max_turns=3"], []):  # like editing the file
        refused = cli("run", str(SCRIPTED), "--db", str(db), "--quiet", *different)
        assert refused.returncode == 2, refused.stderr
        now = different[1].split("=")[1] if different else "4"
        assert f"campaign.max_turns: stored 2, now {now}" in refused.stderr


@pytest.fixture(scope="module")
def campaign_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("view") / "scripted.db"
    done = cli("run", str(SCRIPTED), "--db", str(db), "--quiet", "--set", "campaign.max_turns=2")
    assert done.returncode == 0, done.stderr
    return db


def _browser(monkeypatch: pytest.MonkeyPatch, answer: bool) -> list[str]:
    opened: list[str] = []

    def fake_open(url: str, new: int = 0, autoraise: bool = True) -> bool:
        opened.append(url)
        return answer

    monkeypatch.setattr(webbrowser, "open", fake_open)
    return opened


def _report_path(out: str) -> Path:
    [line] = out.splitlines()
    return Path(line)


def test_view_prints_the_path_when_no_browser_opens_it(
    campaign_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    opened = _browser(monkeypatch, False)  # webbrowser found no browser
    assert main(["view", str(campaign_db)]) == 0
    page = _report_path(capsys.readouterr().out)
    assert opened == [page.as_uri()]
    html = page.read_text()
    assert "<html" in html and "scripted-demo" in html  # the campaign's report
    assert page.parent.stat().st_mode & 0o077 == 0  # a folder only its owner reads

    monkeypatch.setenv("CI", "true")  # never tried in CI
    assert main(["view", str(campaign_db)]) == 0
    assert _report_path(capsys.readouterr().out).is_file() and len(opened) == 1
    monkeypatch.delenv("CI")
    for display in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(display, raising=False)
    if os.uname().sysname == "Linux":  # no display: a console browser would take the terminal
        assert main(["view", str(campaign_db)]) == 0
        assert _report_path(capsys.readouterr().out).is_file() and len(opened) == 1


def test_view_opens_the_report_in_a_browser(
    campaign_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    opened = _browser(monkeypatch, True)
    assert main(["view", str(campaign_db)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    [url] = opened
    assert url.startswith("file://") and f"opened {url.removeprefix('file://')}" in captured.err
    assert main(["view", str(campaign_db), "--no-browser"]) == 0
    assert _report_path(capsys.readouterr().out).is_file() and len(opened) == 1


def test_view_exits_like_report_on_bad_input(
    campaign_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    opened = _browser(monkeypatch, True)
    assert main(["view", str(tmp_path / "absent.db")]) == 2
    assert "absent.db" in capsys.readouterr().err
    assert main(["view", str(campaign_db), "--campaign", "nope"]) == 2
    assert main(["report", str(campaign_db), "--campaign", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert opened == []
