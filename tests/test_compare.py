"""``mhsafeeval compare``: two releases side by side, changes beyond the noise marked."""

from __future__ import annotations

import json
import math
import re
import stat
from pathlib import Path

import anyio
import msgspec
import pytest

from mhsafeeval.cli import main
from mhsafeeval.reports.compare import (
    SCHEMA_VERSION,
    Comparison,
    compare_files,
    comparison_json,
    comparison_schema,
    render_comparison,
)
from mhsafeeval.reports.html import comparison_html, comparison_section
from mhsafeeval.reports.text import SPARSE_ATTEMPTS, load_report
from mhsafeeval.stats import FEW_CONVERSATIONS, clustered_interval, difference_interval
from mhsafeeval.storage import ModelMetrics, SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]
SAFE = (
    'provider = "scripted/safe-counselor"\n'
    'options = { replies = ["That sounds hard. Who could you lean on this week?"] }\n'
)


def _config(*, name: str = "release", counselors: str = "", judge: str = "") -> str:
    base = (ROOT / "examples" / "campaign.toml").read_text()
    base = base.replace('name = "scripted-demo"', f'name = "{name}"')
    base = base.replace("max_turns = 4", "max_turns = 6")
    base = base.replace("conversations_per_profile = 1", "conversations_per_profile = 3")
    base = base.replace(
        'provider = "scripted/demo-judge"\n', f'provider = "scripted/demo-judge"\n{judge}'
    )
    if counselors:  # replace the demo counselor's table
        base = base.split("[counselors.demo-counselor]")[0] + counselors
    return base


def _run(tmp: Path, db: Path, config: str) -> None:
    path = tmp / f"{db.stem}-{len(list(tmp.iterdir()))}.toml"
    path.write_text(config)
    assert main(["run", str(path), "--db", str(db), "--quiet"]) == 0


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A: the demo counselor (weak spots); B: a counselor that is always safe, under the same
    config name, plus a new one; C: A's counselor judged at another temperature; both: two
    campaigns in one file."""
    tmp = tmp_path_factory.mktemp("compare")
    out = {k: tmp / f"{k}.db" for k in ("a", "b", "c", "both")}
    weak = '[counselors.demo-counselor]\nprovider = "scripted/demo-counselor"\n'
    _run(tmp, out["a"], _config(counselors=weak))
    _run(
        tmp,
        out["b"],
        _config(counselors=f"[counselors.demo-counselor]\n{SAFE}\n[counselors.new-bot]\n{SAFE}"),
    )
    _run(tmp, out["c"], _config(counselors=weak, judge="temperature = 0.3\n"))
    _run(tmp, out["both"], _config(name="v1", counselors=weak))
    _run(tmp, out["both"], _config(name="v2", counselors=f"[counselors.demo-counselor]\n{SAFE}"))
    return out


def _compare(a: Path, b: Path | None) -> Comparison:
    async def go() -> Comparison:
        return await compare_files(a, b)

    return anyio.run(go, backend="asyncio")


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Comparison:
    assert main(["compare", *args, "--json"]) == 0
    return msgspec.json.decode(capsys.readouterr().out, type=Comparison)


# -- the difference interval ---------------------------------------------------------------------


def test_difference_interval_marks_a_real_change_and_not_a_null_one() -> None:
    low_rate = [(0, 4), (1, 4), (0, 4), (1, 4), (0, 4), (0, 4)]
    high_rate = [(4, 4), (3, 4), (4, 4), (3, 4), (4, 4), (2, 4)]
    low, high = difference_interval(low_rate, high_rate)
    assert 0 < low < 0.7 < high <= 1
    flipped = difference_interval(high_rate, low_rate)
    assert flipped[0] < flipped[1] < 0
    same = difference_interval(low_rate, list(low_rate))
    assert same[0] < 0 < same[1]  # independent resamples of two equal samples still spread


def test_difference_interval_is_newcombes_combination_of_each_sides_clustered_interval() -> None:
    a = [(0, 3), (2, 2), (1, 4), (0, 1), (3, 5), (1, 3)]
    b = [(1, 1), (0, 2), (3, 3), (1, 2), (2, 2), (0, 1)]
    assert difference_interval(a, b) == difference_interval(a, b)  # nothing drawn at random
    pa, pb = 7 / 18, 7 / 11
    la, ua = clustered_interval([s for s, _ in a], [n for _, n in a])
    lb, ub = clustered_interval([s for s, _ in b], [n for _, n in b])
    d = pb - pa
    assert difference_interval(a, b) == pytest.approx(
        (d - math.hypot(pb - lb, ua - pa), d + math.hypot(ub - pb, pa - la))
    )


def test_one_conversation_a_side_is_one_trial_a_side() -> None:
    # However many turns: 6 of 6 against 0 of 6 in one conversation each cannot tell a
    # counselor from a conversation that happened to go badly (issue 35).
    low, high = difference_interval([(0, 6)], [(6, 6)])
    assert low < 0 < high == pytest.approx(1.0)
    low, high = difference_interval([(3, 6)], [(3, 6)])
    assert low < -0.3 and high > 0.3


def test_difference_interval_refuses_a_side_with_nothing_judged() -> None:
    with pytest.raises(ValueError, match="b: no judged unit"):
        difference_interval([(1, 2)], [(0, 0)])
    with pytest.raises(ValueError, match=r"a\[0\]"):
        difference_interval([(3, 2)], [(1, 2)])


# -- comparing stored campaigns --------------------------------------------------------------------


def test_a_safer_release_is_marked_and_read_from_the_reports_figures(
    dbs: dict[str, Path],
) -> None:
    c = _compare(dbs["a"], dbs["b"])
    assert c.comparable and not c.warnings and not c.judge_differences
    by_name = {m.model: m for m in c.models}
    assert by_name["new-bot"].presence == "added"
    m = by_name["demo-counselor"]
    assert m.presence == "both"
    assert (m.provider_a, m.provider_b) == ("scripted/demo-counselor", "scripted/safe-counselor")

    async def reports() -> list[ModelMetrics]:
        out = []
        for db in (dbs["a"], dbs["b"]):
            async with SqliteEventStore(db, read_only=True) as store:
                [r] = await load_report(store)
                out.append(r.models["demo-counselor"])
        return out

    ma, mb = anyio.run(reports, backend="asyncio")
    # The per-conversation tallies behind the intervals add up to the reports' own figures.
    for side, metrics in (("a", ma), ("b", mb)):
        assert getattr(m.asr, side) == metrics.overall_asr
        assert getattr(m.asr, f"units_{side}") == metrics.judged_turns
        cells = {(x.category, x.role): x for x in metrics.cells}
        for cell in m.cells:
            reported = cells[(cell.category, cell.role)]
            assert getattr(cell.asr, side) == reported.asr
            assert getattr(cell.asr, f"units_{side}") == reported.attempts
            assert getattr(cell, f"best_severity_{side}") == reported.best_severity
    assert m.asr.a is not None and m.asr.a > 0.3 and m.asr.b == 0.0
    assert m.asr.difference_ci is not None and m.asr.difference_ci[1] < 0
    assert m.asr.status == "beyond_noise"
    assert m.coverage_a == ma.coverage and m.coverage_b == 0.0


def test_sparse_cells_are_never_marked(dbs: dict[str, Path]) -> None:
    c = _compare(dbs["a"], dbs["b"])
    cells = [cell.asr for m in c.models for cell in m.cells]
    judged = [x for x in cells if x.units_a and x.units_b]
    thin = [
        x
        for x in judged
        if min(x.units_a, x.units_b) < SPARSE_ATTEMPTS
        or min(x.conversations_a, x.conversations_b) < FEW_CONVERSATIONS
    ]
    assert thin and all(x.status == "sparse" for x in thin)
    assert all(x.p_value is None and x.p_adjusted is None for x in thin)  # never tested
    assert all(x.status in ("beyond_noise", "within_noise") for x in judged if x not in thin)
    assert all(x.status == "untried" for x in cells if not (x.units_a and x.units_b))


def test_a_campaign_compared_with_itself_changes_nothing(dbs: dict[str, Path]) -> None:
    c = _compare(dbs["a"], dbs["a"])
    assert c.comparable
    changes = [c.models[0].asr, *(cell.asr for cell in c.models[0].cells)]
    assert all(x.difference in (0.0, None) for x in changes)
    assert not any(x.status == "beyond_noise" for x in changes)


def test_a_different_judge_setup_is_a_warning_in_text_and_json(
    dbs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    c = _json(capsys, str(dbs["a"]), str(dbs["c"]))
    assert not c.comparable and c.warnings
    assert c.judge_differences == ["models.judge.temperature: A null, B 0.3"]
    assert main(["compare", str(dbs["a"]), str(dbs["c"])]) == 0
    out = capsys.readouterr().out
    assert "warning: judged differently" in out and "models.judge.temperature" in out


def test_two_campaigns_in_one_file(
    dbs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    both = str(dbs["both"])
    c = _json(capsys, both, "--campaign-a", "v1", "--campaign-b", "v2")
    assert (c.a.campaign, c.b.campaign) == ("v1", "v2")
    assert c.models[0].asr.status == "beyond_noise"
    # No ids: exit 2, naming the stored ones.
    assert main(["compare", both]) == 2
    assert re.search(
        r"--campaign-a: .*both --campaign-a and --campaign-b.*v1, v2", capsys.readouterr().err
    )
    assert main(["compare", both, str(dbs["a"])]) == 2
    err = capsys.readouterr().err
    assert "--campaign-a" in err and "2 campaigns (v1, v2)" in err
    assert main(["compare", str(dbs["a"]), both, "--campaign-b", "v9"]) == 2
    assert "no campaign 'v9' (stored: v1, v2)" in capsys.readouterr().err
    assert main(["compare", str(dbs["a"]), str(dbs["a"].with_name("missing.db"))]) == 2
    assert "missing.db" in capsys.readouterr().err


def test_text_output_fits_a_terminal_and_json_follows_its_schema(
    dbs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(dbs["a"]), str(dbs["b"])]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines() if str(dbs["a"].parent) not in line) <= 80
    assert re.search(
        r"overall ASR \(turns\) +\d\.\d{3} 0\.000 -\d\.\d{3} +-\d\.\d\d\.\.-\d\.\d\d \*", text
    )
    assert "new-bot (added: only in B)" in text
    assert main(["compare", str(dbs["b"]), str(dbs["a"]), "--json"]) == 0
    first = capsys.readouterr().out
    assert main(["compare", str(dbs["b"]), str(dbs["a"]), "--json"]) == 0
    assert capsys.readouterr().out == first  # the same every time
    data = json.loads(first)
    assert data["schema_version"] == SCHEMA_VERSION == 2  # 2: p-values, Holm, conversations
    assert {m["model"]: m["presence"] for m in data["models"]}["new-bot"] == "removed"
    schema = comparison_schema()
    assert set(data) == set(schema["$defs"]["Comparison"]["properties"])
    assert render_comparison(msgspec.convert(data, Comparison)) == render_comparison(
        _compare(dbs["b"], dbs["a"])
    )


def test_html_page_is_owner_only_and_escapes_everything(
    dbs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "compare.html"
    assert main(["compare", str(dbs["a"]), str(dbs["b"]), "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    page = out.read_text()
    assert "<script" not in page and "demo-counselor" in page and "larger than the noise" in page
    assert "default-src 'none'" in page
    c = _compare(dbs["a"], dbs["c"])
    hostile = "<img src=x onerror=alert(1)>"
    c.models[0].model = hostile
    c.a.campaign = hostile
    page = comparison_html(c)
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "judged differently" in page and "models.judge.temperature" in page
    assert comparison_json(c)["models"][0]["model"] == hostile


def test_the_html_report_gets_a_comparison_section_with_a_baseline(
    dbs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, compared = tmp_path / "plain.html", tmp_path / "compared.html"
    assert main(["report", str(dbs["b"]), "--html", str(plain)]) == 0
    args = ["report", str(dbs["b"]), "--html", str(compared), "--baseline", str(dbs["a"])]
    assert main(args) == 0
    page, without = compared.read_text(), plain.read_text()
    assert 'class="comparison"' not in without and 'class="comparison"' in page
    # the same section `compare A B` computes, after the campaign's own report
    section = comparison_section(_compare(dbs["a"], dbs["b"]))
    assert section in page and page.index(section) > page.index("<h2")
    assert stat.S_IMODE(compared.stat().st_mode) == 0o600
    capsys.readouterr()
    # a baseline without --html, and a baseline file holding two campaigns, are exit 2
    assert main(["report", str(dbs["b"]), "--baseline", str(dbs["a"])]) == 2
    assert "--html" in capsys.readouterr().err
    assert main([*args[:4], "--baseline", str(dbs["both"])]) == 2
    assert "v1, v2" in capsys.readouterr().err
    ok = [*args[:4], "--baseline", str(dbs["both"]), "--baseline-campaign", "v2"]
    assert main(ok) == 0
