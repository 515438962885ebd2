"""End-to-end check of the ``vllm/`` provider on a GPU: a short campaign whose counselor and
judge run on vLLM in-process (one shared engine), the other agents scripted.

Prints how many judged replies got a valid verdict (structured output constrained to the
verdict schema), the calls answered per second (over the whole run, model load included, and
from the first counselor reply on), and failed calls by agent.

    python benchmarks/gpu_check.py Qwen/Qwen2.5-0.5B-Instruct   # a Hub id, or a model folder
    python benchmarks/gpu_check.py /models/qwen2.5-0.5b --turns 3 --concurrency 16

Needs ``pip install 'mhsafeeval[vllm]'`` and a CUDA GPU; elsewhere it says which is missing
and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The tables moved onto vLLM, with their own sampling (the engine options are shared).
VLLM_ROLES = {
    "[models.judge]": "temperature = 0.0\n",
    "[counselors.demo-counselor]": "temperature = 0.7\nmax_tokens = 300\n",
}


def missing() -> str | None:
    """Why this machine cannot run vLLM, or ``None``."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install 'mhsafeeval[vllm]'"
    if not importlib.import_module("torch").cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def config_text(model: str, turns: int, concurrency: int, memory: float) -> str:
    """The scripted example campaign with its judge and counselor moved onto vLLM."""
    text = (ROOT / "examples" / "campaign.toml").read_text(encoding="utf-8")
    table = (
        f'provider = "vllm/{model}"\ntimeout = 600\nmax_concurrency = {concurrency}\n'
        f"options = {{ gpu_memory_utilization = {memory}, max_model_len = 8192 }}\n"
    )
    for header, sampling in VLLM_ROLES.items():
        start = text.index(header)
        end = text.find("\n[", start + 1)
        end = len(text) if end < 0 else end + 1
        text = text[:start] + f"{header}\n{table}{sampling}\n" + text[end:]
    for key, value in (("max_turns", turns), ("concurrency", concurrency)):
        text = "\n".join(
            f"{key} = {value}" if line.startswith(f"{key} =") else line
            for line in text.splitlines()
        )
    return text + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="what vLLM loads: a Hub id or a local model folder")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--gpu-memory", type=float, default=0.6, help="gpu_memory_utilization")
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        print(f"gpu_check: cannot run here: {reason}", file=sys.stderr)
        raise SystemExit(2)
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "gpu.toml"
        config.write_text(config_text(args.model, args.turns, args.concurrency, args.gpu_memory))
        db = Path(folder) / "gpu.db"
        command = [sys.executable, "-m", "mhsafeeval", "run", str(config), "--db", str(db)]
        started = time.time()
        done = subprocess.run([*command, "--quiet"], capture_output=True, text=True, check=False)
        total = time.time() - started
        if done.returncode not in (0, 1) or not db.exists():
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"gpu_check: the campaign exited {done.returncode}")
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        rows = con.execute("SELECT type, recorded_at, body FROM events ORDER BY seq").fetchall()
        con.close()
    counts: Counter[str] = Counter()
    first_reply = None
    for kind, at, body in rows:
        counts[kind] += 1
        if kind == "counselor.reply" and first_reply is None:
            first_reply = at
        if kind == "call.failed":
            counts[f"failed calls ({json.loads(body).get('agent')})"] += 1
    verdicts, unjudged = counts["judge.verdict"], counts["judge.unjudged"]
    judged = verdicts + unjudged
    calls = counts["counselor.reply"] + judged
    steady = None if first_reply is None else started + total - first_reply
    print(f"model                 : vllm/{args.model} (exit {done.returncode})")
    print(f"counselor replies     : {counts['counselor.reply']}")
    share = f"{verdicts / judged:.3f}" if judged else "n/a (nothing judged)"
    print(f"valid-verdict share   : {share} ({verdicts} of {judged})")
    print(f"calls/s, whole run    : {calls / total:.2f} ({calls} calls in {total:.1f} s)")
    if steady:
        print(f"calls/s, after load   : {calls / steady:.2f} (from the first counselor reply)")
    for key, value in sorted(counts.items()):
        if key.startswith("failed calls"):
            print(f"{key:22}: {value}")


if __name__ == "__main__":
    main()
