"""Explicit cross statistics: pairs x windows of impressions, clicks and smoothed CTRs, at scale.

Run it on a generated log (write one with ``python -m jobs.impression_log``) or on ML-100k::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_stats --ds 2026-11-22 \\
        --source generated --log /tmp/log_1m
    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_stats --ds 1998-04-01 \\
        --source ml100k

For every configured pair of key columns (:class:`CrossPair`, e.g. user_segment x item_category)
and every window of ``w`` days ending at ``ds`` (events with ``ds - w days <= t < ds`` midnight
UTC; nothing at or after ``ds`` is read, so a training row at ``t >= ds`` never sees its own
future), one feature row per key seen in the longest window holds, per window: ``imp``, ``clk``,
the smoothed CTR ``ctr = (clk + a) / (imp + a + b)`` and the position-debiased CTR
``dctr = min(1, (clk + a') / (exam + a' + b'))`` with ``exam`` the expected examinations of
the impressions (sum of the position's examination probability; a key clicked more often than
its impressions were expected to be examined, as happens with few impressions at poorly
examined positions, would estimate a click probability above 1); plus recency (days since the key's
last impression and last click) and a time-decayed smoothed CTR (half-life weights). Rows carry
``event_timestamp = ds`` midnight: valid from then on for point-in-time joins.

The Beta(a, b) priors are fitted to the data by the method of moments, one per pair, window and
statistic (see :func:`beta_from_moments`), never a constant.

Passes over the input: (1) a pass for the examination probability of each position,
``min(1, ctr(position) / ctr(top position))`` (unbiased when positions are assigned
independently of relevance, as in the generator; on logs ranked by relevance it overstates the
bias and should come from a randomized slice instead); the same small aggregation counts input
rows, quarantined rows per reason, and clean rows inside and before the longest window. A batch
with no clean row in the window stops there with :class:`EmptyBatch` (its bad rows are still
quarantined; nothing is published). (2) one scan, one shuffle and one aggregation for all pairs
and windows (:func:`cross_aggregate`), cached because it is small next to the input; the
priors and per-pair writes then read the cache. Rows breaking a row rule are written to the
quarantine partition with a ``reason`` and the raw row as it came (``line``).

Why pass 2 runs the way it does (measured on ``local[2]``, 10M generated impressions, see
:mod:`benchmarks.ctr_cross_stats`): one explode instead of one aggregation per pair reads and
filters the input once and runs one exchange instead of one per pair (at 1M: ~30% less CPU, half
the wall time of the aggregation); the exploded rows are narrow (``gid``, the pair's keys in a
few typed slots, the row values: no grouping-set expansion carrying every key column). A pair
whose keys are a subset of another pair's (``user`` of ``user_cat``, ``item`` of ``seg_item``)
is not exploded at all: :func:`rolled_up` sums it from its parent's aggregated rows, exactly
(5 exploded rows per impression instead of 7). Each map task aggregates its rows before the
shuffle (``partial_aggregation``): the coarse pairs collapse to a few thousand rows and the
shuffle carried 5.0M rows (245 MB) instead of 60M (1.8 GB) when every exploded row was
shuffled; pass 2 took ~20 s instead of ~32 s and the whole job ~40 s instead of ~57 s (same
run, interleaved). What remains is the map side's hash aggregation of the sparse pairs
(``user_cat``, ``ctx_item``: ~1-2M keys, a hash map far larger than the CPU caches; alone,
``user_cat`` costs ~0.8 us of CPU per impression). Tried on that aggregation at 10M (noop
sink, map and reduce side, 13.4-14.3 s as it stands, interleaved runs) and left out, none
moving it by more than the runs' spread: a fast hash map of 2^20 rows
(``spark.sql.codegen.aggregate.fastHashMap.capacityBit``), no two-level map, ANSI mode off,
smaller input splits (20 and 40 MB over 500k-row row groups: 8 and 4 even map tasks instead
of 3), JIT compilation of huge generated methods (``-XX:-DontCompileHugeMethods``). Also
measured and left out: the item catalogue summed from one more exploded grouping (item,
category) instead of its own scan of the log (~1 s less at 10M, none at 30M).

AQE coalesces the reduce partitions to ``aggregate_partition_bytes``. The cached aggregate is
sorted by ``gid`` within partitions and not compressed: each pair's write then reads only its
own batches, and nothing pays for encoding a cache read a handful of times. The pair outputs
and the item catalogue are written as concurrent Spark jobs (``write_threads``), largest first.

Outputs under the lake: ``features/ctr_cross/<source>/<pair>/dt=<ds>/`` per pair,
``quarantine/<source>_log/dt=<ds>/`` and ``reports/ctr_cross_stats_<source>/dt=<ds>/summary.json``
(counts, priors, position examination), which the gate reads. A run first deletes the gate's
earlier report on ``ds`` (``CrossLake.gate_report``): rebuilt statistics need a new verdict.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from domains.ctr.catalogue import gate_passed
from jobs import ctr_log_sources as sources
from jobs import spark_sessions

MICROS_PER_DAY = 86_400_000_000
TIMESTAMP = "event_timestamp"


class EmptyBatch(RuntimeError):
    """No clean row of the log falls in the longest window: there is nothing to publish."""


@dataclass(frozen=True, kw_only=True)
class CrossPair:
    """One explicit cross: the key columns it groups by and the prefix of its feature columns."""

    name: str
    """Prefix of the output columns and the lake folder (letters, digits, underscores)."""
    keys: tuple[str, ...]
    """Key columns from the input schema, e.g. ``("user_segment", "item_category")``."""

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ValueError(f"pair name {self.name!r} must be letters, digits and underscores")
        unknown = [k for k in self.keys if k not in sources.LOG_COLUMNS or k == TIMESTAMP]
        if not self.keys or unknown or "click" in self.keys:
            raise ValueError(
                f"pair {self.name!r}: keys {self.keys} must be columns of the input schema "
                f"{sources.LOG_COLUMNS} other than click and {TIMESTAMP}"
            )


USER = CrossPair(name="user", keys=("user_id",))
"""The user's own statistics: the one-key pair on ``user_id`` (a user-side field)."""
ITEM = CrossPair(name="item", keys=("item_id",))
"""The item's own statistics: the one-key pair on ``item_id`` (an item-side field)."""
SEG_CAT = CrossPair(name="seg_cat", keys=("user_segment", "item_category"))
USER_CAT = CrossPair(name="user_cat", keys=("user_id", "item_category"))
SEG_ITEM = CrossPair(name="seg_item", keys=("user_segment", "item_id"))
CTX_ITEM = CrossPair(name="ctx_item", keys=("context", "item_id"))
ITEM_POS = CrossPair(name="item_pos", keys=("item_id", "position"))
CROSSES = (SEG_CAT, USER_CAT, SEG_ITEM, CTX_ITEM, ITEM_POS)
"""The two-key pairs."""
GENERATED_PAIRS = (USER, ITEM, *CROSSES)
"""Every built-in pair: the user's and the item's own statistics, then the crosses (what a
generated log, which fills every column, gets)."""
ML100K_PAIRS = (USER, ITEM, SEG_CAT, USER_CAT, SEG_ITEM)
"""ML-100k has no positions and no contexts, so only user/item attribute crosses."""
PAIRS_BY_NAME = {pair.name: pair for pair in GENERATED_PAIRS}


def pairs_for(source: sources.LogSource, provided: Sequence[str]) -> tuple[CrossPair, ...]:
    """The pairs a source gets: the ones it names, else every built-in pair whose keys the log
    provides (a log without positions gets no ``item_pos``)."""
    if source.pairs is not None:
        unknown = [name for name in source.pairs if name not in PAIRS_BY_NAME]
        if unknown:
            raise ValueError(
                f"source {source.name!r} names pairs {unknown}; known: {sorted(PAIRS_BY_NAME)}"
            )
        return tuple(PAIRS_BY_NAME[name] for name in source.pairs)
    usable = tuple(p for p in GENERATED_PAIRS if set(p.keys) <= set(provided))
    if not usable:
        raise ValueError(
            f"source {source.name!r} provides {list(provided)}: no built-in pair can be keyed "
            f"({[(p.name, p.keys) for p in GENERATED_PAIRS]}); map more columns"
        )
    return usable


def window_text(ds: str, windows: Sequence[int]) -> str:
    """What the windows of partition ``ds`` cover, in words (ds itself is never inside)."""
    end = dt.date.fromisoformat(check_ds(ds))
    last = end - dt.timedelta(days=1)
    spans = [f"{w}d = {end - dt.timedelta(days=w)} .. {last}" for w in windows]
    return f"windows end at {ds} 00:00 UTC, exclusive ({'; '.join(spans)})"


@dataclass(kw_only=True)
class CrossStatsConfig:
    """Knobs of the cross statistics engine."""

    pairs: tuple[CrossPair, ...] = GENERATED_PAIRS
    """The crosses to compute; each needs a distinct name and a distinct key set."""
    windows_days: tuple[int, ...] = (1, 7, 30)
    """Window lengths in days, all ending at ds midnight (exclusive)."""
    half_life_days: float = 7.0
    """Half-life of the time-decayed CTR (weight 2 ** (-age / half_life))."""
    max_position: int = 10
    """Positions above this share one examination estimate (and one ``item_pos`` key)."""
    min_prior_strength: float = 1.0
    """Lower clamp on a + b of a fitted prior (keys vary more than a Beta can express)."""
    max_prior_strength: float = 1e6
    """Upper clamp on a + b: used when the data shows no spread between keys at all."""
    output_files: int = 2
    """Parquet files per pair and partition."""
    max_quarantine_fraction: float = 0.01
    """The gate fails the batch when more than this share of input rows is quarantined."""
    row_count_tolerance: float = 0.5
    """The gate fails when a pair's row count moves more than this fraction from the
    previous partition's."""
    aggregate_partitions: int = 200
    """Shuffle partitions of the cross aggregation before AQE coalesces them: an upper bound,
    so large inputs get many small final hash maps (no spill)."""
    aggregate_partition_bytes: int = 16 << 20
    """AQE target of one coalesced reduce partition of the cross aggregation (shuffle bytes)."""
    partial_aggregation: bool = True
    """Aggregate each map task's rows before the shuffle (Spark's partial aggregation). Pays
    when keys repeat within a task, as the one-key and coarse pairs' do; off, every exploded
    row is shuffled (see the module docstring for the measurements)."""
    write_threads: int = 4
    """Pair outputs and the item catalogue written at once (concurrent Spark jobs), so a small
    pair's two-task write does not leave a core idle; 1 writes them one after another."""
    windows: tuple[int, ...] = field(init=False)
    """``windows_days`` sorted and deduplicated (derived; not an argument)."""

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("CrossStatsConfig.pairs is empty; configure at least one CrossPair")
        names = [p.name for p in self.pairs]
        key_sets = [frozenset(p.keys) for p in self.pairs]
        if len(set(names)) != len(names) or len(set(key_sets)) != len(key_sets):
            raise ValueError(f"pairs need distinct names and key sets, got {self.pairs}")
        if not self.windows_days or min(self.windows_days) < 1:
            raise ValueError(f"windows_days must be >= 1 day each, got {self.windows_days}")
        if self.half_life_days <= 0 or self.max_position < 1:
            raise ValueError("half_life_days must be > 0 and max_position >= 1")
        if not 0 < self.min_prior_strength <= self.max_prior_strength:
            raise ValueError("need 0 < min_prior_strength <= max_prior_strength")
        if self.output_files < 1 or not 0 <= self.max_quarantine_fraction <= 1:
            raise ValueError("output_files must be >= 1, max_quarantine_fraction in [0, 1]")
        if self.row_count_tolerance < 0:
            raise ValueError("row_count_tolerance must be >= 0")
        if self.write_threads < 1:
            raise ValueError("write_threads must be >= 1")
        if self.aggregate_partitions < 1 or self.aggregate_partition_bytes < 1 << 20:
            raise ValueError(
                "aggregate_partitions must be >= 1 and aggregate_partition_bytes >= 1 MiB"
            )
        self.windows = tuple(sorted(set(self.windows_days)))

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Every column some pair groups by, in schema order."""
        used = {k for pair in self.pairs for k in pair.keys}
        return tuple(c for c in sources.LOG_COLUMNS if c in used)


def ds_midnight(ds: str) -> dt.datetime:
    return dt.datetime.combine(dt.date.fromisoformat(check_ds(ds)), dt.time(), dt.UTC)


def feature_columns(pair: CrossPair, windows: Sequence[int]) -> list[str]:
    """The feature columns of one pair, in output order (after the keys and event_timestamp)."""
    per_window = [f"{pair.name}_{s}_{w}d" for w in windows for s in ("imp", "clk", "ctr", "dctr")]
    recency = [f"{pair.name}_days_since_imp", f"{pair.name}_days_since_click"]
    return [*per_window, *recency, f"{pair.name}_decay_ctr"]


# --- transforms: DataFrame -> DataFrame, no I/O -------------------------------------------------


def with_reason(
    log: DataFrame, key_columns: Sequence[str], *, cutoff: dt.datetime | None = None
) -> DataFrame:
    """``log`` plus ``reason``: the first row rule it breaks, null for a clean row. With
    ``cutoff`` a row at or after it breaks a rule (see :func:`jobs.ctr_log_sources.row_rules`)."""
    rules = sources.row_rules(key_columns, cutoff=cutoff)
    return log.withColumn("reason", sources.first_failed(rules))


def before_cutoff(log: DataFrame, cutoff: dt.datetime) -> DataFrame:
    """What an earlier partition takes from a later partition's log (a history run): the rows
    before its cut-off, and those without a timestamp (the rules quarantine them). Rows at or
    after the cut-off belong to later partitions: left out, not quarantined as misfiled."""
    return log.filter(F.col(TIMESTAMP).isNull() | (F.col(TIMESTAMP) < F.lit(cutoff)))


def in_lookback(log: DataFrame, *, cutoff: dt.datetime, days: int) -> DataFrame:
    """Rows with ``cutoff - days <= event_timestamp < cutoff``, plus ``age_us`` (> 0)."""
    age = F.unix_micros(F.lit(cutoff)) - F.unix_micros(F.col(TIMESTAMP))
    return log.withColumn("age_us", age).filter(
        (F.col("age_us") > 0) & (F.col("age_us") <= days * MICROS_PER_DAY)
    )


def clean_in_window(checked: DataFrame, *, cutoff: dt.datetime, days: int) -> DataFrame:
    """The clean rows (``reason`` null, :func:`with_reason`) of the ``days`` before ``cutoff``."""
    return in_lookback(checked, cutoff=cutoff, days=days).filter(F.col("reason").isNull())


def item_catalogue(clean: DataFrame) -> DataFrame:
    """One row per item of the clean rows: ``item_id``, ``item_category`` (at the item's newest
    impression; null when the log has none), ``impressions`` and ``last_seen``. The items a
    server can list as candidates of the partition, with the category its requests key by."""
    return clean.groupBy("item_id").agg(
        F.max_by("item_category", TIMESTAMP).alias("item_category"),
        F.count(F.lit(1)).alias("impressions"),
        F.max(TIMESTAMP).alias("last_seen"),
    )


def clip_position(log: DataFrame, max_position: int) -> DataFrame:
    """Positions above ``max_position`` become ``max_position`` (null stays null)."""
    return log.withColumn("position", F.least(F.col("position"), F.lit(max_position)))


def examination_by_position(counts: Sequence[tuple[int, int, int]]) -> dict[int, float]:
    """Examination probability per position = ctr(position) / ctr(top position).

    ``counts`` holds (position, impressions, clicks). A position without clicks gets a small
    floor instead of 0 so its impressions still count a little as examinations.
    """
    rates = {int(p): clk / imp for p, imp, clk in counts if imp > 0}
    if not rates:
        return {}
    top = rates[min(rates)]
    if top <= 0:
        return {p: 1.0 for p in rates}
    # A lower position can out-click the top one by chance (few impressions): an examination
    # probability is still at most 1.
    return {p: min(max(rate / top, 1e-3), 1.0) for p, rate in rates.items()}


def with_examination(log: DataFrame, examination: dict[int, float]) -> DataFrame:
    """Add ``exam``: the examination probability of the row's position (1 without a position)."""
    exam = F.lit(1.0)
    for position, value in sorted(examination.items()):
        exam = F.when(F.col("position") == position, F.lit(value)).otherwise(exam)
    return log.withColumn("exam", exam)


def grouping_id(pair: CrossPair, key_columns: Sequence[str]) -> int:
    """The pair's ``gid`` in the aggregate: the bitmask Spark's ``grouping_id()`` gives its
    grouping set (bit set = key column not grouped), stable across runs and configs."""
    n = len(key_columns)
    return sum(1 << (n - 1 - i) for i, c in enumerate(key_columns) if c not in pair.keys)


KEY_TYPES = dict(sources.LOG_SCHEMA)
"""Spark SQL type of every input column (keys keep it in the aggregate's key slots)."""


def key_slots(
    pairs: Sequence[CrossPair],
) -> tuple[list[tuple[str, str]], dict[str, dict[str, str]]]:
    """(slot columns as (name, type), pair name -> {key column: slot}) of :func:`cross_aggregate`.

    All pairs share one row layout: a pair's keys fill the slots of their type in key order
    (``key_string_0``, ``key_string_1``, ``key_bigint_0``, ...), the others stay null. There
    are as many slots of a type as the pair using most keys of that type needs, so a row is
    no wider than ``gid`` plus a handful of keys, however many pairs there are.
    """
    assigned: dict[str, dict[str, str]] = {}
    widths: dict[str, int] = {}
    for pair in pairs:
        used: dict[str, int] = {}
        assigned[pair.name] = {}
        for key in pair.keys:
            sql_type = KEY_TYPES[key]
            index = used.get(sql_type, 0)
            used[sql_type] = index + 1
            assigned[pair.name][key] = f"key_{sql_type}_{index}"
        for sql_type, count in used.items():
            widths[sql_type] = max(widths.get(sql_type, 0), count)
    slots = [(f"key_{t}_{i}", t) for t in sorted(widths) for i in range(widths[t])]
    return slots, assigned


def rollup_parents(pairs: Sequence[CrossPair]) -> dict[str, CrossPair]:
    """Pair name -> the pair its statistics are summed from, for every pair whose keys are a
    proper subset of another configured pair's (``user`` from ``user_cat``, ``item`` from
    ``seg_item``). Parents are pairs no other pair's keys contain (so a roll-up never reads
    another roll-up): of those, the one with fewest keys, then the first configured.

    Every statistic of the aggregate is a sum, a count or a latest time, so summing the
    parent's rows over the keys the child lacks gives the child's rows exactly (up to the
    order of floating-point additions): the child's exploded rows never enter the shuffle.
    """
    keys = {pair.name: frozenset(pair.keys) for pair in pairs}
    roots = [p for p in pairs if not any(keys[p.name] < keys[q.name] for q in pairs)]
    parents: dict[str, CrossPair] = {}
    for pair in pairs:
        above = [q for q in roots if keys[pair.name] < keys[q.name]]
        if above:
            parents[pair.name] = min(above, key=lambda q: len(q.keys))
    return parents


AGGREGATE_MERGE = {"imp": F.sum, "clk": F.sum, "exam": F.sum, "dec": F.sum, "last": F.max}
"""How the rows of one statistic of :func:`cross_aggregate` combine, by column prefix."""


def aggregate_columns(config: CrossStatsConfig) -> list[str]:
    """The statistic columns of :func:`cross_aggregate` after ``gid`` and the key slots."""
    columns = [f"{stat}_{w}" for w in config.windows for stat in ("imp", "clk", "exam")]
    return [*columns, "last_imp_us", "last_click_us", "dec_imp", "dec_clk"]


def cross_aggregate(log: DataFrame, config: CrossStatsConfig, *, cutoff: dt.datetime) -> DataFrame:
    """All pairs and windows in one aggregation: ``gid`` (:func:`grouping_id`), the key slots
    of :func:`key_slots` (null where a pair does not use them), per window ``imp_<w>``,
    ``clk_<w>``, ``exam_<w>``; ``last_imp_us``, ``last_click_us``, ``dec_imp``, ``dec_clk``
    over the longest window (:func:`aggregate_columns`).

    Input: clean rows of :func:`in_lookback` (``age_us``) with ``exam``. Pairs with a
    roll-up parent (:func:`rollup_parents`) are left out here: :func:`rolled_up` sums them
    from this aggregate.

    One scan, one shuffle: every input row becomes one row per pair (an ``explode`` of the
    pairs' key slots) carrying only ``gid``, the slots and the row values, and one hash
    aggregation groups them all. Measured at 1M impressions on ``local[2]``: a union of one
    aggregation per pair (a scan, a filter and a shuffle per pair) took ~1.4x the CPU and
    ~2.5x the wall time; grouping sets carrying every key column make wider rows.
    """
    cutoff_us = int(cutoff.timestamp()) * 1_000_000
    decay_per_us = math.log(2.0) / (config.half_life_days * MICROS_PER_DAY)
    keys = list(config.key_columns)
    slots, assigned = key_slots(config.pairs)
    rolled = rollup_parents(config.pairs)
    per_pair: list[Column] = []
    for pair in config.pairs:
        if pair.name in rolled:
            continue
        by_slot = {slot: key for key, slot in assigned[pair.name].items()}
        per_pair.append(
            F.struct(
                F.lit(grouping_id(pair, keys)).cast("long").alias("gid"),
                *[
                    F.col(by_slot[name]).alias(name)
                    if name in by_slot
                    else F.lit(None).cast(sql_type).alias(name)
                    for name, sql_type in slots
                ],
            )
        )
    # The decay weight is a function of the input row: computed once per impression, before
    # the explode repeats the row once per pair.
    values = ["age_us", "click", "exam", "decay"]
    rows = log.withColumn("decay", F.exp(F.col("age_us") * -decay_per_us)).select(
        F.explode(F.array(*per_pair)).alias("pair_key"), *values
    )
    rows = rows.select("pair_key.*", *values)
    aggregates: list[Column] = []
    for w in config.windows:
        inside = F.col("age_us") <= w * MICROS_PER_DAY
        aggregates += [
            F.count(F.when(inside, F.lit(1))).alias(f"imp_{w}"),
            F.sum(F.when(inside, F.col("click")).otherwise(0)).cast("long").alias(f"clk_{w}"),
            F.sum(F.when(inside, F.col("exam")).otherwise(0.0)).alias(f"exam_{w}"),
        ]
    aggregates += [
        (F.lit(cutoff_us) - F.min("age_us")).alias("last_imp_us"),
        (F.lit(cutoff_us) - F.min(F.when(F.col("click") == 1, F.col("age_us")))).alias(
            "last_click_us"
        ),
        F.sum("decay").alias("dec_imp"),
        F.sum(F.col("decay") * F.col("click")).alias("dec_clk"),
    ]
    return rows.groupBy("gid", *[name for name, _ in slots]).agg(*aggregates)


def rolled_up(aggregate: DataFrame, config: CrossStatsConfig) -> DataFrame | None:
    """The rows of every pair with a roll-up parent (:func:`rollup_parents`), summed from the
    parent's rows of :func:`cross_aggregate`, in the same columns; None when no pair has one."""
    keys = list(config.key_columns)
    slots, assigned = key_slots(config.pairs)
    by_name = {pair.name: pair for pair in config.pairs}
    frames: list[DataFrame] = []
    for name, parent in rollup_parents(config.pairs).items():
        child = by_name[name]
        mine = assigned[name]
        theirs = assigned[parent.name]
        grouped = [F.col(theirs[k]).alias(mine[k]) for k in child.keys]
        merged = [
            AGGREGATE_MERGE[column.split("_", 1)[0]](column).alias(column)
            for column in aggregate_columns(config)
        ]
        frame = (
            aggregate.filter(F.col("gid") == grouping_id(parent, keys))
            .groupBy(*grouped)
            .agg(*merged)
            .select(
                F.lit(grouping_id(child, keys)).cast("long").alias("gid"),
                *[
                    F.col(slot) if slot in mine.values() else F.lit(None).cast(t).alias(slot)
                    for slot, t in slots
                ],
                *aggregate_columns(config),
            )
        )
        frames.append(frame)
    if not frames:
        return None
    return functools.reduce(DataFrame.unionByName, frames)


STATISTICS = ("ctr", "dctr")


def trials_and_clicks(statistic: str, window: int | None) -> tuple[str, str]:
    """(trials column, clicks column) of the aggregate behind one smoothed statistic."""
    if statistic == "decay":
        return "dec_imp", "dec_clk"
    return ("imp_" if statistic == "ctr" else "exam_") + str(window), f"clk_{window}"


def prior_moments(aggregate: DataFrame, config: CrossStatsConfig) -> DataFrame:
    """Per ``gid``: ``rows`` (keys), K (keys with trials > 0), N (sum of trials), C (sum of
    clicks), Q (sum of clicks^2 / trials) for every (statistic, window) and the decayed CTR."""
    columns: list[Column] = []
    targets = [(s, w) for s in STATISTICS for w in config.windows] + [("decay", None)]
    for statistic, window in targets:
        trials, clicks = (F.col(c) for c in trials_and_clicks(statistic, window))
        tag = f"{statistic}_{window}"
        seen = trials > 0
        columns += [
            F.count(F.when(seen, F.lit(1))).alias(f"K_{tag}"),
            F.sum(F.when(seen, trials)).alias(f"N_{tag}"),
            F.sum(F.when(seen, clicks)).alias(f"C_{tag}"),
            F.sum(F.when(seen, clicks * clicks / trials)).alias(f"Q_{tag}"),
        ]
    return aggregate.groupBy("gid").agg(F.count(F.lit(1)).alias("rows"), *columns)


def beta_from_moments(
    *,
    keys: float,
    trials: float,
    clicks: float,
    sum_sq: float,
    min_strength: float,
    max_strength: float,
) -> tuple[float, float]:
    """Beta(a, b) prior of the keys' true rates, by the method of moments of a beta-binomial.

    With mean ``mu = C / N`` and ``S = sum n_i (r_i - mu)^2 = Q - 2 mu C + mu^2 N`` (r_i = c_i/n_i),
    ``E[S] = tau^2 (N - K) + K mu (1 - mu)``, so the between-key variance is
    ``tau^2 = (S - K mu (1 - mu)) / (N - K)`` and a Beta with that mean and variance has strength
    ``m = a + b = mu (1 - mu) / tau^2 - 1``, clamped to [min_strength, max_strength] (tau^2 <= 0:
    no spread beyond binomial noise, so the maximum). ``a = mu m``, ``b = (1 - mu) m``.
    A rate of exactly 0 or 1 is moved inside (0, 1) by half a click so the prior stays proper.
    """
    if trials <= 0 or keys <= 0:
        return 0.5, 0.5  # no data: the uninformative Jeffreys prior
    mu = min(max(clicks / trials, 0.5 / trials), 1.0 - 0.5 / trials)
    spread = sum_sq - 2.0 * mu * clicks + mu * mu * trials
    tau2 = (spread - keys * mu * (1.0 - mu)) / (trials - keys) if trials > keys else 0.0
    strength = mu * (1.0 - mu) / tau2 - 1.0 if tau2 > 0 else max_strength
    strength = min(max(strength, min_strength), max_strength)
    return mu * strength, (1.0 - mu) * strength


def smoothed(clicks: Column, trials: Column, prior: tuple[float, float]) -> Column:
    """(clicks + a) / (trials + a + b): a double in (0, 1) for 0 <= clicks <= trials."""
    a, b = prior
    return ((clicks + F.lit(a)) / (trials + F.lit(a + b))).cast("double")


def debiased(clicks: Column, examinations: Column, prior: tuple[float, float]) -> Column:
    """The smoothed click probability given examination, capped at 1: a double in (0, 1]."""
    return F.least(smoothed(clicks, examinations, prior), F.lit(1.0))


def pair_features(
    aggregate: DataFrame,
    pair: CrossPair,
    config: CrossStatsConfig,
    *,
    priors: dict[str, tuple[float, float]],
    cutoff: dt.datetime,
) -> DataFrame:
    """The feature rows of one pair: keys, event_timestamp (= cutoff), :func:`feature_columns`.

    ``priors`` maps ``"<statistic>_<window>"`` (and ``"decay_None"``) to (a, b) of this pair.
    """
    gid = grouping_id(pair, config.key_columns)
    cutoff_us = int(cutoff.timestamp()) * 1_000_000
    slot = key_slots(config.pairs)[1][pair.name]
    columns: list[Column] = [
        *[F.col(slot[k]).alias(k) for k in pair.keys],
        F.lit(cutoff).alias(TIMESTAMP),
    ]
    for w in config.windows:
        columns += [
            F.col(f"imp_{w}").cast("long").alias(f"{pair.name}_imp_{w}d"),
            F.col(f"clk_{w}").alias(f"{pair.name}_clk_{w}d"),
            smoothed(F.col(f"clk_{w}"), F.col(f"imp_{w}"), priors[f"ctr_{w}"]).alias(
                f"{pair.name}_ctr_{w}d"
            ),
            debiased(F.col(f"clk_{w}"), F.col(f"exam_{w}"), priors[f"dctr_{w}"]).alias(
                f"{pair.name}_dctr_{w}d"
            ),
        ]
    columns += [
        ((F.lit(cutoff_us) - F.col("last_imp_us")) / MICROS_PER_DAY).alias(
            f"{pair.name}_days_since_imp"
        ),
        ((F.lit(cutoff_us) - F.col("last_click_us")) / MICROS_PER_DAY).alias(
            f"{pair.name}_days_since_click"
        ),
        smoothed(F.col("dec_clk"), F.col("dec_imp"), priors["decay_None"]).alias(
            f"{pair.name}_decay_ctr"
        ),
    ]
    # A null key (a source without that notion) would be one meaningless row: drop it.
    keyed = F.lit(True)
    for k in pair.keys:
        keyed = keyed & F.col(slot[k]).isNotNull()
    return aggregate.filter((F.col("gid") == gid) & keyed).select(*columns)


# --- session, extract, load ---------------------------------------------------------------------


@dataclass(frozen=True)
class CrossLake:
    """Where the engine writes, under the lake root (nothing here touches the disk)."""

    lake: Lake
    source: str

    def pair(self, pair: CrossPair, ds: str) -> Path:
        return self.lake.root / "features" / "ctr_cross" / self.source / pair.name / f"dt={ds}"

    def pair_root(self, pair: CrossPair) -> Path:
        return self.lake.root / "features" / "ctr_cross" / self.source / pair.name

    def catalogue(self, ds: str) -> Path:
        """:func:`item_catalogue` of partition ``ds`` (:meth:`cascade.lake.Lake.ctr_catalogue`,
        where a server reads it too)."""
        return self.lake.ctr_catalogue(self.source, ds)

    def quarantine(self, ds: str) -> Path:
        return self.lake.quarantine(f"{self.source}_log", ds)

    def summary(self, ds: str) -> Path:
        return self.lake.reports(f"ctr_cross_stats_{self.source}", ds) / "summary.json"

    def gate_report(self, ds: str) -> Path:
        """The verdict of :mod:`jobs.ctr_cross_stats_gate` on partition ``ds``
        (:meth:`cascade.lake.Lake.ctr_cross_gate_report`)."""
        return self.lake.ctr_cross_gate_report(self.source, ds)

    def outputs(self, ds: str) -> list[Path]:
        """What a build of partition ``ds`` leaves, besides its quarantine: every pair's
        partition (whichever pairs an earlier build computed), the catalogue and the summary."""
        pairs = sorted((self.lake.root / "features" / "ctr_cross" / self.source).glob(f"*/dt={ds}"))
        found = [*pairs, self.catalogue(ds), self.summary(ds)]
        return [path for path in found if path.exists()]

    def remove_ungated(self, ds: str) -> list[Path]:
        """Remove partition ``ds``'s outputs unless its gate passed them (a build that failed
        or was refused after deleting the verdict leaves nothing unchecked in the lake)."""
        if gate_passed(self.gate_report(ds)):
            return []
        removed = self.outputs(ds)
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        return removed


def build_session(settings: Settings, *, app: str = "cascade.ctr_cross_stats") -> SparkSession:
    """A session on ``settings.spark_master`` in UTC writing microsecond timestamps."""
    local = spark_sessions.on_this_machine(settings)
    return spark_sessions.build_session(
        app,
        master=settings.spark_master,
        conf={
            **spark_sessions.UTC_MICROS,
            # Few cores locally: more shuffle partitions than ~4x cores only add task overhead.
            "spark.sql.shuffle.partitions": "8" if local else "200",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "4g",
            **spark_sessions.stack_conf(settings),
        },
        local_ip=settings.host if local else None,
        log_level="WARN",
    )


def read_log(
    spark: SparkSession, source: str, log_path: Path | None, *, sources_file: Path | None = None
) -> tuple[DataFrame, DataFrame | None]:
    """(log in the input schema, adapter-level quarantine or None) for a registered source."""
    return sources.resolve(source, sources_file).read(spark, log_path)


def default_config(
    spark: SparkSession, source: str, log_path: Path | None, *, sources_file: Path | None = None
) -> CrossStatsConfig:
    """The engine's defaults with the pairs the source can key (:func:`pairs_for`)."""
    registered = sources.resolve(source, sources_file)
    return CrossStatsConfig(pairs=pairs_for(registered, registered.provided(spark, log_path)))


@contextmanager
def sql_conf(spark: SparkSession, values: dict[str, str]) -> Iterator[None]:
    """Set session SQL options for one block and restore the previous values afterwards, so
    a tuning meant for one query does not leak into the caller's session."""
    previous = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def aggregate_conf(config: CrossStatsConfig) -> dict[str, str]:
    """Session options of pass 2 (see the module docstring for why)."""
    return {
        "spark.sql.execution.bypassPartialAggregation": str(not config.partial_aggregation).lower(),
        "spark.sql.shuffle.partitions": str(config.aggregate_partitions),
        "spark.sql.adaptive.enabled": "true",
        # Without this a cached plan keeps all aggregate_partitions (AQE is off inside caches).
        "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": str(config.aggregate_partition_bytes),
        # The cache is read once per pair right after: encoding it costs more than it saves.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }


@dataclass(frozen=True)
class CrossAggregate:
    """Pass 2's cached result: :func:`cross_aggregate` and the :func:`rolled_up` pairs."""

    frame: DataFrame
    """Every pair's rows (``gid``, key slots, :func:`aggregate_columns`): a view over the caches."""
    cached: tuple[DataFrame, ...]

    def unpersist(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def batch_counts(checked: DataFrame, *, cutoff: dt.datetime, lookback_days: int) -> DataFrame:
    """Pass 1's one small aggregation over :func:`with_reason` rows: per ``reason`` (null for
    clean rows), ``in_window`` (clean rows only: inside the longest window or older) and
    ``position`` (clean rows in the window only): ``imp`` and ``clk``. A few dozen rows."""
    clean = F.col("reason").isNull()
    age = F.unix_micros(F.lit(cutoff)) - F.unix_micros(F.col(TIMESTAMP))
    inside = clean & (age <= lookback_days * MICROS_PER_DAY)
    return (
        checked.select(
            "reason",
            F.when(clean, inside).alias("in_window"),
            F.when(inside, F.col("position")).alias("position"),
            F.when(clean, F.col("click")).alias("click"),
        )
        .groupBy("reason", "in_window", "position")
        .agg(F.count(F.lit(1)).alias("imp"), F.sum("click").cast("long").alias("clk"))
    )


def summarize_counts(rows: Sequence[Any]) -> dict[str, Any]:
    """The batch facts of :func:`batch_counts`' rows: input, quarantined (and per reason),
    clean rows in and before the window, and (position, imp, clk) for the examination."""
    by_reason: dict[str, int] = {}
    in_window = older = 0
    positions: list[tuple[int, int, int]] = []
    for row in rows:
        imp = int(row["imp"])
        if row["reason"] is not None:
            by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + imp
        elif row["in_window"]:
            in_window += imp
            if row["position"] is not None:
                positions.append((int(row["position"]), imp, int(row["clk"] or 0)))
        else:
            older += imp
    quarantined = sum(by_reason.values())
    return {
        "input_rows": quarantined + in_window + older,
        "quarantined_rows": quarantined,
        "quarantined_by_reason": dict(sorted(by_reason.items())),
        "clean_rows_in_window": in_window,
        "clean_rows_before_window": older,
        "position_counts": sorted(positions),
    }


def compute(
    log: DataFrame,
    config: CrossStatsConfig,
    *,
    cutoff: dt.datetime,
) -> tuple[CrossAggregate, dict[str, Any]]:
    """Run passes 1 and 2; return (cached aggregate, facts: examination, priors, row counts,
    the batch counts of :func:`summarize_counts` under ``"batch"``).

    The caller unpersists the aggregate. Raises :class:`EmptyBatch` (after pass 1, nothing
    cached) when no clean row falls inside the longest window.
    """
    lookback = max(config.windows)
    checked = clip_position(
        with_reason(log, config.key_columns, cutoff=cutoff), config.max_position
    )
    # Pass 1: examination per position from clean rows in the longest window, and every
    # input row counted by reason (pass 2 needs the examination first and drops rows early).
    batch = summarize_counts(batch_counts(checked, cutoff=cutoff, lookback_days=lookback).collect())
    if batch["clean_rows_in_window"] == 0:
        raise EmptyBatch(
            f"no clean row in the {lookback}-day window before the cut-off "
            f"{cutoff.date()} 00:00 UTC: {batch['input_rows']:,} input rows, "
            f"{batch['quarantined_rows']:,} quarantined {batch['quarantined_by_reason']}, "
            f"{batch['clean_rows_before_window']:,} older than the window. Nothing is "
            "published; check the log's ids and timestamps against --ds"
        )
    examination = examination_by_position(batch["position_counts"])

    # Pass 2: every pair and window (see cross_aggregate for the single shuffle).
    clean = clean_in_window(checked, cutoff=cutoff, days=lookback)
    base = cross_aggregate(with_examination(clean, examination), config, cutoff=cutoff)
    with sql_conf(log.sparkSession, aggregate_conf(config)):
        # Planned (at persist) and built (by the first action) under pass 2's options only:
        # the small aggregations after it keep their partial aggregation. Sorted by gid
        # within each partition, nearly every cached batch holds one pair, so a pair's
        # write skips the others' batches by their gid min/max.
        base = base.sortWithinPartitions("gid").persist(StorageLevel.MEMORY_AND_DISK)
        base.select("gid").write.format("noop").mode("overwrite").save()
    cached = [base]
    rolled = rolled_up(base, config)
    if rolled is not None:
        rolled = rolled.persist(StorageLevel.MEMORY_AND_DISK)
        rolled.select("gid").write.format("noop").mode("overwrite").save()
        cached.append(rolled)
    aggregate = CrossAggregate(
        frame=base if rolled is None else base.unionByName(rolled), cached=tuple(cached)
    )
    moment_rows = prior_moments(aggregate.frame, config).collect()
    key_rows = sum(int(r["rows"]) for r in moment_rows)

    priors: dict[str, dict[str, tuple[float, float]]] = {}
    moments = {r["gid"]: r.asDict() for r in moment_rows}
    tags = [f"{s}_{w}" for s in STATISTICS for w in config.windows] + ["decay_None"]
    blank: dict[str, list[str]] = {}
    for pair in config.pairs:
        row = moments.get(grouping_id(pair, config.key_columns), {})
        priors[pair.name] = {
            tag: beta_from_moments(
                keys=float(row.get(f"K_{tag}") or 0),
                trials=float(row.get(f"N_{tag}") or 0),
                clicks=float(row.get(f"C_{tag}") or 0),
                sum_sq=float(row.get(f"Q_{tag}") or 0),
                min_strength=config.min_prior_strength,
                max_strength=config.max_prior_strength,
            )
            for tag in tags
        }
        blank[pair.name] = [tag for tag in tags if not float(row.get(f"N_{tag}") or 0) > 0]
    for pair in config.pairs:
        for tag in blank[pair.name]:
            priors[pair.name][tag] = empty_window_prior(tag, priors, blank, pair.name, config)
    empty_windows = {
        pair: [statistic_column(pair, tag) for tag in tags_]
        for pair, tags_ in blank.items()
        if tags_
    }
    facts = {
        "examination": examination,
        "priors": priors,
        "aggregate_rows": key_rows,
        "pair_rows": {
            pair.name: int(moments.get(grouping_id(pair, config.key_columns), {}).get("rows", 0))
            for pair in config.pairs
        },
        "batch": batch,
        "constant_features": constant_features(priors, config, skip=empty_windows),
        "empty_windows": empty_windows,
    }
    return aggregate, facts


def empty_window_prior(
    tag: str,
    priors: dict[str, dict[str, tuple[float, float]]],
    blank: dict[str, list[str]],
    pair: str,
    config: CrossStatsConfig,
) -> tuple[float, float]:
    """The prior of a window with no trials (a day without impressions): the rate of the
    pair's nearest window with data (the same statistic's longest, else its decayed CTR, else
    any pair's decayed CTR) at the maximum strength. Every key then gets that rate, a
    constant column at the real click rate, flagged in ``empty_windows``; Jeffreys' Beta(0.5,
    0.5) would have put every key at a CTR of 0.5."""
    statistic = tag.split("_", 1)[0]
    own = [f"{statistic}_{w}" for w in sorted(config.windows, reverse=True)] + ["decay_None"]
    others = [(name, "decay_None") for name in priors if name != pair]
    for name, candidate in [(pair, t) for t in own] + others:
        if candidate not in blank[name]:
            a, b = priors[name][candidate]
            mean = a / (a + b)
            return mean * config.max_prior_strength, (1.0 - mean) * config.max_prior_strength
    raise EmptyBatch(f"no window of any pair holds a trial (pair {pair}, {tag})")


def statistic_column(pair: str, tag: str) -> str:
    """The feature column smoothed with the prior ``tag`` (``ctr_7``, ``decay_None``, ...)."""
    statistic, window = tag.split("_", 1)
    return f"{pair}_decay_ctr" if statistic == "decay" else f"{pair}_{statistic}_{window}d"


def constant_features(
    priors: dict[str, dict[str, tuple[float, float]]],
    config: CrossStatsConfig,
    skip: dict[str, list[str]] | None = None,
) -> dict[str, list[str]]:
    """Per pair, the smoothed columns whose fitted prior sits at ``max_prior_strength``: the
    data showed no spread between keys, so the prior swamps every key's counts and the column
    is (nearly) the same constant for every key. Worth flagging, not worth serving. Columns in
    ``skip`` (the empty windows, flagged for that reason) are left out."""
    flagged: dict[str, list[str]] = {}
    for pair, tags in priors.items():
        at_clamp = [
            statistic_column(pair, tag)
            for tag, (a, b) in tags.items()
            if a + b >= config.max_prior_strength * (1 - 1e-9)
            and statistic_column(pair, tag) not in (skip or {}).get(pair, [])
        ]
        if at_clamp:
            flagged[pair] = at_clamp
    return flagged


def run(
    ds: str,
    *,
    source: str = "generated",
    log_path: Path | None = None,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    config: CrossStatsConfig | None = None,
    sources_file: Path | None = None,
    history: bool = False,
) -> dict[str, Any]:
    """Build partition ``ds`` of every configured pair for one registered source; returns the
    summary. ``config`` defaults to the pairs the source can key (:func:`default_config`).

    ``history``: the log is a later partition's (a missing earlier partition rebuilt from it):
    its rows at or after ``ds`` are left out (:func:`before_cutoff`) instead of quarantined, and
    the summary says so (``history``, so the gate reads the log the same way).

    Raises :class:`EmptyBatch` when no clean row falls in the longest window (bad rows are
    quarantined first; no feature partition, summary or gate verdict is written). A build
    that fails or is refused removes the partition's earlier outputs, which its start left
    ungated (:meth:`CrossLake.remove_ungated`).
    A session passed in is left running; one built here is stopped before returning.
    """
    check_ds(ds)
    settings = settings or load_settings()
    registered = sources.resolve(source, sources_file)
    if registered.reads_landing and log_path is None:
        raise ValueError(f"source {source!r} reads a landed log: pass --log PATH")
    own = spark is None
    session = spark or build_session(settings)
    try:
        if config is None:
            config = default_config(session, source, log_path, sources_file=sources_file)
        return _run(
            ds,
            source=source,
            log_path=log_path,
            settings=settings,
            spark=session,
            config=config,
            sources_file=sources_file,
            history=history,
        )
    except BaseException:
        # The build deleted the gate's verdict first: an earlier build's files would stay
        # behind unchecked, so nothing of the partition is left but its quarantine.
        removed = CrossLake(Lake(settings.lake_root), source).remove_ungated(ds)
        if removed:
            print(
                f"[cross] ds={ds} not built: removed {len(removed)} ungated outputs of an "
                f"earlier build ({', '.join(str(p) for p in removed)})",
                flush=True,
            )
        raise
    finally:
        if own:
            session.stop()


def _write_quarantine(
    log: DataFrame,
    adapter_quarantine: DataFrame | None,
    *,
    source: str,
    config: CrossStatsConfig,
    cutoff: dt.datetime,
    path: Path,
    any_bad: bool,
) -> int:
    """Write the rows breaking a rule with their reason and raw line; returns the adapter's
    count. Bad rows are rare: the input is only re-read for them when ``any_bad``."""
    bad = with_reason(log, config.key_columns, cutoff=cutoff).filter(F.col("reason").isNotNull())
    raw = (
        F.col(sources.RAW_COLUMN)
        if sources.RAW_COLUMN in log.columns
        else F.struct(*sources.LOG_COLUMNS)
    )
    quarantine = bad.select(F.lit(source).alias("source"), F.to_json(raw).alias("line"), "reason")
    if not any_bad:
        quarantine = quarantine.limit(0)
    if adapter_quarantine is not None:
        quarantine = quarantine.unionByName(adapter_quarantine)
    quarantine.coalesce(1).write.mode("overwrite").parquet(str(path))
    return adapter_quarantine.count() if adapter_quarantine is not None else 0


def _run(
    ds: str,
    *,
    source: str,
    log_path: Path | None,
    settings: Settings,
    spark: SparkSession,
    config: CrossStatsConfig,
    sources_file: Path | None,
    history: bool = False,
) -> dict[str, Any]:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    started = time.monotonic()
    cutoff = ds_midnight(ds)
    where = CrossLake(Lake(settings.lake_root), source)
    # The partition is being rebuilt: an earlier gate verdict no longer vouches for it.
    where.gate_report(ds).unlink(missing_ok=True)
    log, adapter_quarantine = read_log(spark, source, log_path, sources_file=sources_file)
    if history:
        log = before_cutoff(log, cutoff)
    print(
        f"[cross] {source} ds={ds}{' (history, from a later log)' if history else ''}: "
        f"{window_text(ds, config.windows)}",
        flush=True,
    )

    write_quarantine = functools.partial(
        _write_quarantine,
        log,
        adapter_quarantine,
        source=source,
        config=config,
        cutoff=cutoff,
        path=where.quarantine(ds),
    )
    try:
        aggregate, facts = compute(log, config, cutoff=cutoff)
    except EmptyBatch:
        where.summary(ds).unlink(missing_ok=True)
        write_quarantine(any_bad=True)
        print(f"[cross] bad rows of ds={ds} -> {where.quarantine(ds)}", flush=True)
        raise
    batch = facts["batch"]
    print(
        f"[cross] {batch['input_rows']:,} input rows, {batch['clean_rows_in_window']:,} clean in "
        f"the window, {batch['quarantined_rows']:,} quarantined {batch['quarantined_by_reason']}"
    )
    if facts["constant_features"]:
        print(
            "[cross] WARNING prior at its clamp (no spread between keys, the column is a "
            f"constant): {facts['constant_features']}",
            flush=True,
        )
    if facts["empty_windows"]:
        print(
            "[cross] WARNING empty window (no impression in it; the column is a constant at the "
            f"pair's rate over its nearest window with data): {facts['empty_windows']}",
            flush=True,
        )

    rows: dict[str, int] = {}
    paths: dict[str, str] = {}

    def write_pair(pair: CrossPair) -> None:
        frame = pair_features(
            aggregate.frame, pair, config, priors=facts["priors"][pair.name], cutoff=cutoff
        )
        path = where.pair(pair, ds)
        counted = Observation(f"rows {pair.name}")
        frame.observe(counted, F.count(F.lit(1)).alias("rows")).coalesce(
            config.output_files
        ).write.mode("overwrite").parquet(str(path))
        rows[pair.name] = int(counted.get["rows"])
        paths[pair.name] = str(path)
        print(f"[cross]   {pair.name}: {rows[pair.name]:,} rows -> {path}", flush=True)

    catalogue: dict[str, Any] = {}

    def write_catalogue() -> None:
        items = Observation("catalogue items")
        clean = clean_in_window(
            with_reason(log, config.key_columns, cutoff=cutoff),
            cutoff=cutoff,
            days=max(config.windows),
        )
        item_catalogue(clean).observe(items, F.count(F.lit(1)).alias("rows")).coalesce(
            1
        ).write.mode("overwrite").parquet(str(where.catalogue(ds)))
        catalogue.update(items=int(items.get["rows"]), path=str(where.catalogue(ds)))
        print(f"[cross]   catalogue: {catalogue['items']:,} items -> {catalogue['path']}")

    # Concurrent Spark jobs, longest first (the catalogue's scan of the log, then the pairs by
    # their rows) so no core waits on a lone straggler; a failed write raises here after the
    # others have finished.
    largest_first = sorted(config.pairs, key=lambda pair: -facts["pair_rows"][pair.name])
    writes = [write_catalogue, *[functools.partial(write_pair, pair) for pair in largest_first]]
    try:
        with ThreadPoolExecutor(max_workers=config.write_threads) as pool:
            for done in [pool.submit(write) for write in writes]:
                done.result()
    finally:
        aggregate.unpersist()
    rows = {pair.name: rows[pair.name] for pair in config.pairs}
    paths = {pair.name: paths[pair.name] for pair in config.pairs}

    quarantined = int(batch["quarantined_rows"])
    adapter_bad = write_quarantine(any_bad=quarantined > 0)
    print(f"[cross] quarantined {quarantined + adapter_bad:,} rows -> {where.quarantine(ds)}")

    by_reason = dict(batch["quarantined_by_reason"])
    if adapter_bad:
        by_reason["adapter"] = adapter_bad
    summary = {
        "ds": ds,
        "source": source,
        "pairs": [pair.name for pair in config.pairs],
        "history": history,
        "log_path": None if log_path is None else str(log_path),
        "sources_file": None if sources_file is None else str(sources_file),
        "input_rows": int(batch["input_rows"]) + adapter_bad,
        "quarantined_rows": quarantined + adapter_bad,
        "adapter_quarantined_rows": adapter_bad,
        "quarantined_by_reason": by_reason,
        "future_rows_quarantined": int(by_reason.get(sources.FUTURE_REASON, 0)),
        "clean_rows_in_window": int(batch["clean_rows_in_window"]),
        "clean_rows_before_window": int(batch["clean_rows_before_window"]),
        "rows": rows,
        "paths": paths,
        "catalogue": catalogue,
        "quarantine_path": str(where.quarantine(ds)),
        "windows_days": list(config.windows),
        "windows": window_text(ds, config.windows),
        "examination": {str(k): v for k, v in sorted(facts["examination"].items())},
        "priors": {
            pair: {tag: {"a": a, "b": b} for tag, (a, b) in tags.items()}
            for pair, tags in facts["priors"].items()
        },
        "constant_features": facts["constant_features"],
        "empty_windows": facts["empty_windows"],
        "seconds": round(time.monotonic() - started, 3),
    }
    summary_path = where.summary(ds)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2))
    summary["summary_path"] = str(summary_path)
    print(f"[cross] done in {summary['seconds']:.1f} s; summary -> {summary_path}")
    return summary


DS_HELP = (
    "partition date YYYY-MM-DD. Every window ends at DS 00:00 UTC and excludes it: the 1-day "
    "window of 2026-11-22 is 2026-11-21; rows at or after DS are quarantined as misfiled"
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI: ``python -m jobs.ctr_cross_stats --ds YYYY-MM-DD --source NAME [--log PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_cross_stats", description=__doc__)
    parser.add_argument("--ds", required=True, help=DS_HELP)
    parser.add_argument(
        "--source",
        default="generated",
        help="a registered log source: generated, ml100k, or one from --sources-file or the "
        f"'{sources.ENTRY_POINT_GROUP}' entry points",
    )
    parser.add_argument("--log", type=Path, help="the landed log folder (ml100k: source dir)")
    parser.add_argument("--sources-file", type=Path, help="TOML file of [sources.NAME] tables")
    args = parser.parse_args(argv)
    return run(args.ds, source=args.source, log_path=args.log, sources_file=args.sources_file)


if __name__ == "__main__":
    main()
