"""Campaign throughput through an OpenAI-compatible mock server with a fixed latency.

A mock server (aiohttp, in a process of its own so that its CPU is not counted) answers every
chat request ``--latency`` seconds after its handler started, with the demo personas' replies
(the model name picks the persona: ``demo-client``, ``demo-judge``, ...): the reply is worked
out within that time, not after it, as a server with a fixed latency would. A scripted
campaign with every role on it runs through ``mhsafeeval run`` in a fresh process, once per
provider (``openai``: ``openai/``, on aiohttp; ``litellm``: ``litellm/``, which needs the
``litellm`` extra) and per concurrency C, with at least ``--per-slot`` conversations per slot
so that the tail does not dominate. For each run it prints:

* calls and calls/s, and that rate over C / latency: what C sequential clients (the paper's code
  runs one conversation at a time, so at best 1 / latency calls/s) would reach (target >= 0.9);
* CPU per call: the whole campaign process (start-up included) and its marginal cost, measured
  against a run of the same config with C conversations (target <= 1.5 ms for ``openai/`` at
  C = 64);
* calls in flight at the server: the most, and the mean over the run;
* wall time from the first stored event to the last over the critical-path bound, the larger of
  the longest conversation's chain of calls x latency and calls x latency / C (target <= 1.1),
  and the start-up (process start to first event) and exit (last event to process end) times.

``--profile`` runs each campaign under cProfile as well and prints where its CPU goes, grouped
by package.

    python benchmarks/throughput.py [--providers openai,litellm]
        [--concurrency 64,256] [--per-slot 16] [--latency 0.2] [--max-turns 1] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pstats
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mhsafeeval.agents.profiles import builtin_profiles

ROLES = {
    "models.default": "demo-client",
    "models.mutator": "demo-mutator",
    "models.judge": "demo-judge",
    "models.refiner": "demo-refiner",
    "counselors.demo": "demo-counselor",
}


# -- the mock server ----------------------------------------------------------------------------


def serve(port_file: Path, latency: float) -> None:
    """Run the mock server until killed; writes its port to ``port_file`` once listening."""
    from aiohttp import web

    from mhsafeeval.providers import CallParams, ChatMessage, ModelSettings, open_model

    # The scripted demo personas answer: the same replies a scripted campaign gets.
    personas = {
        persona: open_model(ModelSettings(provider=f"scripted/{persona}", max_concurrency=4096))
        for persona in ROLES.values()
    }

    state: dict[str, Any] = {"requests": 0, "in_flight": 0, "max": 0, "area": 0.0}
    state["mark"] = time.monotonic()

    def tick(change: int) -> None:
        now = time.monotonic()
        state["area"] += state["in_flight"] * (now - state["mark"])
        state["mark"] = now
        state["in_flight"] += change
        state["max"] = max(state["max"], state["in_flight"])

    async def chat(request: web.Request) -> web.Response:
        arrived = time.monotonic()
        body = await request.json()
        tick(+1)
        state["requests"] += 1
        try:
            persona = personas[body["model"].rpartition("/")[2]]
            messages = [ChatMessage(m["role"], m["content"]) for m in body["messages"]]
            fmt = body.get("response_format") or {}
            schema = (fmt.get("json_schema") or {}).get("schema")
            text = (await persona.complete(messages, CallParams(json_schema=schema))).text
            await asyncio.sleep(max(0.0, latency - (time.monotonic() - arrived)))
        finally:
            tick(-1)
        words = sum(len(m.content.split()) for m in messages)
        return web.json_response(
            {
                "id": f"mock-{state['requests']}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": words,
                    "completion_tokens": len(text.split()),
                    "total_tokens": words + len(text.split()),
                },
            }
        )

    async def stats(request: web.Request) -> web.Response:
        tick(0)
        return web.json_response(
            {**{k: state[k] for k in ("requests", "max", "area")}, "cpu": time.process_time()}
        )

    async def reset(request: web.Request) -> web.Response:
        tick(0)
        state.update(requests=0, max=0, area=0.0)
        return web.json_response({"cpu": time.process_time()})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock, backlog=1024)
        await site.start()
        port = str(sock.getsockname()[1])
        await asyncio.to_thread(port_file.write_text, port)
        await asyncio.Event().wait()

    asyncio.run(main())


class Server:
    """The mock server in a subprocess."""

    def __init__(self, latency: float, folder: Path) -> None:
        port_file = folder / "port"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port_file), "--latency", str(latency)]
        )
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the mock server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    def call(self, method: str, path: str) -> Any:
        import urllib.request

        request = urllib.request.Request(
            self.url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- one campaign -------------------------------------------------------------------------------


def config_text(
    provider: str, url: str, *, concurrency: int, conversations: int, max_turns: int
) -> str:
    # The bound packs the calls exactly into C slots, so the plan is a whole number of waves
    # of C conversations: a power-of-two number of profiles, ``conversations`` a multiple of it
    # (with the 37 built-in profiles, 1,024 conversations would round up to 1,036, a 17th wave
    # of 12 that leaves 52 slots idle for a whole conversation: +5% on the bound by itself).
    profiles = [p.id for p in builtin_profiles()]
    profiles = profiles[: 1 << (len(profiles).bit_length() - 1)]
    per_profile = -(-conversations // len(profiles))
    head = f"""
[campaign]
name = "throughput"
seed = 5
max_turns = {max_turns}
max_attempts = 1
concurrency = {concurrency}
conversations_per_profile = {per_profile}
profile_ids = {json.dumps(profiles)}
"""
    tables = []
    if provider not in ("openai", "litellm"):
        raise SystemExit(f"--providers: {provider!r} is not openai or litellm")
    for table, persona in ROLES.items():
        address = f"openai/{persona}" if provider == "openai" else f"litellm/openai/{persona}"
        tables.append(
            f'\n[{table}]\nprovider = "{address}"\napi_base = "{url}/v1"\n'
            f"max_concurrency = {concurrency}\ntimeout = 120\n"
            + ('api_key_env = "BENCH_KEY"\n' if provider == "litellm" else "")
        )
    return head + "".join(tables)


def run_campaign(
    provider: str,
    server: Server,
    folder: Path,
    *,
    concurrency: int,
    conversations: int,
    max_turns: int,
    profile: bool,
) -> dict[str, Any]:
    tag = f"{provider}-c{concurrency}-n{conversations}"
    tag += "-profiled" if profile else ""
    config = folder / f"{tag}.toml"
    config.write_text(
        config_text(
            provider,
            server.url,
            concurrency=concurrency,
            conversations=conversations,
            max_turns=max_turns,
        ),
        encoding="utf-8",
    )
    db = folder / f"{tag}.db"
    prof = folder / f"{tag}.prof"
    command = [sys.executable]
    if profile:
        command += ["-m", "cProfile", "-o", str(prof)]
    command += ["-m", "mhsafeeval", "run", str(config), "--db", str(db), "--quiet"]
    server_cpu = server.call("POST", "/reset")["cpu"]
    env = {**os.environ, "BENCH_KEY": "sk-bench-not-a-key"}
    started = time.time()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    cpu_first, cpu_finish = watch(proc, db)
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.time()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{tag}: mhsafeeval run exited {os.waitstatus_to_exitcode(status)}")
    stats = server.call("GET", "/stats")
    with sqlite3.connect(db) as con:
        first, last = con.execute(
            "SELECT min(recorded_at), max(recorded_at) FROM events"
        ).fetchone()
        calls: Counter[str] = Counter()
        for conversation, body in con.execute("SELECT conversation, body FROM events"):
            used = json.loads(body).get("usage")
            if used:
                calls[conversation] += int(used.get("calls", 1))
    out = {
        "tag": tag,
        "calls": stats["requests"],
        "stored_calls": sum(calls.values()),
        "chain": max(calls.values(), default=0),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "run_cpu_s": cpu_finish - cpu_first,
        "wall_s": ended - started,
        "run_s": last - first,
        "startup_s": first - started,
        "exit_s": ended - last,
        "server_cpu_s": stats["cpu"] - server_cpu,
        "max_in_flight": stats["max"],
        "mean_in_flight": stats["area"] / max(last - first, 1e-9),
        "profile": prof if profile else None,
    }
    return out


_FINISHED = "SELECT 1 FROM events WHERE type = 'campaign.finished' LIMIT 1"


def watch(proc: subprocess.Popen[bytes], db: Path) -> tuple[float, float]:
    """The campaign process's CPU seconds when its first event was stored and when its
    ``campaign.finished`` event was (polled every 50 ms: the run phase, without start-up,
    the final report and exit)."""
    tick = os.sysconf("SC_CLK_TCK")
    first = finish = None
    while proc.poll() is None:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        except (OSError, IndexError, ValueError):
            break
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
                started = con.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None
                done = con.execute(_FINISHED).fetchone() is not None
        except sqlite3.Error:
            started = done = False
        if started and first is None:
            first = cpu
        if done:
            finish = cpu
            break
        time.sleep(0.05)
    if first is None or finish is None:
        return (math.nan, math.nan)
    return (first, finish)


def where_cpu_goes(prof: Path, top: int = 12) -> list[str]:
    """tottime grouped by package, then the top functions."""
    stats = pstats.Stats(str(prof))
    by_package: Counter[str] = Counter()
    rows = []
    for (file, line, name), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        package = _package(file)
        by_package[package] += tottime
        rows.append((tottime, f"{package}: {Path(file).name}:{line} {name}"))
    total = sum(by_package.values()) or 1.0
    lines = [
        f"    {pkg:<22} {s:7.2f} s {100 * s / total:5.1f}%" for pkg, s in by_package.most_common(14)
    ]
    lines.append("    top functions (own time):")
    lines += [f"      {s:6.2f} s  {what}" for s, what in sorted(rows, reverse=True)[:top]]
    return lines


def _package(file: str) -> str:
    if file.startswith("~") or file.startswith("<"):
        return "builtins"
    parts = Path(file).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].split(".")[0]
    if "mhsafeeval" in parts:
        i = parts.index("mhsafeeval")
        return "/".join(parts[i : i + 2]).removesuffix(".py")
    if "python3.11" in parts:
        rest = parts[parts.index("python3.11") + 1 :]
        return f"stdlib/{rest[0].removesuffix('.py')}"
    return file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", default="openai,litellm")
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--per-slot", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.latency)
        return
    latency = args.latency
    with tempfile.TemporaryDirectory(prefix="mhsafeeval-throughput-") as tmp:
        folder = Path(tmp)
        server = Server(latency, folder)
        try:
            for c in (int(x) for x in args.concurrency.split(",")):
                n = c * args.per_slot
                for provider in args.providers.split(","):
                    small = run_campaign(
                        provider, server, folder, concurrency=c, conversations=c,
                        max_turns=args.max_turns, profile=False,
                    )  # fmt: skip
                    big = run_campaign(
                        provider, server, folder, concurrency=c, conversations=n,
                        max_turns=args.max_turns, profile=False,
                    )  # fmt: skip
                    report(provider, c, n, latency, small, big)
                    if args.profile:
                        profiled = run_campaign(
                            provider, server, folder, concurrency=c, conversations=n,
                            max_turns=args.max_turns, profile=True,
                        )  # fmt: skip
                        print("  where the CPU goes (cProfile, own time):")
                        print("\n".join(where_cpu_goes(profiled["profile"])))
        finally:
            server.stop()


def report(
    provider: str, c: int, n: int, latency: float, small: dict[str, Any], big: dict[str, Any]
) -> None:
    calls = big["calls"]
    rate = calls / big["run_s"]
    bound = max(big["chain"] * latency, calls * latency / c)
    marginal = (big["cpu_s"] - small["cpu_s"]) / max(calls - small["calls"], 1)
    print(f"{provider}/ at C = {c}, {n} conversations, latency {latency * 1000:.0f} ms:")
    print(
        f"  calls {calls} (stored {big['stored_calls']}), {rate:.1f} calls/s = "
        f"{rate * latency / c:.2f} x C / latency (target >= 0.9)"
    )
    print(
        f"  CPU per call: {1000 * big['run_cpu_s'] / calls:.2f} ms from the first event to the "
        f"last (target <= 1.5 for openai/ at C = 64); {1000 * big['cpu_s'] / calls:.2f} ms "
        f"for the whole process, {1000 * marginal:.2f} ms marginal to a run of "
        f"{small['calls']} calls (start-up, the final report and exit included)"
    )
    print(
        f"  in flight at the server: max {big['max_in_flight']}, mean {big['mean_in_flight']:.1f};"
        f" the mock server's own CPU: {1000 * big['server_cpu_s'] / calls:.2f} ms per call"
    )
    print(
        f"  wall {big['run_s']:.2f} s first to last event; bound {bound:.2f} s "
        f"(chain {big['chain']} calls, {calls} x {latency:g} / {c}); "
        f"ratio {big['run_s'] / bound:.2f} (target <= 1.1)"
    )
    print(f"  start-up {big['startup_s']:.2f} s, exit {big['exit_s']:.2f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
