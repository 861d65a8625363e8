"""Source adapter: MovieLens-100k (RecBole atomic files) -> the CTR job's input schema.

A source adapter reads one raw dataset and returns :class:`SourceTables`: three typed frames
(impressions, users, items) plus a ``quarantine`` frame holding every raw line that broke a row
rule, with a ``reason``. A new source only has to return the same tables.

Output schema:

* impressions: ``user_id`` long, ``item_id`` long, ``event_timestamp`` timestamp (UTC),
  ``click`` int (1 when rating >= 4)
* users: ``user_id`` long, ``age`` long (null when absent or not an integer)
* items: ``item_id`` long, ``release_year`` int (null when unknown), ``genre`` string (the
  first token of ``class:token_seq``; ``'unknown'`` when empty)
* quarantine: ``source`` string (file name), ``line`` string (the raw line), ``reason`` string

Keys are the contract of the joins downstream, so a row whose key cannot be parsed is
quarantined; an unparseable optional attribute (age, release year) becomes null instead, since
ML-100k itself has an item with release year ``unkonwn``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

DATASET = "ml100k"
"""Name of this source in the lake (quarantine folder, impressions folder)."""

CLICK_MIN_RATING = 4.0
"""A rating at or above this counts as a click."""

MAX_EPOCH_SECONDS = 253402300799.0
"""9999-12-31T23:59:59Z: the largest timestamp a parquet/pandas reader handles."""

QUARANTINE_COLUMNS = ("source", "line", "reason")


@dataclass(kw_only=True)
class SourceTables:
    """What every source adapter returns (frames are lazy; nothing has been read yet)."""

    impressions: DataFrame
    """user_id long, item_id long, event_timestamp timestamp, click int."""
    users: DataFrame
    """user_id long, age long."""
    items: DataFrame
    """item_id long, release_year int, genre string."""
    quarantine: DataFrame
    """source string, line string, reason string: every raw line that broke a row rule."""


def default_ml100k_dir() -> Path:
    """The ML-100k folder shipped inside the installed ``recbole`` package (not imported)."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "MovieLens-100k not found: the 'recbole' package is not installed; "
            "run `pip install --no-deps recbole` or pass source_dir explicitly"
        )
    folder = Path(spec.submodule_search_locations[0]) / "dataset_example" / "ml-100k"
    if not (folder / "ml-100k.inter").is_file():
        raise FileNotFoundError(f"{folder / 'ml-100k.inter'} is missing; reinstall recbole")
    return folder


def read_atomic(spark: SparkSession, path: Path, columns: tuple[str, ...]) -> DataFrame:
    """Read a RecBole atomic file as raw lines split into string fields.

    Returns ``line`` (the raw text), ``n_fields`` and one string column per name in
    ``columns``, located through the header (``name:type``), so column order in the file does
    not matter. The header line itself is removed.
    """
    if not path.is_file():
        raise FileNotFoundError(f"atomic file {path} does not exist")
    with path.open(encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
    names = [field.split(":", 1)[0] for field in header]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{path}: header {header} lacks columns {missing}")
    raw = spark.read.text(str(path)).withColumnRenamed("value", "line")
    fields = F.split(F.col("line"), "\t")
    # Blank lines are not rows; try_element_at because ANSI mode raises on a short row.
    lines = raw.filter((F.col("line") != "\t".join(header)) & (F.trim("line") != ""))
    return lines.select(
        "line",
        F.size(fields).alias("n_fields"),
        *[F.trim(F.try_element_at(fields, F.lit(names.index(c) + 1))).alias(c) for c in columns],
    )


def _as_long(name: str) -> Column:
    return F.expr(f"try_cast({name} AS BIGINT)")


def _as_double(name: str) -> Column:
    return F.expr(f"try_cast({name} AS DOUBLE)")


def _first_failed(rules: list[tuple[Column, str]]) -> Column:
    """The reason of the first rule that fails (null when the row is clean)."""
    reason = F.lit(None).cast("string")
    for broken, message in reversed(rules):
        reason = F.when(broken, F.lit(message)).otherwise(reason)
    return reason


def _duplicate_rank(key: str) -> Column:
    # Order by the raw line so the surviving copy is deterministic across runs.
    return F.row_number().over(Window.partitionBy(key).orderBy("line"))


def parse_ratings(raw: DataFrame, *, n_fields: int) -> DataFrame:
    """Typed impressions plus a ``reason`` column (null for good rows)."""
    user_id, item_id = _as_long("user_id"), _as_long("item_id")
    rating, seconds = _as_double("rating"), _as_double("timestamp")
    reason = _first_failed(
        [
            (F.col("n_fields") != n_fields, f"expected {n_fields} tab-separated fields"),
            (user_id.isNull(), "user_id is null or not an integer"),
            (item_id.isNull(), "item_id is null or not an integer"),
            (rating.isNull(), "rating is null or not a number"),
            (~rating.between(1.0, 5.0), "rating outside 1..5"),
            (seconds.isNull(), "timestamp is missing or not a number"),
            (~seconds.between(0.0, MAX_EPOCH_SECONDS), "timestamp outside 1970..9999"),
        ]
    )
    return raw.select(
        "line",
        user_id.alias("user_id"),
        item_id.alias("item_id"),
        # Guarded so an absurd value is quarantined instead of failing the job (ANSI overflow).
        F.when(seconds.between(0.0, MAX_EPOCH_SECONDS), F.timestamp_seconds(seconds)).alias(
            "event_timestamp"
        ),
        (rating >= CLICK_MIN_RATING).cast("int").alias("click"),
        reason.alias("reason"),
    )


def parse_users(raw: DataFrame, *, n_fields: int) -> DataFrame:
    """Typed users plus ``reason``; a repeated user_id keeps one row, the rest are quarantined."""
    parsed = raw.select(
        "line",
        _as_long("user_id").alias("user_id"),
        _as_long("age").alias("age"),
        (F.col("n_fields") != n_fields).alias("bad_width"),
    )
    reason = _first_failed(
        [
            (F.col("bad_width"), f"expected {n_fields} tab-separated fields"),
            (F.col("user_id").isNull(), "user_id is null or not an integer"),
            (_duplicate_rank("user_id") > 1, "duplicate user_id"),
        ]
    )
    return parsed.select("line", "user_id", "age", reason.alias("reason"))


def parse_items(raw: DataFrame, *, n_fields: int) -> DataFrame:
    """Typed items plus ``reason``; genre is the first ``class`` token or ``'unknown'``."""
    first_genre = F.split(F.col("class"), " ").getItem(0)
    parsed = raw.select(
        "line",
        _as_long("item_id").alias("item_id"),
        F.expr("try_cast(release_year AS INT)").alias("release_year"),
        F.when(F.coalesce(first_genre, F.lit("")) == "", F.lit("unknown"))
        .otherwise(first_genre)
        .alias("genre"),
        (F.col("n_fields") != n_fields).alias("bad_width"),
    )
    reason = _first_failed(
        [
            (F.col("bad_width"), f"expected {n_fields} tab-separated fields"),
            (F.col("item_id").isNull(), "item_id is null or not an integer"),
            (_duplicate_rank("item_id") > 1, "duplicate item_id"),
        ]
    )
    return parsed.select("line", "item_id", "release_year", "genre", reason.alias("reason"))


def _split(parsed: DataFrame, source: str, keep: tuple[str, ...]) -> tuple[DataFrame, DataFrame]:
    good = parsed.filter(F.col("reason").isNull()).select(*keep)
    bad = parsed.filter(F.col("reason").isNotNull()).select(
        F.lit(source).alias("source"), "line", "reason"
    )
    return good, bad


def read_ml100k(spark: SparkSession, source_dir: Path | None = None) -> SourceTables:
    """Read ML-100k (``ml-100k.inter``, ``.user``, ``.item``) into :class:`SourceTables`."""
    folder = source_dir or default_ml100k_dir()
    inter = read_atomic(
        spark, folder / "ml-100k.inter", ("user_id", "item_id", "rating", "timestamp")
    )
    users = read_atomic(spark, folder / "ml-100k.user", ("user_id", "age"))
    items = read_atomic(spark, folder / "ml-100k.item", ("item_id", "release_year", "class"))

    impressions, bad_inter = _split(
        parse_ratings(inter, n_fields=4),
        "ml-100k.inter",
        ("user_id", "item_id", "event_timestamp", "click"),
    )
    good_users, bad_users = _split(
        parse_users(users, n_fields=5), "ml-100k.user", ("user_id", "age")
    )
    good_items, bad_items = _split(
        parse_items(items, n_fields=4), "ml-100k.item", ("item_id", "release_year", "genre")
    )
    return SourceTables(
        impressions=impressions,
        users=good_users,
        items=good_items,
        quarantine=bad_inter.unionByName(bad_users).unionByName(bad_items),
    )
