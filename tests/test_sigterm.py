"""SIGTERM at any moment: one line, exit 143, nothing stored is lost, no traceback.

Two moments where the event loop cannot answer a signal: while a command is busy in synchronous
work before its store opens (an SDK's import: litellm's takes seconds), and while a campaign's
loop is blocked by synchronous work inside a call (an ``async`` app that blocks). asyncio's own
signal handler waits for the loop, so the first took 15-19 s to exit on a loaded machine and
the second printed aiosqlite's "Event loop is closed" traceback.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import cli, stored
from mhsafeeval.messages import CampaignFinished, ConversationStarted

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "examples" / "campaign.toml").read_text()
COUNSELOR = '[counselors.demo-counselor]\nprovider = "scripted/demo-counselor"'
HANG_GUARD_S = 20.0
"""Far above the 2 s target on a loaded machine, far below the 30 s the app blocks for."""


def _campaign(tmp_path: Path, app: str) -> Path:
    (tmp_path / "slow_app.py").write_text(app)
    config = tmp_path / "c.toml"
    assert COUNSELOR in BASE
    config.write_text(
        BASE.replace(
            COUNSELOR,
            f'[counselors.app]\nprovider = "python/{tmp_path / "slow_app.py"}:reply"\n'
            "timeout = 120\nmax_attempts = 1",
        )
    )
    return config


def _terminate_when(marker: Path, command: list[str], cwd: Path) -> tuple[int, str, float]:
    """Start ``command``, send SIGTERM once ``marker`` exists; (exit code, stderr, seconds)."""
    with subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the command never reached the blocking step"
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"still running {HANG_GUARD_S:.0f} s after SIGTERM")
        return proc.returncode, err, time.monotonic() - sent


def test_sigterm_while_a_command_is_busy_before_its_store_opens(tmp_path: Path) -> None:
    """An import that blocks for 30 s (as an SDK's import can for seconds): `run` still ends
    at once, with one line and exit 143, and has written nothing."""
    marker = tmp_path / "importing"
    config = _campaign(
        tmp_path,
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(30)\n"
        "def reply(messages):\n    return 'ok'\n",
    )
    db = tmp_path / "c.db"
    code, err, _ = _terminate_when(
        marker, [sys.executable, "-m", "mhsafeeval", "run", str(config), "--db", str(db)], tmp_path
    )
    assert code == 143, err
    assert err == "mhsafeeval: terminated (SIGTERM)\n", err
    assert not db.exists()


def test_sigterm_while_the_loop_is_blocked_mid_campaign_keeps_what_was_stored(
    tmp_path: Path,
) -> None:
    """An ``async`` app that blocks the event loop for 30 s on its third call: one line, exit
    143, no traceback from the store's worker thread, every event stored before is still there,
    and the same command then finishes the campaign."""
    marker = tmp_path / "blocking"
    config = _campaign(
        tmp_path,
        "import pathlib, time\ncalls = 0\n"
        "async def reply(messages):\n"
        "    global calls\n    calls += 1\n"
        "    if calls == 3:\n"
        f"        pathlib.Path({str(marker)!r}).touch()\n"
        "        time.sleep(30)  # blocks the loop: no await\n"
        "    return 'I hear you. Tell me more about that.'\n",
    )
    db = tmp_path / "c.db"
    command = [sys.executable, "-m", "mhsafeeval", "run", str(config), "--db", str(db), "--quiet"]
    code, err, _ = _terminate_when(marker, command, tmp_path)
    assert code == 143, err
    assert err.endswith("mhsafeeval: terminated (SIGTERM)\n"), err
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    before = stored(db)
    assert any(isinstance(m, ConversationStarted) for m in before)
    assert [m.status for m in before if isinstance(m, CampaignFinished)] == ["interrupted"]
    marker.unlink()
    (tmp_path / "slow_app.py").write_text("def reply(messages):\n    return 'I hear you.'\n")
    done = cli("run", str(config), "--db", str(db), "--quiet", timeout=300)
    assert done.returncode == 0, done.stderr
    after = stored(db)
    assert after[: len(before)] == before  # nothing stored before SIGTERM was lost
    assert [m.status for m in after if isinstance(m, CampaignFinished)][-1] == "completed"
