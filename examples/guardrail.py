"""A guardrail between the counselor and the client, added to the MHSafeEval campaign as is.

The campaign is the ordinary one (``examples/campaign.toml``: scripted models, seconds, no
network); the guardrail is an interceptor (:class:`mhsafeeval.framework.engine.Intercept`) that sees
every counselor reply before anyone else does, the client and the judge included. A reply
that says one of the phrases it knows to be harmful is rewritten into a safe redirection; the
judge rates what the client actually read, so the report measures the counselor *with* its
guardrail, and says what the guardrail blocked:

    python examples/guardrail.py --db guarded.db          # kill it and run it again: it resumes
    mhsafeeval report guarded.db                          # ends with "interceptors: ..."
    mhsafeeval events guarded.db --type runtime.intercepted   # each rewrite, with the original

Each decision is stored (an ``Intercepted`` record with the original reply), so a resumed run
keeps the decisions made before it stopped instead of asking again.

A guardrail must be quick and synchronous: it runs inside ``publish``. A check that needs a
model call is an agent of its own (``run_campaign(extra=[Node.of(...)])``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio
import msgspec

from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import load_config
from mhsafeeval.framework.engine import Intercept
from mhsafeeval.messages import CounselorReply
from mhsafeeval.reports.text import load_reports_and_logs, render_text
from mhsafeeval.storage import SqliteEventStore

HERE = Path(__file__).parent
BLOCKED = (
    # Phrases of the scripted counselor's slips (see mhsafeeval.providers._demo): a
    # real guardrail would hold your own list, a classifier's verdict, and so on.
    "never happened the way you remember",
    "your fault",
    "you only need me",
    "pathetic",
)
REDIRECT = (
    "I want to be careful here. What you are going through matters, and I'd like to "
    "understand it better: can you tell me more about how this has been for you?"
)


def guard(reply: CounselorReply) -> CounselorReply:
    """The reply as the client will read it: unchanged, or the redirection."""
    lowered = reply.text.lower()
    if not any(phrase.lower() in lowered for phrase in BLOCKED):
        return reply
    # Same coordinates and publisher: the rewrite answers what the original answered.
    return msgspec.structs.replace(reply, text=REDIRECT)


async def main(db: Path, config_path: Path, delay: float) -> int:
    config = load_config(config_path)
    overrides = [f"{where}.options.delay_s={delay}" for where, _ in config.model_tables()]
    config = load_config(config_path, overrides if delay else [])
    async with SqliteEventStore(db) as store:
        result = await run_campaign(
            config,
            store,
            source=config_path,
            interceptors=[Intercept("guardrail", guard, (CounselorReply,))],
        )
        resumed = f", resumed from {result.resumed_from} events" if result.resumed_from else ""
        print(f"{result.status}: {result.finished}/{result.conversations} conversations{resumed}")
        for report, _ in await load_reports_and_logs(store, config.campaign.name, source=db):
            print(render_text(report))
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=Path("guarded.db"))
    parser.add_argument("--config", type=Path, default=HERE / "campaign.toml")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per scripted call")
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.db, args.config, args.delay, backend="asyncio"))
