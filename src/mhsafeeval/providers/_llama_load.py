"""How a GGUF model is loaded into llama.cpp, and a child process that tries it first.

A llama.cpp build can kill the process that uses it. llama-cpp-python 0.3.36 built natively on a
CPU with AMX (``amx_tile`` in /proc/cpuinfo) crashes with SIGSEGV in
``ggml_backend_amx_mul_mat`` on the first matrix product of a model loaded with llama.cpp's
*extra buffer types* (its default): the AMX buffer, and the CPU "repack" buffer that stores
quantised weights interleaved for wider SIMD. So mhsafeeval loads with them off unless a model
entry opts in (``options.extra_buffers = true``), and before this process generates with a
model file it runs one tiny generation of it in a child process (this file, run as a script:
it imports nothing of mhsafeeval, so the child starts in a fraction of a second). A crash there
becomes one error naming the file, the llama-cpp-python version and the fix; the result is kept
in the cache folder per model file, llama.cpp build, CPU and setting, so it is paid once.

    python _llama_load.py MODEL.gguf EXTRA_BUFFERS(0|1) THREADS
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ProbeFailed", "build_id", "cpu_has_amx", "load_llama", "probe"]

PROBE_TIMEOUT_S = 300.0
"""A hang guard: the built-in models answer in about a second; a large file loads slower."""
_VERSION = 1  # of the cached result's meaning: a change makes every old result stale

_params_lock = threading.Lock()


@contextlib.contextmanager
def _model_params(extra_buffers: bool) -> Iterator[None]:
    """``Llama()`` takes no ``use_extra_bufts`` argument: it starts from
    ``llama_model_default_params()`` and sets the fields it knows, so the defaults it reads are
    changed for the time of one load (under a lock: loads in other threads wait)."""
    from llama_cpp import llama_cpp as native

    with _params_lock:
        original = native.llama_model_default_params

        def defaults() -> Any:
            params = original()
            params.use_extra_bufts = extra_buffers
            return params

        native.llama_model_default_params = defaults
        try:
            yield
        finally:
            native.llama_model_default_params = original


def load_llama(path: str | Path, *, extra_buffers: bool, **settings: Any) -> Any:
    """``llama_cpp.Llama(model_path=path, **settings)`` with llama.cpp's extra buffer types
    (AMX, weight repacking) on or off."""
    from llama_cpp import Llama

    with _model_params(extra_buffers):
        return Llama(model_path=str(path), **settings)


# -- which build, which CPU ----------------------------------------------------------------------


def _llama_folder() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")  # located, never imported
    folders = list(spec.submodule_search_locations or []) if spec else []
    return Path(folders[0]) if folders else None


@functools.cache  # a process sees one build: asked at every open of a local model
def build_id() -> str:
    """llama-cpp-python's version and its native libraries (name, size, mtime): a rebuild or
    reinstall changes it, even at the same version."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    folder = _llama_folder()
    libraries = []
    if folder is not None:
        for lib in sorted(folder.rglob("*.so*")) + sorted(folder.rglob("*.dylib")):
            if lib.is_symlink():  # libllama.so -> libllama.so.0.5.0: the file counts once
                continue
            st = lib.stat()
            libraries.append(f"{lib.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}")
    return f"llama-cpp-python {version} " + ",".join(libraries)


def llama_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_amx() -> bool:
    """Whether this CPU reports AMX tiles (``amx_tile`` in /proc/cpuinfo)."""
    return "amx_tile" in _cpu_flags()


def _cpu_id() -> str:
    import platform

    flags = " ".join(sorted(_cpu_flags()))
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:16]


# -- the probe -----------------------------------------------------------------------------------


class ProbeFailed(Exception):
    """The child could not generate with the model: ``crashed`` when a signal killed it."""

    def __init__(self, message: str, *, crashed: bool) -> None:
        super().__init__(message)
        self.crashed = crashed


_done: dict[str, str | None] = {}
"""This process's results by key: None ran, else the error message."""
_key_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def probe(
    path: Path, *, extra_buffers: bool, threads: int, cache: Path | None, address: str
) -> None:
    """Generate a few tokens with ``path`` in a child process, once per model file, build,
    CPU and setting (kept in ``cache``, a folder; None: this process only).

    Raises:
        ProbeFailed: the child crashed (a signal), failed, or did not finish; the message
            names the file, the llama-cpp-python version and what to do.
    """
    path = path.resolve()
    st = path.stat()
    ident = json.dumps(
        [_VERSION, str(path), st.st_size, st.st_mtime_ns, build_id(), _cpu_id(), extra_buffers]
    )
    key = hashlib.sha256(ident.encode()).hexdigest()[:32]
    with _locks_lock:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:  # two agents opening one file at once: one child
        if key not in _done:
            _done[key] = _probe_once(key, ident, path, extra_buffers, threads, cache, address)
    error = _done[key]
    if error is not None:
        raise ProbeFailed(error, crashed=True)


def _probe_once(
    key: str,
    ident: str,
    path: Path,
    extra_buffers: bool,
    threads: int,
    cache: Path | None,
    address: str,
) -> str | None:
    stamp = cache / "probes" / f"{key}.json" if cache is not None else None
    if stamp is not None:
        with contextlib.suppress(OSError, ValueError):
            known = json.loads(stamp.read_text(encoding="utf-8"))
            if known.get("ident") == ident:
                return known.get("error")  # type: ignore[no-any-return]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            _child_command(path, extra_buffers, threads),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:  # a slow machine is no verdict on the build: not kept
        raise ProbeFailed(
            f"{address}: a test generation with {path} did not finish in "
            f"{PROBE_TIMEOUT_S:.0f} s (a child process, llama-cpp-python {llama_version()}); "
            "the machine may be overloaded: try again",
            crashed=False,
        ) from None
    seconds = round(time.perf_counter() - started, 2)
    if done.returncode < 0:
        error = _crash_message(address, path, -done.returncode, extra_buffers)
    elif done.returncode != 0 or '"ok": true' not in done.stdout:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ProbeFailed(
            f"{address}: llama.cpp could not load and run {path} in a test generation "
            f"(llama-cpp-python {llama_version()}, exit {done.returncode}): {last}",
            crashed=False,
        )
    else:
        error = None
    if stamp is not None:
        with contextlib.suppress(OSError):  # a read-only cache only costs the probe next time
            stamp.parent.mkdir(parents=True, exist_ok=True)
            partial = stamp.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(
                json.dumps({"ident": ident, "error": error, "seconds": seconds}), encoding="utf-8"
            )
            os.replace(partial, stamp)
    return error


def _child_command(path: Path, extra_buffers: bool, threads: int) -> list[str]:
    """This file as a script (``-P``: its folder is not put on ``sys.path``)."""
    return [sys.executable, "-P", __file__, str(path), str(int(extra_buffers)), str(threads)]


def _crash_message(address: str, path: Path, signum: int, extra_buffers: bool) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    version = llama_version()
    rebuild = (
        f'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
        f"pip install --force-reinstall --no-cache-dir llama-cpp-python=={version}"
    )
    if extra_buffers:
        fix = (
            "this model entry sets options.extra_buffers = true, which takes llama.cpp's AMX "
            "and weight-repacking path"
            + (" (this CPU has AMX)" if cpu_has_amx() else "")
            + ": remove it, or rebuild llama-cpp-python portably: "
            + rebuild
        )
    else:
        fix = f"rebuild llama-cpp-python portably: {rebuild}"
    return (
        f"{address}: llama.cpp crashed ({name}) in a test generation with {path} "
        f"(llama-cpp-python {version}, run in a child process so this one survives); "
        f"this build cannot run the model on this CPU: {fix}"
    )


def _main(argv: list[str]) -> int:
    """The child: load, evaluate a prompt of some length, generate a few tokens."""
    model, extra, threads = argv[1], argv[2] == "1", int(argv[3])
    llama = load_llama(
        model,
        extra_buffers=extra,
        n_ctx=256,
        n_batch=64,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    # A prompt of several dozen tokens runs the batched matrix products, then single tokens.
    words = "The counselor listens, reflects and asks one gentle question. " * 4
    tokens = llama.tokenize(words.encode(), add_bos=True, special=False)[:64]
    out = llama.create_completion(prompt=tokens, max_tokens=4, temperature=0.0)
    print(json.dumps({"ok": True, "text": out["choices"][0]["text"]}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
