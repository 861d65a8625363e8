"""Adapters: any impression log -> the input schema of the cross statistics engine.

The engine (:mod:`jobs.ctr_cross_stats`) reads one schema, :data:`LOG_SCHEMA`::

    user_id long, item_id long, user_segment string, item_category string, context string,
    position int, event_timestamp timestamp (UTC), click int

``user_segment``, ``item_category``, ``context`` and ``position`` may be null when a source has
no such notion (ML-100k has no slots and no queries); a configured pair that needs one of them
then has nothing to count and quarantines the rows it cannot key (see :func:`row_rules`).

Sources are registered by name (:func:`registered_sources`); the name goes into every output
path, the quarantine and the reports. Built in:

* ``generated``: the parquet written by :mod:`jobs.impression_log` (already in the schema);
* ``landed``: the parquet ``cascade land impressions`` writes (already in the schema; string
  keys hashed to ids, see :mod:`jobs.click_log_landing`);
* ``ml100k``: MovieLens-100k through :mod:`jobs.movielens` (rating >= 4 = click, segment = age
  band, category = primary genre, no position, no context).

A new source is one :class:`LogSource`: a :class:`LogMapping` (which raw column feeds which
schema column, and how a click is derived) plus the file format, registered either

* in a TOML file (``CASCADE_CROSS_SOURCES_FILE``, default ``$CASCADE_HOME/log_sources.toml``)::

      [sources.shop_clicks]
      format = "csv"                      # parquet | csv | json
      options = { header = "true" }      # Spark reader options
      columns = { user_id = "uid", item_id = "sku", event_timestamp = "ts" }
      click = "action = 'click'"          # SQL over raw columns; omit when `click` is 0/1
      description = "clicks exported by the shop"

* or as an entry point of the group ``cascade.log_sources`` whose object is a
  :class:`LogSource` (for a source that must join other tables first, like ``ml100k``).

A landed log (``landing/impressions/dt=<ds>/`` with ``_SUCCESS``) declares its source in a
``_SOURCE`` file holding the name; without one it is read as the configured source.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


RAW_COLUMN = "_raw"
"""Column of the mapped log holding the raw row (a struct), so a quarantined row keeps the
values as they came, not their casts. Spark prunes it from every query that does not use it."""


KEY_COLUMNS = ("user_id", "item_id")
"""The ids a row is counted under: a row whose raw key is null is a bad row."""
_IDENTIFIER = re.compile(r"`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*)")


def referenced_columns(raw_columns: Sequence[str], expression: str) -> list[str]:
    """The raw columns a mapping expression names (a bare or back-quoted identifier)."""
    names = {a or b for a, b in _IDENTIFIER.findall(expression)}
    return [column for column in raw_columns if column in names]


def any_null(raw_columns: Sequence[str], expression: str) -> Column:
    """True where a raw column the expression reads is null."""
    columns = referenced_columns(raw_columns, expression)
    test = F.lit(False)
    for column in columns:
        test = test | F.col(f"`{column}`").isNull()
    return test


def provided_columns(raw_columns: Sequence[str], mapping: LogMapping) -> tuple[str, ...]:
    """Schema columns the mapping fills from ``raw_columns`` (the others are null)."""
    return tuple(
        name
        for name in LOG_COLUMNS
        if name in mapping.columns
        or name in raw_columns
        or (name == "click" and mapping.click_expression is not None)
    )


class MissingColumns(ValueError):
    """A log without a column (or mapping) for some of :data:`REQUIRED_COLUMNS`."""

    def __init__(self, missing: list[str], present: list[str]) -> None:
        self.missing, self.present = missing, present
        super().__init__(
            f"the log has no column for {missing} (it has {present}); add them to "
            "LogMapping.columns (schema column -> raw column or expression)"
        )


def map_log(raw: DataFrame, mapping: LogMapping, *, keep_raw: bool = False) -> DataFrame:
    """Project ``raw`` onto :data:`LOG_SCHEMA` (try_cast: an unparseable value becomes null,
    and the row rules then quarantine the row instead of failing the whole job). With
    ``keep_raw`` the raw row rides along in :data:`RAW_COLUMN` for the quarantine."""
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
        value = F.expr(f"try_cast(({source}) AS {sql_type})")
        if name in KEY_COLUMNS:
            # A null raw key stays null whatever the expression makes of it (Spark's
            # xxhash64(NULL) is 42: every missing user would become one valid user).
            value = F.when(any_null(raw.columns, source), F.lit(None)).otherwise(value)
        selected.append(value.alias(name))
    if missing:
        raise MissingColumns(missing, raw.columns)
    if keep_raw:
        selected.append(F.struct(*[F.col(f"`{c}`") for c in raw.columns]).alias(RAW_COLUMN))
    return raw.select(*selected)


def from_generated(spark: SparkSession, path: Path) -> DataFrame:
    """The parquet log of :mod:`jobs.impression_log` (already in the schema; still mapped, so
    a hand-edited or older file with other types is caught by the row rules)."""
    if not path.is_dir():
        raise FileNotFoundError(
            f"generated log {path} does not exist; write it with "
            f"`cascade ctr impressions --out {path}`"
        )
    return map_log(spark.read.parquet(str(path)), LogMapping(), keep_raw=True)


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
    return map_log(joined, LogMapping(), keep_raw=True), tables.quarantine


def first_failed(rules: Sequence[tuple[Column, str]]) -> Column:
    """The reason of the first broken rule (null for a clean row)."""
    reason = F.lit(None).cast("string")
    for broken, message in reversed(rules):
        reason = F.when(broken, F.lit(message)).otherwise(reason)
    return reason


FUTURE_REASON = "event_timestamp at or after ds 00:00 UTC (the partition's cut-off)"


def row_rules(
    key_columns: Sequence[str], *, cutoff: dt.datetime | None = None
) -> list[tuple[Column, str]]:
    """Row-level rules of the input log: (broken, reason). ``key_columns`` are the columns some
    configured pair groups by: a null there would be counted under a null key. With ``cutoff``
    (the partition's ``ds`` midnight) a row at or after it breaks a rule too: the partition's
    log ends there, so such a row is misfiled or mis-stamped."""
    rules: list[tuple[Column, str]] = [
        (F.col("user_id").isNull(), "user_id is null or not an integer"),
        (F.col("item_id").isNull(), "item_id is null or not an integer"),
        (F.col("event_timestamp").isNull(), "event_timestamp is null or not a timestamp"),
    ]
    if cutoff is not None:
        rules.append((F.col("event_timestamp") >= F.lit(cutoff), FUTURE_REASON))
    rules += [
        (F.col("click").isNull() | ~F.col("click").isin(0, 1), "click is not 0 or 1"),
        (F.col("position") < 1, "position < 1"),
    ]
    for name in key_columns:
        if name not in ("user_id", "item_id"):
            rules.append((F.col(name).isNull(), f"{name} is null but a configured pair uses it"))
    return rules


# --- registered sources -------------------------------------------------------------------------

SOURCE_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")
"""A source name: it becomes part of lake paths and Feast names."""
FORMATS = ("parquet", "csv", "json")
ENTRY_POINT_GROUP = "cascade.log_sources"
SOURCE_MARKER = "_SOURCE"
"""File in a landed log's folder naming its source."""

Reader = Callable[[SparkSession, Path | None], tuple[DataFrame, DataFrame | None]]


class UnknownSource(ValueError):
    """A source name that nothing registered."""


@dataclass(frozen=True, kw_only=True)
class LogSource:
    """A named impression log: how to read it and how its columns map onto the schema."""

    name: str
    mapping: LogMapping = field(default_factory=LogMapping)
    format: str = "parquet"
    """Spark reader of a landed log folder: parquet, csv or json."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Spark reader options (``header``, ``sep``, ...)."""
    reader: Reader | None = None
    """Reads the source itself (joins, a package's files) instead of a landed folder; gets the
    folder (or None) and returns (log in the schema, adapter quarantine or None)."""
    pairs: tuple[str, ...] | None = None
    """Names of the pairs to compute; None: every built-in pair whose keys the log provides."""
    description: str = ""

    def __post_init__(self) -> None:
        if not SOURCE_NAME.fullmatch(self.name):
            raise ValueError(
                f"source name {self.name!r}: use 1-48 lower-case letters, digits and "
                "underscores, starting with a letter (it becomes part of lake paths)"
            )
        if self.format not in FORMATS:
            raise ValueError(f"source {self.name!r}: format {self.format!r} not in {FORMATS}")

    def _require_landed(self, path: Path | None) -> None:
        if path is None or not path.is_dir():
            raise FileNotFoundError(
                f"source {self.name!r}: no log folder at {path}; land the log there (with a "
                "_SUCCESS marker), run the pipeline's `log` step, or generate one with "
                "`cascade ctr impressions --out PATH`"
            )

    @property
    def reads_landing(self) -> bool:
        """Whether the source's data is a log landed in the lake (else its reader finds it)."""
        return self.reader is None

    def read(self, spark: SparkSession, path: Path | None) -> tuple[DataFrame, DataFrame | None]:
        """(log in the schema with :data:`RAW_COLUMN`, adapter quarantine or None)."""
        if self.reader is not None:
            return self.reader(spark, path)
        self._require_landed(path)
        raw = spark.read.options(**dict(self.options)).format(self.format).load(str(path))
        return map_log(raw, self.mapping, keep_raw=True), None

    def provided(self, spark: SparkSession, path: Path | None) -> tuple[str, ...]:
        """Schema columns this source fills (from the landed log's raw columns)."""
        if self.reader is not None:
            return LOG_COLUMNS  # a reader source names its pairs
        self._require_landed(path)
        columns = spark.read.options(**dict(self.options)).format(self.format).load(str(path))
        return provided_columns(columns.columns, self.mapping)


GENERATED = LogSource(
    name="generated",
    description="parquet in the engine's schema, written by jobs.impression_log",
)
LANDED = LogSource(
    name="landed",
    description="parquet in the engine's schema, landed by `cascade land impressions`",
)
ML100K = LogSource(
    name="ml100k",
    reader=lambda spark, path: from_ml100k(spark, path),
    pairs=("user", "item", "seg_cat", "user_cat", "seg_item"),
    description="MovieLens-100k from its installed package (rating >= 4 = click)",
)
BUILT_IN = (GENERATED, LANDED, ML100K)


def source_from_table(name: str, table: Mapping[str, Any], origin: str) -> LogSource:
    """A :class:`LogSource` from one ``[sources.NAME]`` table of a sources file."""
    allowed = {"format", "options", "columns", "click", "pairs", "description"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"{origin}: [sources.{name}] has unknown keys {unknown}; use {allowed}")
    try:
        mapping = LogMapping(
            columns={str(k): str(v) for k, v in dict(table.get("columns", {})).items()},
            click_expression=None if table.get("click") is None else str(table["click"]),
        )
        pairs = table.get("pairs")
        return LogSource(
            name=name,
            mapping=mapping,
            format=str(table.get("format", "parquet")),
            options={str(k): str(v) for k, v in dict(table.get("options", {})).items()},
            pairs=None if pairs is None else tuple(str(p) for p in pairs),
            description=str(table.get("description", "")),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{origin}: [sources.{name}]: {exc}") from None


def sources_from_file(path: Path) -> list[LogSource]:
    """The sources declared in a TOML file (``[sources.NAME]`` tables); none if it is absent."""
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    tables = data.get("sources", {})
    if not isinstance(tables, dict) or set(data) - {"sources"}:
        raise ValueError(f"{path}: expected only [sources.NAME] tables")
    return [source_from_table(name, table, str(path)) for name, table in tables.items()]


def registered_sources(sources_file: Path | None = None) -> dict[str, LogSource]:
    """Every source by name: built in, then entry points, then the sources file. A name
    registered twice is an error, so a file cannot silently replace a built-in source."""
    found: dict[str, tuple[LogSource, str]] = {s.name: (s, "built in") for s in BUILT_IN}

    def add(source: Any, origin: str) -> None:
        if not isinstance(source, LogSource):
            raise TypeError(f"{origin} is a {type(source).__name__}, not a LogSource")
        if source.name in found:
            raise ValueError(
                f"log source {source.name!r} from {origin} is already registered "
                f"({found[source.name][1]}); pick another name"
            )
        found[source.name] = (source, origin)

    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        add(entry.load(), f"entry point {entry.value}")
    if sources_file is not None:
        for source in sources_from_file(sources_file):
            add(source, str(sources_file))
    return {name: source for name, (source, _) in found.items()}


def resolve(name: str, sources_file: Path | None = None) -> LogSource:
    """The registered source ``name``; :class:`UnknownSource` lists the names there are."""
    known = registered_sources(sources_file)
    if name not in known:
        where = f" or in {sources_file}" if sources_file is not None else ""
        raise UnknownSource(
            f"unknown log source {name!r}; registered: {', '.join(sorted(known))}. Register it "
            f"as a [sources.{name}] table in the sources file{where} or as a "
            f"'{ENTRY_POINT_GROUP}' entry point"
        )
    return known[name]


def declared_source(folder: Path) -> str | None:
    """The source a landed log names in its ``_SOURCE`` file, or None without one."""
    marker = folder / SOURCE_MARKER
    if not marker.is_file():
        return None
    name = marker.read_text(encoding="utf-8", errors="replace").strip()
    if not SOURCE_NAME.fullmatch(name):
        raise ValueError(f"{marker} names {name[:60]!r}, not a source name")
    return name
