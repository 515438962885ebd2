"""Credentials and terminal escapes never pass through: what comes from outside (an app's error
body, a file quoted in an error line, a config, a model's reply) is redacted or escaped before
it is stored or shown."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from helpers import stored
from mhsafeeval.cli import main
from mhsafeeval.messages import CallFailed
from test_app_targets import ROLES, LoopbackApp

ROOT = Path(__file__).resolve().parents[1]
# Fake keys of each shape, built in pieces so that no scanner takes this file for a leak.
SHAPES = {
    "openai": "sk-" + "proj-" + "Ab12Cd34" * 5,
    "anthropic": "sk-" + "ant-api03-" + "Zx98Yw76" * 5,
    "google": "AIza" + "Sy" + "Q1w2E3r4" * 4 + "T5y",
    "github": "ghp" + "_" + "R4nd0mT0k3n" * 4,
    "slack": "xoxb" + "-" + "1234567890-abcdefABCDEF",
    "huggingface": "hf" + "_" + "aBcDeFgHiJ" * 4,
    "aws": "AKIA" + "IOSFODNN7EXAMPL3",
    "aws-session": "ASIA" + "Z2X3C4V5B6N7M8Q9",
    "groq": "gsk" + "_" + "Gr0qK3yV4lu3" * 4,
    "replicate": "r8" + "_" + "R3pl1c4t3T0k3n" * 3,
    "xai": "xai" + "-" + "X41K3yV4lu3" * 6,
    "jwt": "eyJ" + "hbGciOiJIUzI1NiJ9" + ".eyJ" + "zdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVm",
    "bearer": "Bearer " + "opaque.T0k3n-value~42",
}


# -- http/: an app whose error page echoes the request's headers -------------------------------

APP_KEY = "planted-app-key-7Q2xZr9W"  # no known shape: only its variable tells it is a key
APP_TOKEN = "planted-header-token-55Kp"


async def echo_headers(request: web.Request) -> web.Response:
    """A framework's default error page: the request, headers first, sent back as text."""
    shown = "\n".join(f"{k}: {v}" for k, v in sorted(request.headers.items()))
    return web.Response(status=400, text=f"Bad Request\n{shown}")


def test_an_app_that_echoes_its_request_headers_leaks_no_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHS_TEST_APP_KEY", APP_KEY)
    monkeypatch.setenv("MHS_TEST_APP_TOKEN", APP_TOKEN)
    db, html = tmp_path / "c.db", tmp_path / "r.html"
    with LoopbackApp(echo_headers) as app:
        config = tmp_path / "c.toml"
        config.write_text(
            '[campaign]\nname = "echo"\nmax_turns = 1\nmax_attempts = 1\n'
            'profile_ids = ["grief-widower"]\n' + ROLES + "[counselors.app]\n"
            'provider = "http/app"\napi_key_env = "MHS_TEST_APP_KEY"\nmax_attempts = 1\n'
            f'[counselors.app.options]\nurl = "{app.url}/chat"\nreply_path = "reply"\n'
            'extra_headers_env = { "X-App-Token" = "MHS_TEST_APP_TOKEN" }\n'
        )
        main(["run", str(config), "--db", str(db)])
        [(_, headers), *_] = app.requests
    assert headers["Authorization"] == f"Bearer {APP_KEY}"  # the app did get (and echo) them
    failed = [e for e in stored(db) if isinstance(e, CallFailed) and e.agent == "counselor"]
    assert failed and all("HTTP 400" in e.error for e in failed), failed
    shown = [capsys.readouterr().err]
    for args in (
        ["events", str(db)],
        ["events", str(db), "--json"],
        ["export", str(db), "--format", "jsonl"],
        ["export", str(db), "--format", "csv"],
        ["report", str(db), "--html", str(html)],
    ):
        main(args)
        out = capsys.readouterr()
        shown += [out.out, out.err]
    shown.append(html.read_text(encoding="utf-8"))
    shown += [e.error for e in failed]
    assert any("Bad Request" in text for text in shown)  # the echo is shown, masked
    for text in shown:
        assert APP_KEY not in text and APP_TOKEN not in text
    files = [p for p in tmp_path.iterdir() if p.name.startswith("c.db")]
    for path in files:
        data = path.read_bytes()
        assert APP_KEY.encode() not in data and APP_TOKEN.encode() not in data, path


# -- files quoted in error lines ---------------------------------------------------------------


def test_a_labels_file_linked_to_a_file_of_keys_shows_none_of_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = SHAPES["openai"]
    target = tmp_path / "environ"
    target.write_bytes(f"HOME=/root\0OPENAI_API_KEY={key}\0PATH=/usr/bin\0".encode())
    header = tmp_path / "labels.csv"
    header.symlink_to(target)
    cell = tmp_path / "cell.csv"
    cell.write_text(f"client,counselor,category,role,severity\nhi,there,{key},x,3\n")
    for labels in (header, cell):
        code = main(["calibrate", "--judge", "scripted/x", "--labels", str(labels)])
        err = capsys.readouterr().err
        assert code == 2 and f"{labels}: row " in err, err
        assert key not in err and key[:12] not in err, err
        assert len(err) < 400, err  # a short excerpt of the file, not the file


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
def test_a_labels_file_linked_to_the_environment_shows_no_key(tmp_path: Path) -> None:
    key = SHAPES["openai"]
    labels = tmp_path / "labels.csv"
    labels.symlink_to("/proc/self/environ")
    env = {"MHS_PLANTED": key, **os.environ}  # first: in the first column the file names
    done = subprocess.run(
        [sys.executable, "-m", "mhsafeeval.cli", "calibrate", "--judge", "scripted/x",
         "--labels", str(labels)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert key not in done.stderr and key[:12] not in done.stderr, done.stderr
    assert len(done.stderr) < 400, done.stderr


# -- literal credentials in a config -----------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_key_shape_in_a_config_is_refused_naming_its_key(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = SHAPES[shape]
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml").read_text()
        + f'options = {{ replies = ["fine", "my key is {key} ok"], cycle = true }}\n'
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "counselors.demo-counselor.options.replies[1]" in err, err
    assert "api_key_env" in err, err  # the safe way is named
    assert key not in err and key.split()[-1][4:16] not in err, err


# -- escape sequences in CSV -------------------------------------------------------------------

HOSTILE = {
    "esc": "\x1b[2J\x1b[31m",
    "bel": "\x07",
    "rlo": "\u202e",
    "csi": "\x9b",
    "isolate": "\u2066",
    "del": "\x7f",
    "nul": "\x00",
}


def test_csv_export_to_a_terminal_escapes_control_and_bidi_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replies = ["two\nlines\tand a tab"]
    replies += [f"ok {name}: a{raw}b" for name, raw in HOSTILE.items() if raw != "\x00"]
    toml = json.dumps(replies)  # JSON strings are valid TOML basic strings
    config = tmp_path / "c.toml"
    config.write_text(
        (ROOT / "examples" / "campaign.toml")
        .read_text()
        .replace("max_turns = 4", "max_turns = 2")
        .replace('"grief-widower", "panic-disorder-bus-driver"', "")
        + f"options = {{ replies = {toml}, cycle = true }}\n"
    )
    db = tmp_path / "c.db"
    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["export", str(db), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    for raw in HOSTILE.values():
        assert raw not in out, repr(raw)
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    texts = {row["reply"] for row in rows}
    assert "ok esc: a\\x1b[2J\\x1b[31mb" in texts and "ok rlo: a\\u202eb" in texts, texts
    assert "ok csi: a\\x9bb" in texts and "ok bel: a\\x07b" in texts, texts
    assert "two\nlines\tand a tab" in texts  # line breaks and tabs are kept
