"""Adapters: any impression log -> the input schema of the cross statistics engine.

The engine (:mod:`jobs.ctr_cross_stats`) reads one schema, :data:`LOG_SCHEMA`::

    user_id long, item_id long, user_segment string, item_category string, context string,
    position int, event_timestamp timestamp (UTC), click int

``user_segment``, ``item_category``, ``context`` and ``position`` may be null when a source has
no such notion (ML-100k has no slots and no queries); a configured pair that needs one of them
then has nothing to count and quarantines the rows it cannot key (see :func:`row_rules`).

A new source needs one :class:`LogMapping` (which raw column feeds which schema column, and how
a click is derived) or, when attributes live in other tables, a small function like
:func:`from_ml100k` that joins them and then calls :func:`map_log`. Sources here:

* ``generated``: the parquet written by :mod:`jobs.impression_log` (already in the schema);
* ``ml100k``: MovieLens-100k through :mod:`jobs.movielens` (rating >= 4 = click, segment = age
  band, category = primary genre, no position, no context).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs import movielens

LOG_SCHEMA: tuple[tuple[str, str], ...] = (
    ("user_id", "bigint"),
    ("item_id", "bigint"),
    ("user_segment", "string"),
    ("item_category", "string"),
    ("context", "string"),
    ("position", "int"),
    ("event_timestamp", "timestamp"),
    ("click", "int"),
)
"""(column, Spark SQL type) of the engine's input, in order."""

LOG_COLUMNS = tuple(name for name, _ in LOG_SCHEMA)
REQUIRED_COLUMNS = ("user_id", "item_id", "event_timestamp", "click")
"""Columns that every source must provide (the others may be mapped to null)."""


@dataclass(kw_only=True)
class LogMapping:
    """How one raw log's columns map onto :data:`LOG_SCHEMA`."""

    columns: dict[str, str] = field(default_factory=dict)
    """Schema column -> raw column (or a Spark SQL expression over raw columns). A schema
    column left out is taken from a raw column of the same name, or null when absent."""
    click_expression: str | None = None
    """SQL expression giving click (0/1) from raw columns, e.g. ``rating >= 4``; None means
    the mapped ``click`` column already holds 0/1."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.columns) - set(LOG_COLUMNS))
        if unknown:
            raise ValueError(f"LogMapping.columns names {unknown}, not in the schema {LOG_COLUMNS}")


def map_log(raw: DataFrame, mapping: LogMapping) -> DataFrame:
    """Project ``raw`` onto :data:`LOG_SCHEMA` (try_cast: an unparseable value becomes null,
    and the row rules then quarantine the row instead of failing the whole job)."""
    selected: list[Column] = []
    missing: list[str] = []
    for name, sql_type in LOG_SCHEMA:
        source = mapping.columns.get(name, name if name in raw.columns else None)
        if name == "click" and mapping.click_expression is not None:
            source = mapping.click_expression
        if source is None:
            if name in REQUIRED_COLUMNS:
                missing.append(name)
            selected.append(F.lit(None).cast(sql_type).alias(name))
            continue
        selected.append(F.expr(f"try_cast(({source}) AS {sql_type})").alias(name))
    if missing:
        raise ValueError(
            f"the log has no column for {missing} (it has {raw.columns}); add them to "
            "LogMapping.columns (schema column -> raw column or expression)"
        )
    return raw.select(*selected)


def from_generated(spark: SparkSession, path: Path) -> DataFrame:
    """The parquet log of :mod:`jobs.impression_log` (already in the schema; still mapped, so
    a hand-edited or older file with other types is caught by the row rules)."""
    if not path.is_dir():
        raise FileNotFoundError(
            f"generated log {path} does not exist; write it with "
            f"`python -m jobs.impression_log --out {path}`"
        )
    return map_log(spark.read.parquet(str(path)), LogMapping())


AGE_BANDS: tuple[tuple[int, str], ...] = ((18, "age<18"), (25, "18-24"), (35, "25-34"))
"""ML-100k user segments: (exclusive upper age, label); older users are ``35+``."""


def age_band(age: Column) -> Column:
    """The ML-100k user segment of an age (``unknown`` when the age is null)."""
    band = F.lit("35+")
    for upper, label in reversed(AGE_BANDS):
        band = F.when(age < upper, F.lit(label)).otherwise(band)
    return F.when(age.isNull(), F.lit("unknown")).otherwise(band)


def from_ml100k(spark: SparkSession, source_dir: Path | None = None) -> tuple[DataFrame, DataFrame]:
    """ML-100k as (log in the schema, quarantined raw lines with ``source, line, reason``)."""
    tables = movielens.read_ml100k(spark, source_dir)
    joined = (
        tables.impressions.join(tables.users, "user_id", "left")
        .join(tables.items, "item_id", "left")
        .withColumn("user_segment", age_band(F.col("age")))
        .withColumn("item_category", F.coalesce(F.col("genre"), F.lit("unknown")))
    )
    return map_log(joined, LogMapping()), tables.quarantine


def first_failed(rules: Sequence[tuple[Column, str]]) -> Column:
    """The reason of the first broken rule (null for a clean row)."""
    reason = F.lit(None).cast("string")
    for broken, message in reversed(rules):
        reason = F.when(broken, F.lit(message)).otherwise(reason)
    return reason


def row_rules(key_columns: Sequence[str]) -> list[tuple[Column, str]]:
    """Row-level rules of the input log: (broken, reason). ``key_columns`` are the columns some
    configured pair groups by: a null there would be counted under a null key."""
    rules: list[tuple[Column, str]] = [
        (F.col("user_id").isNull(), "user_id is null or not an integer"),
        (F.col("item_id").isNull(), "item_id is null or not an integer"),
        (F.col("event_timestamp").isNull(), "event_timestamp is null or not a timestamp"),
        (F.col("click").isNull() | ~F.col("click").isin(0, 1), "click is not 0 or 1"),
        (F.col("position") < 1, "position < 1"),
    ]
    for name in key_columns:
        if name not in ("user_id", "item_id"):
            rules.append((F.col(name).isNull(), f"{name} is null but a configured pair uses it"))
    return rules
