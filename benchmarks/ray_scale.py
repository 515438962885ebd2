"""Distributed campaigns on Ray: calls/s and CPU per call, one process vs 1 and 2 workers.

The mock OpenAI-compatible server of ``benchmarks/throughput.py`` (a process of its own, not
counted) answers every call after ``--latency`` seconds; every role is on it (``openai/``).
The same campaign (``--conversations`` of ``--max-turns`` turns, ``--concurrency`` in flight
in all) runs in this process: once plain (:func:`~mhsafeeval.campaign.run_campaign`), then on a
local Ray cluster of ``--cpus`` CPUs with each worker count of ``--workers``
(:func:`~mhsafeeval.distributed.run_distributed`). For each it prints:

* calls (counted by the server) and calls/s over the run's wall time (actors' start included);
* CPU per call, summed over every process that does the work: this one (the plain run, or the
  driver), the worker actors, and Ray's own processes (raylet, GCS, the other ``ray::`` ones),
  read from ``/proc`` every 50 ms (a worker is killed at the end of the run, so up to 50 ms of
  its CPU can be missed);
* the same at ``--concurrency`` conversations (one wave), to split the CPU into a fixed part
  (start-up: a worker imports mhsafeeval and the OpenAI SDK) and a marginal part per call: the
  overhead of the shard boundary is the marginal CPU per call over the plain run's, and the
  fixed part per worker.

    python benchmarks/ray_scale.py [--conversations 512] [--concurrency 64]
        [--latency 0.05] [--workers 1,2] [--cpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio

from mhsafeeval.agents.profiles import builtin_profiles
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.storage import SqliteEventStore

sys.path.insert(0, str(Path(__file__).parent))
from throughput import ROLES, Server

TICK = os.sysconf("SC_CLK_TCK")


def campaign(url: str, *, conversations: int, concurrency: int, max_turns: int) -> str:
    profiles = [p.id for p in builtin_profiles()][:8]
    head = (
        f'[campaign]\nname = "ray-scale"\nseed = 5\nmax_turns = {max_turns}\nmax_attempts = 1\n'
        f"concurrency = {concurrency}\nconversations_per_profile = "
        f"{-(-conversations // len(profiles))}\nprofile_ids = {json.dumps(profiles)}\n"
    )
    tables = "".join(
        f'\n[{table}]\nprovider = "openai/{persona}"\napi_base = "{url}/v1"\n'
        f"max_concurrency = {concurrency}\ntimeout = 120\n"
        for table, persona in ROLES.items()
    )
    return head + tables


def _cpu(pid: str) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def _kind(pid: str) -> str | None:
    """``self``, ``worker`` (a shard actor), ``ray`` (Ray's own processes) or None."""
    if pid == str(os.getpid()):
        return "self"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if "ShardWorker" in cmdline:
        return "worker"
    if "ray" in cmdline and "throughput.py" not in cmdline:
        return "ray"
    return None


class CpuMeter:
    """CPU seconds each kind of process spent between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            kind = _kind(pid)  # asked again: a worker process becomes a shard actor later
            if kind is None:
                continue
            cpu = _cpu(pid)
            if cpu is not None:
                self.last[pid] = (kind, cpu)

    def start(self) -> None:
        self._sample()
        self.first = {pid: cpu for pid, (_, cpu) in self.last.items()}
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._sample()
        spent: dict[str, float] = {"self": 0.0, "worker": 0.0, "ray": 0.0}
        for pid, (kind, cpu) in self.last.items():
            spent[kind] += cpu - self.first.get(pid, 0.0)
        return spent


def run(
    text: str, folder: Path, server: Server, workers: int | None
) -> tuple[int, float, dict[str, float]]:
    """One campaign: (calls, wall seconds, CPU seconds by kind of process)."""
    from mhsafeeval.distributed import run_distributed

    config = parse_config(text, "ray-scale.toml")
    db = folder / f"w{workers}-{time.monotonic_ns()}.db"
    server.call("POST", "/reset")

    async def main() -> None:
        async with SqliteEventStore(db) as store:
            if workers is None:
                result = await run_campaign(config, store, config_text=text)
            else:
                result = await run_distributed(config, store, workers=workers, config_text=text)
        assert result.status == "completed", result

    meter = CpuMeter()
    meter.start()
    started = time.perf_counter()
    anyio.run(main)
    wall = time.perf_counter() - started
    spent = meter.stop()
    return int(server.call("GET", "/stats")["requests"]), wall, spent


Row = tuple[str, int | None, int, float, dict[str, float], int, float]
"""(name, workers, calls, wall s, CPU s by kind, calls of the small run, its CPU s)."""


def measure(
    name: str, args: argparse.Namespace, folder: Path, server: Server, workers: int | None
) -> Row:
    texts = [
        campaign(
            server.url, conversations=n, concurrency=args.concurrency, max_turns=args.max_turns
        )
        for n in (args.concurrency, args.conversations)
    ]
    small_calls, _, small = run(texts[0], folder, server, workers)
    calls, wall, spent = run(texts[1], folder, server, workers)
    row = (name, workers, calls, wall, spent, small_calls, sum(small.values()))
    show(row)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    import logging

    import ray

    from mhsafeeval.framework import configure_logging

    configure_logging("warning")  # as `mhsafeeval run` does (and the workers do)

    with tempfile.TemporaryDirectory(prefix="mhsafeeval-ray-scale-") as tmp:
        folder = Path(tmp)
        server = Server(args.latency, folder)
        try:
            print(
                f"{args.conversations} conversations x {args.max_turns} turn(s), "
                f"{args.concurrency} in flight, {args.latency * 1000:.0f} ms per call, "
                f"{os.cpu_count()} cores here; Ray cluster of {args.cpus} CPUs"
            )
            print(
                f"{'run':<12}{'calls':>7}{'wall s':>8}{'calls/s':>9}{'ms CPU/call':>13}"
                f"{'driver':>8}{'workers':>9}{'ray':>7}{'marginal':>10}{'fixed s':>9}"
            )
            rows = [measure("one process", args, folder, server, None)]
            ray.init(
                num_cpus=args.cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            try:
                for n in (int(x) for x in args.workers.split(",")):
                    rows.append(measure(f"{n} worker(s)", args, folder, server, n))
            finally:
                ray.shutdown()
            overhead(rows)
        finally:
            server.stop()


def split(row: Row) -> tuple[float, float]:
    """(marginal CPU ms per call, fixed CPU s) from the big and the small run."""
    _, _, calls, _, spent, small_calls, small_cpu = row
    marginal = (sum(spent.values()) - small_cpu) / (calls - small_calls)
    return marginal * 1000, small_cpu - marginal * small_calls


def show(row: Row) -> None:
    name, _, calls, wall, spent, _, _ = row
    per = {k: v / calls * 1000 for k, v in spent.items()}
    marginal, fixed = split(row)
    print(
        f"{name:<12}{calls:>7}{wall:>8.2f}{calls / wall:>9.0f}{sum(per.values()):>13.2f}"
        f"{per['self']:>8.2f}{per['worker']:>9.2f}{per['ray']:>7.2f}{marginal:>10.2f}"
        f"{fixed:>9.2f}"
    )


def overhead(rows: list[Row]) -> None:
    plain, plain_fixed = split(rows[0])
    for row in rows[1:]:
        name, n, *_ = row
        assert n is not None
        marginal, fixed = split(row)
        print(
            f"{name}: {marginal - plain:+.2f} ms CPU per call over one process "
            f"({(marginal - plain) / plain:+.0%}, marginal); start-up "
            f"{(fixed - plain_fixed) / n:+.2f} s CPU per worker over one process's"
        )


if __name__ == "__main__":
    main()
