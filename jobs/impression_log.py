"""Deterministic impression-log generator with a known ground truth, at any scale, in Spark.

Write ``N`` impressions ending at ``--end-ds`` (overwrites the folder, so re-runs are idempotent)::

    SPARK_LOCAL_IP=127.0.0.1 cascade ctr impressions \\
        --impressions 1000000 --end-ds 2026-11-22 --out /tmp/log_1m

The hidden model (every random draw is a hash of ``(seed, salt, key)``, so the output does not
depend on the number of partitions, executors or the run)::

    relevance = sigmoid(bias + user[u] + item[i] + seg_cat[segment(u), category(i)]
                        + user_cat[u, category(i)] + seg_item[segment(u), i]
                        + ctx_item[context, i])
    P(click)  = examination[position] * relevance,   examination[p] = p ** -position_decay

``seg_cat`` is an independent draw per (segment, category); the other three crosses are low
rank, ``sigma * <f_a, g_b> / sqrt(cross_rank)`` with unit-variance latent factors per key (a
user's taste over item genres, a segment's over items, a query's over items), so a pair that
was seen rarely or never can still be predicted from its keys' other pairs: the structure the
learned cross features (:mod:`jobs.ctr_learned_cross`) exploit. ``item_category`` is the item's
genre (the pre-ranker's ``genre``).

Users and items are drawn from bounded Zipf laws (``P(rank k) ~ k ** -zipf`` over ``users`` /
``items`` ids; id 0 is the most frequent), by inverting the continuous power law on
``[0.5, n + 0.5)`` and rounding (exact in the tail, within a few percent at the head). With
the defaults (exponent 1.1, 200,000 users, 20,000 items) a 1M-impression log has heavy users
and items whose crosses are dense enough to recover the effects, and a long tail of rare
pairs; positions, contexts and timestamps are uniform.

:func:`ground_truth_relevance` recomputes ``relevance`` for any frame holding ``user_id``,
``item_id`` and ``context``; :func:`examination` gives the position bias; the ``*_effect``
functions give each hidden term. :func:`write` also records the truth beside the log in
``<out>/_TRUTH/`` (Spark and the engine skip ``_`` folders): ``model.json`` (the config and
the formula) and one small parquet per key kind (``users``, ``items``, ``segments``,
``categories``, ``contexts``: each key's main effect and latent factors, ``seg_cat``: every
cell). :func:`read_truth` loads it and :func:`pair_effect` turns it into the true logit effect
of any engine pair for a frame of keys, so benchmarks can score recovered statistics.

Output schema (the CTR engine's input schema, see :mod:`jobs.ctr_log_sources`): ``user_id``
long, ``item_id`` long, ``user_segment`` string, ``item_category`` string, ``context`` string,
``position`` int, ``event_timestamp`` timestamp (UTC, microseconds), ``click`` int.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.spark_sessions import build_session

MICROS_PER_DAY = 86_400_000_000
_MANTISSA = (1 << 53) - 1
TRUTH_DIR = "_TRUTH"
"""Folder inside the log folder holding the generator's hidden effects (skipped by readers)."""

# Salts keep the draws of different quantities independent (one hash stream per purpose).
_SALT_USER_DRAW, _SALT_ITEM_DRAW, _SALT_POSITION, _SALT_TIME = 1, 2, 3, 4
_SALT_CLICK, _SALT_CONTEXT, _SALT_SEGMENT, _SALT_CATEGORY = 5, 6, 7, 8
_SALT_USER_EFFECT, _SALT_ITEM_EFFECT, _SALT_SEG_CAT = 10, 12, 14
# Latent factors of the low-rank crosses: (salt of the first key's factors, of the second's).
_SALT_FACTORS = {"user_cat": (20, 21), "seg_item": (22, 23), "ctx_item": (24, 25)}


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
    """Item categories (genres); an item's category is a fixed hash of its id."""
    contexts: int = 500
    """Distinct context (query) values, drawn uniformly."""
    positions: int = 10
    """Slots 1..positions, drawn uniformly."""
    user_zipf: float = 1.1
    """Zipf exponent of user activity: P(user k) ~ (k + 1) ** -user_zipf (0 = uniform)."""
    item_zipf: float = 1.1
    """Zipf exponent of item popularity, the same way."""
    bias: float = -1.5
    """Intercept of the relevance logit."""
    user_sigma: float = 0.4
    """Standard deviation of the per-user logit effect."""
    item_sigma: float = 0.4
    """Standard deviation of the per-item logit effect."""
    seg_cat_sigma: float = 0.8
    """Standard deviation of the user_segment x item_category cross effect (independent cells)."""
    user_cat_sigma: float = 1.0
    """Standard deviation of the low-rank user x item_category cross effect."""
    seg_item_sigma: float = 0.6
    """Standard deviation of the low-rank user_segment x item_id cross effect."""
    ctx_item_sigma: float = 0.4
    """Standard deviation of the low-rank context x item_id cross effect."""
    cross_rank: int = 4
    """Latent factors per key of the low-rank crosses."""
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
        if self.contexts < 1 or self.positions < 1 or self.cross_rank < 1:
            raise ValueError("GeneratorConfig.contexts, .positions and .cross_rank must be >= 1")
        if self.user_zipf < 0 or self.item_zipf < 0:
            raise ValueError("user_zipf and item_zipf must be >= 0 (0 means uniform ids)")
        sigmas = ("user_sigma", "item_sigma", "seg_cat_sigma", "user_cat_sigma")
        for name in (*sigmas, "seg_item_sigma", "ctx_item_sigma"):
            if getattr(self, name) < 0:
                raise ValueError(f"GeneratorConfig.{name} must be >= 0, got {getattr(self, name)}")
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


def zipf_rank(u: Column, n: int, exponent: float) -> Column:
    """A rank in 0..n-1 with P(k) ~ (k + 1) ** -exponent, from a uniform ``u`` in (0, 1).

    Inverts the continuous power law x ** -exponent on [0.5, n + 0.5) and rounds: one
    expression per row, no table, the same rank for the same ``u`` wherever it runs.
    """
    lo, hi = 0.5, n + 0.5
    if abs(exponent - 1.0) < 1e-9:
        x = F.lit(lo) * F.pow(F.lit(hi / lo), u)
    else:
        s = 1.0 - exponent
        x = F.pow(F.lit(lo**s) + u * F.lit(hi**s - lo**s), F.lit(1.0 / s))
    return F.least(F.floor(x - 0.5), F.lit(n - 1)).cast("long")


def factor(seed: int, salt: int, key: Column, j: int) -> Column:
    """Latent factor ``j`` of a key: uniform with mean 0 and variance 1 (one hash, no log)."""
    return (uniform(seed, salt, key, F.lit(j)) - 0.5) * math.sqrt(12.0)


def low_rank(config: GeneratorConfig, cross: str, a: Column, b: Column, sigma: float) -> Column:
    """``sigma * <f_a, g_b> / sqrt(cross_rank)``: a cross effect with standard deviation sigma."""
    salt_a, salt_b = _SALT_FACTORS[cross]
    dot = sum(
        (
            factor(config.seed, salt_a, a, j) * factor(config.seed, salt_b, b, j)
            for j in range(config.cross_rank)
        ),
        F.lit(0.0),
    )
    return dot * (sigma / math.sqrt(config.cross_rank))


def user_segment(config: GeneratorConfig, user_id: Column) -> Column:
    """The segment of a user: ``s<k>``, a fixed hash of the id."""
    k = F.floor(uniform(config.seed, _SALT_SEGMENT, user_id) * config.segments)
    return F.concat(F.lit("s"), k.cast("string"))


def item_category(config: GeneratorConfig, item_id: Column) -> Column:
    """The category (genre) of an item: ``c<k>``, a fixed hash of the id."""
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
    """Hidden user x item_category cross effect (low rank: a user's taste for genres)."""
    return low_rank(config, "user_cat", user_id, category, config.user_cat_sigma)


def seg_item_effect(config: GeneratorConfig, segment: Column, item_id: Column) -> Column:
    """Hidden user_segment x item_id cross effect (low rank)."""
    return low_rank(config, "seg_item", segment, item_id, config.seg_item_sigma)


def ctx_item_effect(config: GeneratorConfig, context: Column, item_id: Column) -> Column:
    """Hidden context x item_id cross effect (low rank: a query's affinity to items)."""
    return low_rank(config, "ctx_item", context, item_id, config.ctx_item_sigma)


def examination(config: GeneratorConfig, position: Column) -> Column:
    """Probability that a slot is looked at: ``position ** -position_decay``."""
    return F.pow(position.cast("double"), F.lit(-config.position_decay))


def ground_truth_relevance(config: GeneratorConfig, frame: DataFrame) -> DataFrame:
    """``frame`` plus ``true_relevance``: the click probability at the top slot (no position bias).

    Needs ``user_id``, ``item_id`` and ``context``; segment and category are recomputed.
    """
    user, item, context = F.col("user_id"), F.col("item_id"), F.col("context")
    segment, category = user_segment(config, user), item_category(config, item)
    logit = (
        F.lit(config.bias)
        + user_effect(config, user)
        + item_effect(config, item)
        + seg_cat_effect(config, segment, category)
        + user_cat_effect(config, user, category)
        + seg_item_effect(config, segment, item)
        + ctx_item_effect(config, context, item)
    )
    return frame.withColumn("true_relevance", 1.0 / (1.0 + F.exp(-logit)))


def generate(spark: SparkSession, config: GeneratorConfig) -> DataFrame:
    """The impression log as a lazy DataFrame (nothing runs until it is written or counted)."""
    partitions = config.partitions or max(2, math.ceil(config.impressions / 2_000_000))
    row = F.col("id")
    seed = config.seed
    user = zipf_rank(uniform(seed, _SALT_USER_DRAW, row), config.users, config.user_zipf)
    item = zipf_rank(uniform(seed, _SALT_ITEM_DRAW, row), config.items, config.item_zipf)
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


# --- the recorded truth ---------------------------------------------------------------------------


def truth_tables(spark: SparkSession, config: GeneratorConfig) -> dict[str, pd.DataFrame]:
    """The hidden effects per key kind, small (one row per user, item, segment, category,
    context, and segment x category cell): main effects and the latent factors of the crosses."""
    seed, rank = config.seed, config.cross_rank

    def factors(cross: str, side: int, key: Column, prefix: str) -> list[Column]:
        salt = _SALT_FACTORS[cross][side]
        return [factor(seed, salt, key, j).alias(f"{prefix}_{j}") for j in range(rank)]

    def names(prefix: str, count: int) -> list[str]:
        return [f"{prefix}{k}" for k in range(count)]

    def keyed(name: str, values: list[str]) -> DataFrame:
        return spark.createDataFrame([(v,) for v in values], f"{name} string")

    users = spark.range(config.users).select(F.col("id").alias("user_id"))
    items = spark.range(config.items).select(F.col("id").alias("item_id"))
    segments = keyed("user_segment", names("s", config.segments))
    categories = keyed("item_category", names("c", config.categories))
    contexts = keyed("context", names("q", config.contexts))
    user, item = F.col("user_id"), F.col("item_id")
    segment, category = F.col("user_segment"), F.col("item_category")
    tables = {
        "users": users.select(
            user,
            user_segment(config, user).alias("user_segment"),
            user_effect(config, user).alias("effect"),
            *factors("user_cat", 0, user, "user_cat"),
        ),
        "items": items.select(
            item,
            item_category(config, item).alias("item_category"),
            item_effect(config, item).alias("effect"),
            *factors("seg_item", 1, item, "seg_item"),
            *factors("ctx_item", 1, item, "ctx_item"),
        ),
        "segments": segments.select(segment, *factors("seg_item", 0, segment, "seg_item")),
        "categories": categories.select(category, *factors("user_cat", 1, category, "user_cat")),
        "contexts": contexts.select(
            F.col("context"), *factors("ctx_item", 0, F.col("context"), "ctx_item")
        ),
        "seg_cat": segments.crossJoin(categories).select(
            segment, category, seg_cat_effect(config, segment, category).alias("effect")
        ),
    }
    arrow = "spark.sql.execution.arrow.pyspark.enabled"
    before = spark.conf.get(arrow, "false")
    spark.conf.set(arrow, "true")  # columnar collection: ~200,000 user rows in a blink
    try:
        return {name: frame.toPandas() for name, frame in tables.items()}
    finally:
        spark.conf.set(arrow, before)


def write_truth(spark: SparkSession, config: GeneratorConfig, out: Path) -> Path:
    """Record the hidden model of ``config`` in ``out/_TRUTH`` (see the module docstring)."""
    folder = out / TRUTH_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in truth_tables(spark, config).items():
        frame.to_parquet(folder / f"{name}.parquet", index=False)
    model = {
        "config": asdict(config),
        "logit": "bias + users.effect + items.effect + seg_cat.effect + user_cat + seg_item "
        "+ ctx_item",
        "low_rank": "<cross> = <cross>_sigma * sum_j a.<cross>_j * b.<cross>_j / sqrt(cross_rank)",
        "click": "P = position ** -position_decay * sigmoid(logit)",
    }
    (folder / "model.json").write_text(json.dumps(model, indent=2) + "\n")
    return folder


def read_truth(log: Path) -> tuple[GeneratorConfig, dict[str, pd.DataFrame]]:
    """The config and truth tables :func:`write` recorded beside the log ``log``."""
    folder = Path(log) / TRUTH_DIR
    if not (folder / "model.json").is_file():
        raise FileNotFoundError(
            f"{folder} holds no model.json: the log was not written by jobs.impression_log.write "
            "(or by a version before the truth was recorded); regenerate it"
        )
    config = GeneratorConfig(**json.loads((folder / "model.json").read_text())["config"])
    tables = {p.stem: pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))}
    return config, tables


_TRUTH_PAIRS = {
    "user_cat": ("users", "user_id", "categories", "item_category"),
    "seg_item": ("segments", "user_segment", "items", "item_id"),
    "ctx_item": ("contexts", "context", "items", "item_id"),
}


def pair_effect(
    config: GeneratorConfig, tables: dict[str, pd.DataFrame], pair: str, keys: pd.DataFrame
) -> np.ndarray:
    """The true logit effect of cross ``pair`` (seg_cat, user_cat, seg_item or ctx_item) for
    each row of ``keys`` (holding the pair's key columns); NaN for a key the log cannot hold."""
    if pair == "seg_cat":
        cells = tables["seg_cat"]
        merged = keys[["user_segment", "item_category"]].merge(
            cells, on=["user_segment", "item_category"], how="left"
        )
        return merged["effect"].to_numpy(np.float64)
    if pair not in _TRUTH_PAIRS:
        raise ValueError(
            f"no hidden effect for pair {pair!r}; known: seg_cat, {list(_TRUTH_PAIRS)}"
        )
    table_a, key_a, table_b, key_b = _TRUTH_PAIRS[pair]
    columns = [f"{pair}_{j}" for j in range(config.cross_rank)]
    left = keys[[key_a]].merge(tables[table_a][[key_a, *columns]], on=key_a, how="left")
    right = keys[[key_b]].merge(tables[table_b][[key_b, *columns]], on=key_b, how="left")
    dot = (left[columns].to_numpy(np.float64) * right[columns].to_numpy(np.float64)).sum(axis=1)
    missing = left[columns[0]].isna().to_numpy() | right[columns[0]].isna().to_numpy()
    sigma = getattr(config, f"{pair}_sigma")
    return np.where(missing, np.nan, dot * sigma / math.sqrt(config.cross_rank))


def true_logit(
    config: GeneratorConfig, tables: dict[str, pd.DataFrame], frame: pd.DataFrame
) -> np.ndarray:
    """The relevance logit of each row of ``frame`` (``user_id``, ``item_id``, ``context``)
    from the recorded truth: what :func:`ground_truth_relevance` computes, in pandas."""
    keys = frame[["user_id", "item_id", "context"]].reset_index(drop=True)
    keys = keys.merge(tables["users"][["user_id", "user_segment"]], on="user_id", how="left")
    keys = keys.merge(tables["items"][["item_id", "item_category"]], on="item_id", how="left")
    users = keys[["user_id"]].merge(tables["users"], on="user_id", how="left")["effect"]
    items = keys[["item_id"]].merge(tables["items"], on="item_id", how="left")["effect"]
    crosses = sum(pair_effect(config, tables, pair, keys) for pair in ("seg_cat", *_TRUTH_PAIRS))
    return config.bias + users.to_numpy(np.float64) + items.to_numpy(np.float64) + crosses


def write(spark: SparkSession, config: GeneratorConfig, out: Path) -> int:
    """Generate and overwrite ``out`` (parquet, microsecond timestamps) and record the truth in
    ``out/_TRUTH``; returns rows written."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    generate(spark, config).write.mode("overwrite").parquet(str(out))
    write_truth(spark, config, Path(out))
    return config.impressions


def main(argv: list[str] | None = None) -> int:
    """CLI: ``cascade ctr impressions --impressions N --end-ds YYYY-MM-DD --out DIR``."""
    parser = argparse.ArgumentParser(
        prog="cascade ctr impressions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = GeneratorConfig()
    parser.add_argument("--impressions", type=int, default=defaults.impressions)
    parser.add_argument("--end-ds", default=defaults.end_ds)
    parser.add_argument("--days", type=int, default=defaults.days, help="days the log spans")
    parser.add_argument("--users", type=int, default=defaults.users)
    parser.add_argument("--items", type=int, default=defaults.items)
    parser.add_argument("--user-zipf", type=float, default=defaults.user_zipf)
    parser.add_argument("--item-zipf", type=float, default=defaults.item_zipf)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", type=Path, required=True, help="parquet folder to (over)write")
    args = parser.parse_args(argv)
    named = ("impressions", "end_ds", "days", "users", "items", "user_zipf", "item_zipf", "seed")
    config = GeneratorConfig(**{name: getattr(args, name) for name in named})
    spark = build_session("cascade.impression_log", master="local[2]", local_ip="127.0.0.1")
    try:
        print(f"[impression_log] wrote {write(spark, config, args.out):,} rows -> {args.out}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    main()
