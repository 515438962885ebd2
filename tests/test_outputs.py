"""What the CLI writes and shows: atomic owner-only files, read-only readers, safe CSV and text.

Several tests need permission bits to bind. The suite runs as root here and in CI, where they
do not; those tests run the CLI under ``setpriv`` with the capabilities that bypass permission
checks dropped, which makes root as bound by file modes as any other user.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest

from mhsafeeval._terminal import visible
from mhsafeeval.cli import main
from mhsafeeval.errors import InputError
from mhsafeeval.framework import encode_message
from mhsafeeval.messages import ClientUtterance, CounselorReply, Message
from mhsafeeval.reports.export import export
from mhsafeeval.storage import MemoryEventStore, SqliteEventStore
from needs import need_command

ROOT = Path(__file__).resolve().parents[1]
DROP_PRIVILEGES = (
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable",
    "--inh-caps=-all",
)
ESC = "\x1b[2J\x1b[31m"  # clear the screen, then turn the text red
RLO = "\u202e"  # right-to-left override: shows text reversed


def run_cli(
    *args: str, prefix: Sequence[str] = (), script: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``mhsafeeval ARGS`` in a fresh interpreter, optionally after ``script`` (a fault)."""
    code = (
        f"{script or ''}\nimport sys\nfrom mhsafeeval.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [*prefix, sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def one_error_line(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhsafeeval: error: "), done.stderr
    for part in parts:
        assert part in lines[0]


@pytest.fixture
def locked() -> Iterator[list[Path]]:
    """Paths a test made read-only; given back their write bits so tmp_path can be removed."""
    paths: list[Path] = []
    yield paths
    for path in reversed(paths):
        path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o700)


def lock(paths: list[Path], *targets: Path) -> None:
    for target in targets:
        target.chmod(0o500 if target.is_dir() else 0o400)
        paths.append(target)


@pytest.fixture
def unprivileged(tmp_path: Path, locked: list[Path]) -> tuple[str, ...]:
    """A command prefix under which a read-only file or folder really cannot be written."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv (util-linux) is missing: modes do not bind")
    probe = tmp_path / "probe"
    probe.mkdir()
    lock(locked, probe)
    done = subprocess.run(
        [*DROP_PRIVILEGES, "touch", str(probe / "x")], capture_output=True, text=True
    )
    if done.returncode == 0 or "Permission denied" not in done.stderr:
        pytest.skip(f"cannot drop root's permission override here: {done.stderr.strip()}")
    return DROP_PRIVILEGES


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of the offline demo campaign (each test copies it)."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    done = run_cli("run", str(ROOT / "examples" / "campaign.toml"), "--db", str(db), "--quiet")
    assert done.returncode == 0, done.stderr
    return db


def copy_db(demo_db: Path, folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    return Path(shutil.copy(demo_db, folder / "demo.db"))


def turns(
    texts: Sequence[str], campaign: str = "c1", conversation: str = "c1/m/p/0"
) -> list[Message]:
    """A client utterance and a counselor reply (``texts[turn]``) per turn."""
    out: list[Message] = []
    for turn, text in enumerate(texts):
        for kind, said in ((ClientUtterance, f"client {turn}"), (CounselorReply, text)):
            out.append(
                kind(
                    campaign=campaign,
                    conversation=conversation,
                    turn=turn,
                    category="blaming",
                    role="enabler",
                    text=said,
                )
            )
    return out


def make_db(path: Path, messages: Sequence[Message], campaign: str = "c1") -> Path:
    async def fill() -> None:
        async with SqliteEventStore(path) as store:
            await store.register_campaign(campaign)
            for message in messages:
                await store.append(message)

    anyio.run(fill, backend="asyncio")
    return path


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- atomic, owner-only files --------------------------------------------------------------


def test_an_existing_output_is_replaced_whole_and_made_owner_only(
    demo_db: Path, tmp_path: Path
) -> None:
    db = copy_db(demo_db, tmp_path / "db")
    out = tmp_path / "out"
    out.mkdir()
    report = out / "report.html"
    report.write_text("old report")
    report.chmod(0o644)
    attempts = out / "attempts.csv"
    attempts.write_text("old export")
    attempts.chmod(0o644)

    assert run_cli("report", str(db), "--html", str(report)).returncode == 0
    assert run_cli("export", str(db), "--format", "csv", "--out", str(attempts)).returncode == 0

    assert sorted(p.name for p in out.iterdir()) == ["attempts.csv", "report.html"]  # no temps
    for path in (report, attempts):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert report.read_text().lstrip().lower().startswith("<!doctype html")
    assert attempts.read_text().startswith("campaign,")


def test_a_failed_flush_to_disk_leaves_the_previous_file(
    demo_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = copy_db(demo_db, tmp_path / "db")
    out = tmp_path / "out"
    out.mkdir()
    target = out / "attempts.jsonl"
    target.write_text("the previous export\n")
    before = listing(out)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    assert main(["export", str(db), "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(target) in err[0] and "No space left" in err[0], err
    assert listing(out) == before  # the old file as it was, and no temporary file left


def test_a_size_limit_hit_mid_write_leaves_the_previous_file(tmp_path: Path) -> None:
    # A real write failure from the kernel, after part of the output is written: RLIMIT_FSIZE
    # makes write() fail with EFBIG past 64 KiB (a full disk in miniature, no privileges needed).
    db = make_db(tmp_path / "big.db", turns(["x" * 60_000, "y" * 60_000]))
    out = tmp_path / "out"
    out.mkdir()
    target = out / "attempts.jsonl"
    target.write_text("the previous export\n")
    before = listing(out)
    limit = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
    )
    done = run_cli("export", str(db), "--out", str(target), script=limit)
    one_error_line(done, str(target), "File too large")
    assert listing(out) == before


def test_a_kill_during_the_write_leaves_the_previous_file(demo_db: Path, tmp_path: Path) -> None:
    db = copy_db(demo_db, tmp_path / "db")
    out = tmp_path / "out"
    out.mkdir()
    target = out / "report.html"
    target.write_text("the previous report")
    # Killed once the new content is written but before it is in place.
    kill = "import os, signal\nos.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
    done = run_cli("report", str(db), "--html", str(target), script=kill)
    assert done.returncode == -9, done.stderr
    assert target.read_text() == "the previous report"
    leftovers = [p.name for p in out.iterdir() if p != target]
    assert all(name.startswith(".report.html.") for name in leftovers)  # only our temp file


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_missing_folder_or_a_folder_as_output_is_a_one_line_error(
    command: str, demo_db: Path, tmp_path: Path
) -> None:
    db = copy_db(demo_db, tmp_path / "db")
    flag = "--html" if command == "report" else "--out"
    missing = tmp_path / "no-such-folder" / "out.txt"
    one_error_line(run_cli(command, str(db), flag, str(missing)), str(missing), "no such folder")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    one_error_line(run_cli(command, str(db), flag, str(folder)), str(folder), "is a folder")


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_read_only_output_folder_is_a_one_line_error(
    command: str,
    demo_db: Path,
    tmp_path: Path,
    locked: list[Path],
    unprivileged: tuple[str, ...],
) -> None:
    db = copy_db(demo_db, tmp_path / "db")
    flag = "--html" if command == "report" else "--out"
    shut = tmp_path / "read-only"
    shut.mkdir()
    (shut / "out.txt").write_text("kept")
    lock(locked, shut / "out.txt", shut)
    target = shut / "out.txt"
    done = run_cli(command, str(db), flag, str(target), prefix=unprivileged)
    one_error_line(done, str(target), "Permission denied")
    assert listing(shut) == {"out.txt": b"kept"}


def test_the_helper_refuses_a_folder_and_names_the_path(tmp_path: Path) -> None:
    from mhsafeeval._files import write_private_atomic

    with pytest.raises(InputError, match="is a folder") as info:
        write_private_atomic(tmp_path, "text")
    assert info.value.source == str(tmp_path)


# -- readers need no write access ----------------------------------------------------------


def test_readers_work_on_a_read_only_database_in_a_read_only_folder(
    demo_db: Path, tmp_path: Path, locked: list[Path], unprivileged: tuple[str, ...]
) -> None:
    # Read a copy for the expected output: a reader in a writable folder leaves -wal/-shm there.
    other = copy_db(demo_db, tmp_path / "writable")
    expected = {
        "report": run_cli("report", str(other)).stdout,
        "export": run_cli("export", str(other), "--format", "csv").stdout,
        "events": run_cli("events", str(other), "--json").stdout,
    }
    assert all(expected.values())
    folder = tmp_path / "shared"
    db = copy_db(demo_db, folder)
    before = listing(folder)
    assert list(before) == ["demo.db"]
    lock(locked, db, folder)

    assert run_cli("report", str(db), prefix=unprivileged).stdout == expected["report"]
    assert run_cli("report", str(db), "--json", prefix=unprivileged).returncode == 0
    csv_out = run_cli("export", str(db), "--format", "csv", prefix=unprivileged)
    assert csv_out.stdout == expected["export"], csv_out.stderr
    assert run_cli("events", str(db), "--json", prefix=unprivileged).stdout == expected["events"]
    html = tmp_path / "report.html"
    done = run_cli("report", str(db), "--html", str(html), prefix=unprivileged)
    assert done.returncode == 0 and html.is_file(), done.stderr
    assert listing(folder) == before  # no -wal, -shm or lock file was created


def test_a_read_only_folder_with_uncheckpointed_commits(
    tmp_path: Path, locked: list[Path], unprivileged: tuple[str, ...]
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    db = make_db(live / "c.db", turns(["first"]))
    late = CounselorReply(
        campaign="c1", conversation="c1/m/p/0", turn=5, category="blaming", role="enabler",
        text="committed, only in the WAL",
    )  # fmt: skip
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute(
            "INSERT INTO events (id, campaign, conversation, turn, attempt, branch, type, "
            "recorded_at, body) VALUES (?, ?, ?, ?, 0, '', ?, 0, ?)",
            (late.id, "c1", late.conversation, late.turn, late.tag, encode_message(late)),
        )
        crashed = tmp_path / "crashed"  # what a killed writer leaves: the WAL, no index
        crashed.mkdir()
        for name in ("c.db", "c.db-wal"):
            shutil.copy(live / name, crashed / name)
        lock(locked, live, crashed)

        # With the writer's -shm index present, the WAL's commits are read.
        shown = run_cli("events", str(db), "--json", prefix=unprivileged)
        assert "committed, only in the WAL" in shown.stdout, shown.stderr
        # Without it, reading would silently miss them: refused, naming the WAL file.
        refused = run_cli("events", str(crashed / "c.db"), prefix=unprivileged)
        one_error_line(refused, str(crashed / "c.db"), "c.db-wal")
    finally:
        writer.close()


# -- CSV injection ---------------------------------------------------------------------------

FORMULAS = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tTAB", "\rCR", "-"]
PLAIN = ["plain text", "a = b", " =leading space", "'quoted already", ""]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_csv_cells_a_spreadsheet_would_evaluate_are_made_text() -> None:
    texts = FORMULAS + PLAIN
    async with MemoryEventStore() as store:
        await store.register_campaign("c1")
        for message in turns(texts):
            await store.append(message)
        out = io.StringIO(newline="")
        await export(store, "c1", "csv", out)
        lines = io.StringIO(newline="")
        await export(store, "c1", "jsonl", lines)
    rows = list(csv.DictReader(io.StringIO(out.getvalue(), newline="")))
    replies = [row["reply"] for row in rows]
    assert replies == [f"'{t}" for t in FORMULAS] + PLAIN
    for row in rows:  # the rule holds for every cell, and numbers stay numbers
        for value in row.values():
            assert value[:1] not in ("=", "+", "-", "@", "\t", "\r"), row
        assert row["turn"].isdigit()
    # JSON lines are data, not a spreadsheet: they keep the text exactly.
    assert [json.loads(line)["reply"] for line in lines.getvalue().splitlines()] == texts


def _formulas_in_libreoffice(csv_file: Path, tmp_path: Path) -> list[str]:
    """Open ``csv_file`` in LibreOffice Calc (headless), save it as ODS, and return every
    formula the spreadsheet made of its cells."""
    import re
    import zipfile

    done = subprocess.run(
        [
            "soffice",
            f"-env:UserInstallation=file://{tmp_path / 'lo-profile'}",
            "--headless",
            "--infilter=CSV:44,34,76,1",  # comma, double quote, UTF-8, from line 1
            "--convert-to",
            "ods",
            "--outdir",
            str(tmp_path),
            str(csv_file),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    ods = tmp_path / f"{csv_file.stem}.ods"
    assert ods.exists(), done.stdout + done.stderr
    with zipfile.ZipFile(ods) as book:
        content = book.read("content.xml").decode()
    return re.findall(r'table:formula="([^"]*)"', content)


def test_a_real_spreadsheet_finds_no_formula_in_a_csv_export(tmp_path: Path) -> None:
    """LibreOffice Calc opens the export: not one cell becomes a formula. The same texts
    written raw do become formulas, so the check can fail."""
    need_command("soffice", "apt-get install libreoffice-calc-nogui; .ci/run does")
    db = make_db(tmp_path / "c.db", turns(FORMULAS + PLAIN))
    exported = tmp_path / "attempts.csv"
    done = run_cli("export", str(db), "--format", "csv", "--out", str(exported))
    assert done.returncode == 0, done.stderr
    assert _formulas_in_libreoffice(exported, tmp_path) == []
    raw = tmp_path / "raw.csv"
    with raw.open("w", newline="", encoding="utf-8") as out:
        csv.writer(out).writerows([["reply"], *([t] for t in FORMULAS)])
    assert _formulas_in_libreoffice(raw, tmp_path)  # e.g. of:=HYPERLINK("http://x")


# -- terminal text ---------------------------------------------------------------------------


def test_events_show_control_sequences_instead_of_emitting_them(tmp_path: Path) -> None:
    hostile = f"{ESC}gone{RLO}drow\r"
    db = make_db(tmp_path / "c.db", turns([hostile], conversation=f"c1/m{ESC}/p/0"))
    text = run_cli("events", str(db))
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout and RLO not in text.stdout and "\r" not in text.stdout
    assert "\\x1b[2J" in text.stdout and "\\u202e" in text.stdout
    as_json = run_cli("events", str(db), "--json")
    assert "\x1b" not in as_json.stdout and RLO not in as_json.stdout
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert rows[1]["text"] == hostile and rows[1]["conversation"] == f"c1/m{ESC}/p/0"


def test_report_text_shows_names_with_control_sequences_made_visible(tmp_path: Path) -> None:
    name = f"c1{ESC}"
    db = make_db(tmp_path / "c.db", turns(["hello"], campaign=name), campaign=name)
    shown = run_cli("report", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "c1\\x1b[2J" in shown.stdout
    as_json = run_cli("report", str(db), "--json")
    assert "\x1b" not in as_json.stdout
    assert json.loads(as_json.stdout)  # still JSON


def test_lines_about_unfinished_conversations_make_escapes_visible(tmp_path: Path) -> None:
    config = tmp_path / "down.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + '\n[counselors."do\\u001b[2Jwn"]\nprovider = "litellm/openai/gpt-4o-mini"\n'
        'api_key_env = "MHS_DOWN_KEY"\nmax_attempts = 1\nbreaker_threshold = 2\n'
        'options = { mock_response = "litellm.InternalServerError" }\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "mhsafeeval.cli", "run", str(config), "--db", f"{tmp_path}/d.db"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MHS_DOWN_KEY": "sk-test-down-000000"},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    named = [line for line in done.stderr.splitlines() if "did not complete" in line]
    assert len(named) == 3 and all("/do\\x1b[2Jwn/" in line for line in named), named
    assert "\x1b" not in done.stdout  # the report names the counselor too


def test_visible_json_escapes_what_a_terminal_would_act_on_and_keeps_the_value() -> None:
    from mhsafeeval._terminal import visible_json

    for value in ({"text": f"{ESC}x{RLO}\u0085\U000e0041"}, ["\ud7ff", "caf\u00e9 \U0001f642"]):
        raw = json.dumps(value, ensure_ascii=False)
        shown = visible_json(raw)
        assert json.loads(shown) == value
        assert shown.isprintable()
    assert visible_json('{"a":\r\n\t1}') == '{"a":   1}'
    assert visible("\U000e0041") == "\\U000e0041"


# -- events on damaged rows ------------------------------------------------------------------


@pytest.mark.parametrize("mode", [(), ("--json",)])
def test_events_name_corrupt_rows_go_on_and_exit_1(tmp_path: Path, mode: tuple[str, ...]) -> None:
    db = make_db(tmp_path / "c.db", turns(["first", "second"]))
    damaged = {
        b"\xff\xfe not json": "not JSON",
        b"[1, 2]": "not a JSON object",
        b'{"campaign": "c1"}': "type",
        b'{"type": "counselor.reply", "turn": "two"}': "turn",
        "a body stored as TEXT, not JSON": "not JSON",  # another tool's row, as TEXT
    }
    with sqlite3.connect(db) as conn:
        for n, body in enumerate(damaged):
            conn.execute(
                "INSERT INTO events (id, campaign, conversation, turn, attempt, branch, type, "
                "recorded_at, body) "
                "VALUES (?, 'c1', 'c1/m/p/0', 9, 0, '', 'counselor.reply', 0, ?)",
                (f"bad{n}", body),
            )
    conn.close()
    done = run_cli("events", str(db), *mode)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stdout.splitlines()) == 4  # every good event is still listed
    problems = done.stderr.strip().splitlines()
    assert len(problems) == len(damaged), done.stderr
    for seq, (line, why) in enumerate(zip(problems, damaged.values(), strict=True), start=5):
        assert line.startswith("mhsafeeval: ") and f"seq {seq}" in line and why in line, line


def test_events_limit_refuses_negative_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_db(tmp_path / "c.db", turns(["first"]))
    with pytest.raises(SystemExit) as info:
        main(["events", str(db), "--limit", "-1"])
    assert info.value.code == 2
    assert "--limit" in capsys.readouterr().err
    assert main(["events", str(db), "--limit", "0"]) == 0
