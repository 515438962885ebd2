"""Time and memory of ``report``, ``report --html`` and ``export`` against a campaign's size.

For each size (conversations) it builds, once, a scripted campaign into a SQLite file (the
scripted personas, every call instant; three turns of up to three attempts; about 40 events per
conversation) and keeps it in ``--dir`` (default: a folder under the system's temporary
folder), so a second run of the benchmark skips the builds. Then it runs each command in a
fresh Python process and prints its wall time, its CPU time (user + system of the child: the
machine may be shared, and CPU time is what the command itself cost), its peak resident memory
(``ru_maxrss`` of the finished child) and, for ``--html``, the size of the main file and of its
side files (``REPORT_files/``).

With ``--repeat N`` each command runs N times and the row gives its least CPU time (the
machine's other work only ever adds to it) and its largest peak memory. The ``startup`` row is
``mhsafeeval --help``: what every command pays before it reads anything (the imports; when
Python may not write bytecode, ``PYTHONDONTWRITEBYTECODE``, every run also compiles the
sources, and the first line says so).

``text``, ``json`` and ``html`` are ``report``, ``report --json`` and ``report --html`` as a
user runs them after a campaign: they read the report that ``run`` (or the campaign's first
``report``) kept in the database (:mod:`mhsafeeval.reports.kept`); each is run once unmeasured
first, which keeps it if nothing did yet. ``refold`` and ``html-refold`` add ``--refold``: they
fold every stored event, which is what the first report after the campaign changed costs.

The last lines give the ratio of the largest size's figures to the smallest's, and whether
``report``, ``report --json`` and ``report --html`` stay under 2 s of CPU at 10,000
conversations (issue 35). Targets: CPU time grows linearly with the events (a ratio of at
most ~11 between 1,000 and 10,000 conversations), peak memory stays bounded (it grows far
slower than the events), and the main HTML file stays small however large the campaign.

    python benchmarks/report_scale.py [--sizes 1000,5000,10000] [--dir DIR] [--commands ...]
        [--repeat N]

The code measured is the one ``python`` imports: ``PYTHONPATH=/path/to/old/src`` measures
another checkout's (the databases are built by it too, so give it its own ``--dir``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """
[campaign]
name = "scale"
seed = 1
max_turns = 3
max_attempts = 3
conversations_per_profile = {per_profile}
concurrency = 16
profile_ids = {profiles}
"""
PROFILES = ("grief-widower", "panic-disorder-bus-driver")
COMMANDS = ("startup", "text", "json", "html", "refold", "html-refold", "jsonl", "csv")
KEPT = ("text", "json", "html")
"""Commands measured reading what a report keeps in the database (one unmeasured run first
keeps it, as ``run`` and a campaign's first ``report`` do); ``refold`` and ``html-refold``
fold every event (``--refold``): what a report of a changed campaign costs."""
REPORT_CPU_TARGET = 2.0
"""CPU seconds that ``report`` (text, --json, --html) may take at 10,000 conversations."""


BUILD = """
import sys, anyio
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import read_config
from mhsafeeval.framework import configure_logging
from mhsafeeval.storage import SqliteEventStore
configure_logging(level="error")
async def main():
    text, config = read_config(sys.argv[1])
    async with SqliteEventStore(sys.argv[2]) as store:
        r = await run_campaign(config, store, config_text=text)
    assert r.status == "completed", r.status
anyio.run(main, backend="asyncio")
"""


def build(
    db: Path, conversations: int, *, config_template: str = CONFIG, code: str = BUILD
) -> None:
    """Run a scripted campaign of ``conversations`` into ``db`` (in a child process running
    ``code`` with the config file and the database as arguments)."""
    from mhsafeeval.testing import scripted_models

    per_profile = max(1, conversations // len(PROFILES))
    profiles = "[" + ", ".join(f'"{p}"' for p in PROFILES) + "]"
    config = db.with_suffix(".toml")
    text = config_template.format(per_profile=per_profile, profiles=profiles)
    config.write_text(text + scripted_models())
    partial = db.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(config), str(partial)], check=True)
    os.replace(partial, db)
    Path(f"{partial}.lock").unlink(missing_ok=True)
    print(f"built {db} ({conversations} conversations) in {time.perf_counter() - start:.0f} s")


def measure(command: list[str]) -> tuple[float, float, float]:
    """Run ``command`` to its end: wall seconds, CPU seconds and peak RSS (MB) of the child."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{' '.join(command)} failed:\n{tail}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def command_for(name: str, db: Path, out: Path) -> list[str]:
    """The ``mhsafeeval`` command line of one measured command."""
    base = [sys.executable, "-m", "mhsafeeval"]
    return {
        "startup": [*base, "--help"],
        "text": [*base, "report", str(db)],
        "json": [*base, "report", str(db), "--json"],
        "html": [*base, "report", str(db), "--html", str(out / "report.html")],
        "refold": [*base, "report", str(db), "--refold"],
        "html-refold": [*base, "report", str(db), "--html", str(out / "report.html"), "--refold"],
        "jsonl": [*base, "export", str(db), "--out", str(out / "export.jsonl")],
        "csv": [*base, "export", str(db), "--format", "csv", "--out", str(out / "export.csv")],
    }[name]


def html_sizes(out: Path) -> tuple[int, int, int]:
    """Bytes of the main HTML file, bytes and count of its side files."""
    main = out / "report.html"
    side = [p for p in (out / "report_files").rglob("*") if p.is_file()]
    return main.stat().st_size, sum(p.stat().st_size for p in side), len(side)


def main() -> None:
    """Build what is missing, measure every command at every size, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000,10000", help="conversations per campaign")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "report-scale")
    parser.add_argument("--commands", default=",".join(COMMANDS), help=", ".join(COMMANDS))
    parser.add_argument("--repeat", type=int, default=1, help="runs per command (least CPU)")
    args = parser.parse_args()
    if sys.dont_write_bytecode:
        print(
            "note: Python writes no bytecode here (PYTHONDONTWRITEBYTECODE): every run "
            "compiles the sources it imports, which the startup row includes"
        )
    sizes = [int(s) for s in args.sizes.split(",")]
    commands = args.commands.split(",")
    args.dir.mkdir(parents=True, exist_ok=True)
    figures: dict[tuple[str, int], tuple[float, float, float]] = {}
    print(f"{'size':>6} {'command':<11} {'wall s':>7} {'cpu s':>7} {'peak MB':>8}  html")
    for size in sizes:
        db = args.dir / f"scale-{size}.db"
        if not db.exists():
            build(db, size)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            for name in commands:
                if name in KEPT:  # keeps what it reads, if nothing kept it yet
                    measure(command_for(name, db, out))
                runs = [measure(command_for(name, db, out)) for _ in range(max(1, args.repeat))]
                wall, cpu, _ = min(runs, key=lambda run: run[1])
                rss = max(run[2] for run in runs)
                figures[(name, size)] = (wall, cpu, rss)
                extra = ""
                if name.startswith("html"):
                    main_bytes, side_bytes, files = html_sizes(out)
                    extra = (
                        f"main {main_bytes / 1e6:.2f} MB, {files} side files "
                        f"{side_bytes / 1e6:.1f} MB"
                    )
                print(f"{size:>6} {name:<11} {wall:>7.2f} {cpu:>7.2f} {rss:>8.0f}  {extra}")
    if len(sizes) > 1:
        low, high = min(sizes), max(sizes)
        print(f"\nratios {high} / {low} conversations (target: cpu <= ~{11 * high / low / 10:.0f})")
        for name in commands:
            a, b = figures[(name, low)], figures[(name, high)]
            print(f"  {name:<11} cpu x{b[1] / a[1]:.1f}  peak RSS x{b[2] / a[2]:.2f}")
    if 10000 in sizes:
        print(f"\nCPU at 10000 conversations (target: under {REPORT_CPU_TARGET:g} s for report)")
        for name in (c for c in ("text", "json", "html") if c in commands):
            cpu = figures[(name, 10000)][1]
            verdict = "ok" if cpu < REPORT_CPU_TARGET else "over"
            startup = figures.get(("startup", 10000))
            own = f"  ({cpu - startup[1]:.2f} s after the startup)" if startup else ""
            print(f"  {name:<11} {cpu:>6.2f} s  {verdict}{own}")


if __name__ == "__main__":
    main()
