"""The review workbench with a queue of 10,000 items: page load and save times, startup, memory.

It builds (once, in a child process, kept in ``--dir``) a campaign store whose review queue
holds ``--items`` replies: that many minus ``--safe-sample`` judged harmful and three times
``--safe-sample`` judged safe, one reply per turn, four turns per conversation, each with
its client message, reply, verdict and committed turn (about six events per reply), written
straight to a SQLite event store (no model is called). Then, in this process, it starts the
workbench as ``mhsafeeval review`` does (:func:`mhsafeeval.review.serve`: uvicorn on
127.0.0.1, in a thread with its own event loop) and drives it over HTTP with one client
(httpx, keep-alive, cookies), the way a browser would:

- **startup**: from calling ``serve`` to the server listening (the campaign read, the queue
  drawn and stored, the app built);
- **item page**: ``GET /item/N`` for ``--requests`` positions drawn at random (seeded);
- **save**: ``POST /rate`` (a rating stored and flushed to the database before the answer),
  and **save and next**: the same followed through its redirects to the rater's next item
  page, which is what a rater waits for after pressing Enter;
- **memory**: the process's peak resident memory before the server starts and after the
  requests (``ru_maxrss``), and the Python heap the session holds (tracemalloc, optional:
  ``--trace-memory`` slows startup).

Target (issue 36): item page and save under 100 ms each on 2 cores, median and p95.

    python benchmarks/review_queue.py [--items 10000] [--requests 200] [--dir DIR]
"""

from __future__ import annotations

import argparse
import functools
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

TARGET_MS = 100.0

BUILD = """
import sys, anyio
from mhsafeeval.messages import (CampaignStarted, ClientUtterance, ConversationStarted,
    CounselorReply, TurnCommitted, Verdict)
from mhsafeeval.framework import ConversationFinished
from mhsafeeval.storage import SqliteEventStore
from mhsafeeval.taxonomy import builtin_taxonomy

db, harmful, safe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
TURNS = 4

async def main():
    cells = builtin_taxonomy().cell_ids()
    total = harmful + safe
    async with SqliteEventStore(db) as store:
        await store.append(CampaignStarted(campaign="bench", cells=tuple(cells), threshold=2))
        for n in range(total):
            c, t = divmod(n, TURNS)
            conv = f"bench/model-{c % 2}/p{c}/0"
            if t == 0:
                await store.append(ConversationStarted(campaign="bench", conversation=conv,
                    counselor_model=f"model-{c % 2}", profile_id=f"p{c}"))
            category, role = cells[n % len(cells)]
            ids = dict(campaign="bench", conversation=conv, turn=t, category=category, role=role)
            severity = 1 + n % 4 + 1 if n < harmful else 1  # 2-5, then safe ones
            said = f"Client {c}.{t}: I keep going over what I did wrong last week, again and again."
            reply = (f"Reply {c}.{t}: " + "It sounds like this weighs on you a great deal. " * 6)
            await store.append(ClientUtterance(**ids, text=said))
            await store.append(CounselorReply(**ids, text=reply))
            await store.append(Verdict(**ids, severity=severity, label="x",
                reasoning="Rated against the ladder. " * 4, evidence=("weighs on you",),
                publisher="judge"))
            await store.append(TurnCommitted(**ids, committed_attempt=0, client_text=said,
                counselor_text=reply, best_severity=severity))
            if t == TURNS - 1 or n == total - 1:
                await store.append(ConversationFinished(campaign="bench", conversation=conv,
                    turns=t + 1))

anyio.run(main, backend="asyncio")
"""


def build(db: Path, items: int, safe_sample: int) -> None:
    """The campaign store, built in a child process (so its memory is not counted here)."""
    if db.exists():
        return
    partial = db.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    start = time.perf_counter()
    harmful = items - safe_sample
    args = [str(partial), str(harmful), str(3 * safe_sample)]
    subprocess.run([sys.executable, "-c", BUILD, *args], check=True)
    partial.rename(db)
    print(f"built {db} ({harmful + 3 * safe_sample} judged replies) in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):6.1f} ms   p95 {p95:6.1f} ms   (n={len(values)})"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--safe-sample", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "mhs-review")
    parser.add_argument("--trace-memory", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    source = args.dir / f"review-{args.items}.db"
    build(source, args.items, args.safe_sample)
    db = args.dir / "measured.db"  # a fresh copy each run: the ratings stored here are new
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(source.read_bytes())

    import anyio
    import httpx

    from mhsafeeval.review import ReviewServer, serve

    before = _rss_mb()
    if args.trace_memory:
        tracemalloc.start()
    box: dict[str, Any] = {}
    ready = threading.Event()

    def started(server: ReviewServer) -> None:
        box["server"], box["up"] = server, time.perf_counter()
        ready.set()

    def run() -> None:
        try:
            go = functools.partial(
                serve, db, open_browser=False, started=started, safe_sample=args.safe_sample
            )
            anyio.run(go, backend="asyncio")
        except BaseException as exc:
            box["error"] = exc
            ready.set()

    start = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(600)
    if "error" in box:
        raise box["error"]
    server: ReviewServer = box["server"]
    startup = box["up"] - start
    heap = tracemalloc.get_traced_memory()[0] / 2**20 if args.trace_memory else None
    tracemalloc.stop()
    queue = len(server.session.queue)
    base, token = server.url.split("/?token=")
    rng = random.Random(0)
    pages: list[float] = []
    saves: list[float] = []
    onward: list[float] = []
    try:
        with httpx.Client(base_url=base, follow_redirects=False, timeout=30) as client:
            client.get(f"/?token={token}")
            page = client.get("/start").text
            csrf = page.split('name="csrf" content="', 1)[1].split('"', 1)[0]
            client.post("/start", data={"csrf": csrf, "rater": "bench"})
            for _ in range(5):  # warm up
                client.get(f"/item/{rng.randrange(queue)}")
            for _ in range(args.requests):
                pos = rng.randrange(queue)
                t0 = time.perf_counter()
                response = client.get(f"/item/{pos}")
                pages.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, response.status_code
            for n in range(args.requests):
                item = server.session.ids[rng.randrange(queue)]
                form = {
                    "csrf": csrf,
                    "item": item,
                    "severity": str(1 + n % 5),
                    "spans": "[[0, 5]]",
                    "comment": "benchmark rating",
                }
                if n % 2:
                    form["refused"] = "on"
                t0 = time.perf_counter()
                response = client.post("/rate", data=form)
                saves.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 303, response.text
                t0 = time.perf_counter()
                response = client.post("/rate", data=form, follow_redirects=True)
                onward.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, response.status_code
    finally:
        server.stop()
        thread.join(30)
    after = _rss_mb()
    size = source.stat().st_size / 2**20
    print(f"queue: {queue} items ({server.session.drawn.kinds}); database {size:.0f} MB")
    print(f"startup (read campaign, draw and store queue, build app): {startup:.2f} s")
    print(f"item page      {_ms(pages)}")
    print(f"save           {_ms(saves)}")
    print(f"save and next  {_ms(onward)}")
    print(f"peak RSS: {before:.0f} MB before the server, {after:.0f} MB after the requests")
    if heap is not None:
        print(f"Python heap held after startup (tracemalloc): {heap:.0f} MB")
    worst = max(sorted(x)[round(0.95 * (len(x) - 1))] for x in (pages, saves))
    verdict = "meets" if worst < TARGET_MS else "MISSES"
    print(
        f"target: page and save p95 under {TARGET_MS:.0f} ms: {verdict} (worst p95 {worst:.1f} ms)"
    )


if __name__ == "__main__":
    main()
