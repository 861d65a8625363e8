"""Deterministic impression-log generator with a known ground truth, at any scale, in Spark.

Write ``N`` impressions ending at ``--end-ds`` (overwrites the folder, so re-runs are idempotent)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.impression_log \\
        --impressions 1000000 --end-ds 2026-11-22 --out /tmp/log_1m

The hidden model (every random draw is a hash of ``(seed, salt, key)``, so the output does not
depend on the number of partitions, executors or the run)::

    relevance = sigmoid(bias + user[u] + item[i] + seg_cat[segment(u), category(i)]
                        + user_cat[u, category(i)])
    P(click)  = examination[position] * relevance,   examination[p] = p ** -position_decay

Users and items are drawn with a power-law skew (many rare keys, a few heavy ones), positions
and timestamps uniformly. :func:`ground_truth_relevance` recomputes ``relevance`` for any frame
holding ``user_id`` and ``item_id``; :func:`examination` gives the position bias; the
``*_effect`` functions give each hidden term, so tests and benchmarks can score recovered
statistics against the truth.

Output schema (the CTR engine's input schema, see :mod:`jobs.ctr_log_sources`): ``user_id``
long, ``item_id`` long, ``user_segment`` string, ``item_category`` string, ``context`` string,
``position`` int, ``event_timestamp`` timestamp (UTC, microseconds), ``click`` int.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.spark_sessions import build_session

MICROS_PER_DAY = 86_400_000_000
_MANTISSA = (1 << 53) - 1

# Salts keep the draws of different quantities independent (one hash stream per purpose).
_SALT_USER_DRAW, _SALT_ITEM_DRAW, _SALT_POSITION, _SALT_TIME = 1, 2, 3, 4
_SALT_CLICK, _SALT_CONTEXT, _SALT_SEGMENT, _SALT_CATEGORY = 5, 6, 7, 8
_SALT_USER_EFFECT, _SALT_ITEM_EFFECT, _SALT_SEG_CAT, _SALT_USER_CAT = 10, 12, 14, 16


@dataclass(kw_only=True)
class GeneratorConfig:
    """Size, shape and hidden model of a generated impression log."""

    impressions: int = 1_000_000
    """Rows to generate."""
    end_ds: str = "2026-11-22"
    """Partition date the log ends at: every timestamp is strictly before its midnight UTC."""
    days: int = 35
    """Timestamps are uniform over the ``days`` days before ``end_ds``."""
    users: int = 200_000
    """Distinct user ids that can be drawn (ids 0..users-1)."""
    items: int = 20_000
    """Distinct item ids that can be drawn (ids 0..items-1)."""
    segments: int = 16
    """User segments; a user's segment is a fixed hash of its id."""
    categories: int = 24
    """Item categories; an item's category is a fixed hash of its id."""
    contexts: int = 500
    """Distinct context (query) values, drawn uniformly; they carry no effect."""
    positions: int = 10
    """Slots 1..positions, drawn uniformly."""
    user_skew: float = 2.0
    """user_id = floor(users * u ** user_skew): > 1 makes low ids heavy and the tail rare."""
    item_skew: float = 2.5
    """Same power-law skew for item ids."""
    bias: float = -1.5
    """Intercept of the relevance logit."""
    user_sigma: float = 0.4
    """Standard deviation of the per-user logit effect."""
    item_sigma: float = 0.4
    """Standard deviation of the per-item logit effect."""
    seg_cat_sigma: float = 0.8
    """Standard deviation of the user_segment x item_category cross effect."""
    user_cat_sigma: float = 0.5
    """Standard deviation of the user x item_category cross effect."""
    position_decay: float = 0.7
    """examination[p] = p ** -position_decay (1 at the top slot)."""
    seed: int = 7
    """Every draw is a hash of the seed: equal seeds give byte-equal logs."""
    partitions: int = 0
    """Spark partitions of the generated range; 0 means one per ~2M rows (at least 2)."""

    def __post_init__(self) -> None:
        dt.date.fromisoformat(self.end_ds)
        for name in ("impressions", "days", "users", "items", "segments", "categories"):
            if getattr(self, name) < 1:
                raise ValueError(f"GeneratorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.contexts < 1 or self.positions < 1:
            raise ValueError("GeneratorConfig.contexts and .positions must be >= 1")
        if self.user_skew <= 0 or self.item_skew <= 0:
            raise ValueError("user_skew and item_skew must be > 0 (1 means uniform ids)")
        if self.position_decay < 0:
            raise ValueError(f"position_decay must be >= 0, got {self.position_decay}")
        if self.partitions < 0:
            raise ValueError("partitions must be >= 0 (0 = automatic)")

    @property
    def end(self) -> dt.datetime:
        """Midnight UTC of ``end_ds``: the exclusive upper bound of every timestamp."""
        return dt.datetime.combine(dt.date.fromisoformat(self.end_ds), dt.time(), dt.UTC)


# --- deterministic draws: native column expressions, no UDFs -----------------------------------


def uniform(seed: int, salt: int, *keys: Column) -> Column:
    """A double in (0, 1), a fixed function of (seed, salt, keys) (53 bits of xxhash64)."""
    hashed = F.xxhash64(F.lit(seed), F.lit(salt), *keys)
    return (hashed.bitwiseAND(F.lit(_MANTISSA)).cast("double") + 0.5) / float(1 << 53)


def normal(seed: int, salt: int, *keys: Column) -> Column:
    """A standard normal draw (Box-Muller over two independent uniforms)."""
    u1, u2 = uniform(seed, salt, *keys), uniform(seed, salt + 1, *keys)
    return F.sqrt(-2.0 * F.log(u1)) * F.cos(2.0 * math.pi * u2)


def user_segment(config: GeneratorConfig, user_id: Column) -> Column:
    """The segment of a user: ``s<k>``, a fixed hash of the id."""
    k = F.floor(uniform(config.seed, _SALT_SEGMENT, user_id) * config.segments)
    return F.concat(F.lit("s"), k.cast("string"))


def item_category(config: GeneratorConfig, item_id: Column) -> Column:
    """The category of an item: ``c<k>``, a fixed hash of the id."""
    k = F.floor(uniform(config.seed, _SALT_CATEGORY, item_id) * config.categories)
    return F.concat(F.lit("c"), k.cast("string"))


def user_effect(config: GeneratorConfig, user_id: Column) -> Column:
    return normal(config.seed, _SALT_USER_EFFECT, user_id) * config.user_sigma


def item_effect(config: GeneratorConfig, item_id: Column) -> Column:
    return normal(config.seed, _SALT_ITEM_EFFECT, item_id) * config.item_sigma


def seg_cat_effect(config: GeneratorConfig, segment: Column, category: Column) -> Column:
    """Hidden user_segment x item_category cross effect (a logit offset)."""
    return normal(config.seed, _SALT_SEG_CAT, segment, category) * config.seg_cat_sigma


def user_cat_effect(config: GeneratorConfig, user_id: Column, category: Column) -> Column:
    """Hidden user x item_category cross effect (a logit offset)."""
    return normal(config.seed, _SALT_USER_CAT, user_id, category) * config.user_cat_sigma


def examination(config: GeneratorConfig, position: Column) -> Column:
    """Probability that a slot is looked at: ``position ** -position_decay``."""
    return F.pow(position.cast("double"), F.lit(-config.position_decay))


def ground_truth_relevance(config: GeneratorConfig, frame: DataFrame) -> DataFrame:
    """``frame`` plus ``true_relevance``: the click probability at the top slot (no position bias).

    Needs ``user_id`` and ``item_id``; segment and category are recomputed from them.
    """
    user, item = F.col("user_id"), F.col("item_id")
    segment, category = user_segment(config, user), item_category(config, item)
    logit = (
        F.lit(config.bias)
        + user_effect(config, user)
        + item_effect(config, item)
        + seg_cat_effect(config, segment, category)
        + user_cat_effect(config, user, category)
    )
    return frame.withColumn("true_relevance", 1.0 / (1.0 + F.exp(-logit)))


def generate(spark: SparkSession, config: GeneratorConfig) -> DataFrame:
    """The impression log as a lazy DataFrame (nothing runs until it is written or counted)."""
    partitions = config.partitions or max(2, math.ceil(config.impressions / 2_000_000))
    row = F.col("id")
    seed = config.seed
    user = F.floor(
        F.pow(uniform(seed, _SALT_USER_DRAW, row), F.lit(config.user_skew)) * config.users
    ).cast("long")
    item = F.floor(
        F.pow(uniform(seed, _SALT_ITEM_DRAW, row), F.lit(config.item_skew)) * config.items
    ).cast("long")
    position = (F.floor(uniform(seed, _SALT_POSITION, row) * config.positions) + 1).cast("int")
    end_us = int(config.end.timestamp()) * 1_000_000
    span_us = config.days * MICROS_PER_DAY
    offset_us = F.floor(uniform(seed, _SALT_TIME, row) * span_us).cast("long") + 1
    context = F.concat(
        F.lit("q"), F.floor(uniform(seed, _SALT_CONTEXT, row) * config.contexts).cast("string")
    )
    drawn = spark.range(0, config.impressions, numPartitions=partitions).select(
        row.alias("row_id"),
        user.alias("user_id"),
        item.alias("item_id"),
        context.alias("context"),
        position.alias("position"),
        F.timestamp_micros(F.lit(end_us) - offset_us).alias("event_timestamp"),
    )
    truth = ground_truth_relevance(config, drawn)
    p_click = examination(config, F.col("position")) * F.col("true_relevance")
    clicked = uniform(seed, _SALT_CLICK, F.col("row_id")) < p_click
    return truth.select(
        "user_id",
        "item_id",
        user_segment(config, F.col("user_id")).alias("user_segment"),
        item_category(config, F.col("item_id")).alias("item_category"),
        "context",
        "position",
        "event_timestamp",
        clicked.cast("int").alias("click"),
    )


def write(spark: SparkSession, config: GeneratorConfig, out: Path) -> int:
    """Generate and overwrite ``out`` (parquet, microsecond timestamps); returns rows written."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    generate(spark, config).write.mode("overwrite").parquet(str(out))
    return config.impressions


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m jobs.impression_log --impressions N --end-ds YYYY-MM-DD --out DIR``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.impression_log", description=__doc__)
    parser.add_argument("--impressions", type=int, default=GeneratorConfig.impressions)
    parser.add_argument("--end-ds", default=GeneratorConfig.end_ds)
    parser.add_argument("--seed", type=int, default=GeneratorConfig.seed)
    parser.add_argument("--out", type=Path, required=True, help="parquet folder to (over)write")
    args = parser.parse_args(argv)
    config = GeneratorConfig(impressions=args.impressions, end_ds=args.end_ds, seed=args.seed)
    spark = build_session("cascade.impression_log", master="local[2]", local_ip="127.0.0.1")
    try:
        print(f"[impression_log] wrote {write(spark, config, args.out):,} rows -> {args.out}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    main()
