"""A client simulator of your own in the MHSafeEval campaign, in place of the built-in one.

The built-in client asks a model to act out each instruction in the profile's voice. This one
speaks from a phrasebook instead: for each instruction it says the line the instruction
suggests, opened with a hesitation chosen by the conversation and turn, with no model call.
A team might do this to replay a fixed set of client lines against each new build of their
app, or to plug in a simulator they trust more. Everything else is the ordinary campaign
(mutator, counselor, judge, search, store, resume, report):

    python examples/custom_client.py --db phrasebook.db    # kill it and run it again: it resumes
    mhsafeeval report phrasebook.db

The contract of the ``client`` node (``campaign_graph(replace={"client": ...})``): answer each
:class:`~mhsafeeval.messages.Instruction` with one
:class:`~mhsafeeval.messages.ClientUtterance` with the instruction's coordinates, category and
role (or a :class:`~mhsafeeval.messages.CallFailed` if it cannot), and keep any state in
synchronous handlers, so that a resumed run rebuilds it from the stored messages.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import anyio

from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import load_config
from mhsafeeval.framework import Agent, on
from mhsafeeval.framework.engine import Node
from mhsafeeval.messages import CallFailed, ClientUtterance, Instruction
from mhsafeeval.reports.text import load_reports_and_logs, render_text
from mhsafeeval.storage import SqliteEventStore

HERE = Path(__file__).parent
OPENINGS = ("Um... ", "Okay. ", "This is hard to say. ", "Sorry. ", "")


class PhrasebookClient(Agent):
    """Says the line each instruction suggests (``Say something like: ...``), no model."""

    outcomes = (ClientUtterance,)
    publishes = (ClientUtterance, CallFailed)

    @on(Instruction)
    def speak(self, msg: Instruction) -> None:
        suggested = msg.text.split("Say something like:", 1)[-1].strip()
        line = suggested or "I'm not sure what to say."
        pick = hashlib.blake2b(f"{msg.conversation}#{msg.turn}".encode(), digest_size=1)
        opening = OPENINGS[pick.digest()[0] % len(OPENINGS)]
        text = opening + line
        self.publish(
            ClientUtterance(**msg.child_ids(), category=msg.category, role=msg.role, text=text)
        )


async def main(db: Path, config_path: Path, delay: float) -> int:
    config = load_config(config_path)
    overrides = [f"{where}.options.delay_s={delay}" for where, _ in config.model_tables()]
    config = load_config(config_path, overrides if delay else [])
    async with SqliteEventStore(db) as store:
        result = await run_campaign(
            config,
            store,
            source=config_path,
            replace={"client": Node.of(PhrasebookClient)},
        )
        resumed = f", resumed from {result.resumed_from} events" if result.resumed_from else ""
        print(f"{result.status}: {result.finished}/{result.conversations} conversations{resumed}")
        for report, _ in await load_reports_and_logs(store, config.campaign.name, source=db):
            print(render_text(report))
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=Path("phrasebook.db"))
    parser.add_argument("--config", type=Path, default=HERE / "campaign.toml")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per scripted call")
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.db, args.config, args.delay, backend="asyncio"))
