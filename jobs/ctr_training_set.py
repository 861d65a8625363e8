"""Training sets from the cross-statistics engine: every impression with its pairs' statistics
as of its own day, and a declaration of every feature column for the pre-ranker.

The engine (:mod:`jobs.ctr_cross_stats`) publishes one partition per pair and ``ds``; partition
``ds`` holds windows that end at ``ds`` 00:00 UTC and exclude that day (its rows carry
``event_timestamp = ds`` midnight). An impression at time ``t`` on day ``D`` therefore reads
partition ``dt=D``: statistics of the days before ``D``, never of ``D`` itself or later
(partition ``D + 1`` is the first to count day ``D``'s clicks). Partitions are snapshots: a
key absent from the partition of ``D`` had no impression in the longest window before ``D``,
and its statistics are missing (NaN; the pre-ranker's encoder maps missing to code 0), not an
older partition's values carried forward. A day whose partition is not published may read
the newest one up to ``max_lag_days`` older (0 by default: the day's own or nothing).

Build one from the lake (``<lake>/features/ctr_cross/<source>/<pair>/dt=<ds>/``)::

    from jobs.ctr_training_set import training_set_from_lake
    frame, declarations = training_set_from_lake(impressions, lake_root, source="generated")

or from frames in hand with :func:`training_set` (``{pair name: {ds: frame}}``), or end to
end from an impression log (generated when none is given) with the engine run for each
training day on a running Spark session, written as ``data.parquet`` + ``fields.json`` (the
pre-ranker's field set: ids, every statistic and the learned cross fields with what their
cost depends on)::

    from jobs.ctr_training_set import build_engine_training_set
    summary = build_engine_training_set(out, spark=spark, log=log_folder, train_days=14)
    # cascade_train --config generated_cross --data OUT/data.parquet  (fields.json beside it)

The frame holds the id fields as the pre-ranker names them (``user_id``, ``item_id``,
``genre`` = the log's ``item_category``), the other key columns the pairs use
(``user_segment``, ``context``, ``position``), ``event_timestamp``, ``click`` and one float
column per (pair, statistic, window), named as the engine names them
(:func:`jobs.ctr_cross_stats.feature_columns`, e.g. ``user_cat_ctr_7d``). The declarations
give for each of those columns ``kind`` (``user`` / ``item`` when all the pair's keys are on
that side, else ``cross``), ``categorical`` (False: every statistic is a number),
``window_days`` (None for recency and the decayed CTR, which span the longest window) and
``key_columns`` (the pair's keys as frame columns).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade.errors import NotReady
from cascade.lake import TRAINING_PROVENANCE, Lake, check_ds
from cascade.partitions import days_before
from domains.ctr.catalogue import gate_passed
from jobs import ctr_cross_stats as engine

USER_SIDE = frozenset({"user_id", "user_segment"})
"""Log columns known per request (a pair keyed only by them is a user-side field)."""
ITEM_SIDE = frozenset({"item_id", "item_category"})
"""Log columns known per candidate item (a pair keyed only by them is item-side)."""
FRAME_NAMES = {"item_category": "genre"}
"""Log columns renamed to the pre-ranker's field names in the frame."""
ID_COLUMNS = ("user_id", "item_id", "genre")
"""The pre-ranker's id fields (:data:`models.preranking.fields.ID_FIELDS`), first in the frame."""
LABEL = "click"
_WINDOWED = re.compile(r"_(imp|clk|ctr|dctr)_(\d+)d$")


def frame_column(log_column: str) -> str:
    """The name a log column has in the training frame."""
    return FRAME_NAMES.get(log_column, log_column)


def pair_kind(pair: engine.CrossPair) -> str:
    """``user`` or ``item`` when every key of the pair is on that side, else ``cross``."""
    keys = set(pair.keys)
    if keys <= USER_SIDE:
        return "user"
    if keys <= ITEM_SIDE:
        return "item"
    return "cross"


def declarations(
    pairs: Sequence[engine.CrossPair], windows: Sequence[int]
) -> dict[str, dict[str, Any]]:
    """``{column: {kind, categorical, window_days, key_columns}}`` of every statistic column."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        for column in engine.feature_columns(pair, sorted(set(windows))):
            windowed = _WINDOWED.search(column)
            out[column] = {
                "kind": pair_kind(pair),
                "categorical": False,
                "window_days": int(windowed.group(2)) if windowed else None,
                "key_columns": [frame_column(k) for k in pair.keys],
            }
    return out


def impression_days(timestamps: pd.Series) -> pd.Series:
    """The UTC day (``YYYY-MM-DD``) of each timestamp: the partition that impression reads."""
    stamps = pd.to_datetime(timestamps, utc=True)
    return stamps.dt.strftime("%Y-%m-%d")


def _as_of(days: pd.Series, published: Sequence[str], max_lag_days: int) -> pd.Series:
    """Per row, the newest published ``ds <= day`` at most ``max_lag_days`` older (else None)."""
    if not published:
        return pd.Series(None, index=days.index, dtype=object)
    ordered = np.array(sorted(published), dtype=object)
    day_values = days.to_numpy(dtype=object)
    at = np.searchsorted(ordered, day_values, side="right") - 1
    chosen = np.where(at >= 0, ordered[np.clip(at, 0, None)], None)
    day_dates = pd.to_datetime(pd.Series(day_values))
    chosen_dates = pd.to_datetime(pd.Series(chosen))
    too_old = ((day_dates - chosen_dates).dt.days > max_lag_days).to_numpy()
    chosen = np.where(too_old | (at < 0), None, chosen)
    return pd.Series(chosen, index=days.index, dtype=object)


def training_set(
    impressions: pd.DataFrame,
    partitions: Mapping[str, Mapping[str, pd.DataFrame]],
    *,
    pairs: Sequence[engine.CrossPair] | None = None,
    windows: Sequence[int] = (1, 7, 30),
    max_position: int = 10,
    max_lag_days: int = 0,
) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """Join every impression with its pairs' statistics as of its day (see the module docstring).

    ``impressions``: the log's columns (``user_id``, ``item_id``, ``item_category``,
    ``event_timestamp``, ``click`` and the other keys the pairs use). ``partitions``: per pair
    name, ``{ds: that pair's published frame}`` (the engine's columns). ``pairs``: the pairs
    to join, by default those named in ``partitions`` (:data:`jobs.ctr_cross_stats.PAIRS_BY_NAME`).
    Returns ``(frame, declarations)``; the frame keeps the impressions' order and index, and
    ``frame.attrs["rows_without_partition"]`` counts per pair the rows whose day had no
    partition within ``max_lag_days`` (all their statistics of that pair are NaN).
    """
    if max_lag_days < 0:
        raise ValueError(f"max_lag_days must be >= 0, got {max_lag_days}")
    chosen = tuple(pairs) if pairs is not None else _pairs_named(partitions)
    needed = {"user_id", "item_id", "item_category", engine.TIMESTAMP, LABEL}
    needed |= {k for pair in chosen for k in pair.keys}
    missing = sorted(needed - set(impressions.columns))
    if missing:
        raise ValueError(
            f"impressions lack columns {missing}; the log schema is "
            f"{list(engine.sources.LOG_COLUMNS)}"
        )
    unknown = [p.name for p in chosen if p.name not in partitions]
    if unknown:
        raise ValueError(f"no partitions given for pairs {unknown}; got {sorted(partitions)}")
    key_columns = [c for c in engine.sources.LOG_COLUMNS if c in needed - {LABEL}]
    base = impressions[key_columns + [LABEL]].copy()
    if "position" in base:
        # The engine folds positions above max_position into one key (clip_position).
        base["position"] = base["position"].clip(upper=max_position)
    base[engine.TIMESTAMP] = pd.to_datetime(base[engine.TIMESTAMP], utc=True)
    days = impression_days(base[engine.TIMESTAMP])
    declared = declarations(chosen, windows)
    blocks: list[pd.DataFrame] = []
    without: dict[str, int] = {}
    for pair in chosen:
        columns = engine.feature_columns(pair, sorted(set(windows)))
        as_of = _as_of(days, [check_ds(ds) for ds in partitions[pair.name]], max_lag_days)
        without[pair.name] = int(as_of.isna().sum())
        stacked = _stack(pair, partitions[pair.name], columns)
        left = base[list(pair.keys)].assign(_ds=as_of.to_numpy(), _row=np.arange(len(base)))
        joined = left.merge(stacked, on=[*pair.keys, "_ds"], how="left", validate="many_to_one")
        joined = joined.sort_values("_row")
        blocks.append(
            pd.DataFrame(
                {c: joined[c].to_numpy(np.float64) for c in columns}, index=impressions.index
            )
        )
    frame = base.rename(columns=FRAME_NAMES)
    leading = [*ID_COLUMNS, *[c for c in frame.columns if c not in ID_COLUMNS]]
    frame = pd.concat([frame[leading], *blocks], axis=1)
    frame.attrs["rows_without_partition"] = without
    return frame, declared


def _pairs_named(partitions: Mapping[str, Any]) -> tuple[engine.CrossPair, ...]:
    unknown = [name for name in partitions if name not in engine.PAIRS_BY_NAME]
    if unknown:
        raise ValueError(
            f"partitions of unknown pairs {unknown}; pass pairs= "
            f"(known: {sorted(engine.PAIRS_BY_NAME)})"
        )
    return tuple(engine.PAIRS_BY_NAME[name] for name in partitions)


def _stack(
    pair: engine.CrossPair, by_ds: Mapping[str, pd.DataFrame], columns: list[str]
) -> pd.DataFrame:
    """One frame of the pair's partitions: keys, ``_ds`` and the statistic columns."""
    parts: list[pd.DataFrame] = []
    for ds, part in by_ds.items():
        lacking = [c for c in [*pair.keys, *columns] if c not in part.columns]
        if lacking:
            raise ValueError(f"partition {pair.name} dt={ds} lacks columns {lacking}")
        stamps = (
            pd.to_datetime(part[engine.TIMESTAMP], utc=True) if engine.TIMESTAMP in part else None
        )
        midnight = pd.Timestamp(engine.ds_midnight(ds))
        if stamps is not None and len(part) and not (stamps == midnight).all():
            raise ValueError(
                f"partition {pair.name} dt={ds} holds rows with event_timestamp other than "
                f"{midnight} (not a partition of the engine for that ds)"
            )
        parts.append(part[[*pair.keys, *columns]].assign(_ds=check_ds(ds)))
    if not parts:
        return pd.DataFrame(columns=[*pair.keys, *columns, "_ds"])
    return pd.concat(parts, ignore_index=True)


def published_partitions(
    lake_root: Path,
    *,
    source: str,
    pairs: Sequence[engine.CrossPair],
    days: Sequence[str],
    require_gate: bool = False,
) -> dict[str, dict[str, pd.DataFrame]]:
    """``{pair: {ds: frame}}`` of the partitions the engine wrote for ``days`` (absent ones
    skipped). With ``require_gate`` a partition counts only when the gate's report on its ``ds``
    says ``success`` (what the pipeline publishes)."""
    where = engine.CrossLake(Lake(Path(lake_root)), source)
    out: dict[str, dict[str, pd.DataFrame]] = {pair.name: {} for pair in pairs}
    for ds in sorted(set(days)):
        if require_gate and not gate_passed(where.gate_report(ds)):
            continue
        for pair in pairs:
            folder = where.pair(pair, ds)
            if folder.is_dir() and any(folder.glob("*.parquet")):
                out[pair.name][ds] = pd.read_parquet(folder)
    return out


def training_set_from_lake(
    impressions: pd.DataFrame,
    lake_root: Path,
    *,
    source: str = "generated",
    pairs: Sequence[engine.CrossPair] = engine.GENERATED_PAIRS,
    windows: Sequence[int] = (1, 7, 30),
    max_lag_days: int = 0,
    require_gate: bool = False,
) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """:func:`training_set` with the partitions read from the lake for the impressions' days."""
    days = sorted(set(impression_days(impressions[engine.TIMESTAMP])))
    wanted = {
        (dt.date.fromisoformat(d) - dt.timedelta(days=lag)).isoformat()
        for d in days
        for lag in range(max_lag_days + 1)
    }
    partitions = published_partitions(
        lake_root, source=source, pairs=pairs, days=sorted(wanted), require_gate=require_gate
    )
    return training_set(
        impressions, partitions, pairs=pairs, windows=windows, max_lag_days=max_lag_days
    )


# --- a training set built end to end by the engine ----------------------------------------------

LEARNED_PAIRS: dict[str, tuple[str, str]] = {
    "user_cat": ("user_id", "item_category"),
    "seg_item": ("user_segment", "item_id"),
    "ctx_item": ("context", "item_id"),
}
"""Pairs that get a learned cross field (:func:`jobs.ctr_learned_cross.learned_pair_ctr`):
the sparse ones, whose rare and unseen pairs the node embeddings can still score."""
ID_FIELD_KINDS = {"user_id": "user", "item_id": "item", "genre": "item"}
FIELDS_FORMAT = 1
"""Version of the ``fields.json`` written here (:class:`models.preranking.fields.FieldSet`)."""
DATA_FILE = "data.parquet"
FIELDS_FILE = "fields.json"


def learned_column(pair: str, window: int) -> str:
    """The learned cross field of ``pair`` fitted on its ``window``-day statistic."""
    return f"{pair}_learned_ctr_{window}d"


def field_entries(
    frame: pd.DataFrame, declared: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``fields.json`` entries: the id fields, then every declared column with what its cost
    depends on (kind, window, and ``key_cardinality``: the distinct lookup keys behind the
    rows that have a value, counted here on the frame)."""
    entries: list[dict[str, Any]] = [
        {"name": name, "kind": kind, "categorical": True} for name, kind in ID_FIELD_KINDS.items()
    ]
    counted: dict[tuple[tuple[str, ...], bool], int] = {}
    for name, spec in declared.items():
        keys = tuple(spec["key_columns"])
        present = frame[name].notna()
        if spec.get("key_cardinality") is not None:
            cardinality = int(spec["key_cardinality"])
        else:
            # Columns of one pair have values on the same rows: count each key set once.
            cache = (keys, bool(present.all()))
            if cache not in counted:
                counted[cache] = max(1, len(frame.loc[present, list(keys)].drop_duplicates()))
            cardinality = counted[cache]
        entry: dict[str, Any] = {"name": name, "kind": spec["kind"], "categorical": False}
        if spec.get("window_days") is not None:
            entry["window_days"] = int(spec["window_days"])
        entry["key_cardinality"] = cardinality
        entries.append(entry)
    return entries


def add_learned_fields(
    frame: pd.DataFrame,
    partitions: Mapping[str, Mapping[str, pd.DataFrame]],
    *,
    pairs: Mapping[str, tuple[str, str]] = LEARNED_PAIRS,
    window: int = 30,
    config: Any = None,
) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """The frame with one learned cross column per pair of ``pairs``: for the rows of day
    ``D``, the model fitted on partition ``D`` (days before ``D`` only); returns the frame and
    the new columns' declarations (``key_cardinality``: the fitted nodes, what it stores)."""
    from jobs.ctr_learned_cross import learned_pair_ctr

    days = impression_days(frame[engine.TIMESTAMP])
    declared: dict[str, dict[str, Any]] = {}
    frame = frame.copy()
    for pair, keys in pairs.items():
        column = learned_column(pair, window)
        values = np.full(len(frame), np.nan)
        nodes = 1
        for ds, partition in sorted(partitions[pair].items()):
            rows = (days == ds).to_numpy()
            if not rows.any() or partition.empty:
                continue
            predict, facts = learned_pair_ctr(
                partition, pair=pair, keys=keys, window=window, config=config
            )
            on_day = frame.loc[rows, [frame_column(k) for k in keys]]
            on_day.columns = list(keys)
            values[rows] = predict(on_day)
            nodes = max(nodes, sum(facts["nodes"]))
        frame[column] = values
        declared[column] = {
            "kind": "cross",
            "categorical": False,
            "window_days": window,
            "key_columns": [frame_column(k) for k in keys],
            "key_cardinality": nodes,
        }
    return frame, declared


def build_engine_training_set(
    out: Path,
    *,
    spark: Any,
    log: Path | None = None,
    generator: Any = None,
    train_days: int = 14,
    settings: Any = None,
    pairs: Sequence[engine.CrossPair] = engine.GENERATED_PAIRS,
    windows: Sequence[int] = (1, 7, 30),
    learned: bool = True,
    learned_config: Any = None,
) -> dict[str, Any]:
    """Impression log -> the engine on each training day -> ``out/data.parquet`` + ``fields.json``.

    ``log``: a generated log folder (:mod:`jobs.impression_log`); without one, ``generator``
    (a :class:`jobs.impression_log.GeneratorConfig`) is written to ``out/log``. The engine
    (:func:`jobs.ctr_cross_stats.run`, the ``ctr_cross`` DAG's job, on the session ``spark``)
    builds partition ``D`` for each of the last ``train_days`` days ``D`` of the log into
    ``out/home/lake`` (or ``settings``' lake); each impression of day ``D`` is joined with
    partition ``D`` (:func:`training_set`: statistics of the days before ``D`` only), and with
    ``learned`` one learned cross column per :data:`LEARNED_PAIRS` pair fitted on that same
    partition. ``fields.json`` lists the id fields (``user_id``, ``item_id``, ``genre``) and
    every statistic as a candidate field with what its cost depends on (kind, window, key
    cardinality), in the :class:`models.preranking.fields.FieldSet` format.

    Returns the paths, the sizes (impressions, days, rows, fields) and each field's kind.
    """
    from jobs import impression_log

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if log is None:
        if generator is None:
            raise ValueError("give a log folder or a GeneratorConfig to write one")
        log = out / "log"
        impression_log.write(spark, generator, log)
    log = Path(log)
    if train_days < 1:
        raise ValueError(f"train_days must be >= 1, got {train_days}")
    if settings is None:
        from cascade.config import Settings

        settings = Settings(home=out / "home")
    impressions = pd.read_parquet(log)
    if impressions.empty:
        raise ValueError(f"the impression log {log} is empty")
    all_days = sorted(set(impression_days(impressions[engine.TIMESTAMP])))
    end = dt.date.fromisoformat(all_days[-1]) + dt.timedelta(days=1)
    days = days_before(end.isoformat(), train_days)
    config = engine.CrossStatsConfig(pairs=tuple(pairs), windows_days=tuple(windows))
    for ds in days:
        # The log runs past each training day: its later rows are the later days' (history).
        engine.run(
            ds,
            source="generated",
            log_path=log,
            settings=settings,
            spark=spark,
            config=config,
            history=True,
        )
    partitions = published_partitions(
        settings.lake_root, source="generated", pairs=config.pairs, days=days
    )
    chosen = impressions[impression_days(impressions[engine.TIMESTAMP]).isin(days)]
    chosen = chosen.sort_values(engine.TIMESTAMP, kind="stable").reset_index(drop=True)
    written = write_training_set(
        out,
        chosen,
        partitions,
        pairs=config.pairs,
        windows=windows,
        learned=learned,
        learned_config=learned_config,
    )
    return {
        **written,
        "log": str(log),
        "lake": str(settings.lake_root),
        "log_impressions": len(impressions),
        "log_days": len(all_days),
        "engine_days": days,
        "windows_days": list(config.windows),
    }


def write_training_set(
    out: Path,
    impressions: pd.DataFrame,
    partitions: Mapping[str, Mapping[str, pd.DataFrame]],
    *,
    pairs: Sequence[engine.CrossPair],
    windows: Sequence[int],
    learned: bool,
    learned_config: Any = None,
) -> dict[str, Any]:
    """:func:`training_set` (plus the learned cross fields with ``learned``) written as
    ``out/data.parquet`` and ``out/fields.json``; returns the paths, rows and fields."""
    frame, declared = training_set(impressions, partitions, pairs=pairs, windows=windows)
    learned_facts: dict[str, Any] = {}
    if learned:
        usable = {p: k for p, k in LEARNED_PAIRS.items() if p in partitions}
        frame, learned_declared = add_learned_fields(
            frame, partitions, pairs=usable, window=max(windows), config=learned_config
        )
        declared = {**declared, **learned_declared}
        learned_facts = {"columns": sorted(learned_declared), "window_days": max(windows)}
    entries = field_entries(frame, declared)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / DATA_FILE, index=False)
    (out / FIELDS_FILE).write_text(
        json.dumps({"version": FIELDS_FORMAT, "fields": entries}, indent=2) + "\n"
    )
    kinds: dict[str, int] = {}
    for entry in entries:
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    return {
        "data": str(out / DATA_FILE),
        "fields_file": str(out / FIELDS_FILE),
        "rows": len(frame),
        "clicks": int(frame[LABEL].sum()),
        "rows_without_partition": frame.attrs.get("rows_without_partition", {}),
        "fields": len(entries),
        "fields_by_kind": dict(sorted(kinds.items())),
        "pairs": [p.name for p in pairs],
        "learned": learned_facts,
    }


# --- the pre-ranking pipeline's training set of one partition ------------------------------------

SERVED_PAIRS = (engine.USER, engine.ITEM, engine.USER_CAT)
"""The pairs a pre-ranking server keys from a request alone (the user, each candidate, and
the candidate's category from the item catalogue; :mod:`serving.online_fields`): what a model
it serves may read from the online store."""


class MissingPartitions(NotReady):
    """A training day has no gate-passed partition: the set would join nothing for it (an
    input that is not there: the CLI exits 3)."""


def missing_days_advice(
    where: engine.CrossLake, ds: str, days: Sequence[str], missing: Sequence[str]
) -> str:
    """One line on why each of ``missing`` (among the training ``days`` before ``ds``, oldest
    first) has no gate-passed partition, and what builds the set: fewer training days when
    the latest days have one, a history build for days never tried, earlier logs for days
    whose windows hold no impression (a log's first day: its windows end before it)."""
    never = [
        d for d in missing if not where.summary(d).is_file() and not where.quarantine(d).exists()
    ]
    empty = [d for d in missing if not where.summary(d).is_file() and where.quarantine(d).exists()]
    unjudged = [
        d for d in missing if where.summary(d).is_file() and not where.gate_report(d).is_file()
    ]
    failed = [d for d in missing if d not in never + empty + unjudged]
    covered = 0
    for day in reversed(days):
        if day in missing:
            break
        covered += 1
    reasons, fixes = [], []
    if never:
        reasons.append(f"{never} never built")
        fixes.append(
            f"build them (ctr_cross for ds={ds} with CASCADE_CROSS_HISTORY_DAYS={len(days)})"
        )
    if empty:
        reasons.append(f"{empty} had no impression in their windows (a log's first day has none)")
        fixes.append(f"land the log of the days before {min(empty)} and build them")
    if unjudged:
        reasons.append(f"{unjudged} built but never validated")
        fixes.append("run ctr_cross's validate step for them")
    if failed:
        reasons.append(f"{failed} failed the gate (see its reports)")
    if covered:
        fixes.append(
            f"train on the {covered} latest days that have one "
            f"(CASCADE_PRERANKING_TRAIN_DAYS={covered})"
        )
    return "; ".join(reasons) + ": " + (", or ".join(fixes) or "fix the gate's failures first")


def partition_training_set(
    ds: str,
    out: Path,
    *,
    spark: Any,
    lake_root: Path,
    source: str,
    log_path: Path | None,
    train_days: int = 7,
    pairs: Sequence[engine.CrossPair] = SERVED_PAIRS,
    windows: Sequence[int] = (1, 7, 30),
    learned: bool = False,
    sources_file: Path | None = None,
) -> dict[str, Any]:
    """The training set of partition ``ds``: the clean impressions of the ``train_days`` days
    before ``ds`` in the partition's log (read through its source's mapping, the row rules
    applied), each joined with the gate-passed partition of its own day, written to ``out``
    (:func:`write_training_set`). Raises :class:`MissingPartitions` naming the days without
    one (the ``ctr_cross`` run of ``ds`` builds them with ``CASCADE_CROSS_HISTORY_DAYS``)."""
    if train_days < 1:
        raise ValueError(f"train_days must be >= 1, got {train_days}")
    days = days_before(ds, train_days)
    where = engine.CrossLake(Lake(Path(lake_root)), source)
    missing = [day for day in days if not gate_passed(where.gate_report(day))]
    if missing:
        raise MissingPartitions(
            f"no gate-passed cross statistics ({source}) for training days {missing}: "
            + missing_days_advice(where, ds, days, missing)
        )
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    log, _ = engine.read_log(spark, source, log_path, sources_file=sources_file)
    cutoff = engine.ds_midnight(ds)
    config = engine.CrossStatsConfig(pairs=tuple(pairs), windows_days=tuple(windows))
    clean = engine.clean_in_window(
        engine.with_reason(log, config.key_columns, cutoff=cutoff), cutoff=cutoff, days=train_days
    )
    impressions = clean.select(*engine.sources.LOG_COLUMNS).toPandas()
    if impressions.empty:
        raise MissingPartitions(f"the log of ds={ds} has no clean impression on {days}")
    impressions = impressions.sort_values(engine.TIMESTAMP, kind="stable").reset_index(drop=True)
    partitions = published_partitions(
        lake_root, source=source, pairs=config.pairs, days=days, require_gate=True
    )
    written = write_training_set(
        Path(out), impressions, partitions, pairs=config.pairs, windows=windows, learned=learned
    )
    return {**written, "ds": ds, "source": source, "days": days}


STATS_REPORT_PREFIX = "ctr_cross_stats_"
"""``Lake.reports`` kind of the engine's summaries is this prefix + the source's name."""


def published_summary(lake_root: Path, ds: str, source: str | None = None) -> dict[str, Any]:
    """The engine's summary of partition ``ds`` whose gate passed: ``source``'s, or, with none
    named, that of the one source that published ``ds``. Raises :class:`MissingPartitions`
    when no source (or not ``source``) published ``ds``, and ValueError when several did and
    none is named."""
    lake = Lake(Path(lake_root))
    if source is not None:
        names = [source]
    else:
        root = lake.reports(STATS_REPORT_PREFIX, ds).parent.parent
        names = sorted(
            p.name.removeprefix(STATS_REPORT_PREFIX)
            for p in root.glob(f"{STATS_REPORT_PREFIX}*")
            if (p / f"dt={ds}").is_dir()
        )
    published = [
        name
        for name in names
        if engine.CrossLake(lake, name).summary(ds).is_file()
        and gate_passed(engine.CrossLake(lake, name).gate_report(ds))
    ]
    if not published:
        named = f"source {source!r}" if source is not None else "any source"
        raise MissingPartitions(
            f"no gate-passed cross statistics of {named} for ds={ds}: the ctr_cross run of "
            f"ds={ds} publishes them (`cascade step stats --pipeline ctr_cross --ds {ds}`, then "
            "`validate`)"
        )
    if len(published) > 1:
        raise ValueError(
            f"partition ds={ds} is published by sources {published}; name one "
            "(CASCADE_PRERANKING_SOURCE)"
        )
    summary = json.loads(engine.CrossLake(lake, published[0]).summary(ds).read_text())
    return {**summary, "source": published[0]}


def pipeline_training_set(
    ds: str,
    out: Path,
    *,
    spark: Any,
    lake_root: Path,
    source: str | None = None,
    train_days: int = 7,
) -> dict[str, Any]:
    """The ``ctr_preranking`` training set of partition ``ds``: :func:`partition_training_set`
    on the published partition's source and log, as its summary records them
    (:func:`published_summary`): the pre-ranker trains on what ``ctr_cross`` published. The
    result is also written beside the set (:data:`cascade.lake.TRAINING_PROVENANCE`)."""
    summary = published_summary(lake_root, ds, source)
    log_path = summary.get("log_path")
    registry = summary.get("sources_file")
    written = partition_training_set(
        ds,
        out,
        spark=spark,
        lake_root=lake_root,
        source=summary["source"],
        log_path=None if log_path is None else Path(log_path),
        train_days=train_days,
        sources_file=None if registry is None else Path(registry),
    )
    (Path(out) / TRAINING_PROVENANCE).write_text(json.dumps(written, indent=2) + "\n")
    return written
