"""The cross statistics engine's two passes over a log (:func:`compute`), and the priors and
flags that follow from their counts.

Pass 1 (:func:`batch_counts`, :func:`summarize_counts`): one small aggregation counts the input
rows, the quarantined rows per reason and the clean rows inside and before the longest window,
and gives each position's examination probability, ``min(1, ctr(position) / ctr(top
position))`` (unbiased when positions are assigned independently of relevance, as in the
generator; on logs ranked by relevance it overstates the bias and should come from a
randomized slice instead). A batch with no clean row in the window stops there with
:class:`~jobs.ctr_cross_config.EmptyBatch`. Pass 2: one scan, one shuffle and one aggregation
for all pairs and windows (:func:`jobs.ctr_cross_transforms.cross_aggregate`), cached because it
is small next to the input; the priors and the per-pair writes then read the cache.

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
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.ctr_cross_config import MICROS_PER_DAY, TIMESTAMP, CrossStatsConfig, EmptyBatch
from jobs.ctr_cross_transforms import (
    STATISTICS,
    beta_from_moments,
    clean_in_window,
    clip_position,
    cross_aggregate,
    examination_by_position,
    grouping_id,
    prior_moments,
    rolled_up,
    with_examination,
    with_reason,
)


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
