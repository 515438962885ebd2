"""CPU per call of the ``openai/`` provider on each backend (aiohttp, httpx2), on the mock server.

The mock server of ``benchmarks/throughput.py`` (its own process, so its CPU is not counted)
answers every request after ``--latency`` seconds. This process makes ``--calls`` calls with
``--concurrency`` in flight and prints the CPU time (``time.process_time()``: every thread of
this process) per call of:

* ``openai/`` on asyncio (aiohttp), the provider alone (``OpenAIModel.complete``) and through
  ``open_model`` (limits, retries, deadlines);
* ``openai/`` under trio (httpx2), the same two ways;
* the floor: the same request and decoding on a bare ``aiohttp.ClientSession``.

Rounds alternate between the variants, so a machine that gets busier part-way through weighs
on all of them alike; the median of the rounds is printed.

    python benchmarks/provider_cpu.py [--calls 2000] [--concurrency 64] [--latency 0.05]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
from throughput import Server

from mhsafeeval.providers import CallParams, ChatMessage, ModelSettings, open_model

MESSAGES = [
    ChatMessage("system", "You are a counselor. " * 20),
    ChatMessage("user", "I have not slept well for weeks. " * 8),
]
PARAMS = CallParams(max_tokens=100)
MODEL = "demo-counselor"


async def drive(call: Callable[[], Awaitable[Any]], calls: int, concurrency: int) -> float:
    """CPU ms per call of ``calls`` calls, ``concurrency`` at a time (after one warm-up)."""
    await call()
    gate = anyio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await call()

    start = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return (time.process_time() - start) / calls * 1000


async def provider(url: str, wrapped: bool, calls: int, c: int) -> float:
    settings = ModelSettings(provider=f"openai/{MODEL}", api_base=url, max_concurrency=c)
    client = open_model(settings)
    model: Any = client if wrapped else client.inner  # the provider alone: no limits, retries
    try:
        return await drive(lambda: model.complete(MESSAGES, PARAMS), calls, c)
    finally:
        await client.aclose()


async def bare_aiohttp(url: str, calls: int, c: int) -> float:
    import aiohttp

    encode = msgspec.json.Encoder().encode
    headers = {"Content-Type": "application/json", "Authorization": "Bearer none"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as session:

        async def call() -> Any:
            messages = [{"role": m.role, "content": m.content} for m in MESSAGES]
            body = encode({"model": MODEL, "messages": messages, "max_tokens": PARAMS.max_tokens})
            async with session.post(f"{url}/chat/completions", data=body, headers=headers) as r:
                return msgspec.json.decode(await r.read())

        return await drive(call, calls, c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n, c = args.calls, args.concurrency
    # name: (backend, what to run on it)
    variants: dict[str, tuple[str, Callable[[str], Awaitable[float]]]] = {
        "openai/ on asyncio (aiohttp), provider alone": (
            "asyncio",
            lambda u: provider(u, False, n, c),
        ),
        "openai/ on asyncio (aiohttp), through open_model": (
            "asyncio",
            lambda u: provider(u, True, n, c),
        ),
        "openai/ on trio (httpx2), provider alone": ("trio", lambda u: provider(u, False, n, c)),
        "openai/ on trio (httpx2), through open_model": ("trio", lambda u: provider(u, True, n, c)),
        "bare aiohttp session (the floor)": ("asyncio", lambda u: bare_aiohttp(u, n, c)),
    }
    seen: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="mhsafeeval-provider-cpu-") as tmp:
        server = Server(args.latency, Path(tmp))
        try:
            for _ in range(args.rounds):
                for name, (backend, run) in variants.items():
                    seen[name].append(anyio.run(run, f"{server.url}/v1", backend=backend))
        finally:
            server.stop()
    print(
        f"CPU per call, {args.calls} calls, {args.concurrency} in flight, "
        f"{args.latency * 1000:.0f} ms latency, median of {args.rounds} rounds:"
    )
    for name, values in seen.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {name:50s} {statistics.median(values):.2f} ms  ({shown})")


if __name__ == "__main__":
    main()
