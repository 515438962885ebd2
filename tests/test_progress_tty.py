"""The live progress block in a real pseudo-terminal: `mhsafeeval run` on a scripted campaign
under a pty of a given size, its output replayed on a small terminal model."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "campaign.toml"

# A counselor whose every other reply is empty: each one logs a `counselor.odd_reply`
# warning on stderr while the block is on screen. The client's delay spreads the run over
# several redraws.
CONFIG = (
    EXAMPLE.read_text(encoding="utf-8")
    .replace(
        '[counselors.demo-counselor]\nprovider = "scripted/demo-counselor"',
        "[counselors.demo-counselor]\n"
        'provider = "scripted/odd-counselor"\n'
        'options = { replies = ["", "I hear you. What went through your mind then?"] }',
    )
    .replace(
        '[models.client]\nprovider = "scripted/demo-client"',
        '[models.client]\nprovider = "scripted/demo-client"\noptions = { delay_s = 0.04 }',
    )
)

_TOKEN = re.compile(
    r"\x1b\[([0-9;?]*)([@-~])"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC (hyperlinks, titles)
    r"|\x1b[()][0-9A-Za-z]|\x1b[=>78]"  # charset, keypad, save/restore
    r"|[\r\n\b\x07]|[^\x1b\r\n\b\x07]"
)


class Screen:
    """Enough of a VT100 to replay what a program drew: text with the terminal's own
    wrapping at the right edge (counted in :attr:`wrapped`), cursor moves and erases."""

    def __init__(self, columns: int, rows: int) -> None:
        self.columns = columns
        self.rows = rows
        self.lines: list[list[str]] = [[]]
        self.x = 0
        self.y = 0
        self.wrapped = 0

    def _top(self) -> int:  # the cursor cannot leave the visible screen
        return max(0, len(self.lines) - self.rows)

    def _down(self) -> None:
        self.y += 1
        if self.y == len(self.lines):
            self.lines.append([])

    def feed(self, text: str) -> None:
        for m in _TOKEN.finditer(text):
            token = m.group(0)
            if m.group(2) is not None:
                self._csi(m.group(1), m.group(2))
            elif token == "\r":
                self.x = 0
            elif token == "\n":
                self._down()
            elif token == "\b":
                self.x = max(0, self.x - 1)
            elif token.startswith("\x1b") or token == "\x07":
                pass
            else:
                if self.x >= self.columns:  # past the right edge: the terminal wraps
                    self.wrapped += 1
                    self.x = 0
                    self._down()
                line = self.lines[self.y]
                line.extend(" " * (self.x + 1 - len(line)))
                line[self.x] = token
                self.x += 1

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?") or final in "mhl":
            return
        n = int(params.split(";")[0] or "0")
        line = self.lines[self.y]
        if final in "AF":
            self.y = max(self._top(), self.y - max(n, 1))
            self.x = 0 if final == "F" else self.x
        elif final in "BE":
            for _ in range(max(n, 1)):
                self._down()
            self.x = 0 if final == "E" else self.x
        elif final == "C":
            self.x = min(self.columns, self.x + max(n, 1))
        elif final == "D":
            self.x = max(0, self.x - max(n, 1))
        elif final == "G":
            self.x = max(n, 1) - 1
        elif final == "K":
            if n == 0:
                del line[self.x :]
            elif n == 1:
                line[: self.x + 1] = " " * min(len(line), self.x + 1)
            else:
                line.clear()
        elif final == "J" and n == 0:
            del line[self.x :]
            del self.lines[self.y + 1 :]
        else:
            raise AssertionError(f"the terminal model does not know CSI {params}{final}")

    def text(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.lines]


def run_in_pty(args: list[str], columns: int, rows: int, cwd: Path) -> tuple[str, int]:
    """Run ``args`` with stdin and stderr on a pty of that size and stdout into
    ``cwd/stdout.txt``; what the terminal got, and the exit code."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"}
    }
    env["TERM"] = "xterm-256color"
    with (cwd / "stdout.txt").open("wb") as stdout:
        proc = subprocess.Popen(
            args, stdin=slave, stdout=stdout, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the pty
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return b"".join(chunks).decode("utf-8", "replace"), code


@pytest.mark.parametrize("columns", [80, 200])
def test_the_live_block_fits_the_terminal_and_logs_print_above_it(
    columns: int, tmp_path: Path
) -> None:
    config = tmp_path / "campaign.toml"
    config.write_text(CONFIG, encoding="utf-8")
    cli = "from mhsafeeval.cli import main; raise SystemExit(main())"
    args = [sys.executable, "-c", cli, "run", config.name, "--db", "c.db"]
    output, code = run_in_pty(args, columns, 40, tmp_path)
    assert code == 0, output
    screen = Screen(columns, 40)
    screen.feed(output)
    rows = screen.text()
    assert screen.wrapped == 0, "\n".join(rows)  # no line was wider than the terminal
    # The block's final state: a bar, then the status lines, together, all conversations done.
    start = next(i for i, row in enumerate(rows) if row.endswith("100% of turns"))
    block = rows[start : start + 6]
    assert block[1].startswith("conversations 3/3 ended, turns 12/12 committed"), "\n".join(rows)
    assert block[2].startswith("calls ")
    assert block[3].startswith("failed calls 0, unjudged ")
    assert block[4].startswith("demo-counselor: ASR ")
    assert block[5].startswith("elapsed ") and block[5].endswith("ETA 0.0 min")
    assert sum("% of turns" in row for row in rows) == 1  # redrawn in place, not repeated
    # The warnings logged meanwhile are lines of their own, above the block, not in it.
    warnings = [i for i, row in enumerate(rows) if "counselor.odd_reply" in row]
    assert warnings, "\n".join(rows)
    assert max(warnings) < start
    after = [row for row in rows[start + 6 :] if row]
    assert len(after) == 1 and after[0].startswith("3/3 conversations finished (0 failed)")
    # The report is stdout's, a file here: nothing of it went to the terminal.
    assert "campaign scripted-demo" in (tmp_path / "stdout.txt").read_text(encoding="utf-8")
    assert "campaign scripted-demo  (" not in output
