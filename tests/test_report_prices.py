"""A run stores what each call cost, as priced when it was made; reports read that.

So ``report`` on a campaign of hosted (litellm) models shows the prices the run paid and never
imports litellm (2-12 s and about 200 MB), and a later change of litellm's price map does not
rewrite an old campaign's cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from helpers import cli, stored
from mhsafeeval.messages import CounselorReply

ROOT = Path(__file__).resolve().parents[1]


def test_report_shows_the_stored_prices_without_importing_litellm(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    fake_openai.default = Reply.chat(usage=(1000, 500))  # echoes the client, priced tokens
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + '\n[counselors.hosted]\nprovider = "litellm/openai/gpt-4o-mini"\n'
        f'api_base = "{fake_openai.url}/v1"\napi_key_env = "MHS_FAKE_KEY"\n'
    )
    db = tmp_path / "c.db"
    env = {**os.environ, "MHS_FAKE_KEY": "sk-test-fake-0000000000"}
    done = cli("run", str(config), "--db", str(db), "--quiet", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    replies = [
        m for m in stored(db) if isinstance(m, CounselorReply) and "/hosted/" in m.conversation
    ]
    assert replies and all(r.usage is not None and r.usage.usd for r in replies)
    paid = sum(r.usage.usd or 0.0 for r in replies if r.usage is not None)

    code = (
        "import json, sys\n"
        "from mhsafeeval.cli import main\n"
        f"assert main(['report', {str(db)!r}, '--json']) == 0\n"
        "print('litellm imported:', 'litellm' in sys.modules, file=sys.stderr)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert "litellm imported: False" in shown.stderr, shown.stderr[-2000:]
    report = json.loads(shown.stdout)
    [campaign] = report.values()
    hosted = campaign["models"]["hosted"]
    assert paid > 0 and hosted["usage"]["counselor"]["usd"] == pytest.approx(paid)
