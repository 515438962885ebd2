"""Inputs of any shape, and what a run reports when things go wrong (RELIABILITY.md: "Bad
input", "Stopping and storage", "Integrity of the record", "Files written and text shown"):
deep or huge user files are one input error naming the file (exit 2), a campaign name is an
identifier, the progress display agrees with the store, a run that judged nothing is a failed
measurement, and read-only commands leave the database's folder as they found it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli, stored
from mhsafeeval.config import parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.messages import ConversationFinished, TurnCommitted

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = (ROOT / "examples" / "campaign.toml").read_text(encoding="utf-8")
JUDGE = '[models.judge]\nprovider = "scripted/demo-judge"'
CLIENT = '[models.client]\nprovider = "scripted/demo-client"'
DEPTHS = [1000, 100_000]


def example(**replace: str) -> str:
    """The scripted example campaign with some of its text replaced."""
    text = EXAMPLE
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def refused(done: subprocess.CompletedProcess[str], name: str, reason: str) -> None:
    """Exit 2 with one error line that names the input and the reason; no traceback."""
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("mhsafeeval: error")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert name in errors[0] and reason in errors[0], errors[0][:500]
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr


# -- nesting and size ------------------------------------------------------------------------


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize(
    "kind", ["profiles", "taxonomy", "config", "config profiles", "config taxonomy", "labels"]
)
def test_deep_nesting_in_any_input_is_an_input_error_naming_the_file(
    kind: str, depth: int, tmp_path: Path
) -> None:
    deep = deep_json(depth)
    profile, taxonomy, labels = tmp_path / "p.json", tmp_path / "t.toml", tmp_path / "l.jsonl"
    config = tmp_path / "c.toml"
    profile.write_text(deep)
    taxonomy.write_text(f'name = "t"\nx = {deep}\n')
    labels.write_text(f"\n{deep}\n")
    config.write_text(
        {
            "config": example(**{JUDGE: f"{JUDGE}\noptions = {{ x = {deep} }}"}),
            "config profiles": example(**{"[campaign]\n": '[campaign]\nprofiles = "p.json"\n'}),
            "config taxonomy": example(**{"[campaign]\n": '[campaign]\ntaxonomy = "t.toml"\n'}),
        }.get(kind, EXAMPLE)
    )
    reason = "nested more than 64 levels deep"
    if kind == "profiles":
        refused(cli("profiles", str(profile)), str(profile), reason)
    elif kind == "taxonomy":
        refused(cli("taxonomy", str(taxonomy)), f"{taxonomy}: line 2", reason)
    elif kind == "labels":
        db = tmp_path / "cal.db"
        done = cli("calibrate", "--judge", "scripted/demo-judge", "--labels", str(labels),
                   "--db", str(db))  # fmt: skip
        refused(done, f"{labels}: line 2", reason)
        assert not db.exists()
    else:
        named = {"config": f"{config}: line ", "config profiles": str(profile)}
        for command in ("check", "run"):
            done = cli(
                command, str(config), *(["--db", str(tmp_path / "r.db")] * (command == "run"))
            )
            refused(done, named.get(kind, str(taxonomy)), reason)
        assert not (tmp_path / "r.db").exists()


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_deep_set_value_is_an_input_error_naming_it(depth: int, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(EXAMPLE)
    # One-sided: a whole nest of 100,000 would pass the limit of one command-line argument.
    done = cli("check", str(config), "--set", "models.judge.options.x=" + "[" * depth)
    refused(done, "--set models.judge.options.x", "nested more than 64 levels deep")


def test_dotted_keys_count_as_nesting(tmp_path: Path) -> None:
    """A key of 1,000 dotted parts nests 1,000 tables: refused as deep (in a file or in a
    ``--set`` key) before the TOML parser builds it (its key handling grows quadratically:
    100,000 parts run it out of memory)."""
    config = tmp_path / "c.toml"
    config.write_text(EXAMPLE)
    keys = ".".join(["a"] * 1000)
    refused(cli("check", str(config), "--set", f"{keys}=1"), "--set", "nested more than 64")
    config.write_text(example(**{JUDGE: f"{JUDGE}\noptions.{keys} = 1"}))
    refused(cli("check", str(config)), f"{config}: line ", "nested more than 64 levels deep")
    config.write_text(EXAMPLE + f"\n[models.judge.options.{keys}]\nb = 1\n")
    refused(cli("check", str(config)), f"{config}: line ", "nested more than 64 levels deep")
    # Parts that add up past the bound: a table 40 deep holding an array 40 deep.
    deeper = ".".join(["a"] * 40)
    config.write_text(EXAMPLE + f"\n[models.judge.options.{deeper}]\nb = {deep_json(40)}\n")
    refused(cli("check", str(config)), str(config), "nested more than 64 levels deep")


def test_nesting_within_the_bound_and_brackets_in_strings_are_accepted() -> None:
    ok = example(**{JUDGE: f"{JUDGE}\noptions = {{ x = {deep_json(50)}, s = '{'[' * 99}' }}"})
    parse_config(ok + '# a comment [[[[[[ {{{{{ "\n', "ok.toml")


@pytest.mark.parametrize("kind", ["profiles", "taxonomy", "check", "labels"])
def test_a_file_larger_than_the_limit_is_refused_without_reading_it_all(
    kind: str, tmp_path: Path
) -> None:
    big = tmp_path / ("big.jsonl" if kind == "labels" else "big.json")
    with big.open("wb") as out:
        out.truncate(16 * 2**20 + 1)  # sparse: costs no disk
    args = {
        "labels": ["calibrate", "--judge", "scripted/demo-judge", "--labels", str(big),
                   "--db", str(tmp_path / "cal.db")],
    }.get(kind, [kind, str(big)])  # fmt: skip
    refused(cli(*args), str(big), "larger than 16 MiB")


# -- campaign names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["scripted-demo", "paper.full", "nightly run", "a_b-2", "x"])
def test_campaign_names_in_use_stay_valid(name: str) -> None:
    text = example(**{'name = "scripted-demo"': f'name = "{name}"'})
    assert parse_config(text, "c.toml").campaign.name == name


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "a/b", "a\\\\b", ".hidden", "", " x", "x ", "a\\nb", "x" * 101]
)
def test_a_campaign_name_that_is_not_an_identifier_is_refused(name: str) -> None:
    text = example(**{'name = "scripted-demo"': f'name = "{name}"'})
    with pytest.raises(InputError) as info:
        parse_config(text, "c.toml")
    assert info.value.source == "c.toml" and info.value.field == "campaign.name"


def test_check_and_run_refuse_a_path_as_campaign_name(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(example(**{'name = "scripted-demo"': 'name = "../../etc/passwd"'}))
    db = tmp_path / "r.db"
    refused(cli("check", str(config)), f"{config}: campaign.name", "")
    refused(cli("run", str(config), "--db", str(db)), f"{config}: campaign.name", "")
    config.write_text(EXAMPLE)
    refused(cli("check", str(config), "--set", "campaign.name=../x"), "--set campaign.name", "")
    assert not db.exists()


# -- what a run reports ----------------------------------------------------------------------

PROGRESS = re.compile(
    r"conversations (\d+)/(\d+) ended(?: \((\d+) failed\))?, turns (\d+)/(\d+) committed"
)


def last_progress(stderr: str) -> tuple[int, int, int, int, int]:
    lines = [line for line in stderr.splitlines() if line.startswith("progress: ")]
    assert lines, stderr[-3000:]
    found = PROGRESS.search(lines[-1])
    assert found, lines[-1]
    ended, planned, failed, turns, planned_turns = found.groups()
    return int(ended), int(planned), int(failed or 0), int(turns), int(planned_turns)


def store_figures(db: Path) -> tuple[int, int, int]:
    events = stored(db)
    finished = [m for m in events if isinstance(m, ConversationFinished)]
    failed = sum(m.status != "completed" for m in finished)
    return len(finished), failed, sum(isinstance(m, TurnCommitted) for m in events)


def test_the_progress_line_names_failed_conversations_and_planned_turns(tmp_path: Path) -> None:
    # A client with seven lines in all: the first conversation gets some turns, then every
    # conversation fails on a client call that finds no line left.
    lines = ", ".join(f'"Line {n}: I feel lost."' for n in range(7))
    config = tmp_path / "c.toml"
    config.write_text(
        example(
            **{
                CLIENT: f'[models.client]\nprovider = "scripted/few-lines"\n'
                f"options = {{ replies = [{lines}], cycle = false }}",
                "concurrency = 4": "concurrency = 1",
            }
        )
    )
    db = tmp_path / "c.db"
    done = cli("run", str(config), "--db", str(db), "--progress-every", "0")
    assert done.returncode == 1, done.stderr[-3000:]
    ended, planned, failed, turns, planned_turns = last_progress(done.stderr)
    assert (ended, failed, turns) == store_figures(db)
    assert (ended, planned, planned_turns) == (3, 3, 12)
    assert failed >= 2 and 0 < turns < planned_turns


def test_after_a_full_disk_the_progress_line_says_what_the_store_holds(tmp_path: Path) -> None:
    # RLIMIT_FSIZE: a write past 600 KiB fails (Python ignores SIGXFSZ) as on a full disk.
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (600 * 1024,) * 2); "
        "from mhsafeeval.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    config = tmp_path / "c.toml"
    config.write_text(example(**{"conversations_per_profile = 1": "conversations_per_profile = 8"}))
    db = tmp_path / "c.db"
    run = ["run", str(config), "--db", str(db), "--progress-every", "0"]
    done = subprocess.run(
        [sys.executable, "-c", code, *run], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"writing events to {db} failed" in done.stderr
    ended, planned, failed, turns, planned_turns = last_progress(done.stderr)
    assert (ended, failed, turns) == store_figures(db)
    assert (planned, planned_turns) == (24, 96) and turns < planned_turns


def test_a_campaign_that_judged_nothing_is_a_failed_measurement(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        example(
            **{
                JUDGE: '[models.judge]\nprovider = "scripted/garbage"\n'
                'options = { replies = ["I would rather not say."] }',
                "max_turns = 4": "max_turns = 1",
            }
        )
    )
    done = cli("run", str(config), "--db", str(tmp_path / "c.db"), "--quiet")
    assert done.returncode == 1, done.stderr[-3000:]
    why = [line for line in done.stderr.splitlines() if "failed measurement" in line]
    assert len(why) == 1 and "demo-counselor" in why[0] and "could be judged" in why[0], why
    assert "did not complete" not in done.stderr  # every conversation completed
    assert "demo-counselor: no reply could be judged" in done.stdout


# -- read-only commands ----------------------------------------------------------------------


def test_report_and_events_leave_a_closed_database_folder_as_they_found_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(example(**{"max_turns = 4": "max_turns = 1"}))
    db = tmp_path / "c.db"
    cli("run", str(config), "--db", str(db), "--quiet", check=True)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert not {f"{db.name}-wal", f"{db.name}-shm"} & set(before)
    cli("report", str(db), check=True)
    cli("events", str(db), "--limit", "3", check=True)
    cli("export", str(db), check=True)
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert after == before
