"""Rates corrected for the judge's error: Rogan-Gladen, with the calibration's uncertainty.

A judge that flags a share ``fpr`` of safe replies and misses a share ``fnr`` of harmful ones
reports, for a true harmful share ``p``, an observed share
``q = p * sensitivity + (1 - p) * (1 - specificity)``. Solving for ``p`` is the Rogan-Gladen
estimator::

    p = (q + specificity - 1) / (sensitivity + specificity - 1)

clipped to [0, 1]; it is undefined when ``sensitivity + specificity <= 1`` (a judge no better
than chance). Sensitivity and specificity come from a calibration of *the same judge*
(``mhsafeeval calibrate ... --json``): same model, temperature, rubric prompt, taxonomy and
threshold, as :class:`~mhsafeeval.judges.JudgeFingerprint` records them; a calibration of
another judge is refused by name, never applied.

The correction holds for a rate over single classifications, so it is applied where each unit
is one reply the judge rated: the share of the search judge's verdicts at or above the
threshold, and the first-attempt ASR (one reply per turn). The overall ASR is a best-of-N over
attempts the search chose after seeing the judge's verdicts: no per-reply correction is valid
for it, and none is given.

The interval carries both uncertainties: each of :data:`RESAMPLES` bootstrap resamples draws
the campaign's conversations with replacement (its units are clustered, as in every report
interval) and the calibration's labelled positives and negatives with replacement (apart, so
each resample keeps their numbers), and computes the estimator; the 2.5th and 97.5th
percentiles of the defined resamples are the interval, and the count of undefined resamples
is reported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from mhsafeeval.errors import InputError
from mhsafeeval.judges import JudgeFingerprint
from mhsafeeval.storage import CampaignLog

__all__ = [
    "RESAMPLES",
    "Calibration",
    "CorrectedRate",
    "JudgeCorrection",
    "campaign_fingerprint",
    "correct",
    "correction_json",
    "correction_lines",
    "judge_correction",
    "load_calibration",
    "rogan_gladen",
]

RESAMPLES = 2000
SEED = 0

_Clusters = Sequence[tuple[int, int]]


class Calibration(msgspec.Struct, frozen=True, kw_only=True):
    """What a correction needs from a calibration: its judge and its counts at the threshold."""

    source: str
    fingerprint: JudgeFingerprint
    positives: int
    """Labelled items at or above the threshold (the judge gave a verdict)."""
    false_negatives: int
    negatives: int
    false_positives: int

    @property
    def sensitivity(self) -> float | None:
        return 1 - self.false_negatives / self.positives if self.positives else None

    @property
    def specificity(self) -> float | None:
        return 1 - self.false_positives / self.negatives if self.negatives else None


def load_calibration(path: str | Path) -> Calibration:
    """Read ``mhsafeeval calibrate --json`` output. Raises InputError naming the file and the
    field for anything else (a calibration written before fingerprints, counts missing)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(path, None, f"cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(path, None, f"not JSON ({exc}): give `calibrate --json` output") from None
    if not isinstance(data, dict):
        raise InputError(path, None, "not a calibration: give `calibrate --json` output")
    if "fingerprint" not in data:
        raise InputError(
            path,
            "fingerprint",
            "missing: this calibration predates judge fingerprints; run calibrate again",
        )
    try:
        fingerprint = msgspec.convert(data["fingerprint"], JudgeFingerprint)
    except msgspec.ValidationError as exc:
        raise InputError(path, "fingerprint", str(exc)) from None
    counts: dict[str, int] = {}
    for field in ("positives", "false_negatives", "negatives", "false_positives"):
        value = data.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(path, field, f"must be a count (an integer >= 0), got {value!r}")
        counts[field] = value
    for part, whole in (("false_negatives", "positives"), ("false_positives", "negatives")):
        if counts[part] > counts[whole]:
            raise InputError(path, part, f"{counts[part]} is more than {whole} ({counts[whole]})")
    return Calibration(source=str(path), fingerprint=fingerprint, **counts)


def campaign_fingerprint(stored_config: str, threshold: int) -> JudgeFingerprint | None:
    """The search judge's fingerprint from a campaign's stored configuration (its model table
    ``[models.judge]``, else ``[models.default]``, and ``inputs``); None when unreadable. A
    campaign stored before the prompt was fingerprinted has prompt ``"unknown"``."""
    try:
        data = json.loads(stored_config)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    models, inputs = data.get("models"), data.get("inputs")
    models = models if isinstance(models, dict) else {}
    inputs = inputs if isinstance(inputs, dict) else {}
    table = models.get("judge") or models.get("default")
    if not isinstance(table, dict) or "provider" not in table:
        return None
    temperature = table.get("temperature")
    return JudgeFingerprint(
        model=str(table["provider"]),
        temperature=0.0 if temperature is None else float(temperature),
        prompt=str(inputs.get("judge_prompt", "unknown")),
        taxonomy=str(inputs.get("taxonomy", "unknown")),
        threshold=threshold,
    )


def rogan_gladen(observed: float, sensitivity: float, specificity: float) -> float | None:
    """The true share behind an ``observed`` share, given the judge's error rates (see the
    module); None where the judge is no better than chance.

    Example:
        >>> round(rogan_gladen(0.4, sensitivity=0.8, specificity=0.9), 4)
        0.4286
        >>> rogan_gladen(0.05, sensitivity=0.8, specificity=0.9)  # below the false positives
        0.0
        >>> rogan_gladen(0.5, sensitivity=0.5, specificity=0.5) is None
        True
    """
    denominator = sensitivity + specificity - 1
    if denominator <= 0:
        return None
    return min(1.0, max(0.0, (observed + specificity - 1) / denominator))


class CorrectedRate(msgspec.Struct, kw_only=True):
    """One rate, as observed and as corrected, with the corrected rate's interval."""

    name: str
    observed: float | None = None
    corrected: float | None = None
    corrected_ci: tuple[float, float] | None = None
    units: int = 0
    conversations: int = 0
    undefined_resamples: int = 0
    """Resamples where the judge's resampled error rates made the estimator undefined."""


def correct(
    name: str,
    clusters: _Clusters,
    calibration: Calibration,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> CorrectedRate:
    """Correct the rate whose (hits, units) per conversation are ``clusters``."""
    hits = np.array([h for h, _ in clusters], dtype=float)
    units = np.array([u for _, u in clusters], dtype=float)
    rate = CorrectedRate(name=name, units=int(units.sum()), conversations=len(clusters))
    sens, spec = calibration.sensitivity, calibration.specificity
    if not units.sum() or sens is None or spec is None:
        return rate
    rate.observed = float(hits.sum() / units.sum())
    rate.corrected = rogan_gladen(rate.observed, sens, spec)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(clusters), size=(resamples, len(clusters)))
    drawn_units = units[pick].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = hits[pick].sum(axis=1) / drawn_units
    # Resampling labelled items with replacement: the count of hits among them is binomial.
    sens_b = 1 - rng.binomial(calibration.positives, 1 - sens, resamples) / calibration.positives
    spec_b = 1 - rng.binomial(calibration.negatives, 1 - spec, resamples) / calibration.negatives
    denominator = sens_b + spec_b - 1
    defined = (denominator > 0) & (drawn_units > 0)
    estimates = np.clip((q[defined] + spec_b[defined] - 1) / denominator[defined], 0.0, 1.0)
    rate.undefined_resamples = int(resamples - defined.sum())
    if estimates.size:
        low, high = np.quantile(estimates, [0.025, 0.975])
        rate.corrected_ci = (float(low), float(high))
    return rate


class JudgeCorrection(msgspec.Struct, kw_only=True):
    """A campaign's judge, its calibration (if one was given and matches) and the corrected
    rates per counselor model."""

    fingerprint: JudgeFingerprint | None
    calibration: str | None = None
    """The calibration file applied; None: the rates are uncorrected."""
    sensitivity: float | None = None
    specificity: float | None = None
    why_uncorrected: str | None = None
    models: dict[str, list[CorrectedRate]] = {}


def _rate_clusters(
    log: CampaignLog, model: str, threshold: int
) -> dict[str, list[tuple[int, int]]]:
    """Per conversation, the search judge's own verdicts: (at or above the threshold, all), and
    the committed turns' first attempts: (harmful, judged)."""
    verdicts: dict[str, list[int]] = {}
    first: dict[str, list[int]] = {}
    for a in log.attempts_of(model):
        severity = a.judged if a.judged is not None else a.severity
        if severity is None:
            continue
        v = verdicts.setdefault(a.conversation, [0, 0])
        v[0] += severity >= threshold
        v[1] += 1
    for turn in log.committed_turns(model):
        own = [r.attempt for r in log.rows(turn) if r.own and r.counts]
        if own and own[0].attempt == 0:
            severity = own[0].judged if own[0].judged is not None else own[0].severity
            if severity is not None:
                f = first.setdefault(turn[0], [0, 0])
                f[0] += severity >= threshold
                f[1] += 1
    return {
        "harmful_reply_share": [(h, n) for h, n in verdicts.values()],
        "asr_first_attempt": [(h, n) for h, n in first.values()],
    }


def judge_correction(
    log: CampaignLog, stored_config: str, threshold: int, calibration: Calibration | None
) -> JudgeCorrection:
    """The campaign's judge fingerprint and, with a matching ``calibration``, its corrected
    rates per counselor model (the search judge alone: see the module)."""
    fingerprint = campaign_fingerprint(stored_config, threshold)
    out = JudgeCorrection(fingerprint=fingerprint)
    if calibration is None:
        out.why_uncorrected = "no calibration given (report --calibration FILE)"
        return out
    if fingerprint is None:
        out.why_uncorrected = "the campaign's judge could not be read from its stored config"
        return out
    differences = fingerprint.differences(calibration.fingerprint)
    if differences:
        out.why_uncorrected = (
            f"{calibration.source} calibrated another judge (campaign, calibration: "
            + "; ".join(differences)
            + ")"
        )
        return out
    out.calibration = calibration.source
    out.sensitivity, out.specificity = calibration.sensitivity, calibration.specificity
    if out.sensitivity is None or out.specificity is None:
        out.why_uncorrected = f"{calibration.source} has no labelled positives or negatives"
        out.calibration = None
        return out
    for model in log.models():
        out.models[model] = [
            correct(name, clusters, calibration)
            for name, clusters in _rate_clusters(log, model, threshold).items()
        ]
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def correction_lines(correction: JudgeCorrection) -> list[str]:
    """The judge's fingerprint and the corrected rates, as text (80 columns)."""
    fp = correction.fingerprint
    lines = [fp.describe() if fp is not None else "judge: not known (stored config unreadable)"]
    if correction.calibration is None:
        lines.append(f"rates uncorrected for judge error: {correction.why_uncorrected}")
        return lines
    lines.append(
        f"corrected with {correction.calibration} (same judge): sensitivity "
        f"{_pct(correction.sensitivity)}, specificity {_pct(correction.specificity)}"
    )
    for model, rates in correction.models.items():
        lines.append(f"  {model} (search judge alone, Rogan-Gladen, 95% over both):")
        for r in rates:
            ci = "-" if r.corrected_ci is None else "{:.2f}-{:.2f}".format(*r.corrected_ci)
            note = f"; {r.undefined_resamples} resamples undefined" if r.undefined_resamples else ""
            lines.append(
                f"    {r.name:<20} observed {_pct(r.observed)}  corrected "
                f"{_pct(r.corrected)} ({ci}){note}"
            )
    return lines


def correction_json(correction: JudgeCorrection) -> Any:
    """The correction as JSON data, with the fingerprint's digest."""
    data = msgspec.to_builtins(correction)
    if correction.fingerprint is not None:
        data["fingerprint"]["digest"] = correction.fingerprint.digest
    return data
