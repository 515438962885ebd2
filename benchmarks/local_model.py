"""The local provider against llama.cpp called directly, in one run.

Prints generation speed through ``local/gemma-3-270m`` and through a bare ``llama_cpp.Llama`` on
the same file, prompt, stops and seeds, with the rounds interleaved so that machine noise hits
both alike (target: provider / direct >= 0.9); time to first token; schema-guided JSON against a
full JSON grammar; and peak memory.

    python benchmarks/local_model.py [--tokens 128] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

import anyio

from mhsafeeval.judges import VERDICT_SCHEMA
from mhsafeeval.providers import CallParams, ChatMessage, ModelSettings, open_model
from mhsafeeval.providers._llama_load import load_llama
from mhsafeeval.providers._local import (
    bounded_schema,
    builtin_model_path,
    gemma_prompt,
    json_grammar,
)

MESSAGES = [
    ChatMessage("system", "You are a warm, careful counselor."),
    ChatMessage("user", "I lost my job last month and I can't sleep. Tell me about ways to cope."),
]
STOPS = ["<end_of_turn>"]


async def measure(tokens: int, rounds: int) -> dict[str, Any]:
    from llama_cpp import LlamaGrammar

    path = str(builtin_model_path("gemma-3-270m"))
    threads = len(os.sched_getaffinity(0))
    # Loaded as the provider loads it (llama.cpp's extra buffer types off: see _llama_load).
    llm = load_llama(
        path, extra_buffers=False, n_ctx=8192, n_threads=threads, n_batch=512, verbose=False
    )
    prompt = gemma_prompt(MESSAGES)
    out: dict[str, Any] = {"path": path, "direct": [0, 0.0], "provider": [0, 0.0]}
    async with open_model(ModelSettings(provider="local/gemma-3-270m", timeout=600)) as model:
        llm.create_completion(prompt, max_tokens=4, stop=STOPS)  # warm both prompt caches
        await model.complete(MESSAGES, CallParams(max_tokens=4))
        for i in range(rounds):
            start = time.perf_counter()
            done = llm.create_completion(
                prompt, max_tokens=tokens, seed=i, temperature=0.8, stop=STOPS
            )
            out["direct"][0] += done["usage"]["completion_tokens"]
            out["direct"][1] += time.perf_counter() - start
            start = time.perf_counter()
            reply = await model.complete(
                MESSAGES, CallParams(max_tokens=tokens, seed=i, temperature=0.8)
            )
            out["provider"][0] += reply.completion_tokens
            out["provider"][1] += time.perf_counter() - start
        start = time.perf_counter()
        await model.complete(MESSAGES, CallParams(json_schema=VERDICT_SCHEMA, seed=1))
        out["guided_s"] = time.perf_counter() - start
    llm.reset()
    start = time.perf_counter()
    for _chunk in llm.create_completion(prompt, max_tokens=1, stream=True):
        out["ttft"] = time.perf_counter() - start
        break
    grammar = LlamaGrammar.from_string(
        json_grammar(bounded_schema(VERDICT_SCHEMA, string_cap=240, array_cap=3)), verbose=False
    )
    start = time.perf_counter()
    done = llm.create_completion(prompt, max_tokens=400, grammar=grammar, seed=1)
    out["grammar"] = done["usage"]["completion_tokens"] / (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    r = anyio.run(measure, args.tokens, args.rounds)
    direct = r["direct"][0] / r["direct"][1]
    provider = r["provider"][0] / r["provider"][1]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"model                 : {r['path']}")
    print(f"direct llama.cpp      : {direct:6.1f} tokens/s ({r['direct'][0]} tokens, interleaved)")
    print(f"through the provider  : {provider:6.1f} tokens/s ({r['provider'][0]} tokens)")
    print(f"ratio provider/direct : {provider / direct:6.2f}  (target >= 0.9)")
    print(f"time to first token   : {r['ttft'] * 1000:6.0f} ms (short prompt, uncached)")
    print(f"full JSON grammar     : {r['grammar']:6.1f} tokens/s")
    print(f"guided JSON verdict   : {r['guided_s']:6.1f} s for one whole verdict")
    print(f"peak memory (RSS)     : {peak_mb:6.0f} MiB (two instances of the model loaded)")


if __name__ == "__main__":
    main()
