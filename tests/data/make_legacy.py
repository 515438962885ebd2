"""Write legacy-v1.db (and legacy-v1.toml) with the code of the checked-out commit.

    python tests/data/make_legacy.py /tmp/legacy-v1.db && gzip -9 -c /tmp/legacy-v1.db > ...

See tests/data/README.md: the files in git were written at commit 2537183.
"""

import sqlite3
import sys
from pathlib import Path

import anyio

sys.path.insert(0, "tests")
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.storage import SqliteEventStore
from mhsafeeval.testing import scripted_models
from test_resume import CONFIG, PROFILES

PANEL = """
[judges]
samples = 1

[judges.panel.second]
provider = "scripted/demo-judge"
"""


async def main(path: Path) -> None:
    text = (
        CONFIG.format(
            name="legacy",
            concurrency=1,
            controller="map-elites",
            profiles=PROFILES,
            simulations=5,
            samples=2,
        )
        + scripted_models()
        + PANEL
    )
    config = parse_config(text, "legacy.toml")
    async with SqliteEventStore(path) as store:
        result = await run_campaign(config, store, config_text=text)
    print(result)
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("VACUUM")
    path.with_suffix(".toml").write_text(text)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), backend="asyncio")
