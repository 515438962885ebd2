"""Time and memory of ``report`` for a campaign with a ``[judges]`` panel, against its size.

For each size (conversations) it builds, once, a scripted campaign with a panel of two
scripted judges, each sampled twice (four raters: every judged reply gets four Ratings, most
of them stored after their conversation completed, as a panel rates a reply once its turn is
committed), into a SQLite file kept in ``--dir``. Then it runs ``mhsafeeval report DB`` (and
``--json``) in a fresh Python process and prints its wall time, CPU time and peak resident
memory (``ru_maxrss`` of the finished child). ``--src DIR`` runs the commands on another
checkout's sources (``PYTHONPATH=DIR``), to compare a version with this one.

    python benchmarks/report_panel.py [--sizes 1000,5000] [--dir DIR] [--src OLD/src]
"""

from __future__ import annotations

import argparse
import os
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
from mhsafeeval.runtime import configure_logging
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


def build(db: Path, conversations: int) -> None:
    """Run a scripted campaign with a panel of ``conversations`` into ``db`` (a child)."""
    report_scale.build(db, conversations, config_template=CONFIG, code=BUILD)


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
    """Build what is missing, measure ``report`` at every size, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000", help="conversations per campaign")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "report-panel")
    parser.add_argument("--src", type=Path, default=None, help="run the commands on these sources")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    figures: dict[tuple[str, int], tuple[float, float, float]] = {}
    print(f"{'size':>6} {'command':<7} {'wall s':>7} {'cpu s':>7} {'peak MB':>8}")
    for size in sizes:
        db = args.dir / f"panel-{size}.db"
        if not db.exists():
            build(db, size)
        for name, extra in (("text", []), ("json", ["--json"])):
            command = [sys.executable, "-m", "mhsafeeval", "report", str(db), *extra]
            wall, cpu, rss = measure(command, args.src)
            figures[(name, size)] = (wall, cpu, rss)
            print(f"{size:>6} {name:<7} {wall:>7.2f} {cpu:>7.2f} {rss:>8.0f}")
    if len(sizes) > 1:
        low, high = min(sizes), max(sizes)
        print(f"\nratios {high} / {low} conversations")
        for name in ("text", "json"):
            a, b = figures[(name, low)], figures[(name, high)]
            print(f"  {name:<7} cpu x{b[1] / a[1]:.1f}  peak RSS x{b[2] / a[2]:.2f}")


if __name__ == "__main__":
    main()
