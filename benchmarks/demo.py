"""The offline demo, timed and read back: what a new user sees from `mhsafeeval run`.

Runs the built-in demo (``mhsafeeval run`` with no config) as a user would, in a fresh process,
and prints from its database:

* seconds from the command's start to the first verdict, and to the end (targets on 2 idle
  cores: 30 s and 3 minutes);
* the client: lines said, answers re-asked (empty or repeating the prompt), sentences dropped,
  and lines said that still repeat the prompt (target 0);
* the counselor: replies, replies cut at the token limit, replies that end mid-sentence;
* the judge: verdicts, unjudged replies, refusals, severities; and one exchange as a sample.

``--runs 2`` runs it twice and says whether the two runs stored the same conversations
(``--variant shared-context`` runs the demo with one llama.cpp context per model file instead,
to measure what the per-role KV caches save).

    python benchmarks/demo.py [--runs 2] [--variant shared-context]
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mhsafeeval.agents._echo import EchoCheck, fixed_wording
from mhsafeeval.campaign import DEMO_CONFIG

_CLIENT_TEMPLATES = ("client_system", "client_turn", "client_retry", "client_echo_retry")
_ENDS = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s*$")


def run_demo(folder: Path, index: int, variant: str) -> dict[str, Any]:
    """One demo run in a fresh process; its times and its database."""
    db = folder / f"demo-{index}.db"
    command = [sys.executable, "-m", "mhsafeeval", "run", "--db", str(db), "--quiet"]
    if variant == "shared-context":
        text = DEMO_CONFIG.read_text(encoding="utf-8").replace(
            "options = { n_ctx = 4096", "options = { contexts = 1, n_ctx = 4096"
        )
        config = folder / "demo-shared-context.toml"
        config.write_text(text, encoding="utf-8")
        command.insert(4, str(config))
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    total = time.time() - started
    if done.returncode != 0:
        raise SystemExit(f"the demo exited {done.returncode}:\n{done.stderr[-2000:]}")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute("SELECT type, recorded_at, body FROM events ORDER BY seq").fetchall()
    con.close()
    events = [(kind, at, json.loads(body)) for kind, at, body in rows]
    first = next((at for kind, at, _ in events if kind == "judge.verdict"), None)
    return {
        "total_s": total,
        "first_verdict_s": None if first is None else first - started,
        "events": events,
    }


def read_back(events: list[tuple[str, float, dict[str, Any]]]) -> dict[str, Any]:
    """What the stored demo says about the client, the counselor and the judge."""
    segments, labels = fixed_wording(*_CLIENT_TEMPLATES)
    instructions = {}
    out: Counter[str] = Counter()
    severities: Counter[int] = Counter()
    sample: dict[str, str] = {}
    for kind, _, body in events:
        key = (body["conversation"], body["turn"], body["attempt"])
        if kind == "mutator.instruction":
            instructions[key] = body["text"]
        elif kind == "client.utterance":
            out["lines"] += 1
            out["re-asked"] += body.get("rejected", 0)
            out["sentences dropped"] += body.get("dropped", 0)
            check = EchoCheck(segments, labels, directions=[instructions.get(key, "")])
            out["lines repeating the prompt"] += check.find(body["text"]) is not None
            sample.setdefault("client", body["text"])
        elif kind == "counselor.reply":
            out["replies"] += 1
            out["cut at the token limit"] += body.get("finish_reason") == "length"
            out["ending mid-sentence"] += not _ENDS.search(body["text"])
            sample.setdefault("counselor", body["text"])
        elif kind == "judge.verdict":
            out["verdicts"] += 1
            out["refused"] += bool(body.get("refused"))
            severities[body["severity"]] += 1
            sample.setdefault(
                "verdict",
                f"severity {body['severity']} ({body.get('label')}): {body.get('reasoning')}",
            )
        elif kind == "judge.unjudged":
            out["unjudged"] += 1
        elif kind == "call.failed":
            out[f"failed calls ({body['agent']})"] += 1
    return {"counts": out, "severities": dict(sorted(severities.items())), "sample": sample}


def _content(events: list[tuple[str, float, dict[str, Any]]]) -> list[tuple[str, str]]:
    keep = ("mutator.instruction", "client.utterance", "counselor.reply", "judge.verdict")
    return [(k, json.dumps(b.get("text") or b.get("severity"))) for k, _, b in events if k in keep]


def main() -> None:
    """Run the demo and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--variant", choices=["demo", "shared-context"], default="demo")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_demo(Path(tmp), i, args.variant) for i in range(args.runs)]
    for i, run in enumerate(runs):
        first = run["first_verdict_s"]
        print(
            f"run {i + 1} ({args.variant}): first verdict "
            f"{'none' if first is None else f'{first:.1f} s'} (target 30 s), whole demo "
            f"{run['total_s']:.1f} s (target 180 s)"
        )
    found = read_back(runs[0]["events"])
    for name, value in sorted(found["counts"].items()):
        print(f"  {name}: {value}")
    print(f"  severities: {found['severities']}")
    for role, text in found["sample"].items():
        print(f"  sample {role}: {text}")
    if len(runs) > 1:
        base = _content(runs[0]["events"])
        for i, run in enumerate(runs[1:], start=2):
            other = _content(run["events"])
            same = next(
                (n for n, (a, b) in enumerate(zip(base, other, strict=False)) if a != b), None
            )
            if same is None and len(base) == len(other):
                print(f"run {i} stored the same {len(base)} instructions, lines and verdicts")
            else:
                where = same if same is not None else min(len(base), len(other))
                print(f"run {i} differs from run 1 at stored item {where}")


if __name__ == "__main__":
    main()
