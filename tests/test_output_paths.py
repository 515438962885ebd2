"""Outputs never destroy inputs, and a multi-file output is published as one unit.

Every option that writes a file refuses (exit 2, one line, nothing written) a path that is one
of the command's inputs, however it is spelled (``./sub/../d.db``, absolute, a symbolic or a
hard link, the database's ``-wal`` or ``.lock``), an existing SQLite database or an existing
campaign config. The HTML report and its pages of transcripts are replaced together: a report
killed (or failing) at any step leaves the previous report or the new one, never a main page
with another run's pages, and the next report removes what the dead one left.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from helpers import cli
from mhsafeeval.cli import main
from mhsafeeval.reports import html as html_report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "campaign.toml"


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of the scripted example campaign (22 attempts; each test copies it)."""
    db = tmp_path_factory.mktemp("demo") / "d.db"
    done = cli("run", str(EXAMPLE), "--db", str(db), "--quiet", timeout=120)
    assert done.returncode == 0, done.stderr
    return db


@pytest.fixture
def here(demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder: ``d.db`` (the campaign), ``o.db`` (another campaign's database),
    ``c.toml`` (the campaign's config), ``sub/``, ``link.db`` (a symbolic link to ``d.db``)
    and ``hard.db`` (a hard link to it)."""
    shutil.copy(demo_db, tmp_path / "d.db")
    (tmp_path / "d.db.lock").write_text("")  # as a run leaves it
    shutil.copy(demo_db, tmp_path / "o.db")
    shutil.copy(EXAMPLE, tmp_path / "c.toml")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.db").symlink_to("d.db")
    os.link(tmp_path / "d.db", tmp_path / "hard.db")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder``: a link's target, a file's bytes, or a folder."""
    out: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            out[name] = ("link", os.readlink(path))
        elif path.is_dir():
            out[name] = "folder"
        else:
            out[name] = path.read_bytes()
    return out


# -- outputs never destroy inputs ---------------------------------------------------------

WRITERS = {
    "export --out": ["export", "d.db", "--out"],
    "report --html": ["report", "d.db", "--html"],
    "report --junit": ["report", "d.db", "--junit"],
    "run --junit": ["run", "c.toml", "--db", "d.db", "--quiet", "--junit"],
    "compare --html": ["compare", "d.db", "d.db", "--html"],
}
# The output path, and the input named in the message (None: what it is, not an input).
TARGETS: dict[str, tuple[Callable[[Path], str], str | None]] = {
    "same path": (lambda _: "d.db", "d.db"),
    "through sub/..": (lambda _: "./sub/../d.db", "d.db"),
    "absolute": (lambda here: str(here / "d.db"), "d.db"),
    "symbolic link": (lambda _: "link.db", "d.db"),
    "hard link": (lambda _: "hard.db", "d.db"),
    "the database's -wal": (lambda _: "d.db-wal", "d.db"),
    "the database's lock": (lambda _: "d.db.lock", "d.db"),
    "another campaign's database": (lambda _: "o.db", None),
    "the config file": (lambda _: "c.toml", None),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("writer", WRITERS)
def test_an_output_over_an_input_or_a_database_is_refused_and_nothing_is_written(
    writer: str, target: str, here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, named = TARGETS[target]
    out = path(here)
    option = WRITERS[writer][-1]
    if writer == "run --junit" and target == "the config file":
        named = "c.toml"  # the config run reads
    before = snapshot(here)

    assert main([*WRITERS[writer], out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mhsafeeval: error: "), err
    shown = str(Path(out))  # as the option gives it: ./sub/../d.db is sub/../d.db
    assert option in err[0] and shown in err[0], err
    if named is not None:
        assert re.search(rf"(^|[ /]){re.escape(named)}\b", err[0].split(shown, 1)[1]), err
    assert snapshot(here) == before  # nothing written, not even a -wal or a temporary file
    assert main(["report", "d.db"]) == 0  # the database still opens
    assert main(["report", "o.db"]) == 0


def test_a_baseline_database_is_an_input_too(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(here)
    assert main(["report", "o.db", "--html", "./sub/../d.db", "--baseline", "d.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--html" in err[0] and "d.db" in err[0], err
    assert snapshot(here) == before


def test_init_never_writes_over_a_database(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``init --force`` replaces a campaign.toml (that is what it is for), never a database
    that happens to have that name."""
    project = here / "project"
    project.mkdir()
    shutil.copy(here / "d.db", project / "campaign.toml")
    before = snapshot(here)
    assert main(["init", "project", "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "campaign.toml" in err[0] and "SQLite" in err[0], err
    assert snapshot(here) == before
    (project / "campaign.toml").write_text("# an older config\n[campaign]\nname = 'x'\n")
    assert main(["init", "project", "--force"]) == 0  # a config: replaced, as asked
    assert "[campaign]" in (project / "campaign.toml").read_text()


def test_an_ordinary_earlier_output_is_still_replaced(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("r.html", "r.jsonl", "r.xml"):
        (here / name).write_text("an earlier output\n")
    assert main(["report", "d.db", "--html", "r.html", "--junit", "r.xml"]) == 0
    assert main(["export", "d.db", "--out", "./sub/../r.jsonl"]) == 0
    assert (here / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert (here / "r.jsonl").read_text().startswith("{")
    assert (here / "r.xml").read_text().startswith("<?xml")


def test_two_outputs_of_one_command_on_one_path_are_refused(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(here)
    assert main(["report", "d.db", "--html", "r.out", "--junit", "./sub/../r.out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mhsafeeval: error: --junit sub/../r.out: is the --html file"), err
    assert snapshot(here) == before


def test_a_stream_is_written_into_never_replaced(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` naming a named pipe (as /dev/null or /dev/stdout are streams) gets the
    export written into it; the atomic replace would have put a regular file in its place
    (as root, over /dev/null for every program on the machine)."""
    import stat
    import threading

    fifo = here / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["export", "d.db", "--out", str(fifo)]) == 0, capsys.readouterr().err
    reader.join(timeout=60)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert received and received[0].startswith(b"{") and received[0].count(b"\n") > 3


# -- the HTML report and its pages are one unit --------------------------------------------

STEPS = ("mkdir", "rename", "replace", "fsync", "unlink", "rmdir")
"""The file-system calls a kill is placed before (each call is one step)."""
WRITES = ("mkdir", "rename", "replace", "fsync")
"""The calls a fault is injected in (a failed removal leaves what it could not remove)."""
RUNS = 9
"""Campaigns ``r0`` ... ``r8`` of :func:`runs_db`: a page of one names its conversations."""

CHILD = """
import functools, os, signal, sys
from mhsafeeval.reports import html as html_report
from mhsafeeval.cli import main
kill_at = int(sys.argv[1])
html_report.write_html = functools.partial(
    html_report.write_html, inline_attempts=0, page_attempts=3
)
calls = 0
def counted(real):
    def call(*args, **kwargs):
        global calls
        calls += 1
        if calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return call
for name in STEPS:
    setattr(os, name, counted(getattr(os, name)))
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def runs_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of the example campaign run :data:`RUNS` times, as campaigns ``r0``, ``r1``,
    ...: their conversations are named after them (``r3/demo-counselor/grief-widower/0``), so
    a page shows which report it belongs to."""
    db = tmp_path_factory.mktemp("runs") / "runs.db"
    script = (
        "import sys\nfrom mhsafeeval.cli import main\n"
        f"for i in range({RUNS}):\n"
        f"    args = ['run', {str(EXAMPLE)!r}, '--db', {str(db)!r}, '--quiet']\n"
        "    assert main([*args, '--set', f'campaign.name=r{i}']) == 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return db


@pytest.fixture
def paged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report pages its transcripts, about 3 attempts a page (whole conversations: one
    page per conversation of the example), as the CLI calls it."""
    paging = functools.partial(html_report.write_html, inline_attempts=0, page_attempts=3)
    monkeypatch.setattr(html_report, "write_html", paging)


class Steps:
    """Counts the calls of :data:`STEPS` (while patched in) and makes the ``fail_at``-th call
    of ``names`` fail with a full disk (0: none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.fail_at = 0
        self.names: tuple[str, ...] = STEPS
        for name in STEPS:
            monkeypatch.setattr(os, name, self._counted(name, getattr(os, name)))

    def arm(self, fail_at: int = 0, names: tuple[str, ...] = STEPS) -> None:
        self.calls, self.fail_at, self.names = 0, fail_at, names

    def _counted(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if name in self.names:
                self.calls += 1
                if self.calls == self.fail_at:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args, **kwargs)

        return call


def published(out: Path, campaign: str | None = None) -> set[Path]:
    """Check that the report ``out`` and the pages it names are one run's (each page holds
    the campaign's conversations, and exactly the attempts, conversations, first and last
    conversation the main page says; its folder holds no other page), and return the files
    of that set."""
    found = re.search(
        r'<script type="application/json" id="data">(.*?)</script>', out.read_text(), re.S
    )
    assert found is not None
    files = {out}
    folders = set()
    for index, shown in enumerate(json.loads(found.group(1))):
        assert campaign in (None, shown["campaign"])
        assert shown["attempts"] == [] and shown["pages"], "the report is not paged"
        seen = 0
        for number, entry in enumerate(shown["pages"]):
            path = out.parent / unquote(entry["src"])
            assert path.is_file(), f"{entry['src']} is missing"
            call = re.fullmatch(r"mhsafeevalPage\((\d+), (\d+), (.*)\);\n", path.read_text(), re.S)
            assert call is not None, path
            records = json.loads(call.group(3))
            assert (int(call.group(1)), int(call.group(2))) == (index, number), path
            mine = all(r["conversation"].startswith(shown["campaign"] + "/") for r in records)
            assert mine and len(records) == entry["attempts"], f"{path} is another run's"
            assert records[0]["conversation"] == entry["first"], f"{path} is another run's"
            assert records[-1]["conversation"] == entry["last"], f"{path} is another run's"
            assert len({r["conversation"] for r in records}) == entry["conversations"]
            seen += len(records)
            files.add(path)
            folders.add(path.parent)
        assert seen == shown["total"]
    for folder in folders:
        assert set(folder.iterdir()) <= files, f"{folder} holds pages of another run"
    return files


def leftovers(out: Path, files: set[Path]) -> list[str]:
    """What lies beside the report ``out`` that is not the published set ``files`` (nor a
    folder holding one of them)."""
    keep = files | {parent for f in files for parent in f.parents}
    return sorted(str(p.relative_to(out.parent)) for p in out.parent.rglob("*") if p not in keep)


def report(db: Path, campaign: str, out: Path) -> list[str]:
    return ["report", str(db), "--campaign", campaign, "--html", str(out)]


@pytest.mark.usefixtures("paged")
def test_a_report_failing_at_any_step_keeps_one_run_and_leaves_no_temporaries(
    runs_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A full disk at each write step in turn (r1's report over r0's): the published report
    is one run's, and the failed one removed everything it wrote."""
    out = tmp_path / "r.html"
    steps = Steps(monkeypatch)
    assert main(report(runs_db, "r0", out)) == 0
    published(out, "r0")
    failed = 0
    for fail_at in range(1, 200):
        steps.arm(fail_at, WRITES)
        code = main(report(runs_db, "r1", out))
        reached = steps.calls >= fail_at
        steps.arm()
        capsys.readouterr()
        files = published(out)  # r0's report, or r1's: whole
        assert leftovers(out, files) == [], f"a fault at step {fail_at} left temporaries"
        if not reached:  # every step has failed once
            assert code == 0
            break
        failed += code == 2
        if code == 0:  # published despite the fault: put r0's back
            assert main(report(runs_db, "r0", out)) == 0
    else:
        raise AssertionError("the report never finished")
    assert failed >= 6  # the faults did land, each as one exit-2 error


@pytest.mark.usefixtures("paged")
def test_a_report_killed_at_any_step_keeps_one_run_and_the_next_cleans_up(
    runs_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGKILL at eight points spread over the writing of a report, each a report of another
    campaign, so that a main page with pages of another run shows."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "r.html"
    steps = Steps(monkeypatch)
    assert main(report(runs_db, "r0", out)) == 0
    published(out, "r0")
    left = 0
    kills = RUNS - 1
    for i in range(1, RUNS):
        # How many steps this report takes: the same report, over a copy of the folder.
        scratch = tmp_path / "scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(folder, scratch, symlinks=True)
        steps.arm()
        assert main(report(runs_db, f"r{i}", scratch / "r.html")) == 0
        kill_at = max(1, steps.calls * i // (kills + 1))
        code = CHILD.replace("STEPS", repr(STEPS))
        done = subprocess.run(
            [sys.executable, "-c", code, str(kill_at), *report(runs_db, f"r{i}", out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == -signal.SIGKILL, (kill_at, steps.calls, done.stderr)
        files = published(out)  # the previous report or this one, whole
        left += bool(leftovers(out, files))
    assert left  # the kills did leave temporaries behind
    capsys.readouterr()
    assert main(report(runs_db, "r0", out)) == 0
    files = published(out, "r0")
    assert leftovers(out, files) == []  # the dead runs' temporaries are gone
    assert len(files) == 1 + 3  # the main page and a page per conversation


# -- a live writer's temporaries are never taken for a dead one's --------------------------


def test_a_concurrent_writer_keeps_its_temporary_and_a_dead_one_s_is_removed(
    tmp_path: Path,
) -> None:
    from mhsafeeval._files import open_private_atomic, write_private_atomic

    target = tmp_path / "r.jsonl"
    dead = tmp_path / ".r.jsonl.0123456789abcdef.tmp"  # as a killed writer leaves it
    dead.write_text("half")
    mine = tmp_path / ".r.jsonl.bak.tmp"  # not a name the writer makes: never touched
    mine.write_text("a user's file")
    with open_private_atomic(target) as out:
        out.write("first\n")
        write_private_atomic(target, "second\n")  # another writer, meanwhile
        assert not dead.exists() and mine.exists()
        assert len(list(tmp_path.glob(".r.jsonl.*.tmp"))) == 2  # the first writer's is kept
    assert target.read_text() == "first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".r.jsonl.bak.tmp", "r.jsonl"]


def test_a_report_set_written_meanwhile_is_kept_until_it_is_published(tmp_path: Path) -> None:
    from mhsafeeval._files import FileSet

    main_file, folder = tmp_path / "r.html", tmp_path / "r_files"
    with FileSet(main_file, folder) as slow:
        (slow.side_folder() / "p.js").write_text("slow")
        with FileSet(main_file, folder) as fast:
            (fast.side_folder() / "p.js").write_text("fast")
            fast.publish(fast.name)
        assert (fast.published / "p.js").read_text() == "fast"
        assert (slow.side_folder() / "p.js").read_text() == "slow"  # not taken for a dead one's
        slow.publish(slow.name)
    assert main_file.read_text() == slow.name
    assert [p.name for p in folder.iterdir()] == [slow.name]  # the set published before: gone
    assert (slow.published / "p.js").read_text() == "slow"
