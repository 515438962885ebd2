"""Time and memory of ``report`` and ``export`` for a campaign with a ``[judges]`` panel.

For each size (conversations) it builds, once, a scripted campaign with a panel of two
scripted judges, each sampled twice (four raters: every judged reply gets four Ratings, most
of them stored after their conversation completed, as a panel rates a reply once its turn is
committed), into a SQLite file kept in ``--dir``, and a copy of it rated entirely after the
fact (``-after``: every Rating moved after the campaign's last event, as ``rejudge`` stores
them). Then it runs each command in a fresh Python process and prints its wall time, CPU time
and peak resident memory (``ru_maxrss`` of the finished child): ``report DB`` (and
``--json``), ``export DB --out FILE`` (``jsonl``) and ``export DB`` to a pipe (``pipe``: its
stdout cannot seek, so the export first reads the store once to decide how to write). For
this checkout it also times, in one process, the pipe's pre-pass against the export to a file.
``--src DIR`` runs the commands on another checkout's sources (``PYTHONPATH=DIR``), to compare
a version with this one.

    python benchmarks/report_panel.py [--sizes 1000,5000] [--dir DIR] [--src OLD/src]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report_scale  # the same campaign builder

CONFIG = """
[campaign]
name = "panel"
seed = 1
max_turns = 3
max_attempts = 3
conversations_per_profile = {per_profile}
concurrency = 16
profile_ids = {profiles}

[judges]
samples = 2

[judges.panel.lenient]
provider = "scripted/demo-judge"
temperature = 0.5

[judges.panel.strict]
provider = "scripted/bench-strict-judge"
temperature = 0.5
"""
BUILD = """
import json, sys, anyio
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import read_config
from mhsafeeval.framework import configure_logging
from mhsafeeval.storage import SqliteEventStore
from mhsafeeval.testing import demo_judge, register_script

def strict(messages, params):  # the demo judge, one level harsher on every other reply
    verdict = json.loads(demo_judge(messages, params))
    if len(messages[-1].content) % 2:
        verdict["severity"] = min(5, verdict["severity"] + 1)
    return json.dumps(verdict)

register_script("bench-strict-judge", strict)
configure_logging(level="error")
async def main():
    text, config = read_config(sys.argv[1])
    async with SqliteEventStore(sys.argv[2]) as store:
        r = await run_campaign(config, store, config_text=text)
    assert r.status == "completed", r.status
anyio.run(main, backend="asyncio")
"""


PRE_PASS = """
import os, sys, time, anyio
from mhsafeeval.reports.export import _pipe_plan, export
from mhsafeeval.storage import SqliteEventStore
async def main():
    async with SqliteEventStore(sys.argv[1], read_only=True) as store:
        [info] = await store.list_campaigns()
        start = time.process_time()
        await _pipe_plan(store, info.id)
        plan = time.process_time() - start
        with open(os.devnull, "w") as out:  # a file: no pre-pass
            start = time.process_time()
            await export(store, info.id, "jsonl", out)
            whole = time.process_time() - start
    print(f"{plan:.3f} {whole:.3f}")
anyio.run(main, backend="asyncio")
"""


def build(db: Path, conversations: int) -> None:
    """Run a scripted campaign with a panel of ``conversations`` into ``db`` (a child)."""
    report_scale.build(db, conversations, config_template=CONFIG, code=BUILD)


def rated_after(db: Path, after: Path) -> None:
    """Copy ``db`` to ``after`` with every Rating moved after the last event (their order
    kept): the campaign as ``rejudge`` would leave it."""
    partial = after.with_suffix(".partial")
    shutil.copyfile(db, partial)  # the builder's store closed: its log is in the file
    conn = sqlite3.connect(partial)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")  # all in the one file when closed
        (last,) = conn.execute("SELECT max(seq) FROM events").fetchone()
        with conn:
            conn.execute("UPDATE events SET seq = seq + ? WHERE type = 'judge.rating'", (last,))
    finally:
        conn.close()
    os.replace(partial, after)


def command_for(name: str, db: Path, out: Path) -> list[str]:
    """The ``mhsafeeval`` command line of one measured command."""
    base = [sys.executable, "-m", "mhsafeeval"]
    return {
        "text": [*base, "report", str(db)],
        "json": [*base, "report", str(db), "--json"],
        "jsonl": [*base, "export", str(db), "--out", str(out)],
        "pipe": [*base, "export", str(db)],
    }[name]


def measure(command: list[str], src: Path | None) -> tuple[float, float, float]:
    """Run ``command`` to its end: wall seconds, CPU seconds and peak RSS (MB) of the child."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{' '.join(command)} failed:\n{tail}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    """Build what is missing, measure every command at every size, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000", help="conversations per campaign")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "report-panel")
    parser.add_argument("--src", type=Path, default=None, help="run the commands on these sources")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    figures: dict[tuple[str, int], tuple[float, float, float]] = {}
    passes: list[tuple[str, float, float]] = []
    print(f"{'size':>6} {'campaign':<8} {'command':<7} {'wall s':>7} {'cpu s':>7} {'peak MB':>8}")
    for size in sizes:
        db = args.dir / f"panel-{size}.db"
        if not db.exists():
            build(db, size)
        after = args.dir / f"panel-{size}-after.db"
        if not after.exists():
            rated_after(db, after)
        runs = [(db, "panel", name) for name in ("text", "json", "jsonl", "pipe")]
        runs += [(after, "after", name) for name in ("jsonl", "pipe")]
        for path, kind, name in runs:
            command = command_for(name, path, args.dir / "export.jsonl")
            wall, cpu, rss = measure(command, args.src)
            figures[(f"{kind} {name}", size)] = (wall, cpu, rss)
            print(f"{size:>6} {kind:<8} {name:<7} {wall:>7.2f} {cpu:>7.2f} {rss:>8.0f}")
        if args.src is None:
            for path, kind in ((db, "panel"), (after, "after")):
                run = [sys.executable, "-c", PRE_PASS, str(path)]
                plan, whole = map(float, subprocess.check_output(run, text=True).split())
                passes.append((f"{size} {kind}", plan, whole))
    if passes:
        print("\npipe pre-pass CPU s against the export's own (to a file), in one process")
        for name, plan, whole in passes:
            print(f"  {name:<12} {plan:.2f} / {whole:.2f} = {plan / whole:.2f}")
    if len(sizes) > 1:
        low, high = min(sizes), max(sizes)
        print(f"\nratios {high} / {low} conversations")
        for name in sorted({n for n, _ in figures}):
            a, b = figures[(name, low)], figures[(name, high)]
            print(f"  {name:<12} cpu x{b[1] / a[1]:.1f}  peak RSS x{b[2] / a[2]:.2f}")


if __name__ == "__main__":
    main()
