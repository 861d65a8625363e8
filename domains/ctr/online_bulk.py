"""Bulk materialization into Feast's online stores: Arrow batches in, SQLite rows (the local
profile) or Redis hashes (the cluster profile) out.

Feast's ``materialize`` turns every value into a ``ValueProto`` object and upserts one SQL row
per (entity, feature) from Python. Here a partition is read as Arrow record batches of bounded
size and each batch is encoded column by column with numpy/Arrow
(:mod:`domains.ctr.online_encoding`): entity keys
(``serialize_entity_key``, version 3), value blobs (``ValueProto`` wire bytes) and
``value_text`` exactly as Feast writes them. Python then binds ONE staging row per entity (its
key, timestamps, and each feature's blob and text) and one ``INSERT ... SELECT`` fans the
staged entities out into Feast's table inside SQLite (a ``CROSS JOIN`` with the feature list,
in key order), so the per-(entity, feature) work runs in C; the next batch is read and encoded
on a second thread while SQLite runs that statement.

What bounds it is SQLite itself: Feast's table keeps every (entity, feature) as a row of a
rowid table with two indexes on the entity key, so a 15-feature cross row costs 15 rows and
~45 B-tree inserts; the fan-out statement alone (no Python) is most of the time.

The result equals Feast's own path: every batch is checked against Feast's converter
(``feast.utils._convert_arrow_to_proto`` + ``serialize_entity_key``) on a sample of rows
(always including rows with missing values) and the load stops with
:class:`BulkEncodingMismatch` on any difference. Differences from Feast by design:

- an existing row is replaced only by a row whose event timestamp is not older (Feast's SQLite
  store overwrites unconditionally, so loading an older partition after a newer one would go
  back in time; its Redis store keeps the newer one, as this does);
- rows with a missing entity key are skipped and counted (Feast fails on them);
- each batch commits on its own (bounded journal); a failed load leaves earlier batches
  written, and rerunning the partition replaces them (no duplicates: the table's primary key
  is (entity_key, feature_name)).

The loading connection runs with ``synchronous = OFF`` and a large page cache (its own
settings, gone when it closes: an application crash loses at most the open batch, an OS crash
may need the partition rerun); the store's journal mode is left as it is, since switching a
shared store's mode while the server reads it is not safe.

Redis (:class:`RedisBulkWriter`) gets Feast's own layout: one hash per entity under the key
``serialize_entity_key(...) + project``, a field per feature named by the murmur3 hash of
``view:feature`` holding the value blob, and ``_ts:view`` holding the event time as a
``Timestamp`` message. Each batch is encoded by the same column encoders (checked against
Feast's converter and ``_redis_key`` on a sample the same way), the stored timestamps of its
keys are read in one pipeline and the hashes written in another, as Feast does: a row replaces
a stored one only if its event time is newer (``skip_dedup`` in the store's config skips the
read), and ``key_ttl_seconds`` is applied.

After the load the caller records the materialized interval in the registry
(:func:`record_materialization`), exactly as ``FeatureStore.materialize`` does.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from cascade.progress import Progress
from domains.ctr.online_encoding import (
    BulkEncodingMismatch,
    BulkUnsupported,
    check_against_feast,
    encode_keys,
    encode_values,
    epochs,
    sample_rows,
)

BATCH_ROWS = 50_000
"""Entities per batch (one transaction each): ~750k SQL rows for the 15-feature cross views,
a few tens of MB of Arrow and Python objects whatever the partition size."""
CACHE_KIB = 262_144
"""SQLite page cache of the loading connection (256 MiB): the indexes of a large table stay
in memory while a batch is fanned out."""


@dataclass
class _Staged:
    rows: list[tuple]
    loaded: int
    skipped: int


def _stage(
    batch: pa.RecordBatch,
    view: Any,
    join_keys: dict[str, Any],
    timestamp_field: str,
    created_field: str | None,
    check: bool,
) -> _Staged:
    """One batch as staging rows: key, event_ts, created_ts, each feature's value blob, then
    each feature's text."""
    keys, valid = encode_keys(batch, join_keys)
    skipped = int((~valid).sum())
    if skipped:
        mask = pa.array(valid)
        batch, keys = batch.filter(mask), keys.filter(mask)
    n = batch.num_rows
    features = [(f.name, f.dtype.to_value_type()) for f in view.features]
    encoded = [encode_values(batch.column(name), kind) for name, kind in features]
    event = epochs(batch.column(timestamp_field))
    created = epochs(batch.column(created_field)) if created_field else [None] * n
    key_list = keys.to_pylist()
    columns = [c.blobs.to_pylist() for c in encoded] + [c.texts.to_pylist() for c in encoded]
    rows = list(zip(key_list, event, created, *columns, strict=True))
    if check:
        check_against_feast(batch, view, join_keys, rows, features)
    rows.sort(key=itemgetter(0))  # key order: the B-tree pages of a batch are touched once
    return _Staged(rows, n, skipped)


# ---------------------------------------------------------------- writing (SQLite)


@dataclass
class BulkResult:
    """What one view's load did."""

    view: str
    rows: int = 0
    """Entity rows written (each one SQL row per feature)."""
    skipped_missing_key: int = 0
    seconds: float = 0.0
    batches: int = 0
    journal_mode: str = ""
    stage_s: float = 0.0
    """Binding the staging rows (Python, holds the GIL); Redis: reading and encoding."""
    fanout_s: float = 0.0
    """SQLite copying staged rows into the table and committing (without the GIL); Redis:
    the timestamp reads and hash writes."""
    encode_wait_s: float = 0.0
    """Waiting for the encoder thread beyond the fan-out (reading + encoding)."""
    kept_newer: int = 0
    """Rows not written because the store held the key with an event time at least as new
    (Redis; SQLite's upsert does the same inside the statement, uncounted)."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def batch_written(self, staged: _Staged, tracker: _Progress) -> None:
        """Count a committed batch and show the progress."""
        self.rows += staged.loaded
        self.skipped_missing_key += staged.skipped
        self.batches += 1
        tracker.batch_done(self.rows)


def check_supported(store: Any) -> None:
    """Raise :class:`BulkUnsupported` unless ``store``'s online store is one this writes: a
    local SQLite store or a single Redis server."""
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig, RedisType
    from feast.infra.online_stores.sqlite import SqliteOnlineStoreConfig

    config = store.config
    online = config.online_store
    if int(config.entity_key_serialization_version) != 3:
        raise BulkUnsupported("bulk materialization writes entity keys of serialization v3 only")
    if isinstance(online, RedisOnlineStoreConfig):
        if online.redis_type != RedisType.redis:
            raise BulkUnsupported(
                f"bulk materialization writes a single Redis server, not {online.redis_type.value}"
            )
        return
    if not isinstance(online, SqliteOnlineStoreConfig):
        raise BulkUnsupported(
            f"bulk materialization writes SQLite or Redis; this store is {online.type}"
        )
    if getattr(online, "vector_enabled", False) or getattr(
        online, "enable_openai_compatible_store", False
    ):
        raise BulkUnsupported("bulk materialization does not write vector/value_num columns")


class _Progress:
    """Rows written so far, shown through :mod:`cascade.progress` (a bar on a terminal; in a
    log, a line every ``every_s``, default ``CASCADE_PROGRESS_EVERY_S``, and one at the end)."""

    def __init__(self, view: str, enabled: bool, every_s: float | None) -> None:
        self.started = time.perf_counter()
        self.shown = Progress(
            desc=f"materialize {view}", unit="rows", enabled=enabled, every_s=every_s
        )
        self.rows = 0

    def batch_done(self, rows: int) -> None:
        self.shown.update(rows - self.rows)
        self.rows = rows

    def finish(self, rows: int) -> float:
        """Seconds since the start; closes the display."""
        self.batch_done(rows)
        self.shown.close()
        return time.perf_counter() - self.started


class _ViewWriter:
    """What every bulk writer knows of one feature view: keys, features, timestamps, and how
    to read a partition's rows in Feast's materialization window."""

    def __init__(self, store: Any, view: Any) -> None:
        check_supported(store)
        self.store = store
        self.view = view
        self.join_keys = {c.name: c.dtype.to_value_type() for c in view.entity_columns}
        source = view.batch_source
        self.timestamp_field = source.timestamp_field
        self.created_field = source.created_timestamp_column or None
        if source.field_mapping:
            raise BulkUnsupported(f"{view.name}: sources with a field_mapping are not handled")
        self.features = [f.name for f in view.features]
        for name, kind in [(f.name, f.dtype.to_value_type()) for f in view.features]:
            if kind.name not in ("DOUBLE", "FLOAT", "INT64", "INT32", "BOOL", "STRING"):
                raise BulkUnsupported(f"{view.name}.{name}: {kind.name} features are not handled")

    def batches(self, path: str | Path, start: dt.datetime, end: dt.datetime) -> Iterator:
        """Record batches of the rows of ``path`` with ``start <= event_timestamp <= end``
        (Feast's materialization window), bounded to :data:`BATCH_ROWS` rows."""
        dataset = pads.dataset(str(path), format="parquet", partitioning=None)
        columns = [*self.join_keys, *self.features, self.timestamp_field]
        if self.created_field:
            columns.append(self.created_field)
        absent = [c for c in columns if c not in dataset.schema.names]
        if absent:
            raise ValueError(f"{path} lacks the columns {absent} of view {self.view.name}")
        ts = pc.field(self.timestamp_field)
        unit = dataset.schema.field(self.timestamp_field).type
        window = (ts >= pa.scalar(start, unit)) & (ts <= pa.scalar(end, unit))
        yield from dataset.to_batches(columns=columns, filter=window, batch_size=BATCH_ROWS)

    def write(
        self,
        batches: Iterator[pa.RecordBatch],
        *,
        check: bool = True,
        progress: bool = True,
        progress_every_s: float | None = None,
    ) -> BulkResult:
        """Encode and store every batch, each checked against Feast's encoding (``check``);
        ``progress`` shows the rows written (:mod:`cascade.progress`)."""
        result = BulkResult(view=self.view.name)
        tracker = _Progress(self.view.name, progress, progress_every_s)
        try:
            self._write(batches, result, tracker, check)
        finally:
            result.seconds = tracker.finish(result.rows)
        return result

    def _write(
        self, batches: Iterator, result: BulkResult, tracker: _Progress, check: bool
    ) -> None:
        raise NotImplementedError


def _open_for_loading(db_path: str, table: str) -> sqlite3.Connection:
    """A loading connection to the store at ``db_path`` (which must hold ``table``: the repo
    is applied): no fsync and a large page cache, for this connection only."""
    if not Path(db_path).is_file():
        raise FileNotFoundError(
            f"online store {db_path} does not exist; apply the feature repo first"
        )
    conn = sqlite3.connect(db_path, timeout=60, isolation_level=None)
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if not exists:
        conn.close()
        raise FileNotFoundError(f"table {table} is not in {db_path}; apply the feature repo first")
    conn.execute("PRAGMA synchronous = OFF")  # per connection: only this load skips fsync
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    return conn


class SqliteBulkWriter(_ViewWriter):
    """Loads Arrow batches of one feature view into Feast's SQLite online store."""

    def __init__(self, store: Any, view: Any) -> None:
        from feast.infra.online_stores.sqlite import (
            SqliteOnlineStore,
            SqliteOnlineStoreConfig,
            _quote_id,
            _table_id,
        )

        super().__init__(store, view)
        config = store.config
        if not isinstance(config.online_store, SqliteOnlineStoreConfig):
            raise BulkUnsupported(f"{view.name}: the online store is not SQLite")
        self.db_path = SqliteOnlineStore._get_db_path(config)
        versioning = bool(getattr(config.registry, "enable_online_feature_view_versioning", False))
        self.table = _table_id(config.project, view, versioning)
        self._fanout = self._fanout_sql(_quote_id(self.table))
        params = ", ".join("?" * (3 + 2 * len(self.features)))
        self._stage_sql = f"INSERT INTO temp.bulk_stage VALUES ({params})"

    def _fanout_sql(self, table: str) -> list[str]:
        """The statement copying the staged entities into the table, one SQL row per feature,
        entity by entity (key order, so each index page is visited once per batch); a
        ``CASE`` picks the feature's staged column (no function call per row)."""

        def pick(prefix: str) -> str:
            branches = " ".join(f"WHEN {i} THEN s.{prefix}{i}" for i in range(len(self.features)))
            return f"CASE f.i {branches} END"

        return [
            f"INSERT INTO main.{table} "
            "(entity_key, feature_name, value, value_text, event_ts, created_ts) "
            f"SELECT s.k, f.name, {pick('v')}, {pick('t')}, s.ts, s.cts "
            "FROM temp.bulk_stage AS s CROSS JOIN temp.bulk_features AS f WHERE 1 "
            "ON CONFLICT(entity_key, feature_name) DO UPDATE SET "
            "value = excluded.value, value_text = excluded.value_text, "
            "event_ts = excluded.event_ts, created_ts = excluded.created_ts "
            "WHERE excluded.event_ts >= event_ts"
        ]

    def _connect(self) -> sqlite3.Connection:
        conn = _open_for_loading(self.db_path, self.table)
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("DROP TABLE IF EXISTS temp.bulk_stage")
        f = range(len(self.features))
        conn.execute(
            "CREATE TEMP TABLE bulk_stage (k BLOB, ts INTEGER, cts INTEGER, "
            + ", ".join([*(f"v{i} BLOB" for i in f), *(f"t{i} TEXT" for i in f)])
            + ")"
        )
        conn.execute("DROP TABLE IF EXISTS temp.bulk_features")
        conn.execute("CREATE TEMP TABLE bulk_features (i INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO temp.bulk_features VALUES (?, ?)", enumerate(self.features))
        return conn

    def _write(
        self, batches: Iterator, result: BulkResult, tracker: _Progress, check: bool
    ) -> None:
        """Upsert every batch; one transaction per batch."""
        conn = self._connect()
        result.journal_mode = conn.execute("PRAGMA journal_mode").fetchone()[0]

        def stage(batch: pa.RecordBatch) -> _Staged:
            return _stage(
                batch, self.view, self.join_keys, self.timestamp_field, self.created_field, check
            )

        source = iter(batches)

        def produce() -> _Staged | None:
            for batch in source:
                if batch.num_rows:
                    return stage(batch)
            return None

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulk-encode") as pool:
                staged = pool.submit(produce).result()
                result.encode_wait_s = time.perf_counter() - tracker.started
                while staged is not None:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        mark = time.perf_counter()
                        conn.execute("DELETE FROM temp.bulk_stage")
                        conn.executemany(self._stage_sql, staged.rows)
                        # The next batch is read and encoded while SQLite fans this one out
                        # (the statement runs without the GIL).
                        pending = pool.submit(produce)
                        staged_at = time.perf_counter()
                        for statement in self._fanout:
                            conn.execute(statement)
                        conn.execute("COMMIT")
                        result.stage_s += staged_at - mark
                        result.fanout_s += time.perf_counter() - staged_at
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    result.batch_written(staged, tracker)
                    mark = time.perf_counter()
                    staged = pending.result()
                    result.encode_wait_s += time.perf_counter() - mark
        finally:
            conn.execute("DROP TABLE IF EXISTS temp.bulk_stage")
            conn.close()


def packed_columns(
    batch: pa.RecordBatch, types: list[tuple[str, str]]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each feature of ``batch`` as the packed layout stores it (:mod:`domains.ctr.online_packed`):
    values (float64 or int64) and presence, with NaN absent as Feast writes it."""
    values: list[np.ndarray] = []
    present: list[np.ndarray] = []
    for name, kind in types:
        column = batch.column(name)
        if kind in ("DOUBLE", "FLOAT"):
            floats = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
            if kind == "FLOAT":  # Feast keeps a Float32 feature's float32 value
                floats = floats.astype("<f4").astype("<f8")
            has = ~np.isnan(floats)
            values.append(floats)
        else:
            has = column.is_valid().to_numpy(zero_copy_only=False)
            ints = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            values.append(ints.astype(bool).astype(np.int64) if kind == "BOOL" else ints)
        present.append(has)
    return values, present


def _micros(column: pa.Array) -> np.ndarray:
    """int64 microseconds since the epoch (UTC) of a timestamp column (null: an error)."""
    if not pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("us", tz="UTC"))
    if column.null_count:
        raise ValueError("event timestamps must not be null")
    return (
        column.cast(pa.timestamp("us", tz=column.type.tz))
        .cast(pa.int64())
        .to_numpy(zero_copy_only=False)
    )


PACKED_RUN_ROWS = 250_000
"""Rows the packed writer sorts by key and writes in one transaction: keys arrive in random
order across a partition's batches, and a longer sorted run visits each B-tree page fewer
times (one 1M-row pair: ~174,000 rows/s, against ~95,000 with the 50,000-row batches; 500,000
gave no more at 3M rows); ~100 MB of Python objects per run."""


class PackedBulkWriter(_ViewWriter):
    """Loads Arrow batches of one view tagged packed into :mod:`domains.ctr.online_packed`'s table:
    one SQL row per entity. Batches are encoded column by column (keys, one payload record per
    row) into runs of :data:`PACKED_RUN_ROWS`, each sorted by key in Arrow and written by one
    ``executemany`` in one transaction while the next run is encoded on a second thread."""

    def __init__(self, store: Any, view: Any) -> None:
        from feast.infra.online_stores.sqlite import SqliteOnlineStore

        from domains.ctr import online_packed

        super().__init__(store, view)
        config = store.config
        self.types = online_packed.check_packable(view)
        self.db_path = SqliteOnlineStore._get_db_path(config)
        versioning = bool(getattr(config.registry, "enable_online_feature_view_versioning", False))
        self.table = online_packed.packed_table(config.project, view, versioning)
        self._sql = online_packed.upsert_sql(self.table)
        self.run_rows = PACKED_RUN_ROWS

    def encode(self, batch: pa.RecordBatch, *, check: bool = True) -> tuple[pa.Table, int]:
        """``(rows, skipped)``: the batch's table rows as Arrow columns ``k`` (entity key),
        ``e`` / ``c`` (event and created time, µs), ``p`` (payload), in the batch's order,
        and the count of rows dropped for a missing key."""
        from domains.ctr import online_packed

        keys, valid = encode_keys(batch, self.join_keys)
        skipped = int((~valid).sum())
        if skipped:
            mask = pa.array(valid)
            batch, keys = batch.filter(mask), keys.filter(mask)
        n = batch.num_rows
        values, present = packed_columns(batch, self.types)
        record = online_packed.pack_record(self.types, values, present)
        payload = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(record.dtype.itemsize), n, [None, pa.py_buffer(record.tobytes())]
        )
        event = pa.array(_micros(batch.column(self.timestamp_field)), pa.int64())
        created = (
            pa.array(_micros(batch.column(self.created_field)), pa.int64())
            if self.created_field
            else pa.nulls(n, pa.int64())
        )
        rows = pa.table({"k": keys, "e": event, "c": created, "p": payload})
        if check:
            self._check_against_feast(batch, rows)
        return rows, skipped

    def _check_against_feast(self, batch: pa.RecordBatch, rows: pa.Table) -> None:
        """A sample of the batch through Feast's converter and the store's own packing
        (:func:`domains.ctr.online_packed.pack_protos`, what ``materialize`` writes) must give the
        same rows byte for byte (else the load stops)."""
        from feast.utils import _convert_arrow_to_proto

        from domains.ctr import online_packed

        if batch.num_rows == 0:
            return
        picks = sample_rows(batch, [(name, None) for name, _ in self.types])
        protos = _convert_arrow_to_proto(batch.take(pa.array(picks)), self.view, self.join_keys)
        expected = online_packed.pack_protos(self.types, protos, 3)
        mine = rows.take(pa.array(picks)).to_pylist()
        for row, have, want in zip(picks, mine, expected, strict=True):
            if (have["k"], have["e"], have["c"], have["p"]) != tuple(want):
                raise BulkEncodingMismatch(
                    f"{self.view.name}: row {row} packs to {tuple(have.values())!r}, "
                    f"Feast's values to {want!r}"
                )

    @staticmethod
    def sorted_rows(tables: list[pa.Table]) -> list[tuple]:
        """The rows of ``tables`` as SQL parameters, in key order."""
        table = pa.concat_tables(tables)
        table = table.take(pc.sort_indices(table, [("k", "ascending")]))
        return list(
            zip(
                table.column("k").to_pylist(),
                table.column("e").to_pylist(),
                table.column("c").to_pylist(),
                table.column("p").to_pylist(),
                strict=True,
            )
        )

    def _connect(self) -> sqlite3.Connection:
        return _open_for_loading(self.db_path, self.table)

    def _write(
        self, batches: Iterator, result: BulkResult, tracker: _Progress, check: bool
    ) -> None:
        conn = self._connect()
        result.journal_mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        source = iter(batches)

        def produce() -> _Staged | None:
            tables: list[pa.Table] = []
            rows = skipped = 0
            for batch in source:
                if batch.num_rows:
                    encoded, dropped = self.encode(batch, check=check)
                    tables.append(encoded)
                    rows += encoded.num_rows
                    skipped += dropped
                if rows >= self.run_rows:
                    break
            if not tables:
                return None
            return _Staged(self.sorted_rows(tables), rows, skipped)

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulk-encode") as pool:
                staged = pool.submit(produce).result()
                result.encode_wait_s = time.perf_counter() - tracker.started
                while staged is not None:
                    pending = pool.submit(produce)
                    mark = time.perf_counter()
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        conn.executemany(self._sql, staged.rows)
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    result.fanout_s += time.perf_counter() - mark
                    result.batch_written(staged, tracker)
                    mark = time.perf_counter()
                    staged = pending.result()
                    result.encode_wait_s += time.perf_counter() - mark
        finally:
            conn.close()


class RedisBulkWriter(_ViewWriter):
    """Loads Arrow batches of one feature view into Feast's Redis online store, in Feast's
    layout (see the module's doc), with pipelined reads of the stored timestamps and pipelined
    hash writes of :data:`PIPELINE_ROWS` entities each."""

    PIPELINE_ROWS = 5_000

    def __init__(self, store: Any, view: Any) -> None:
        from feast.infra.online_stores.helpers import _mmh3
        from feast.infra.online_stores.redis import (
            RedisOnlineStore,
            RedisOnlineStoreConfig,
            _versioned_fv_name,
        )

        super().__init__(store, view)
        config = store.config
        online = config.online_store
        if not isinstance(online, RedisOnlineStoreConfig):
            raise BulkUnsupported(f"{view.name}: the online store is not Redis")
        self.online = online
        self.project = config.project.encode("utf-8")
        name = _versioned_fv_name(view, config)
        self.ts_field = f"_ts:{name}".encode()
        self.fields = [_mmh3(f"{name}:{feature}") for feature in self.features]
        # The client Feast itself reads with, from the same connection string.
        self.client = RedisOnlineStore()._get_client(online)
        self._stored_nanos: dict[bytes, int] = {}

    def _timestamps(self, column: pa.Array) -> tuple[list[bytes], list[int]]:
        """Each row's event time as Feast stores it (a serialized ``Timestamp`` of the
        tz-aware time) and in nanoseconds, computed once per distinct value."""
        from feast.utils import make_tzaware
        from google.protobuf.timestamp_pb2 import Timestamp

        if not pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", tz="UTC"))
        unique = column.unique()
        indices = pc.index_in(column, unique).to_numpy(zero_copy_only=False)
        blobs, nanos = [], []
        for value in unique.to_pylist():
            stamp = Timestamp()
            stamp.FromDatetime(make_tzaware(value))
            blobs.append(stamp.SerializeToString())
            nanos.append(stamp.seconds * 1_000_000_000 + stamp.nanos)
        return [blobs[i] for i in indices], [nanos[i] for i in indices]

    def stage(self, batch: pa.RecordBatch, *, check: bool = True) -> _Staged:
        """One batch as ``(redis key, timestamp blob, nanoseconds, [value blobs])`` rows."""
        keys, valid = encode_keys(batch, self.join_keys)
        skipped = int((~valid).sum())
        if skipped:
            mask = pa.array(valid)
            batch, keys = batch.filter(mask), keys.filter(mask)
        features = [(f.name, f.dtype.to_value_type()) for f in self.view.features]
        blobs = [encode_values(batch.column(n), kind).blobs.to_pylist() for n, kind in features]
        stamps, nanos = self._timestamps(batch.column(self.timestamp_field))
        project = self.project
        rows = [
            (key + project, stamp, nano, list(values))
            for key, stamp, nano, *values in zip(
                keys.to_pylist(), stamps, nanos, *blobs, strict=True
            )
        ]
        if check:
            self._check_against_feast(batch, rows, features)
        return _Staged(rows, batch.num_rows, skipped)

    def _check_against_feast(
        self, batch: pa.RecordBatch, rows: list[tuple], features: list[tuple[str, Any]]
    ) -> None:
        """Feast's own key, timestamp and value bytes for a sample of the batch."""
        from feast.infra.online_stores.helpers import _redis_key
        from feast.utils import _convert_arrow_to_proto, make_tzaware
        from google.protobuf.timestamp_pb2 import Timestamp

        if batch.num_rows == 0:
            return
        picks = sample_rows(batch, features)
        expected = _convert_arrow_to_proto(batch.take(pa.array(picks)), self.view, self.join_keys)
        name = self.view.name
        for row, (entity_key, values, event_ts, _) in zip(picks, expected, strict=True):
            key, stamp, _, blobs = rows[row]
            if _redis_key(self.project.decode(), entity_key, 3) != key:
                raise BulkEncodingMismatch(f"{name}: Redis key of row {row} differs from Feast")
            want = Timestamp()
            want.FromDatetime(make_tzaware(event_ts))
            if want.SerializeToString() != stamp:
                raise BulkEncodingMismatch(f"{name}: event time of row {row} differs from Feast")
            for i, (feature, _) in enumerate(features):
                if values[feature].SerializeToString() != blobs[i]:
                    raise BulkEncodingMismatch(
                        f"{name}: feature {feature} of row {row} (key {key!r}) is "
                        f"{blobs[i]!r}, Feast writes {values[feature].SerializeToString()!r}"
                    )

    def _nanos(self, stored: bytes | None) -> int:
        if not stored:
            return 0
        found = self._stored_nanos.get(stored)
        if found is None:
            from google.protobuf.timestamp_pb2 import Timestamp

            stamp = Timestamp()
            stamp.ParseFromString(stored)
            found = stamp.seconds * 1_000_000_000 + stamp.nanos
            if len(self._stored_nanos) < 1 << 16:
                self._stored_nanos[stored] = found
        return found

    def _write_rows(self, rows: list[tuple]) -> int:
        """Write ``rows`` whose event time is newer than the stored one (all of them with
        ``skip_dedup``); returns how many were kept out as not newer."""
        dedup = not self.online.skip_dedup
        ttl = self.online.key_ttl_seconds
        kept = 0
        for start in range(0, len(rows), self.PIPELINE_ROWS):
            chunk = rows[start : start + self.PIPELINE_ROWS]
            stored: list[bytes | None] = [None] * len(chunk)
            if dedup:
                with self.client.pipeline(transaction=False) as pipe:
                    for key, *_ in chunk:
                        pipe.hget(key, self.ts_field)
                    stored = pipe.execute()
            latest: dict[bytes, int] = {}
            with self.client.pipeline(transaction=False) as pipe:
                for (key, stamp, nanos, blobs), previous in zip(chunk, stored, strict=True):
                    if dedup:
                        seen = max(self._nanos(previous), latest.get(key, 0))
                        if seen and nanos <= seen:
                            kept += 1
                            continue
                        latest[key] = nanos
                    mapping = dict(zip(self.fields, blobs, strict=True))
                    mapping[self.ts_field] = stamp
                    pipe.hset(key, mapping=mapping)
                    if ttl:
                        pipe.expire(key, ttl)
                pipe.execute()
        return kept

    def _write(
        self, batches: Iterator, result: BulkResult, tracker: _Progress, check: bool
    ) -> None:
        """Encode and write every batch (one read and one write pipeline per chunk)."""
        for batch in batches:
            if not batch.num_rows:
                continue
            mark = time.perf_counter()
            staged = self.stage(batch, check=check)
            written_at = time.perf_counter()
            result.kept_newer += self._write_rows(staged.rows)
            result.stage_s += written_at - mark
            result.fanout_s += time.perf_counter() - written_at
            result.batch_written(staged, tracker)


def writer_for(store: Any, view: Any) -> SqliteBulkWriter | PackedBulkWriter | RedisBulkWriter:
    """The bulk writer of ``store``'s online store and ``view``'s layout
    (:class:`BulkUnsupported` for stores it does not write)."""
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig

    from domains.ctr.online_packed import PackedSqliteOnlineStoreConfig, wants_packed

    check_supported(store)
    if isinstance(store.config.online_store, RedisOnlineStoreConfig):
        return RedisBulkWriter(store, view)
    if isinstance(store.config.online_store, PackedSqliteOnlineStoreConfig) and wants_packed(view):
        return PackedBulkWriter(store, view)
    return SqliteBulkWriter(store, view)


def write_path(
    store: Any,
    view: Any,
    path: str | Path,
    start: dt.datetime,
    end: dt.datetime,
    **kwargs: Any,
) -> BulkResult:
    """Bulk-load the rows of ``path`` (a parquet file or folder) with ``start <= event
    timestamp <= end`` into ``view``'s online table or hashes. Does not touch the registry."""
    writer = writer_for(store, view)
    return writer.write(writer.batches(path, start, end), **kwargs)


def record_materialization(store: Any, view: Any, start: dt.datetime, end: dt.datetime) -> None:
    """Append ``(start, end)`` to the view's materialization intervals and mark it available
    online: the registry call ``FeatureStore.materialize`` makes after a view is loaded."""
    store.registry.apply_materialization(
        store.get_feature_view(view.name), store.project, start, end
    )
