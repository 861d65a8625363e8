"""Click logs (impressions) into the lake: the importers of ``cascade land impressions``.

    cascade land impressions clicks.csv --ds 2026-11-22             # format from the suffix
    cascade land impressions export/ --ds 2026-11-22 --format jsonl
    cascade land impressions shop.parquet --ds 2026-11-22 --source shop_clicks
    cascade land impressions --source generated --ds 2026-11-22      # the generator, by name

Formats: ``csv`` (with a header row), ``parquet`` and ``jsonl`` (JSON lines), one file or a
folder of them. Without ``--source`` the columns are named as the engine's schema
(:data:`jobs.ctr_log_sources.LOG_SCHEMA`: ``user_id``, ``item_id``, ``event_timestamp``,
``click`` required; ``user_segment``, ``item_category``, ``context``, ``position`` optional);
with ``--source NAME`` a registered log source's mapping and format apply.

Keys: an integer ``user_id`` / ``item_id`` column is kept; a string one is hashed to a
non-negative 63-bit id, deterministically (Spark's ``xxhash64``, the hashing of
:mod:`jobs.impression_log`, masked to 63 bits), so the same key gets the same id in every batch.
Distinct keys that share an id are counted (``user_id_collisions``, ``item_id_collisions``). A
null or blank key is a bad row whatever the mapping: quarantined, never hashed (Spark's
``xxhash64(NULL)`` is 42).

The landed folder holds the log in the engine's schema (parquet, read as the ``landed`` source;
the optional columns only where the log has them),
``_SOURCE``, and ``_quarantine/`` (each bad row's reason and its raw values as JSON). The counts
are ``rows`` (kept), ``quarantined`` and the collision counts of hashed keys. A zero-byte or
unreadable file, a log without a required column and a log of nothing but bad rows are each one
error naming the file and the fix; nothing lands.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from jobs import ctr_log_sources as sources

FORMATS = ("csv", "jsonl", "parquet")
SPARK_FORMATS = {"csv": "csv", "jsonl": "json", "parquet": "parquet"}
DEFAULT_OPTIONS = {"csv": {"header": "true", "inferSchema": "true"}, "jsonl": {}, "parquet": {}}
ID_MASK = (1 << 63) - 1
"""Hashed ids keep 63 bits: non-negative ``bigint`` ids, like the generated and ML-100k ones."""
QUARANTINE_DIR = "_quarantine"
LANDED_SOURCE = "landed"
CORRUPT = "_corrupt_record"


class UnreadableLog(ValueError):
    """A file of the batch cannot be read in its format; the message names it and the fix."""


def _files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    return sorted(
        p
        for p in source.rglob("*")
        if p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(source).parts)
    )


def read_raw(
    spark: SparkSession, source: Path, fmt: str, options: Mapping[str, str] | None = None
) -> DataFrame:
    """The batch at ``source`` as Spark reads it in ``fmt`` (csv, jsonl, parquet); a zero-byte,
    missing or unreadable file raises :class:`UnreadableLog` naming it."""
    files = _files(source)
    if not files:
        raise UnreadableLog(f"{source} holds no data files; put the log's {fmt} files there")
    for path in files:
        if path.stat().st_size == 0:
            raise UnreadableLog(
                f"{path} is empty (0 bytes); export the log again or remove the file from the batch"
            )
    reader = spark.read.options(**{**DEFAULT_OPTIONS[fmt], **dict(options or {})})
    spark_format = SPARK_FORMATS[fmt]

    def load(paths: list[Path]) -> DataFrame:
        frame = reader.format(spark_format).load([str(p) for p in paths])
        frame.schema  # noqa: B018 - schema inference reads the files now
        if fmt == "parquet":
            frame.limit(1).collect()
        return frame

    try:
        frame = load(files)
    except Exception as exc:  # Spark's AnalysisException / Py4J errors name no file
        bad = files[0]
        for path in files if len(files) > 1 else ():
            try:
                load([path])
            except Exception:  # noqa: BLE001 - this file is the culprit
                bad = path
                break
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UnreadableLog(
            f"{bad} cannot be read as {fmt} ({detail}); check the file's format (--format "
            f"{'|'.join(FORMATS)}) or export it again"
        ) from None
    if frame.columns == [CORRUPT]:
        raise UnreadableLog(
            f"{source}: no line is a JSON object; land JSON lines (one object per line) or pass "
            "another --format"
        )
    return frame


def hash_string_keys(
    raw: DataFrame, mapping: sources.LogMapping
) -> tuple[DataFrame, sources.LogMapping, list[str]]:
    """``raw`` with each string key replaced by its 63-bit hash id (null or blank keys stay
    null), the mapping pointing at those ids, and the hashed keys' names."""
    columns = dict(mapping.columns)
    hashed: list[str] = []
    for key in sources.KEY_COLUMNS:
        expression = columns.get(key, key if key in raw.columns else None)
        if expression is None:
            continue
        helper = f"_key_{key}"
        raw = raw.withColumn(helper, F.expr(expression))
        if not isinstance(raw.schema[helper].dataType, StringType):
            raw = raw.drop(helper)
            continue
        value = F.col(helper)
        missing = sources.any_null(raw.columns, expression) | value.isNull() | (F.trim(value) == "")
        ids = F.xxhash64(value).bitwiseAND(F.lit(ID_MASK))
        raw = raw.withColumn(f"_raw_{key}", value).withColumn(
            helper, F.when(missing, F.lit(None).cast("bigint")).otherwise(ids)
        )
        columns[key] = helper
        hashed.append(key)
    keyed = sources.LogMapping(columns=columns, click_expression=mapping.click_expression)
    return raw, keyed, hashed


def collisions(frame: DataFrame, hashed: list[str]) -> dict[str, int]:
    """Per hashed key: distinct keys minus distinct ids (keys that share an id with another)."""
    if not hashed:
        return {}
    aggregates = []
    for key in hashed:
        aggregates += [
            F.countDistinct(f"_raw_{key}").alias(f"{key}_keys"),
            F.countDistinct(f"_key_{key}").alias(f"{key}_ids"),
        ]
    row = frame.agg(*aggregates).first()
    assert row is not None
    return {f"{key}_collisions": int(row[f"{key}_keys"] - row[f"{key}_ids"]) for key in hashed}


def land_log(
    spark: SparkSession,
    source: Path,
    dest: Path,
    *,
    ds: str,
    fmt: str,
    mapping: sources.LogMapping | None = None,
    options: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Read the batch at ``source``, hash string keys, quarantine bad rows, and write the log in
    the engine's schema into ``dest`` (with ``_SOURCE`` and ``_quarantine/``); returns counts."""
    raw = read_raw(spark, source, fmt, options)
    corrupt = CORRUPT in raw.columns
    if corrupt:
        raw = raw.cache()  # Spark refuses a query of the corrupt-record column alone otherwise
    keyed, keyed_mapping, hashed = hash_string_keys(raw, mapping or sources.LogMapping())
    try:
        mapped = sources.map_log(keyed, keyed_mapping, keep_raw=True)
    except sources.MissingColumns as exc:
        given = [c for c in raw.columns if c != CORRUPT]
        raise UnreadableLog(
            f"{source}: the log has no column for {exc.missing} (its columns: {given}); name "
            f"them so in the export ({', '.join(sources.REQUIRED_COLUMNS)} are required), or "
            "register a log source that maps them and land with --source NAME"
        ) from None
    cutoff = dt.datetime.fromisoformat(ds).replace(tzinfo=dt.UTC)
    rules = sources.row_rules((), cutoff=cutoff)
    if corrupt:
        rules.insert(0, (F.col(f"{sources.RAW_COLUMN}.{CORRUPT}").isNotNull(), "not a JSON object"))
    checked = mapped.withColumn("reason", sources.first_failed(rules)).cache()
    # Only the columns the log has: the statistics job computes the pairs whose keys a landed
    # log provides, and a column written as all nulls would claim keys it does not have.
    provided = sources.provided_columns(keyed.columns, keyed_mapping)
    try:
        kept = checked.where(F.col("reason").isNull()).select(*provided)
        kept.coalesce(1).write.mode("overwrite").parquet(str(dest))
        bad = checked.where(F.col("reason").isNotNull())
        bad.select("reason", F.to_json(sources.RAW_COLUMN).alias("raw")).coalesce(1).write.mode(
            "overwrite"
        ).parquet(str(dest / QUARANTINE_DIR))
        counts = {"rows": kept.count(), "quarantined": bad.count()}
        counts |= collisions(keyed, hashed)
        # The quarantine goes with the refused batch: the error carries its reasons.
        reasons = {} if counts["rows"] else dict(bad.groupBy("reason").count().collect())
    finally:
        checked.unpersist()
        if corrupt:
            raw.unpersist()
    (dest / "_SUCCESS").unlink(missing_ok=True)  # Spark's; the landing writes the batch's own
    (dest / sources.SOURCE_MARKER).write_text(LANDED_SOURCE + "\n")
    if counts["rows"] == 0:
        raise ValueError(
            f"{source}: every one of its {counts['quarantined']} rows is bad ({reasons}); "
            "nothing landed: fix the log's keys, timestamps and clicks, then land again"
        )
    return counts


def _session() -> Any:
    from cascade.config import load_settings
    from jobs.ctr_cross_stats import build_session
    from jobs.spark_sessions import active_or_new

    return active_or_new(lambda: build_session(load_settings(), app="cascade.land.impressions"))


def _land(
    fmt: str,
    source: Path,
    dest: Path,
    ds: str,
    mapping: sources.LogMapping | None = None,
    options: Mapping[str, str] | None = None,
) -> dict[str, int]:
    with _session() as spark:
        return land_log(spark, source, dest, ds=ds, fmt=fmt, mapping=mapping, options=options)


def land_csv(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
    """A CSV log with a header row, columns named as the engine's schema."""
    return _land("csv", source, dest, ds)


def land_parquet(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
    """A parquet log, columns named as the engine's schema."""
    return _land("parquet", source, dest, ds)


def land_jsonl(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
    """A JSON-lines log, keys named as the engine's schema."""
    return _land("jsonl", source, dest, ds)


def source_importer(name: str, sources_file: Path | None) -> Callable[..., dict[str, int]]:
    """The importer of a batch in the shape of registered log source ``name`` (its mapping,
    format and reader options); ValueError for an unknown source or one that reads its own
    data."""
    registered = sources.resolve(name, sources_file)
    if not registered.reads_landing:
        raise ValueError(
            f"log source {name!r} reads its own data ({registered.description}); it lands no "
            "path: set CASCADE_CROSS_SOURCE to it instead"
        )
    fmt = "jsonl" if registered.format == "json" else registered.format

    def land(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
        return _land(fmt, source, dest, ds, registered.mapping, registered.options)

    return land
