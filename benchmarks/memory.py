"""Peak memory of a scripted campaign against the number of conversations it runs.

For each size it writes a campaign config on the scripted personas (every call instant; two
turns, two attempts, 8 conversations at a time) and runs it in a fresh Python process, twice:

* ``run``: the campaign alone (:func:`mhsafeeval.campaign.run_campaign` into a SQLite store,
  no progress display, no report);
* ``cli``: ``python -m mhsafeeval run CONFIG --db DB --quiet``, which also builds and prints
  the final report.

It prints each process's peak resident memory (``ru_maxrss`` of the finished child), its wall
time, and the ratio of the largest size's peak to the smallest's. Target: a ratio of at most
1.2 between 1,000 and 10,000 conversations, in both modes (memory follows the conversations in
flight, not the total; the final report tallies each conversation once it completed and
forgets its attempts). ``--retained N`` also measures, in this process, with tracemalloc, the
bytes still allocated per finished conversation (at the ``2N``-th finished conversation against
the ``N``-th, in one run with a progress display attached and a store that keeps nothing;
target: a few hundred bytes at most).

    python benchmarks/memory.py [--sizes 1000,10000] [--modes run,cli] [--retained 500]
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

PROFILE = "grief-widower"
CONFIG = """
[campaign]
name = "memory"
seed = 5
max_turns = 2
max_attempts = 2
conversations_per_profile = {conversations}
concurrency = 8
profile_ids = ["{profile}"]
"""


def write_config(folder: Path, conversations: int) -> Path:
    """A config of ``conversations`` scripted conversations, zero delay."""
    from mhsafeeval.testing import scripted_models

    path = folder / f"memory-{conversations}.toml"
    path.write_text(CONFIG.format(conversations=conversations, profile=PROFILE) + scripted_models())
    return path


async def run_only(config_path: Path, db: Path) -> None:
    """The campaign without a report (what ``--child`` runs)."""
    from mhsafeeval.campaign import run_campaign
    from mhsafeeval.config import read_config
    from mhsafeeval.storage import SqliteEventStore

    text, config = read_config(config_path)
    async with SqliteEventStore(db) as store:
        result = await run_campaign(config, store, source=config_path, config_text=text)
    if result.status != "completed":
        raise SystemExit(f"campaign ended {result.status}")


def measure(command: list[str]) -> tuple[float, float]:
    """Run ``command`` to its end; its peak RSS (MB) and wall time (s)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        # wait4 gives this child's own resource usage (ru_maxrss: its peak RSS, in KiB).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{tail}")
    return usage.ru_maxrss / 1024, wall


def retained_per_conversation(n: int) -> float:
    """Bytes allocated at the ``2n``-th finished conversation less at the ``n``-th, over ``n``
    (one run of ``2n + 8`` conversations, a progress display attached, events forgotten)."""
    import anyio

    from mhsafeeval.campaign import run_campaign
    from mhsafeeval.config import parse_config
    from mhsafeeval.framework import configure_logging
    from mhsafeeval.messages import ConversationFinished, Message
    from mhsafeeval.progress import Progress
    from mhsafeeval.storage import MemoryEventStore
    from mhsafeeval.testing import scripted_models

    configure_logging(level="error")

    class Forgetful(MemoryEventStore):
        """Keeps nothing: what is measured is the run's own memory, not the events."""

        async def append(self, message: Message) -> None:
            """Forget it at once."""

    text = CONFIG.format(conversations=2 * n + 8, profile=PROFILE) + scripted_models()
    config = parse_config(text, "<memory>")
    sizes: dict[int, int] = {}
    finished = 0

    def measure(msg: Message) -> None:
        nonlocal finished
        if isinstance(msg, ConversationFinished):
            finished += 1
            if finished in (n, 2 * n):
                gc.collect()
                sizes[finished] = tracemalloc.get_traced_memory()[0]

    async def run(progress: Progress) -> None:
        async with Forgetful() as store:
            observers = (measure, progress)
            await run_campaign(config, store, config_text=text, observers=observers)

    with open(os.devnull, "w") as devnull:
        tracemalloc.start()
        try:
            anyio.run(run, Progress(devnull, every_s=1e9))
        finally:
            tracemalloc.stop()
    return (sizes[2 * n] - sizes[n]) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="conversation counts (a,b,...)")
    parser.add_argument("--modes", default="run,cli", help="run (campaign only), cli (with report)")
    parser.add_argument(
        "--retained", type=int, default=0, help="also measure bytes kept per conversation (N)"
    )
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import anyio

        anyio.run(run_only, Path(args.child[0]), Path(args.child[1]))
        return
    sizes = sorted(int(s) for s in args.sizes.split(","))
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for mode in modes:
            peaks: list[float] = []
            for size in sizes:
                config, db = write_config(folder, size), folder / f"{mode}-{size}.db"
                if mode == "run":
                    command = [sys.executable, __file__, "--child", str(config), str(db)]
                else:
                    command = [sys.executable, "-m", "mhsafeeval", "run", str(config)]
                    command += ["--db", str(db), "--quiet"]
                peak, wall = measure(command)
                peaks.append(peak)
                print(f"{mode}: {size:>6} conversations: peak RSS {peak:6.1f} MB, {wall:6.1f} s")
            print(f"{mode}: peak RSS ratio {sizes[-1]}/{sizes[0]}: {peaks[-1] / peaks[0]:.2f}")
    if args.retained:
        per = retained_per_conversation(args.retained)
        print(f"retained per finished conversation (tracemalloc, N={args.retained}): {per:.0f} B")


if __name__ == "__main__":
    main()
