"""The documentation site (``docs/``, ``mkdocs.yml``): it builds in strict mode, every config key
has a description, every example in it runs, and the command line and the text report read
without it (80 columns, each help pointing at its page).

Examples in the docs are tested by this convention, an HTML comment on the line before a fence
(invisible on the site):

* a ```` ```toml ```` block is a whole config and must parse as ``mhsafeeval check`` reads one
  (:func:`mhsafeeval.config.parse_config`, then the ``[search]`` and ``[judge]`` options of the
  controller and judge it names). ``<!-- docs-test: base=PATH -->``: a fragment, appended to the
  config at ``PATH`` (relative to the repository) before it is parsed;
* a ```` ```python ```` block runs in a fresh interpreter, in the repository's root, and must
  exit 0;
* ``<!-- docs-test: skip REASON -->``: not run (say why: it needs an API key, a server, ...).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

from mhsafeeval.cli._arguments import DOCS
from mhsafeeval.config import parse_config
from mhsafeeval.judges import judge_options
from mhsafeeval.search import controller_options
from needs import has_module, need

ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = ROOT / "docs"
WIDTH = 80


def _hook() -> ModuleType:
    """``docs/hooks/reference.py``, the build's generator, imported as a module."""
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS_DIR / "hooks/reference.py")
    assert spec is not None and spec.loader is not None, "docs/hooks/reference.py is missing"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Snippet(NamedTuple):
    page: str
    line: int
    lang: str
    text: str
    marker: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


_FENCE = re.compile(r"^(?P<indent>(?:> ?| {2,})*)```(?P<lang>[a-z]*)")
_MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<marker>.*?)\s*-->")


def snippets(lang: str) -> list[Snippet]:
    """Every fenced ``lang`` block of the docs' Markdown pages, with the marker before it."""
    found = []
    for page in sorted(DOCS_DIR.rglob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            opened = _FENCE.match(lines[i])
            if not opened:
                i += 1
                continue
            indent, start = len(opened["indent"]), i
            body = []
            i += 1
            while i < len(lines) and not lines[i][indent:].startswith("```"):
                body.append(lines[i][indent:])
                i += 1
            before = lines[start - 1] if start else ""
            marker = _MARKER.search(before)
            if opened["lang"] == lang:
                found.append(
                    Snippet(
                        str(page.relative_to(DOCS_DIR)),
                        start + 1,
                        lang,
                        "\n".join(body) + "\n",
                        marker["marker"] if marker else "",
                    )
                )
            i += 1
    return found


TOML = snippets("toml")
PYTHON = snippets("python")


def test_every_config_key_has_a_description() -> None:
    missing = _hook().undocumented()
    assert missing == [], (
        "config keys without a description (write a docstring under the field): "
        + ", ".join(missing)
    )


def test_the_config_reference_lists_every_section() -> None:
    text = _hook().config_markdown()
    for section in ("campaign", "budget", "models.NAME", "counselors.NAME", "gate", "confirm"):
        assert f"### `[{section}]`" in text
    assert "### `[[gate.cells]]`" in text
    assert "| `max_turns` | integer | `10` | >= 1, <= 100,000 |" in text


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """Broken links, missing anchors and unresolved references fail the build."""
    need(has_module("mkdocs"), "mkdocs", "pip install -e '.[docs]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = (tmp_path / "site/reference/config/index.html").read_text(encoding="utf-8")
    assert "conversations_per_profile" in config and "generated: config" not in config
    cli = (tmp_path / "site/reference/cli/index.html").read_text(encoding="utf-8")
    assert "--fail-above-ci" in cli
    assert (tmp_path / "site/report.png").is_file()


def test_there_are_examples_to_test() -> None:
    assert len(TOML) >= 15 and len(PYTHON) >= 2, (len(TOML), len(PYTHON))


def _skip(snippet: Snippet) -> None:
    if snippet.marker.startswith("skip"):
        reason = snippet.marker.removeprefix("skip").strip()
        assert reason, f"{snippet.id}: say why it is skipped: <!-- docs-test: skip REASON -->"
        pytest.skip(f"{snippet.id}: {reason}")


@pytest.mark.parametrize("snippet", TOML, ids=[s.id for s in TOML])
def test_toml_examples_parse(snippet: Snippet) -> None:
    _skip(snippet)
    text = snippet.text
    if snippet.marker.startswith("base="):
        base = ROOT / snippet.marker.removeprefix("base=")
        text = base.read_text(encoding="utf-8") + "\n" + text
    config = parse_config(text, f"docs/{snippet.id}")
    controller_options(config.campaign.controller, config.search, f"docs/{snippet.id}")
    judge_options(config.campaign.judge, config.judge, f"docs/{snippet.id}")


@pytest.mark.parametrize("snippet", PYTHON, ids=[s.id for s in PYTHON])
def test_python_examples_run(snippet: Snippet) -> None:
    _skip(snippet)
    done = subprocess.run(
        [sys.executable, "-c", snippet.text],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _help(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mhsafeeval", *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},  # a wide terminal: still 80 columns
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", list(DOCS))
def test_each_help_fits_80_columns_and_points_at_its_page(command: str) -> None:
    text = _help(*filter(None, [command]))
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert wide == []
    page = DOCS[command]
    assert f"docs: {page}" in " ".join(text.split())
    assert (ROOT / page).is_file()


def test_every_command_has_a_docs_page() -> None:
    shown = _help().split("positional arguments:")[1].split("options:")[0]
    listed = re.findall(r"^    (\w+) ", shown, flags=re.MULTILINE)
    assert listed and set(listed) <= set(DOCS)


def test_the_text_report_explains_its_columns_and_marks(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mhsafeeval",
            "run",
            str(ROOT / "examples/campaign.toml"),
            "--db",
            str(db),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert [line for line in report.splitlines() if len(line) > WIDTH] == []
    header = next(line for line in report.splitlines() if line.startswith("model "))
    legend = report.split(header, 1)[1]
    for column in header.split()[1:]:
        assert f"{column} = " in legend or f"{column}, " in legend, column
    assert re.search(r"\d[*?] \d\.\d\d", report)  # a cell mark ...
    assert '"3* 0.50": best severity 3, cell ASR 0.50; * = a finding' in report  # ... explained
    assert "? = unconfirmed candidates only" in report
