"""`check` refuses what `run` would refuse, statically, and `run` refuses it before writing.

Every case is one line on stderr naming the file, the key path and the reason, exit code 2, and
no file written (no database, no lock).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, Reply, fake_openai_fixture  # noqa: F401 - the fixture
from mhsafeeval.cli import main
from mhsafeeval.config import MAX_PLANNED_CONVERSATIONS, parse_config
from mhsafeeval.errors import InputError
from mhsafeeval.providers import ModelSettings, open_model
from mhsafeeval.providers._types import ProviderUnavailable

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "examples" / "campaign.toml").read_text()


def write(tmp_path: Path, extra: str, base: str = BASE) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(base + "\n" + extra)
    return path


def refused(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], *, run: bool = True
) -> str:
    """Run `check` and `run` on ``config``; both must exit 2 and write nothing."""
    before = sorted(tmp_path.iterdir())
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    if run:
        assert main(["run", str(config), "--db", str(tmp_path / "c.db"), "--quiet"]) == 2
        assert capsys.readouterr().err == err  # the same line
    assert sorted(tmp_path.iterdir()) == before  # no database, no lock file
    assert err.count("\n") == 1 and err.startswith(f"mhsafeeval: error: {config}: "), err
    return err


COUNSELOR = "[counselors.x]\n"
SCRIPTED = COUNSELOR + 'provider = "scripted/echo"\n'
LITELLM = COUNSELOR + 'provider = "litellm/openai/gpt-4o-mini"\n'


@pytest.mark.parametrize(
    ("table", "where", "reason"),
    [
        (COUNSELOR + 'provider = "litellm/"', "counselors.x.provider", "no model after"),
        (COUNSELOR + 'provider = "local/"', "counselors.x.provider", "no model after"),
        (COUNSELOR + 'provider = "nosuch/model"', "counselors.x.provider", "unknown provider"),
        (
            COUNSELOR + 'provider = "litellm/opnai/gpt-4o-mini"',
            "counselors.x.provider",
            "litellm knows no provider for 'opnai/gpt-4o-mini'",
        ),
        (LITELLM + 'api_base = "localhost:8000/v1"', "counselors.x.api_base", "http(s) URL"),
        (LITELLM + 'api_base = "ftp://example.org/v1"', "counselors.x.api_base", "http(s) URL"),
        (LITELLM + 'api_base = "http:///v1"', "counselors.x.api_base", "http(s) URL"),
        (SCRIPTED + "timeout = inf", "counselors.x.timeout", "must be <= 86400"),
        (SCRIPTED + "backoff_max = inf", "counselors.x.backoff_max", "must be <= 86400"),
        (SCRIPTED + "max_retry_after = inf", "counselors.x.max_retry_after", "<= 86400"),
        (SCRIPTED + "breaker_cooldown = inf", "counselors.x.breaker_cooldown", "<= 86400"),
        (SCRIPTED + "temperature = -0.5", "counselors.x.temperature", "must be >= 0"),
        (SCRIPTED + "temperature = nan", "counselors.x.temperature", "a finite number"),
        (SCRIPTED + "max_tokens = -1", "counselors.x.max_tokens", "must be >= 1"),
        (SCRIPTED + "max_tokens = 0", "counselors.x.max_tokens", "must be >= 1"),
        (SCRIPTED + "max_attempts = 1000000", "counselors.x.max_attempts", "must be <= 100"),
        (SCRIPTED + "max_concurrency = 100000", "counselors.x.max_concurrency", "<= 1024"),
        (SCRIPTED + "breaker_threshold = 99999999", "counselors.x.breaker_threshold", "<= "),
        (SCRIPTED + "options = { dealy_s = 1 }", "counselors.x.options.dealy_s", "unknown"),
        (SCRIPTED + 'options = { delay_s = "1" }', "counselors.x.options.delay_s", "expected"),
        (
            COUNSELOR + 'provider = "local/gemma-3-270m"\noptions = { n_ctxx = 4096 }',
            "counselors.x.options.n_ctxx",
            "unknown",
        ),
        (
            COUNSELOR + 'provider = "local/gemma-3-270m"\noptions = { n_ctx = -5 }',
            "counselors.x.options.n_ctx",
            ">= 256",
        ),
        (
            LITELLM + "options = { temprature = 0.2 }",
            "counselors.x.options.temprature",
            "not an option litellm.acompletion accepts",
        ),
        (
            LITELLM + 'options = { frequency_penalty = "high" }',
            "counselors.x.options.frequency_penalty",
            "not a value litellm.acompletion takes for frequency_penalty: Expected `float",
        ),
        (
            LITELLM + 'options = { seed = 1.5, stop = ["x"] }',
            "counselors.x.options.seed",
            "Expected `int",
        ),
        (
            LITELLM + "options = { num_retries = 3 }",
            "counselors.x.options.num_retries",
            "set by mhsafeeval",
        ),
        (
            LITELLM + 'options = { structured_output = "xml" }',
            "counselors.x.options.structured_output",
            "invalid enum value",
        ),
    ],
)
def test_a_bad_model_table_is_refused_by_check_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, where: str, reason: str
) -> None:
    err = refused(tmp_path, write(tmp_path, table), capsys)
    assert f": {where}: " in err and reason in err, err


SIZES = [
    ("max_turns = 4", "max_turns = 1000000", "campaign.max_turns", "must be <= 100000"),
    ("max_attempts = 3", "max_attempts = 100000", "campaign.max_attempts", "must be <= 100"),
    ("concurrency = 4", "concurrency = 100000", "campaign.concurrency", "must be <= 1024"),
    (
        "conversations_per_profile = 1",
        "conversations_per_profile = 2000000000",
        "campaign.conversations_per_profile",
        "must be <= 100000",
    ),
    (
        "conversations_per_profile = 1",
        "conversations_per_profile = 40000",
        "campaign.conversations_per_profile",
        "120000 conversations (1 counselor(s) x 3 profile(s) x 40000 per profile)",
    ),
    ("seed = 7", "seed = 7\njudge_max_asks = 1000", "campaign.judge_max_asks", "must be <= 20"),
    ("", "[search]\nsimulations = 1000000000", "search.simulations", "must be <= 10000"),
    ("", "[search]\nexploration = inf", "search.exploration", "must be <= "),
    ("", "[budget]\nusd = inf", "budget.usd", "must be <= "),
]


@pytest.mark.parametrize(("old", "new", "where", "reason"), SIZES)
def test_absurd_sizes_are_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, where: str, reason: str
) -> None:
    if old:
        assert old in BASE
        config = write(tmp_path, "", BASE.replace(old, new))
    else:
        config = write(tmp_path, new)
    err = refused(tmp_path, config, capsys)
    assert f": {where}: " in err and reason in err, err


def test_the_planned_conversations_are_bounded_before_they_are_listed() -> None:
    many = BASE.replace("conversations_per_profile = 1", "conversations_per_profile = 99999")
    config = parse_config(many.replace("profile_ids = [", "# profile_ids = ["), "c.toml")
    from mhsafeeval.plan import build_plan

    with pytest.raises(InputError, match=f"at most {MAX_PLANNED_CONVERSATIONS}"):
        build_plan(config, "c.toml")


# Literal credentials: refused, with the safe way named


@pytest.mark.parametrize(
    ("table", "where", "pointer"),
    [
        (LITELLM + 'api_key = "sk-live-0123456789abcdef"', "counselors.x.api_key", "api_key_env"),
        (
            LITELLM + 'options = { api_key = "hunter2" }',
            "counselors.x.options.api_key",
            "api_key_env",
        ),
        (
            LITELLM + 'options = { extra_headers = { Authorization = "Bearer abcdefgh" } }',
            "counselors.x.options.extra_headers.Authorization",
            "extra_headers_env",
        ),
        (
            LITELLM + 'options = { extra_headers = { "x-api-key" = "plain" } }',
            "counselors.x.options.extra_headers.x-api-key",
            "extra_headers_env",
        ),
        (
            LITELLM + 'options = { extra_headers = { "api-key" = "plain" } }',
            "counselors.x.options.extra_headers.api-key",
            "extra_headers_env",
        ),
        (
            LITELLM + 'api_base = "https://me:hunter2@proxy.example/v1"',
            "counselors.x.api_base",
            "api_key_env",
        ),
        (
            LITELLM + 'api_base = "https://proxy.example/v1?api-key=hunter2"',
            "counselors.x.api_base",
            "api_key_env",
        ),
        (
            LITELLM + '# api_key = "sk-proj-0123456789abcdefghij"',
            f"line {BASE.count(chr(10)) + 4}",  # the third line after BASE and a blank line
            "api_key_env",
        ),
        (
            LITELLM + 'options = { extra_headers_env = { Authorization = "Bearer abc" } }',
            "counselors.x.options.extra_headers_env.Authorization",
            "NAME of an environment variable",
        ),
    ],
)
def test_a_literal_credential_is_refused_with_a_pointer_to_the_safe_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, where: str, pointer: str
) -> None:
    err = refused(tmp_path, write(tmp_path, table), capsys)
    assert where in err and pointer in err, err
    assert "hunter2" not in err and "abcdefgh" not in err and "0123456789abcdef" not in err


def test_header_secrets_come_from_the_environment_at_call_time(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fake_openai: FakeOpenAI,
) -> None:
    secret = "Bearer planted-header-secret-42"
    fake_openai.always("fake-model", Reply.chat("I hear you."))
    table = (
        f'{COUNSELOR}provider = "litellm/openai/fake-model"\napi_base = "{fake_openai.url}/v1"\n'
        'options = { extra_headers = { "X-Trace" = "t1" }, '
        'extra_headers_env = { Authorization = "MHS_TEST_AUTH_HEADER" } }\n'
    )
    config = write(tmp_path, table)
    monkeypatch.delenv("MHS_TEST_AUTH_HEADER", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "unused-by-the-fake")
    assert main(["check", str(config)]) == 0  # unset: a warning for check...
    assert "counselors.x.options.extra_headers_env.Authorization" in capsys.readouterr().err
    db = tmp_path / "c.db"
    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 2  # ...an error for run
    assert "MHS_TEST_AUTH_HEADER is not set" in capsys.readouterr().err
    assert not db.exists()

    monkeypatch.setenv("MHS_TEST_AUTH_HEADER", secret)
    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 0, capsys.readouterr().err
    requests = fake_openai.requests
    assert requests and all(r.headers.get("authorization") == secret for r in requests)
    assert all(r.headers.get("x-trace") == "t1" for r in requests)
    for path in tmp_path.iterdir():
        assert secret.split()[1].encode() not in path.read_bytes(), path
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from events").fetchone()[0] > 0


# Warnings


def test_concurrency_beyond_the_counselors_limits_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(
        tmp_path,
        '[counselors.y]\nprovider = "scripted/demo-counselor"\nmax_concurrency = 2\n',
        BASE.replace("concurrency = 4", "concurrency = 64"),
    )
    assert main(["check", str(config)]) == 0
    err = capsys.readouterr().err
    expected = (
        f"mhsafeeval: warning: {config}: campaign.concurrency: 64 is more than the counselor "
        "models allow together (6 calls in flight: the sum of counselors.*.max_concurrency)"
    )
    assert expected in err, err
    assert main(["run", str(config), "--db", str(tmp_path / "c.db"), "--quiet"]) == 0
    assert expected in capsys.readouterr().err


# The same checks guard models opened in code


def test_open_model_refuses_options_its_provider_does_not_accept() -> None:
    with pytest.raises(ProviderUnavailable, match=r"options\.dealy_s"):
        open_model(ModelSettings(provider="scripted/echo", options={"dealy_s": 1}))
    with pytest.raises(ProviderUnavailable, match="no model after"):
        open_model(ModelSettings(provider="scripted/"))


@pytest.mark.parametrize(
    ("table", "where", "reason"),
    [
        ('[judge]\nstring_limits = "no"\n', "judge.string_limits", "expected bool"),
        ("[judge]\nstrict = true\n", "judge.strict", "unknown field"),
    ],
)
def test_a_bad_judge_option_is_refused_by_check_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, where: str, reason: str
) -> None:
    err = refused(tmp_path, write(tmp_path, table), capsys)
    assert f": {where}: " in err and reason in err, err


def test_the_judges_own_options_are_accepted(tmp_path: Path) -> None:
    assert main(["check", str(write(tmp_path, "[judge]\nstring_limits = false\n"))]) == 0
