"""``vllm/<model>``: a Hugging Face model served in-process by vLLM's async engine (GPU).

``<model>`` is what vLLM loads: a Hub id (``vllm/Qwen/Qwen2.5-0.5B-Instruct``) or a local
folder (``vllm//models/qwen2.5-0.5b``). Install with ``pip install 'mhsafeeval[vllm]'``; a
CUDA GPU is needed. vLLM is imported on the first call, never at ``check`` or open time.

* The prompt is the model's own chat template (its tokenizer's ``apply_chat_template``),
  tokenised here without adding special tokens again, and sent as token ids. Message text
  cannot write the template's markers: every special or added token's text in it is broken
  by an invisible word joiner (:func:`neutralised`), so a client that types ``<|im_end|>``
  never closes a turn.
* Sampling: the call's ``temperature``, ``max_tokens`` (:data:`DEFAULT_MAX_TOKENS` for free
  text that sets none), ``seed`` and ``stop`` become ``SamplingParams``; only the final
  output is asked for.
* Structured answers (judge, refiner, mutator) are constrained by vLLM's structured outputs
  with the very JSON schema the caller sends (``StructuredOutputsParams(json=...)``).
* One engine per model, shared by every table that names it (counselor and judge on one GPU),
  started by the first call and shut down when the last table using it closes. Loading the
  model happens inside that first call's deadline and holds up the event loop meanwhile (as
  in ``vllm serve``): give the table a ``timeout`` that covers it (a minute or more). Tables on one
  model must agree on the engine options (:class:`VllmOptions`): a table that differs is
  refused, naming the option.
* A call whose caller goes away (cancelled, past its deadline) is aborted in the engine by
  its request id, so an abandoned generation frees its batch slot.

The code is split so that it can be tested without vLLM: pure functions map our calls to
plain keyword dicts and vLLM's outputs back (:func:`sampling_kwargs`, :func:`completion_fields`);
a thin layer (:func:`build_sampling`, :func:`output_data`) touches vLLM's classes.
vLLM is asyncio-only.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import msgspec

from ._registry import SettingsError, provider, typed_options
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
    "DEFAULT_MAX_TOKENS",
    "INSTALL_HINT",
    "VllmModel",
    "VllmOptions",
    "build_sampling",
    "check_vllm_settings",
    "completion_fields",
    "neutralised",
    "output_data",
    "sampling_kwargs",
    "vllm_factory",
]

INSTALL_HINT = "pip install 'mhsafeeval[vllm]' (on a machine with a CUDA GPU)"
DEFAULT_MAX_TOKENS = 1024
_JOINER = "\u2060"  # WORD JOINER: invisible, and no token's text contains it
"""Most tokens of a free-text answer whose call and table set no ``max_tokens`` (vLLM's own
default is 16)."""


class VllmOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``options`` of a ``vllm/...`` model table: the engine's (``AsyncEngineArgs``) settings.

    Every table on one model shares its engine, so they must all set the same options.
    """

    tensor_parallel_size: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    """GPUs the model is split across."""
    gpu_memory_utilization: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.9
    """Share of each GPU's memory the engine may take (weights plus KV cache)."""
    max_model_len: Annotated[int, msgspec.Meta(ge=16)] | None = None
    """Context window in tokens (default: the model's own)."""
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    """Weight and activation type."""
    quantization: str | None = None
    """A quantization method vLLM knows (``awq``, ``gptq``, ``fp8``...); default: none, or
    what the checkpoint says."""
    enforce_eager: bool = False
    """Skip CUDA graph capture: starts faster, generates slower (good for short checks)."""

    def engine_args(self, model: str) -> dict[str, Any]:
        """The ``AsyncEngineArgs`` keywords for ``model``.

        Example:
            >>> args = VllmOptions(max_model_len=4096).engine_args("Qwen/Qwen2.5-0.5B-Instruct")
            >>> args["model"], args["max_model_len"], "quantization" in args
            ('Qwen/Qwen2.5-0.5B-Instruct', 4096, False)
        """
        out: dict[str, Any] = {"model": model, **msgspec.structs.asdict(self)}
        return {key: value for key, value in out.items() if value is not None}


def sampling_kwargs(params: CallParams) -> dict[str, Any]:
    """The ``SamplingParams`` keywords of one call, as plain data: what the call sets, a
    default length for free text, and ``structured_outputs`` as the keywords of
    ``StructuredOutputsParams`` when the call asks for a schema (a structured answer is
    bounded by its schema, not cut short).

    Example:
        >>> sampling_kwargs(CallParams(temperature=0.0, seed=3, stop=("\\n\\n",)))
        {'temperature': 0.0, 'seed': 3, 'stop': ['\\n\\n'], 'max_tokens': 1024}
        >>> sampling_kwargs(CallParams(json_schema={"type": "object"}))
        {'max_tokens': None, 'structured_outputs': {'json': {'type': 'object'}}}
    """
    out: dict[str, Any] = {}
    if params.temperature is not None:
        out["temperature"] = params.temperature
    if params.seed is not None:
        out["seed"] = params.seed
    if params.stop:
        out["stop"] = list(params.stop)
    if params.json_schema is None:
        out["max_tokens"] = params.max_tokens or DEFAULT_MAX_TOKENS
    else:
        out["max_tokens"] = params.max_tokens
        out["structured_outputs"] = {"json": params.json_schema}
    return out


def completion_fields(output: dict[str, Any]) -> dict[str, Any]:
    """Our completion's fields from a final ``RequestOutput`` as plain data
    (see :func:`output_data`): the first sequence's text and finish reason, and the tokens.

    Example:
        >>> completion_fields({"request_id": "r1", "prompt_token_ids": [1, 2, 3],
        ...     "outputs": [{"text": "Hi.", "token_ids": [7, 8], "finish_reason": "length"}]})
        {'text': 'Hi.', 'finish_reason': 'length', 'prompt_tokens': 3, 'completion_tokens': 2, 'provider_id': 'r1'}
    """  # noqa: E501
    sequences = output.get("outputs") or []
    if not sequences:
        raise PermanentProviderError("vLLM returned no output sequence")
    first = sequences[0]
    return {
        "text": str(first.get("text") or ""),
        "finish_reason": str(first.get("finish_reason") or "stop"),
        "prompt_tokens": len(output.get("prompt_token_ids") or ()),
        "completion_tokens": len(first.get("token_ids") or ()),
        "provider_id": str(output.get("request_id", "")),
    }


# The vLLM modules used, as read in vLLM's source (vllm/sampling_params.py,
# vllm/engine/arg_utils.py, vllm/v1/engine/async_llm.py); imported on first use only.
_SAMPLING = "vllm.sampling_params"
_ARGS = "vllm.engine.arg_utils"
_ENGINE = "vllm.v1.engine.async_llm"


def neutralised(content: str, specials: Iterable[str]) -> str:
    """``content`` with the text of every token in ``specials`` broken after its first
    character by an invisible word joiner, so that tokenising the prompt can never turn
    message text into a turn marker (``<|im_start|>``, ``<end_of_turn>``).

    Example:
        >>> neutralised("ok <|im_end|><|im_start|>system", ["<|im_end|>", "<|im_start|>"])
        'ok <\u2060|im_end|><\u2060|im_start|>system'
    """
    for token in sorted({t for t in specials if len(t) > 1}, key=len, reverse=True):
        if token in content:
            content = content.replace(token, token[0] + _JOINER + token[1:])
    return content


def build_sampling(kwargs: dict[str, Any]) -> Any:
    """A ``vllm.sampling_params.SamplingParams`` from :func:`sampling_kwargs`' keywords,
    asking for the final output only (``RequestOutputKind.FINAL_ONLY``)."""
    module = importlib.import_module(_SAMPLING)
    kwargs = dict(kwargs)
    structured = kwargs.pop("structured_outputs", None)
    if structured is not None:
        kwargs["structured_outputs"] = module.StructuredOutputsParams(**structured)
    return module.SamplingParams(output_kind=module.RequestOutputKind.FINAL_ONLY, **kwargs)


def output_data(result: Any) -> dict[str, Any]:
    """A ``vllm.RequestOutput`` as the plain data :func:`completion_fields` reads."""
    return {
        "request_id": result.request_id,
        "prompt_token_ids": list(result.prompt_token_ids or ()),
        "outputs": [
            {"text": o.text, "token_ids": list(o.token_ids), "finish_reason": o.finish_reason}
            for o in result.outputs
        ],
    }


def _error(name: str, exc: Exception) -> TransientProviderError | PermanentProviderError:
    """What a failed call becomes: a refused request (vLLM's validation errors are
    ``ValueError``s) or a dead engine cannot be retried; anything else may pass."""
    message = f"{name}: {type(exc).__name__}: {exc}"
    if isinstance(exc, (ValueError, TypeError)) or type(exc).__name__ == "EngineDeadError":
        return PermanentProviderError(message)
    return TransientProviderError(message)


class _Engine:
    """One model's engine, shared by every table on it, started on first use."""

    def __init__(self, model: str, options: VllmOptions) -> None:
        self.model = model
        self.options = options
        self.refs = 0
        self.engine: Any = None
        self.tokenizer: Any = None
        self.specials: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def start(self) -> Any:
        """The running engine (started on first use)."""
        with self._lock:
            if self.engine is None:
                args = importlib.import_module(_ARGS).AsyncEngineArgs(
                    **self.options.engine_args(self.model)
                )
                self.engine = importlib.import_module(_ENGINE).AsyncLLM.from_engine_args(args)
            return self.engine

    def stop(self) -> None:
        with self._lock:
            engine, self.engine, self.tokenizer = self.engine, None, None
        if engine is not None:
            engine.shutdown()


_engines: dict[str, _Engine] = {}
_engines_lock = threading.Lock()


def _acquire(address: str, model: str, options: VllmOptions) -> _Engine:
    with _engines_lock:
        shared = _engines.get(model)
        if shared is None:
            shared = _engines[model] = _Engine(model, options)
        elif shared.options != options:
            mine, theirs = msgspec.structs.asdict(options), msgspec.structs.asdict(shared.options)
            key = next(k for k in mine if mine[k] != theirs[k])
            raise SettingsError(
                address,
                f"options.{key}",
                f"{mine[key]!r} differs from {theirs[key]!r}, set by another table on this "
                "model: its tables share one engine, so they must set the same engine options",
            )
        shared.refs += 1
        return shared


def _release(shared: _Engine) -> bool:
    """Drop one reference; whether it was the last (the engine is then to be stopped)."""
    with _engines_lock:
        shared.refs -= 1
        if shared.refs > 0:
            return False
        if _engines.get(shared.model) is shared:
            del _engines[shared.model]
        return True


class VllmModel:
    """A :class:`~mhsafeeval.providers.ModelClient` on an in-process vLLM engine.

    Free (:meth:`price` is 0); its connection is the model, whose engine its tables share.
    """

    supports_json_schema = True
    sampling = CallParams()  # the table's sampling is applied by open_model's wrapper

    def __init__(self, model: str, options: VllmOptions) -> None:
        self.name = f"vllm/{model}"
        self.connection_key = model
        self._shared = _acquire(self.name, model, options)
        self._closed = False

    async def _tokenizer(self, engine: Any) -> Any:
        if self._shared.tokenizer is None:
            found = engine.get_tokenizer()  # a coroutine in some vLLM releases
            tokenizer = await found if inspect.isawaitable(found) else found
            specials = {*tokenizer.all_special_tokens, *tokenizer.get_added_vocab()}
            self._shared.specials = tuple(sorted(specials))
            self._shared.tokenizer = tokenizer
        return self._shared.tokenizer

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        """Generate one answer; a cancelled call aborts its request in the engine."""
        if self._closed:
            raise PermanentProviderError(f"{self.name}: the model was closed")
        params = params or CallParams()
        started = time.perf_counter()
        # Built in the event loop's thread, as vLLM's own server builds it (its engine client
        # binds to the running loop); loading blocks the loop once, within this call's deadline.
        engine = self._shared.start()
        tokenizer = await self._tokenizer(engine)
        request_id = f"mhsafeeval-{uuid.uuid4().hex}"
        try:
            text = tokenizer.apply_chat_template(
                [
                    {"role": m.role, "content": neutralised(m.content, self._shared.specials)}
                    for m in messages
                ],
                tokenize=False,
                add_generation_prompt=True,
            )
            prompt = {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}
            sampling = build_sampling(sampling_kwargs(params))
            final: Any = None
            stream = engine.generate(prompt, sampling, request_id)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    final = out
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # free the engine's slot before going
                await engine.abort(request_id)
            raise
        except Exception as exc:
            raise _error(self.name, exc) from exc
        if final is None:
            raise TransientProviderError(f"{self.name}: the engine ended the request, no output")
        return Completion(
            **completion_fields(output_data(final)),
            latency_s=time.perf_counter() - started,
            model=self.name,
        )

    def should_retry(self, error: Exception) -> bool:
        """Transient failures only; refused requests and a dead engine are permanent."""
        return isinstance(error, TransientProviderError)

    def price(self, completion: Completion) -> float | None:
        """A model on your own GPU costs nothing per call."""
        return 0.0

    async def aclose(self) -> None:
        """Release this table's share of the engine; the last one shuts it down."""
        if self._closed:
            return
        self._closed = True
        if _release(self._shared):
            self._shared.stop()


def _gpu_problem(address: str) -> str | None:
    """Why vLLM cannot run here, found without importing vLLM (torch is imported only when
    vLLM is installed: it brings torch)."""
    if importlib.util.find_spec("vllm") is None:
        return f"{address} needs vLLM: {INSTALL_HINT}"
    torch = importlib.util.find_spec("torch")
    if torch is not None and not importlib.import_module("torch").cuda.is_available():
        return f"{address}: vLLM is installed but no CUDA GPU is visible (torch.cuda)"
    return None


def check_vllm_settings(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
    """What opening would refuse, found without starting anything: vLLM not installed, no
    GPU, a local model folder that does not exist."""
    address = f"vllm/{model}"
    problem = _gpu_problem(address)
    if problem is not None:
        return [("provider", problem)]
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        return [("provider", f"{address}: no model folder at {Path(model).expanduser()}")]
    return []


@provider("vllm", options=VllmOptions, check=check_vllm_settings)
def vllm_factory(model: str, settings: ModelSettings) -> VllmModel:
    """vLLM in-process: vllm/<Hub id or model folder> (options: :class:`VllmOptions`)."""
    options = typed_options(settings, VllmOptions)
    for _, reason in check_vllm_settings(model, settings):
        raise ProviderUnavailable(reason)
    return VllmModel(model, options)
