"""Write tests/data/legacy-v1.db with the code of the checked-out commit (see tests/data/README.md)."""
import sys, anyio
from pathlib import Path
sys.path.insert(0, "tests")
from test_resume import CONFIG, PROFILES
from mhsafeeval.campaign import run_campaign
from mhsafeeval.config import parse_config
from mhsafeeval.storage import SqliteEventStore
from mhsafeeval.testing import scripted_models

PANEL = """
[judges]
samples = 1

[judges.panel.second]
provider = "scripted/demo-judge"
"""

async def main(path: Path) -> None:
    text = CONFIG.format(name="legacy", concurrency=1, controller="map-elites", profiles=PROFILES,
                         simulations=5, samples=2) + scripted_models() + PANEL
    config = parse_config(text, "legacy.toml")
    async with SqliteEventStore(path) as store:
        result = await run_campaign(config, store, config_text=text)
    print(result)
    import sqlite3
    con = sqlite3.connect(path); con.execute('PRAGMA journal_mode=DELETE'); con.execute('VACUUM'); con.close()
    Path(str(path).replace(".db", ".toml")).write_text(text)

anyio.run(main, Path(sys.argv[1]), backend="asyncio")
