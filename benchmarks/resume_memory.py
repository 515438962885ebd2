"""Peak memory of resuming a mostly finished scripted campaign, against its size.

For each size it runs a scripted campaign of that many conversations to its end (two turns, two
attempts, 8 conversations at a time, instant scripted models) into a SQLite file, then cuts the
log as a crash would: every event after the ``(size - open)``-th conversation's end is deleted,
so that about ``open`` + 8 conversations are left to do, whatever the size. The resume
(:func:`mhsafeeval.campaign.run_campaign` on the cut file) runs in a fresh Python process; it
prints that process's peak resident memory (``ru_maxrss``), its CPU time, and the ratio of the
largest size's peak to the smallest's. Target: at most 1.2 between 1,000 and 10,000
conversations (what a resume holds follows the work left, not the campaign's size).
``--tracemalloc`` also prints the resume's tracemalloc peak (slower).

    python benchmarks/resume_memory.py [--sizes 1000,10000] [--open 16] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """
[campaign]
name = "resume"
seed = 5
max_turns = 2
max_attempts = 2
conversations_per_profile = {conversations}
concurrency = 8
profile_ids = ["grief-widower"]
"""


def write_config(folder: Path, conversations: int) -> Path:
    """A config of ``conversations`` scripted conversations, zero delay."""
    from mhsafeeval.testing import scripted_models

    path = folder / f"resume-{conversations}.toml"
    path.write_text(CONFIG.format(conversations=conversations) + scripted_models())
    return path


async def run(config_path: Path, db: Path, expect: str) -> None:
    """Run (or resume) the campaign; print its CPU time (what ``--child`` runs)."""
    from mhsafeeval.campaign import run_campaign
    from mhsafeeval.config import read_config
    from mhsafeeval.framework import configure_logging
    from mhsafeeval.storage import SqliteEventStore

    configure_logging(level="error")
    text, config = read_config(config_path)
    started = time.process_time()
    async with SqliteEventStore(db) as store:
        result = await run_campaign(config, store, source=config_path, config_text=text)
    if result.status != "completed" or (expect == "resume" and not result.resumed_from):
        raise SystemExit(f"campaign ended {result.status} (resumed from {result.resumed_from})")
    print(f"cpu={time.process_time() - started:.2f} resumed_from={result.resumed_from}")


def cut(db: Path, keep_finished: int) -> tuple[int, int]:
    """Delete every event after the ``keep_finished``-th stored conversation end; returns
    (events kept, events deleted)."""
    from mhsafeeval.messages import ConversationFinished

    tag = str(ConversationFinished.__struct_config__.tag)
    with sqlite3.connect(db) as conn:
        query = "SELECT seq FROM events WHERE type = ? ORDER BY seq"
        ends = [seq for (seq,) in conn.execute(query, (tag,))]
        last = ends[keep_finished - 1]
        deleted = conn.execute("DELETE FROM events WHERE seq > ?", (last,)).rowcount
        kept = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    return kept, deleted


def measure(command: list[str]) -> tuple[float, float, str]:
    """Run ``command`` to its end; its peak RSS (MB), wall time (s) and stdout."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err)
        # wait4 gives this child's own resource usage (ru_maxrss: its peak RSS, in KiB).
        _, status, usage = os.wait4(proc.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode(errors="replace")
        if code != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{' '.join(command)} failed ({code}):\n{text}{tail}")
    return usage.ru_maxrss / 1024, wall, text.strip()


def child(config: Path, db: Path, expect: str, traced: bool) -> None:
    """The measured process: run the campaign, optionally under tracemalloc."""
    import anyio

    if traced:
        import tracemalloc

        tracemalloc.start()
        anyio.run(run, config, db, expect)
        print(f"tracemalloc_peak_mb={tracemalloc.get_traced_memory()[1] / 2**20:.1f}")
    else:
        anyio.run(run, config, db, expect)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="conversation counts (a,b,...)")
    parser.add_argument("--open", type=int, default=16, help="conversation ends cut off")
    parser.add_argument("--tracemalloc", action="store_true", help="also the tracemalloc peak")
    parser.add_argument("--child", nargs=3, metavar=("CONFIG", "DB", "EXPECT"))
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.child[2], args.tracemalloc)
        return
    sizes = sorted(int(s) for s in args.sizes.split(","))
    peaks: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for size in sizes:
            config, db = write_config(folder, size), folder / f"resume-{size}.db"
            me = [sys.executable, __file__]
            _, build_s, _ = measure([*me, "--child", str(config), str(db), "fresh"])
            kept, deleted = cut(db, size - args.open)
            command = [*me, "--child", str(config), str(db), "resume"]
            if args.tracemalloc:
                command.append("--tracemalloc")
            peak, wall, out = measure(command)
            peaks.append(peak)
            print(
                f"{size:>6} conversations (built in {build_s:.0f} s; {kept:,} events kept, "
                f"{deleted:,} cut): resume peak RSS {peak:6.1f} MB, {wall:5.1f} s wall, {out}"
            )
    print(f"resume peak RSS ratio {sizes[-1]}/{sizes[0]}: {peaks[-1] / peaks[0]:.2f}")


if __name__ == "__main__":
    main()
