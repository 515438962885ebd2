"""Kill a campaign with SIGKILL again and again, resume it, and compare with a clean run.

A scripted campaign (every call takes ``--delay`` seconds) runs once without interruption, then
again into a second database, SIGKILLed each time the store has grown by a random step, until
it finishes. Prints the kill points, the time lost to the kills, and whether the resumed
campaign's events, archive and metrics equal the clean run's (they must, at concurrency 1).

    python benchmarks/crash.py [--kills 30] [--delay 0.02] [--concurrency 1] [--controller uct]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mhsafeeval.testing import scripted_models

CONFIG = """
[campaign]
name = "crash"
seed = 3
max_turns = 3
max_attempts = 3
concurrency = {concurrency}
controller = "{controller}"
profile_ids = ["grief-widower", "panic-disorder-bus-driver", "depression-laid-off-engineer"]

[search]
simulations = 5
in_flight = 3
"""


def count(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return int(con.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def command(config: Path, db: Path) -> list[str]:
    return [sys.executable, "-m", "mhsafeeval.cli", "run", str(config), "--db", str(db), "--quiet"]


def events(db: Path) -> dict[str, str]:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "latency_s"}
        return [strip(v) for v in value] if isinstance(value, list) else value

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT id, body FROM events").fetchall()
    return {i: json.dumps(strip(json.loads(b)), sort_keys=True) for i, b in rows}


def report(db: Path) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "mhsafeeval.cli", "report", str(db), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.replace('"latency', '"ignored-latency'))["crash"]["models"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--controller", default="map-elites")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "crash.toml"
        text = CONFIG.format(concurrency=args.concurrency, controller=args.controller)
        config.write_text(text + scripted_models(delay=args.delay))
        clean, crashed = Path(tmp) / "clean.db", Path(tmp) / "crashed.db"
        start = time.perf_counter()
        subprocess.run(command(config, clean), check=True, capture_output=True)
        clean_s = time.perf_counter() - start
        total = count(clean)
        kills: list[int] = []
        start = time.perf_counter()
        for i in range(args.kills):
            span = max(1, (total - 1 - count(crashed)) // (args.kills - i + 1))
            target = count(crashed) + rng.randint(1, span)
            proc = subprocess.Popen(
                command(config, crashed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            while proc.poll() is None and count(crashed) < target:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.04))
            if proc.poll() is not None:
                print(f"run {i + 1} ended by itself (exit {proc.returncode}) before its kill")
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(count(crashed))
        last = subprocess.run(command(config, crashed), capture_output=True, text=True)
        crashed_s = time.perf_counter() - start
        print(
            f"clean run: {total} events in {clean_s:.1f} s (concurrency {args.concurrency}, "
            f"{args.controller}, {args.delay * 1000:.0f} ms per call)"
        )
        print(f"killed with SIGKILL {len(kills)} times, at stored event counts {kills}")
        print(f"final run: exit {last.returncode}; {last.stderr.strip().splitlines()[-1]}")
        print(
            f"wall time with the kills and {len(kills) + 1} restarts: {crashed_s:.1f} s "
            f"({crashed_s - clean_s:+.1f} s, mostly process start-up)"
        )
        same = events(clean) == events(crashed)
        print(f"same events (ids and contents) as the clean run: {same}")
        print(f"same metrics as the clean run: {report(clean) == report(crashed)}")


if __name__ == "__main__":
    main()
