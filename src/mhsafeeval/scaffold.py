"""Getting started and looking: ``mhsafeeval init`` writes a commented campaign config to
start from, and ``mhsafeeval view`` opens a stored campaign's HTML report in a browser.

Example:
    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     written = write_starter_config(pathlib.Path(folder))
    ...     print(written.name, written.read_text() == INIT_TEMPLATE.read_text())
    campaign.toml True
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import webbrowser
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from mhsafeeval._files import check_output
from mhsafeeval.errors import InputError

__all__ = [
    "CONFIG_NAME",
    "INIT_TEMPLATE",
    "browser_available",
    "next_steps",
    "view_report",
    "write_starter_config",
]

INIT_TEMPLATE = Path(__file__).parent / "data" / "init.toml"
"""The commented campaign config ``mhsafeeval init`` writes (hosted models, every section)."""

CONFIG_NAME = "campaign.toml"
"""The file ``mhsafeeval init DIR`` writes in DIR."""


def write_starter_config(folder: Path, *, force: bool = False) -> Path:
    """Write :data:`INIT_TEMPLATE` to ``folder / CONFIG_NAME`` (the folder is created if need
    be) and return its path. The file appears whole or not at all; an existing one is kept
    unless ``force``.

    Raises:
        InputError: the file exists (and not ``force``), ``folder`` is a file, or the file
            cannot be written.
    """
    target = folder / CONFIG_NAME
    if folder.exists() and not folder.is_dir():
        raise InputError(folder, None, "is a file; name a folder to write campaign.toml in")
    if target.is_dir():
        raise InputError(target, None, "is a folder")
    if target.exists() and not force:
        raise InputError(target, None, "already exists; pass --force to overwrite it")
    check_output(target, config_ok=True)  # --force replaces a config, never a database
    text = INIT_TEMPLATE.read_text(encoding="utf-8")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{CONFIG_NAME}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(folder, None, f"cannot write there ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(temp, 0o644)  # a config holds no secret: readable like any source file
        if force:
            os.replace(temp, target)
        else:
            _link_new(Path(temp), target)
    except FileExistsError:
        raise InputError(target, None, "already exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise InputError(target, None, f"cannot write: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    return target


def _link_new(temp: Path, target: Path) -> None:
    """Give ``temp`` the name ``target`` unless that exists (FileExistsError): a hard link
    fails if the file appeared meanwhile, so it is never clobbered; where the file system has
    no hard links, it is renamed after a last look."""
    try:
        os.link(temp, target)
    except FileExistsError:
        raise
    except OSError:
        if target.exists():
            raise FileExistsError(target) from None
        os.replace(temp, target)


def next_steps(config: Path) -> str:
    """What to run after ``init`` wrote ``config``, as lines to print (paths shell-quoted)."""
    here = config.parent
    db = shlex.quote(str(here / "campaign.db"))
    path = shlex.quote(str(config))
    db_option = "" if here == Path() else f" --db {db}"
    shown_db = "campaign.db" if here == Path() else db
    return "\n".join(
        [
            f"Wrote {path}: a commented campaign config. Next:",
            "  1. edit it: the counselor to test ([counselors.*]) and the attacker and judge "
            "models ([models.*])",
            "  2. export OPENAI_API_KEY=...   (every variable its api_key_env keys name)",
            f"  3. mhsafeeval check {path}",
            f"  4. mhsafeeval run {path}{db_option}   (a rerun resumes it)",
            f"  5. mhsafeeval view {shown_db}",
            f"Change a value for one run: mhsafeeval run {path} --set campaign.max_turns=3",
        ]
    )


def browser_available(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a browser window can be opened here: not in CI (``CI`` set to anything but
    ``0``/``false``), and on Linux and the BSDs only with a display (``DISPLAY`` or
    ``WAYLAND_DISPLAY``) or a ``BROWSER`` of the user's choice (a console browser would
    otherwise take over the terminal).

    Example:
        >>> browser_available({"CI": "true", "DISPLAY": ":0"})
        False
    """
    env = os.environ if environ is None else environ
    if env.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    if sys.platform in ("darwin", "win32") or env.get("BROWSER"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


async def view_report(
    db: Path, campaign: str | None, *, browser: bool = True, out: TextIO | None = None
) -> Path:
    """Write the HTML report of ``campaign`` (``None``: every one stored in ``db``) to a new
    owner-only temporary folder (reading and keeping it as ``report --html`` does:
    :mod:`mhsafeeval.reports.kept`), open it in the user's browser where one can be opened
    (:func:`browser_available`, then :func:`webbrowser.open`), and return its path. When none
    can be (or ``browser`` is false), the path is printed on ``out`` (stdout by default), to
    open by hand. The folder is left for the browser to read; the system's temporary-file
    cleaning removes it.

    Raises:
        InputError: ``db`` is missing or no campaign database, or holds no such campaign.
    """
    from mhsafeeval.reports.html import write_html
    from mhsafeeval.reports.kept import HTML_KIND, Fresh, keep_in_file
    from mhsafeeval.storage import SqliteEventStore

    fresh: Fresh = {}
    async with SqliteEventStore(db, read_only=True) as store:  # a bad file is refused here
        folder = Path(tempfile.mkdtemp(prefix="mhsafeeval-view-"))  # mode 0o700
        page = folder / "report.html"  # a name with nothing of the user's in it
        try:
            await write_html(store, campaign, page, source=db, fresh=fresh)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    await keep_in_file(db, HTML_KIND, fresh)  # as `report --html` does
    opened = browser and browser_available() and _open(page)
    if opened:
        print(f"mhsafeeval: opened {page} in your browser", file=sys.stderr)
    else:
        print(page, file=out or sys.stdout)
        why = "asked not to" if not browser else "no browser can be opened here"
        print(f"mhsafeeval: wrote the report ({why}): open the file above", file=sys.stderr)
    return page


def _open(page: Path) -> bool:
    try:
        return webbrowser.open(page.as_uri())
    except webbrowser.Error:
        return False
