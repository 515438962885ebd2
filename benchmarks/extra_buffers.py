"""What llama.cpp's extra buffer types (AMX, weight repacking) are worth, on this machine.

The ``local/`` provider loads models with them off (``options.extra_buffers = false``): a native
llama-cpp-python 0.3.36 build crashes in the AMX path on CPUs with AMX. This prints, for both
built-in models, prompt evaluation and generation speed with them off and on, rounds
interleaved so that machine noise hits both alike, and the ratio off / on. On a CPU with AMX the
"on" side would crash the process: it is left out there (``--force`` runs it anyway).

    python benchmarks/extra_buffers.py [--rounds 4] [--tokens 96]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from mhsafeeval.providers._llama_load import cpu_has_amx, load_llama
from mhsafeeval.providers._local import builtin_model_path

PROMPT = (
    "You are a warm, careful counselor. A client writes: I lost my job last month, I can't "
    "sleep, and my partner says I should just get over it. I keep thinking I am a failure. "
) * 6


def one_round(llama: Any, tokens: int) -> tuple[float, float]:
    """(prompt tokens/s, generated tokens/s) of one completion from an empty cache."""
    llama.reset()
    prompt = llama.tokenize(PROMPT.encode(), add_bos=True, special=False)
    started = time.perf_counter()
    llama.eval(prompt)
    evaluated = time.perf_counter()
    out = llama.create_completion(prompt=prompt, max_tokens=tokens, temperature=0.0)
    generated = out["usage"]["completion_tokens"]
    ended = time.perf_counter()
    return len(prompt) / (evaluated - started), generated / max(ended - evaluated, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--force", action="store_true", help="run 'on' even on an AMX CPU")
    args = parser.parse_args()
    settings = ["off"] if cpu_has_amx() and not args.force else ["off", "on"]
    threads = len(os.sched_getaffinity(0))
    print(f"threads {threads}, AMX {'yes' if cpu_has_amx() else 'no'}, rounds {args.rounds}")
    print(f"{'model':<24} {'extra buffers':<14} {'prompt tok/s':>13} {'gen tok/s':>10}")
    for name in ("gemma-3-270m", "smollm2-135m-instruct"):
        path = builtin_model_path(name)
        models = {
            s: load_llama(
                path, extra_buffers=s == "on", n_ctx=2048, n_threads=threads, verbose=False
            )
            for s in settings
        }
        speeds: dict[str, list[tuple[float, float]]] = {s: [] for s in settings}
        for _ in range(args.rounds):
            for s in settings:
                speeds[s].append(one_round(models[s], args.tokens))
        medians = {
            s: (statistics.median(p for p, _ in v), statistics.median(g for _, g in v))
            for s, v in speeds.items()
        }
        for s in settings:
            prompt, gen = medians[s]
            print(f"{name:<24} {s:<14} {prompt:>13.0f} {gen:>10.1f}")
        if "on" in medians:
            (p_off, g_off), (p_on, g_on) = medians["off"], medians["on"]
            print(f"{name:<24} {'off / on':<14} {p_off / p_on:>13.2f} {g_off / g_on:>10.2f}")
        for llama in models.values():
            llama.close()


if __name__ == "__main__":
    main()
