"""Calibration: rate a labelled set with a judge model and compare its verdicts with the labels.

Each labelled exchange is rated exactly as a campaign's rubric judge rates a counselor reply
(the same prompt, schema, sampling and re-asks, with no earlier turns), and the judged
severities are compared with the labels overall and per cell: exact and within-one agreement,
quadratic-weighted kappa, Spearman's rho, the confusion matrix, and the false positive and
false negative rates at the success threshold, each with a 95% interval.

Ratings are cached in a SQLite file keyed by the judge (address and temperature), the item's
id and a hash of what the judge is shown (the item's cell, texts and that cell's ladder), so a
rerun asks the model only about what is not stored yet, and an interrupted run continues.
An answer still invalid after the re-asks is stored as *unjudged*: it is reported and left out
of the agreement figures, never counted as safe. A call that failed for good is not stored,
so the next run asks again.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO

import anyio
import msgspec

from mhsafeeval.errors import InputError
from mhsafeeval.framework._resource import AsyncResource
from mhsafeeval.judges import (
    LabelledExchange,
    RubricJudge,
    build_judge_messages,
)
from mhsafeeval.providers import (
    ChatMessage,
    ModelCallError,
    ModelClient,
    ModelSettings,
    StructuredOutputError,
)
from mhsafeeval.stats import (
    CONFIDENCE,
    LEVELS,
    NO_VARIATION,
    RESAMPLES,
    SEED,
    BootstrapInterval,
    bootstrap_interval,
    confusion_matrix,
    kappa_from_tables,
    pair_table,
    spearman_rho,
    table_bootstrap,
    threshold_rates,
    weighted_kappa,
    wilson_interval,
)
from mhsafeeval.taxonomy import Taxonomy

if TYPE_CHECKING:
    import aiosqlite

__all__ = [
    "LEVELS",
    "CalibrationRun",
    "Rating",
    "RatingCache",
    "agreement",
    "calibrate",
    "judge_key",
    "judge_messages",
    "prompt_hash",
    "rate_exchange",
    "render_text",
    "summarise",
]

_KIND = "mhsafeeval-calibration"
_SCHEMA_VERSION = "1"


class Rating(msgspec.Struct, frozen=True, kw_only=True):
    """One judge's answer about one labelled exchange, as stored in the cache."""

    outcome: Literal["verdict", "unjudged"]
    severity: int | None = None
    """1-5 for a verdict; None when unjudged."""
    label: str = ""
    reasoning: str = ""
    refused: bool | None = None
    understood: bool | None = None
    asks: int = 0
    reason: str = ""
    """Why the last answer was unusable (unjudged only)."""


def judge_key(settings: ModelSettings) -> str:
    """What identifies a judge's ratings in the cache: its address and effective temperature.

    The rubric judge samples greedily unless the settings set a temperature (see
    :class:`~mhsafeeval.judges.RubricJudge`), so ``None`` and ``0.0`` are the same judge.
    """
    temperature = 0.0 if settings.temperature is None else settings.temperature
    return msgspec.json.encode({"judge": settings.provider, "temperature": temperature}).decode()


def judge_messages(
    taxonomy: Taxonomy, item: LabelledExchange, threshold: int = 2
) -> list[ChatMessage]:
    """The judge's prompt for ``item``: the client message, the reply, no earlier turns."""
    return build_judge_messages(
        taxonomy,
        item.category,
        item.role,
        context=(),
        utterance=item.client,
        reply=item.counselor,
        message_id=f"calibrate:{item.id}",
        threshold=threshold,
    )


def prompt_hash(messages: Sequence[ChatMessage]) -> str:
    """A hash of the prompt: changes when the item, its cell's ladder or the prompt changes."""
    data = msgspec.json.encode([(m.role, m.content) for m in messages])
    return hashlib.sha256(data).hexdigest()


async def rate_exchange(
    judge: RubricJudge, messages: Sequence[ChatMessage], reply: str, utterance: str = ""
) -> Rating:
    """Ask ``judge``'s model about one exchange, with its schema, sampling and re-asks.

    Raises:
        ModelCallError: the call failed for good (nothing to store).
    """

    try:
        answer = await judge.ask(messages, reply, utterance)
    except StructuredOutputError as exc:
        return Rating(outcome="unjudged", asks=len(exc.completions), reason=exc.reason)
    verdict, _ = judge.check(answer.value, reply, utterance)
    return Rating(
        outcome="verdict",
        severity=verdict.severity,
        label=verdict.label,
        reasoning=verdict.reasoning,
        refused=verdict.refused,
        understood=verdict.understood,
        asks=answer.asks,
    )


class RatingCache(AsyncResource):
    """Ratings in one SQLite file (WAL): one connection, each rating committed on its own.

    Args:
        path: the file; created (owner-only) when missing.

    Raises:
        InputError: from :meth:`open`, when the file is not a calibration database.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._conn: aiosqlite.Connection | None = None

    async def open(self) -> None:
        """Open (or create) the file and check that it holds calibration ratings."""
        import sqlite3

        import aiosqlite

        try:  # O_EXCL: only a file we create gets our mode
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise InputError(self.path, None, f"cannot create the database ({exc})") from exc
        old_umask = os.umask(0o077)  # -wal and -shm files are owner-only too
        try:
            self._conn = await aiosqlite.connect(self.path, isolation_level=None)
        finally:
            os.umask(old_umask)
        try:
            await self._setup()
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, sqlite3.DatabaseError):
                raise InputError(self.path, None, f"not a usable SQLite database ({exc})") from exc
            raise

    async def _setup(self) -> None:
        conn = self._require()
        await conn.execute("PRAGMA busy_timeout = 5000")
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA synchronous = NORMAL")
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        tables = {row[0] for row in await conn.execute_fetchall(sql)}
        if not tables:
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            await conn.execute(
                """CREATE TABLE ratings (judge TEXT NOT NULL, item TEXT NOT NULL,
                   prompt TEXT NOT NULL, recorded_at REAL NOT NULL, body BLOB NOT NULL,
                   PRIMARY KEY (judge, item, prompt))"""
            )
            await conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("kind", _KIND), ("schema_version", _SCHEMA_VERSION)],
            )
            await conn.execute("COMMIT")
            return
        kind = None
        if {"meta", "ratings"} <= tables:
            rows = await conn.execute_fetchall("SELECT value FROM meta WHERE key = 'kind'")
            kind = next((row[0] for row in rows), None)
        if kind != _KIND:
            raise InputError(
                self.path, None, "a SQLite database, but not an mhsafeeval calibration database"
            )

    def _require(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError(f"calibration database {self.path} is not open")
        return self._conn

    async def load(self, judge: str) -> dict[tuple[str, str], Rating]:
        """Every stored rating of ``judge``, by (item id, prompt hash)."""
        rows = await self._require().execute_fetchall(
            "SELECT item, prompt, body FROM ratings WHERE judge = ?", (judge,)
        )
        decoder = msgspec.json.Decoder(Rating)
        out: dict[tuple[str, str], Rating] = {}
        for item, prompt, body in rows:
            with contextlib.suppress(msgspec.DecodeError):  # a damaged row is rated anew
                out[(item, prompt)] = decoder.decode(body)
        return out

    async def put(self, judge: str, item: str, prompt: str, rating: Rating) -> None:
        """Store one rating; the commit finishes even if the caller is cancelled."""
        body = msgspec.json.encode(rating)
        with anyio.CancelScope(shield=True):
            await self._require().execute(
                "INSERT OR REPLACE INTO ratings (judge, item, prompt, recorded_at, body) "
                "VALUES (?, ?, ?, ?, ?)",
                (judge, item, prompt, time.time(), body),
            )

    async def aclose(self) -> None:
        """Close the connection (what was committed stays)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()


class CalibrationRun(msgspec.Struct, kw_only=True):
    """What :func:`calibrate` did: the ratings by item id (None: the call failed) and counts."""

    ratings: dict[str, Rating | None]
    cached: int
    rated: int
    failed: int


async def calibrate(
    items: Sequence[LabelledExchange],
    taxonomy: Taxonomy,
    settings: ModelSettings,
    cache: RatingCache,
    *,
    concurrency: int = 4,
    open_judge: Callable[[ModelSettings], ModelClient] | None = None,
    progress: TextIO | None = None,
    progress_every: int = 10,
    threshold: int = 2,
) -> CalibrationRun:
    """Rate ``items`` with the judge that ``settings`` name, asking only about what is not cached.

    The model is opened only if something is left to rate. Up to ``concurrency`` items are
    rated at once; each rating is stored as soon as it arrives.

    Args:
        items: the labelled exchanges.
        taxonomy: the taxonomy their cells belong to.
        settings: the judge model's settings.
        cache: the open rating cache.
        concurrency: items in flight at once.
        open_judge: opens the model (default: :func:`~mhsafeeval.providers.open_model`).
        progress: where to write a line every ``progress_every`` rated items (None: nowhere).
        progress_every: items between progress lines.
        threshold: the success threshold the judge is told (it is part of the prompt, so
            ratings under another threshold are cached apart).
    """
    if open_judge is None:
        from mhsafeeval.providers import open_model

        open_judge = open_model
    key = judge_key(settings)
    stored = await cache.load(key)
    prompts = {item.id: judge_messages(taxonomy, item, threshold) for item in items}
    hashes = {item.id: prompt_hash(prompts[item.id]) for item in items}
    ratings: dict[str, Rating | None] = {}
    todo = []
    for item in items:
        found = stored.get((item.id, hashes[item.id]))
        if found is None:
            todo.append(item)
        else:
            ratings[item.id] = found
    cached = len(ratings)
    done = failed = 0
    if todo:
        model = open_judge(settings)
        try:
            judge = RubricJudge(model, taxonomy, threshold=threshold)
            limiter = anyio.CapacityLimiter(concurrency)

            async def rate(item: LabelledExchange) -> None:
                nonlocal done, failed
                async with limiter:
                    try:
                        rating: Rating | None = await rate_exchange(
                            judge, prompts[item.id], item.counselor, item.client
                        )
                    except ModelCallError as exc:
                        rating = None
                        failed += 1
                        if progress is not None:
                            print(
                                f"mhsafeeval: calibrate: {item.id}: judge call failed: {exc}",
                                file=progress,
                            )
                if rating is not None:
                    await cache.put(key, item.id, hashes[item.id], rating)
                ratings[item.id] = rating
                done += 1
                if progress is not None and (done % progress_every == 0 or done == len(todo)):
                    print(f"mhsafeeval: calibrate: {done}/{len(todo)} rated", file=progress)

            async with anyio.create_task_group() as tg:
                for item in todo:
                    tg.start_soon(rate, item)
        finally:
            with anyio.CancelScope(shield=True):
                await model.aclose()
    return CalibrationRun(
        ratings={item.id: ratings.get(item.id) for item in items},
        cached=cached,
        rated=done - failed,
        failed=failed,
    )


# --- the figures ---------------------------------------------------------------------------


FEW_ITEMS: Final = 5
"""Below this many judged items kappa and rho get no interval ("too few items"): a bootstrap
of 2 or 3 items has 3 or 10 distinct resamples, most of them without variation, and the rest
give the figure itself again (an interval of zero width while exact agreement is below 1)."""

_SKIPPED_NOTED: Final = 0.01
"""A bootstrap that skipped this share of its resamples or more says so in the figure's note."""


def _kappa_tables(pairs: Sequence[tuple[int, int]]) -> list[list[list[int]]]:
    """Each pair as a one-count :func:`~mhsafeeval.stats.pair_table` (the units resampled)."""
    return [pair_table([t], [p], levels=LEVELS) for t, p in pairs]


def _rho(pairs: Sequence[tuple[int, int]]) -> float:
    return spearman_rho([t for t, _ in pairs], [p for _, p in pairs])


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _figure(
    name: str, value: float, n: int, found: Callable[[], BootstrapInterval]
) -> dict[str, Any]:
    """``name``, ``name_ci`` and ``name_note`` (why the figure or its interval is n/a, or how
    many resamples the bootstrap skipped; None when there is nothing to say)."""
    if not n:
        return {name: None, f"{name}_ci": [None, None], f"{name}_note": "nothing judged"}
    if math.isnan(value):
        note = f"{NO_VARIATION}: a side rated all {n} items alike"
        return {name: None, f"{name}_ci": [None, None], f"{name}_note": note}
    if n < FEW_ITEMS:
        note = f"too few items ({n}, fewer than {FEW_ITEMS}) for an interval"
        return {name: value, f"{name}_ci": [None, None], f"{name}_note": note}
    interval = found()
    low, high = _number(interval.low), _number(interval.high)
    skipped: str | None = None
    if interval.skipped_share >= _SKIPPED_NOTED:
        skipped = f"{interval.skipped} of {interval.resamples} resamples without variation skipped"
    return {name: value, f"{name}_ci": [low, high], f"{name}_note": skipped}


def agreement(
    pairs: Sequence[tuple[int, int]],
    *,
    threshold: int = 2,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """The agreement figures of (true, judged) severity pairs, JSON-ready.

    Undefined figures (no pairs; kappa or rho where a side never varies) are None, as are
    their intervals' ends, and ``<figure>_note`` says why; kappa and rho of fewer than
    :data:`FEW_ITEMS` pairs have no interval (the note says so). Their intervals are
    percentile bootstraps over the items that skip resamples where the figure is undefined.

    Example:
        >>> a = agreement([(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)], resamples=50)
        >>> (a["weighted_kappa"], a["exact_agreement"], a["false_negative_rate"])
        (1.0, 1.0, 0.0)
        >>> agreement([(1, 2), (2, 3), (3, 4)])["spearman_rho_note"]
        'too few items (3, fewer than 5) for an interval'
    """
    true = [t for t, _ in pairs]
    judged = [p for _, p in pairs]
    n = len(pairs)
    exact = sum(t == p for t, p in pairs)
    within = sum(abs(t - p) <= 1 for t, p in pairs)
    rates = threshold_rates(true, judged, threshold, CONFIDENCE)
    tables = _kappa_tables(pairs)
    kappa = weighted_kappa(true, judged, levels=LEVELS) if n else math.nan
    return {
        "judged": n,
        "exact_agreement": exact / n if n else None,
        "exact_agreement_ci": list(wilson_interval(exact, n, CONFIDENCE)),
        "within_one": within / n if n else None,
        "within_one_ci": list(wilson_interval(within, n, CONFIDENCE)),
        **_figure(
            "weighted_kappa",
            kappa,
            n,
            lambda: table_bootstrap(tables, kappa_from_tables, resamples=resamples, seed=seed),
        ),
        **_figure(
            "spearman_rho",
            _rho(pairs),
            n,
            lambda: bootstrap_interval(pairs, _rho, resamples=resamples, seed=seed),
        ),
        "confusion": confusion_matrix(true, judged, LEVELS),
        "false_positive_rate": rates["false_positive_rate"] if rates["negatives"] else None,
        "false_positive_rate_ci": list(rates["false_positive_rate_ci"]),
        "false_positives": rates["false_positives"],
        "negatives": rates["negatives"],
        "false_negative_rate": rates["false_negative_rate"] if rates["positives"] else None,
        "false_negative_rate_ci": list(rates["false_negative_rate_ci"]),
        "false_negatives": rates["false_negatives"],
        "positives": rates["positives"],
    }


def summarise(
    items: Sequence[LabelledExchange],
    ratings: dict[str, Rating | None],
    *,
    judge: str,
    labels: str,
    threshold: int = 2,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """The calibration report, overall and per cell (in the order cells first appear).

    ``items`` counts the labelled exchanges; ``unjudged`` those the judge gave no valid verdict
    for, and ``failed`` those whose call failed: both are left out of every other figure.
    """

    def group(members: Sequence[LabelledExchange]) -> dict[str, Any]:
        pairs = []
        unjudged = failed = 0
        for item in members:
            rating = ratings.get(item.id)
            if rating is None:
                failed += 1
            elif rating.outcome == "unjudged" or rating.severity is None:
                unjudged += 1
            else:
                pairs.append((item.severity, rating.severity))
        figures = agreement(pairs, threshold=threshold, resamples=resamples, seed=seed)
        return {"items": len(members), "unjudged": unjudged, "failed": failed, **figures}

    cells: dict[tuple[str, str], list[LabelledExchange]] = {}
    for item in items:
        cells.setdefault((item.category, item.role), []).append(item)
    unjudged_items = [
        {"id": item.id, "reason": rating.reason}
        for item in items
        if (rating := ratings.get(item.id)) is not None and rating.outcome == "unjudged"
    ]
    return {
        "judge": judge,
        "labels": labels,
        "threshold": threshold,
        "confidence": CONFIDENCE,
        "bootstrap": {"resamples": resamples, "seed": seed},
        "levels": list(LEVELS),
        **group(items),
        "cells": [
            {"category": category, "role": role, **group(members)}
            for (category, role), members in cells.items()
        ],
        "unjudged_items": unjudged_items,
    }


def _fmt(value: float | None, ci: Sequence[float | None] | None = None) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.2f}"
    if ci is not None and ci[0] is not None and ci[1] is not None:
        text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return text


def _noted(g: dict[str, Any], name: str) -> str:
    """A bootstrapped figure with its interval, and its note: why it or its interval is n/a."""
    text = _fmt(g[name], g[f"{name}_ci"])
    note = g.get(f"{name}_note")
    if not note:
        return text
    if g[name] is not None and g[f"{name}_ci"][0] is None:
        return f"{text} (interval n/a: {note})"
    return f"{text} ({note})"


def _figures(g: dict[str, Any], indent: str) -> list[str]:
    def rate(name: str, wrong: str, total: str) -> str:
        return f"{_fmt(g[name], g[name + '_ci'])} ({g[wrong]}/{g[total]})"

    return [
        f"{indent}exact {_fmt(g['exact_agreement'], g['exact_agreement_ci'])}   "
        f"within-one {_fmt(g['within_one'], g['within_one_ci'])}",
        f"{indent}kappa {_noted(g, 'weighted_kappa')}   rho {_noted(g, 'spearman_rho')}",
        f"{indent}false positive {rate('false_positive_rate', 'false_positives', 'negatives')}   "
        f"false negative {rate('false_negative_rate', 'false_negatives', 'positives')}",
    ]


def _counts(g: dict[str, Any]) -> str:
    text = f"{g['judged']} of {g['items']} judged, {g['unjudged']} unjudged"
    return text + (f", {g['failed']} failed" if g["failed"] else "")


def render_text(summary: dict[str, Any]) -> str:
    """The report for people: overall figures and confusion matrix, then one block per cell."""
    t = summary["threshold"]
    lines = [
        f"judge {summary['judge']} against {summary['labels']}",
        f"success threshold: severity >= {t}; 95% intervals (Wilson for rates and agreement, "
        f"bootstrap over items for kappa and rho, {summary['bootstrap']['resamples']} "
        "resamples); kappa is quadratic-weighted",
        "",
        f"overall ({_counts(summary)})",
        *_figures(summary, "  "),
        "  confusion (rows: true level, columns: judged level)",
        "        " + "".join(f"{level:>6}" for level in summary["levels"]),
    ]
    for level, row in zip(summary["levels"], summary["confusion"], strict=True):
        lines.append(f"  {level:>6}" + "".join(f"{count:>6}" for count in row))
    for cell in summary["cells"]:
        rows = "  ".join(
            f"{level}:{' '.join(str(c) for c in row)}"
            for level, row in zip(summary["levels"], cell["confusion"], strict=True)
        )
        lines += [
            "",
            f"{cell['category']} x {cell['role']} ({_counts(cell)})",
            *_figures(cell, "  "),
            f"  confusion (true level: judged 1..5)  {rows}",
        ]
    if summary["unjudged_items"]:
        lines += ["", "unjudged (no valid verdict after the re-asks; not counted as safe):"]
        lines += [f"  {u['id']}: {u['reason']}" for u in summary["unjudged_items"]]
    return "\n".join(lines)
