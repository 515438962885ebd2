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
from typing import Any

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

    campaign = _report_without_litellm(db)
    hosted = campaign["models"]["hosted"]
    assert paid > 0 and hosted["usage"]["counselor"]["usd"] == pytest.approx(paid)


def _report_without_litellm(db: Path) -> dict[str, Any]:
    """``report --json`` of ``db`` in a fresh interpreter, checked not to import litellm."""
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
    [campaign] = json.loads(shown.stdout).values()
    return dict(campaign)


def test_openai_models_are_priced_by_their_table_and_unpriced_ones_stay_unknown(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """``openai/`` calls carry the table's prices; a table without prices leaves its calls
    unpriced, and the report says "unknown" instead of looking a price up by the name the
    server answered with (which would import litellm and guess)."""
    fake_openai.default = Reply.chat(usage=(1000, 500))
    base = f'api_base = "{fake_openai.url}/v1"\n'
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + f'\n[counselors.priced]\nprovider = "openai/gpt-4o-mini"\n{base}'
        "options = { usd_per_million_prompt_tokens = 0.5, "
        "usd_per_million_completion_tokens = 2.0 }\n"
        f'\n[counselors.unpriced]\nprovider = "openai/gpt-4o-mini"\n{base}'
    )
    db = tmp_path / "c.db"
    done = cli("run", str(config), "--db", str(db), "--quiet", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    replies = [m for m in stored(db) if isinstance(m, CounselorReply) and m.usage is not None]
    priced = [r.usage for r in replies if "/priced/" in r.conversation and r.usage]
    assert priced and all(u.usd is not None for u in priced)
    paid = sum(u.prompt_tokens * 0.5 + u.completion_tokens * 2.0 for u in priced) / 1e6
    assert paid > 0 and sum(u.usd or 0.0 for u in priced) == pytest.approx(paid)

    report = _report_without_litellm(db)
    cost, models = report["cost"], report["models"]
    assert models["priced"]["usage"]["counselor"]["usd"] == pytest.approx(paid)
    assert cost["priced"]["usd"] is not None
    assert models["unpriced"]["usage"]["counselor"]["unknown"] == len(
        [r for r in replies if "/unpriced/" in r.conversation]
    )
    assert cost["unpriced"]["usd"] is None
    text = cli("report", str(db), check=True).stdout
    assert "$?" in text


def test_a_usd_budget_needs_every_openai_table_priced(tmp_path: Path) -> None:
    """A USD limit cannot be enforced on calls that get no price: ``check`` refuses an
    ``openai/`` table without prices (it would count them as free) and accepts one with."""
    config = tmp_path / "c.toml"
    base = (ROOT / "examples" / "campaign.toml").read_text() + "\n[budget]\nusd = 1.0\n"
    table = (
        '\n[counselors.api]\nprovider = "openai/gpt-4o-mini"\napi_base = "http://127.0.0.1:9/v1"\n'
    )
    config.write_text(base + table)
    refused = cli("check", str(config))
    assert refused.returncode == 2, refused.stderr
    assert "budget.usd" in refused.stderr and "openai/gpt-4o-mini" in refused.stderr
    prices = (
        "options = { usd_per_million_prompt_tokens = 0.5, "
        "usd_per_million_completion_tokens = 2.0 }\n"
    )
    config.write_text(base + table + prices)
    accepted = cli("check", str(config))
    assert accepted.returncode == 0, accepted.stderr
