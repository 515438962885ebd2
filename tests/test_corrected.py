"""Rates corrected for the judge's error (Rogan-Gladen) and the judge fingerprint behind them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from helpers import cli
from mhsafeeval.judges import JudgeFingerprint, judge_fingerprint, prompt_digest
from mhsafeeval.reports.corrected import (
    Calibration,
    campaign_fingerprint,
    correct,
    load_calibration,
    rogan_gladen,
)
from mhsafeeval.testing import scripted_models

FP = JudgeFingerprint(model="m", temperature=0.0, prompt="p", taxonomy="t", threshold=2)


def calibration(positives: int, fn: int, negatives: int, fp: int) -> Calibration:
    return Calibration(
        source="cal.json",
        fingerprint=FP,
        positives=positives,
        false_negatives=fn,
        negatives=negatives,
        false_positives=fp,
    )


def test_the_corrected_rate_is_the_hand_computation() -> None:
    # 10 conversations of 4 replies, 14 flagged: q = 14/40 = 0.35. Calibration: 40 of 50
    # positives found (sensitivity 0.8), 9 of 60 negatives flagged (specificity 0.85).
    clusters = [(2, 4)] * 4 + [(1, 4)] * 6
    cal = calibration(50, 10, 60, 9)
    rate = correct("harmful_reply_share", clusters, cal, resamples=4000)
    q, sens, spec = 14 / 40, 0.8, 0.85
    assert rate.observed == pytest.approx(q)
    assert rate.corrected == pytest.approx((q + spec - 1) / (sens + spec - 1))  # 0.3077
    assert rate.corrected == pytest.approx(rogan_gladen(q, sens, spec))
    assert rate.corrected_ci is not None and rate.corrected is not None
    low, high = rate.corrected_ci
    assert low < rate.corrected < high
    # The calibration's uncertainty widens the interval: the same campaign with a calibration
    # 100 times larger (the same rates) gives a narrower one.
    large = correct("x", clusters, calibration(5000, 1000, 6000, 900), resamples=4000)
    assert large.corrected == pytest.approx(rate.corrected)
    assert large.corrected_ci is not None
    assert large.corrected_ci[1] - large.corrected_ci[0] < 0.8 * (high - low)


def test_the_interval_covers_the_truth_when_both_are_sampled() -> None:
    """A simulation: true share 0.3, a judge with sensitivity 0.8 and specificity 0.9; 200
    campaigns of 30 conversations x 5 replies and calibrations of 40 + 60 items."""
    rng = np.random.default_rng(7)
    hits = 0
    trials = 200
    for i in range(trials):
        truth = rng.random((30, 5)) < 0.3
        flagged = np.where(truth, rng.random((30, 5)) < 0.8, rng.random((30, 5)) < 0.1)
        clusters = [(int(row.sum()), 5) for row in flagged]
        fn = int(rng.binomial(40, 0.2))
        fp = int(rng.binomial(60, 0.1))
        rate = correct("x", clusters, calibration(40, fn, 60, fp), resamples=1000, seed=i)
        assert rate.corrected_ci is not None
        hits += rate.corrected_ci[0] <= 0.3 <= rate.corrected_ci[1]
    assert hits / trials >= 0.9


def test_the_fingerprint_changes_when_the_prompt_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    from mhsafeeval.judges import _prompt

    before = judge_fingerprint("litellm/openai/gpt-4o-mini", None, "tax", 2)
    monkeypatch.setattr(_prompt, "_SYSTEM", _prompt._SYSTEM + " Be strict.")
    after = judge_fingerprint("litellm/openai/gpt-4o-mini", None, "tax", 2)
    assert before.prompt != after.prompt and before.digest != after.digest
    assert before.differences(after) == [f"prompt: {before.prompt!r}, {after.prompt!r}"]
    # and it is what a campaign stores (inputs.judge_prompt)
    from mhsafeeval.config import parse_config
    from mhsafeeval.plan import build_plan, stored_config

    text = '[campaign]\nname = "fp"\n' + scripted_models()
    config = parse_config(text, "fp.toml")
    stored = stored_config(config, build_plan(config, "fp.toml"))
    fp = campaign_fingerprint(stored, 2)
    assert fp is not None and fp.prompt == prompt_digest() == after.prompt
    monkeypatch.undo()
    assert campaign_fingerprint(stored_config(config, build_plan(config, "fp.toml")), 2) == (
        msgspec.structs.replace(fp, prompt=before.prompt)
    )


def test_report_corrects_only_with_a_calibration_of_the_same_judge(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[campaign]\nname = "cal"\nmax_turns = 2\nprofile_ids = ["grief-widower", '
        '"panic-disorder-bus-driver", "ocd-contamination-accountant"]\n' + scripted_models()
    )
    db = tmp_path / "c.db"
    assert cli("run", str(config), "--db", str(db), "--quiet").returncode == 0
    plain = cli("report", str(db))
    assert plain.returncode == 0
    assert "rates uncorrected for judge error: no calibration given" in plain.stdout
    assert "judge " in plain.stdout and "scripted/demo-judge" in plain.stdout

    def calibrated(threshold: int) -> Path:
        out = cli(
            "calibrate",
            "--judge",
            "scripted/demo-judge",
            "--db",
            str(tmp_path / "cal.db"),
            "--threshold",
            str(threshold),
            "--json",
            "--quiet",
        )
        assert out.returncode == 0, out.stderr
        path = tmp_path / f"cal{threshold}.json"
        path.write_text(out.stdout)
        return path

    same = calibrated(2)
    data = json.loads(same.read_text())
    assert data["fingerprint"]["prompt"] == prompt_digest()
    done = cli("report", str(db), "--calibration", str(same))
    assert done.returncode == 0, done.stderr
    assert "(same judge): sensitivity" in done.stdout
    assert "harmful_reply_share" in done.stdout and "asr_first_attempt" in done.stdout
    as_json = json.loads(cli("report", str(db), "--calibration", str(same), "--json").stdout)
    judge = as_json["cal"]["judge"]
    assert judge["calibration"] == str(same)
    (rates,) = judge["models"].values()
    cal = load_calibration(same)
    for r in rates:
        assert r["corrected"] == pytest.approx(
            rogan_gladen(r["observed"], cal.sensitivity or 0, cal.specificity or 0)
        )
    other = cli("report", str(db), "--calibration", str(calibrated(3)))
    assert other.returncode == 0
    assert "calibrated another judge" in other.stdout and "threshold: 2, 3" in other.stdout
    # A file that is not a calibration: exit 2, naming the file and the field.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in data.items() if k != "fingerprint"}))
    refused = cli("report", str(db), "--calibration", str(bad))
    assert refused.returncode == 2
    assert str(bad) in refused.stderr and "fingerprint" in refused.stderr
