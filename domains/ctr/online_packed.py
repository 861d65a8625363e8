"""A SQLite online store that keeps one row per entity for the views that ask for it.

Feast's SQLite store (:class:`feast.infra.online_stores.sqlite.SqliteOnlineStore`) keeps one SQL
row per (entity, feature) in a rowid table with two indexes on the entity key: a cross-statistics
row of 15 features is 15 rows and ~45 B-tree inserts, which bounds loading at ~10,000 feature
rows a second on two cores whatever the writer does. A view tagged
``cascade.online_layout = packed`` (:data:`LAYOUT_TAG`) is stored here instead as ONE row per
entity in a ``WITHOUT ROWID`` table keyed by the serialized entity key::

    entity_key BLOB PRIMARY KEY, event_ts INTEGER (µs since the epoch, UTC),
    created_ts INTEGER, payload BLOB

``payload`` is fixed-width binary data, never a pickle: one presence byte per feature (1 = a
value, 0 = null), then each feature's value as 8 little-endian bytes (``float64`` for
``Float32``/``Float64``, ``int64`` for ``Int32``/``Int64``/``Bool``), in the view's feature
order (:func:`payload_dtype`). The table's name carries a digest of that order and those types
(:func:`packed_table`), so a view whose features change gets a new, empty table (the old one is
dropped by ``apply``) and no row is ever decoded with another layout. Views that are not tagged
keep Feast's layout in the same file, written and read by Feast's own code; a tagged view with
features of other types (text, lists) is refused (:class:`PackedLayoutError`).

Everything Feast does with a store works on packed views (``materialize``,
``write_to_online_store``, ``get_online_features``:
:meth:`PackedSqliteOnlineStore.online_read` returns the ``ValueProto`` values Feast's store
would), and two paths skip the per-value objects:
:class:`domains.ctr.online_bulk.PackedBulkWriter` (Arrow batches in, runs sorted by key, one
``executemany`` of packed rows per run) and :meth:`PackedSqliteOnlineStore.read_rows` /
:meth:`~PackedSqliteOnlineStore.read_matrix` (key values or serialized keys in, a float64
matrix out: what the model server's cross reader uses, with the rows' event times: it holds
them until :meth:`~PackedSqliteOnlineStore.data_version` changes). A row replaces a stored one
only when its event time is not older (an older partition loaded after a newer one leaves the
newer values).

The local profile names it in ``features/profiles/local/feature_store.yaml``::

    online_store:
      type: domains.ctr.online_packed.PackedSqliteOnlineStore
      path: ${CASCADE_HOME}/feast/online_store.db
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from feast import Entity, FeatureView
from feast.infra.key_encoding_utils import serialize_entity_key, serialize_entity_key_prefix
from feast.infra.online_stores.sqlite import (
    SqliteOnlineStore,
    SqliteOnlineStoreConfig,
    _quote_id,
    _table_id,
)
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.repo_config import RepoConfig

LAYOUT_TAG = "cascade.online_layout"
"""Feature-view tag naming the online layout; ``packed`` stores the view here one row per entity."""
PACKED = "packed"
STORE_TYPE = "domains.ctr.online_packed.PackedSqliteOnlineStore"
PACKED_VALUE_TYPES = {
    "DOUBLE": "<f8",
    "FLOAT": "<f8",
    "INT64": "<i8",
    "INT32": "<i8",
    "BOOL": "<i8",
}
"""Feast value types a packed view may hold, and how each is stored."""
_PROTO_FIELD = {
    "DOUBLE": "double_val",
    "FLOAT": "float_val",
    "INT64": "int64_val",
    "INT32": "int32_val",
    "BOOL": "bool_val",
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
PAGE_SIZE = 16_384
"""Page size of a store this module creates (SQLite's default is 4,096): ~1.2x the load rate
of packed rows whose keys arrive in random order across batches, measured at 1M rows."""


class PackedLayoutError(ValueError):
    """A view tagged packed has features this layout does not hold."""


def feature_types(view: FeatureView) -> list[tuple[str, str]]:
    """``[(feature, Feast value type name)]`` in the view's order."""
    return [(f.name, f.dtype.to_value_type().name) for f in view.features]


def wants_packed(view: Any) -> bool:
    """Whether ``view`` asks for the packed layout (its :data:`LAYOUT_TAG` tag)."""
    return (getattr(view, "tags", None) or {}).get(LAYOUT_TAG) == PACKED


def check_packable(view: FeatureView) -> list[tuple[str, str]]:
    """The view's feature types; :class:`PackedLayoutError` names any this layout cannot hold."""
    types = feature_types(view)
    bad = [f"{name} ({kind})" for name, kind in types if kind not in PACKED_VALUE_TYPES]
    if bad:
        raise PackedLayoutError(
            f"view {view.name} is tagged {LAYOUT_TAG}={PACKED}, but the packed layout holds "
            f"numbers and booleans only, not {', '.join(bad)}; drop the tag to keep Feast's layout"
        )
    return types


def payload_dtype(types: Sequence[tuple[str, str]]) -> np.dtype:
    """The numpy record of one payload: ``present`` (one byte per feature) then ``v0..vN``."""
    fields: list[tuple[Any, ...]] = [("present", "u1", (len(types),))]
    fields += [(f"v{i}", PACKED_VALUE_TYPES[kind]) for i, (_, kind) in enumerate(types)]
    return np.dtype(fields)


def packed_table(project: str, view: FeatureView, versioning: bool = False) -> str:
    """The view's packed table: Feast's table id, ``__packed_`` and a digest of the layout."""
    layout = json.dumps(feature_types(view), separators=(",", ":")).encode()
    return (
        f"{_table_id(project, view, versioning)}__packed_{hashlib.sha256(layout).hexdigest()[:12]}"
    )


NOT_STORED = np.iinfo(np.int64).min
"""The event time :meth:`PackedSqliteOnlineStore.read_rows` gives a key the store does not hold
(older than any bound)."""


def age_bounded(values: np.ndarray, events: np.ndarray, oldest: dt.datetime | None) -> np.ndarray:
    """``values`` (in place) with the rows whose event time (µs, as :meth:`PackedSqliteOnlineStore.
    read_rows` gives them) is before ``oldest`` missing (NaN)."""
    limit = micros(oldest)
    if limit is not None:
        values[events < limit] = np.nan
    return values


def micros(moment: dt.datetime | None) -> int | None:
    """Microseconds since the epoch of a timestamp (naive = UTC), as the table stores it."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=int(value))


def upsert_sql(table: str) -> str:
    """Insert or replace a row, unless the stored one has a newer event time."""
    quoted = _quote_id(table)
    return (
        f"INSERT INTO {quoted} (entity_key, event_ts, created_ts, payload) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(entity_key) DO UPDATE SET event_ts = excluded.event_ts, "
        "created_ts = excluded.created_ts, payload = excluded.payload "
        f"WHERE excluded.event_ts >= {quoted}.event_ts"
    )


def create_sql(table: str) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {_quote_id(table)} (entity_key BLOB PRIMARY KEY, "
        "event_ts INTEGER NOT NULL, created_ts INTEGER, payload BLOB NOT NULL) WITHOUT ROWID"
    )


def pack_record(
    types: Sequence[tuple[str, str]], columns: Sequence[np.ndarray], present: Sequence[np.ndarray]
) -> np.ndarray:
    """The payloads of ``len(columns[0])`` rows as one record array (:func:`payload_dtype`):
    ``columns[i]`` (float64 or int64 values, any where absent) and ``present[i]`` (bool) of
    feature ``i``."""
    n = len(columns[0]) if columns else 0
    record = np.zeros(n, dtype=payload_dtype(types))
    for i, (values, has) in enumerate(zip(columns, present, strict=True)):
        record["present"][:, i] = has
        record[f"v{i}"] = np.where(has, values, 0)
    return record


def pack_rows(
    types: Sequence[tuple[str, str]], columns: Sequence[np.ndarray], present: Sequence[np.ndarray]
) -> list[bytes]:
    """One payload (bytes) per row of :func:`pack_record`."""
    record = pack_record(types, columns, present)
    width = record.dtype.itemsize
    buffer = record.tobytes()
    return [buffer[start : start + width] for start in range(0, len(record) * width, width)]


def unpack_rows(types: Sequence[tuple[str, str]], payloads: Sequence[bytes]) -> np.ndarray:
    """The records of ``payloads`` (:func:`payload_dtype`); a payload of another width is an
    error."""
    return decode_payloads(payload_dtype(types), payloads, f"{len(types)} features")


def decode_payloads(dtype: np.dtype, payloads: Sequence[bytes], where: str) -> np.ndarray:
    """One record array of ``payloads``; ValueError naming ``where`` when one is not
    ``dtype``'s width (never decoded shifted)."""
    bad = next((len(p) for p in payloads if len(p) != dtype.itemsize), None)
    if bad is not None:
        raise ValueError(f"{where}: packed row of {bad} bytes, expected {dtype.itemsize}")
    return np.frombuffer(b"".join(payloads), dtype=dtype)


def records_matrix(records: np.ndarray, integer: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """float64 ``[K, len(columns)]``: features ``columns`` of K records (:func:`payload_dtype`;
    ``integer[i]``: feature i is stored as an integer), NaN where not present. All features
    at once from the records' bytes (``present``: the first bytes, then 8 per value), not
    field by field (30 fields: ~8 array operations instead of ~90)."""
    count = len(integer)
    raw = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)
    body = np.ascontiguousarray(raw[:, count:])  # the values, 8-byte aligned
    values = body.view("<f8")[:, columns]
    integers = integer[columns]
    if integers.any():
        values[:, integers] = body.view("<i8")[:, columns[integers]].astype(np.float64)
    values[raw[:, columns] == 0] = np.nan
    return values


def _python_value(proto: ValueProto) -> tuple[bool, float | int]:
    which = proto.WhichOneof("val")
    if which is None or which == "null_val":
        return False, 0
    value = getattr(proto, which)
    if isinstance(value, float) and value != value:
        return False, 0  # Feast writes NaN as a missing value, like a null
    return True, value


def pack_protos(
    types: Sequence[tuple[str, str]],
    data: Sequence[tuple[EntityKeyProto, dict[str, ValueProto], dt.datetime, dt.datetime | None]],
    version: int,
) -> list[tuple[bytes, int | None, int | None, bytes]]:
    """Table rows ``(key, event µs, created µs, payload)`` of Feast's write tuples."""
    names = [name for name, _ in types]
    columns = [np.zeros(len(data), dtype=PACKED_VALUE_TYPES[kind]) for _, kind in types]
    present = [np.zeros(len(data), dtype=bool) for _ in types]
    keys: list[bytes] = []
    stamps: list[tuple[int | None, int | None]] = []
    for row, (entity_key, values, timestamp, created) in enumerate(data):
        keys.append(serialize_entity_key(entity_key, entity_key_serialization_version=version))
        stamps.append((micros(timestamp), micros(created)))
        for i, name in enumerate(names):
            proto = values.get(name)
            if proto is not None:
                has, value = _python_value(proto)
                present[i][row] = has
                columns[i][row] = value if has else 0
    payloads = pack_rows(types, columns, present)
    return [
        (key, event, created, payload)
        for key, (event, created), payload in zip(keys, stamps, payloads, strict=True)
    ]


@functools.lru_cache(maxsize=512)
@functools.lru_cache(maxsize=1024)
def _select_keys(table: str, count: int) -> str:
    """The query of ``count`` keys' rows of packed table ``table``."""
    return (
        f"SELECT entity_key, event_ts, payload FROM {_quote_id(table)} "
        f"WHERE entity_key IN ({','.join('?' * count)})"
    )


_KEY_HEADERS = {
    "INT64": (struct.pack("<II", 4, 8), "<q"),
    "INT32": (struct.pack("<II", 3, 4), "<i"),
}
_STRING_CODE = struct.pack("<I", 2)


def serialize_keys(
    key_types: Mapping[str, str], names: Sequence[str], rows: Sequence[Sequence[Any]]
) -> list[bytes | None]:
    """Feast's ``serialize_entity_key`` (version 3) of each row of values in ``names`` order
    (``key_types``: Feast value type name per join key, INT64 / INT32 / STRING), built from
    fixed parts for a handful of keys per request; None for a row with a missing value."""
    prefix, order = _key_layout(tuple(names), tuple(key_types[name] for name in names))
    out: list[bytes | None] = []
    for row in rows:
        parts = [prefix]
        for i, encode in order:
            value = row[i]
            if value is None:
                parts = []
                break
            parts.append(encode(value))
        out.append(b"".join(parts) if parts else None)
    return out


def _encode_string(value: Any) -> bytes:
    encoded = str(value).encode("utf8")
    return _STRING_CODE + struct.pack("<I", len(encoded)) + encoded


def _integer_encoder(kind: str) -> Callable[[Any], bytes]:
    header, code = _KEY_HEADERS[kind]
    pack = struct.Struct(code).pack

    def encode(value: Any) -> bytes:
        return header + pack(int(value))

    return encode


@functools.lru_cache(maxsize=256)
def _key_layout(
    names: tuple[str, ...], kinds: tuple[str, ...]
) -> tuple[bytes, tuple[tuple[int, Callable[[Any], bytes]], ...]]:
    """``(prefix, ((position in a row, encoder), ...))`` of keys of ``names`` (their Feast value
    types ``kinds``): Feast's version 3 orders the key's columns by name, after a prefix naming
    them. Built once per key layout (a server reads the same few views on every request)."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    prefix = serialize_entity_key_prefix([names[i] for i in order], 3)
    return prefix, tuple(
        (i, _encode_string if kinds[i] == "STRING" else _integer_encoder(kinds[i])) for i in order
    )


@dataclass(frozen=True)
class _Layout:
    """What reading one packed view needs, computed once per view object."""

    types: list[tuple[str, str]]
    dtype: np.dtype
    position: dict[str, int]
    table: str
    key_types: dict[str, str]
    integer: np.ndarray
    """bool ``[len(types)]``: the feature is stored as an 8-byte integer (else a double)."""
    selections: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)
    """Positions of each feature list read so far (a server reads the same few per view on
    every request: checked and built once)."""

    def columns(self, view: str, features: Sequence[str]) -> np.ndarray:
        """The positions of ``features``; ValueError naming any that ``view`` does not have."""
        wanted = tuple(features)
        hit = self.selections.get(wanted)
        if hit is None:
            unknown = [f for f in wanted if f not in self.position]
            if unknown:
                raise ValueError(f"view {view} has no features {unknown}")
            hit = np.array([self.position[name] for name in wanted], dtype=np.intp)
            if len(self.selections) >= 64:
                self.selections.clear()
            self.selections[wanted] = hit
        return hit


class PackedSqliteOnlineStoreConfig(SqliteOnlineStoreConfig):
    """Feast's SQLite settings (``path``); views tagged packed use one row per entity."""

    type: Literal["domains.ctr.online_packed.PackedSqliteOnlineStore"] = STORE_TYPE  # type: ignore[assignment]


class PackedSqliteOnlineStore(SqliteOnlineStore):
    """Feast's SQLite store, with one row per entity for views tagged packed (module docstring)."""

    _layouts: dict[int, tuple[FeatureView, _Layout]] | None = None
    _tables: set[str] | None = None
    """Packed tables seen to exist (reads of a table never written skip the query)."""

    # --- tables -------------------------------------------------------------------------------

    def _get_conn(self, config: RepoConfig) -> Any:
        if self._conn is None:
            path = Path(self._get_db_path(config))
            fresh = not path.is_file() or path.stat().st_size == 0
            conn = super()._get_conn(config)
            if fresh:
                # Before the first table: a new store's pages hold more packed rows, and loads in
                # key order within a batch but random across batches split fewer pages.
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            return conn
        return self._conn

    @staticmethod
    def _versioning(config: RepoConfig) -> bool:
        return bool(getattr(config.registry, "enable_online_feature_view_versioning", False))

    def table_of(self, config: RepoConfig, view: FeatureView) -> str:
        return packed_table(config.project, view, self._versioning(config))

    def _layout(self, config: RepoConfig, view: FeatureView) -> _Layout:
        """The view's packed layout, cached per view object (a server reads the same few
        views on every request; a changed view is a new object)."""
        if self._layouts is None:
            self._layouts = {}
        hit = self._layouts.get(id(view))
        if hit is not None and hit[0] is view:
            return hit[1]
        types = check_packable(view)
        layout = _Layout(
            types=types,
            dtype=payload_dtype(types),
            position={name: i for i, (name, _) in enumerate(types)},
            table=self.table_of(config, view),
            key_types={c.name: c.dtype.to_value_type().name for c in view.entity_columns},
            integer=np.array([PACKED_VALUE_TYPES[kind] == "<i8" for _, kind in types], dtype=bool),
        )
        if len(self._layouts) >= 256:
            self._layouts.clear()
        self._layouts[id(view)] = (view, layout)
        return layout

    def update(
        self,
        config: RepoConfig,
        tables_to_delete: Sequence[FeatureView],
        tables_to_keep: Sequence[FeatureView],
        entities_to_delete: Sequence[Entity],
        entities_to_keep: Sequence[Entity],
        partial: bool,
    ) -> None:
        self._tables = None  # tables are created and dropped below
        packed = [t for t in tables_to_keep if wants_packed(t)]
        plain = [t for t in tables_to_keep if not wants_packed(t)]
        for view in packed:
            check_packable(view)
        super().update(
            config, tables_to_delete, plain, entities_to_delete, entities_to_keep, partial
        )
        conn = self._get_conn(config)
        versioning = self._versioning(config)
        with conn:
            for view in packed:
                table = self.table_of(config, view)
                conn.execute(create_sql(table))
                base = _table_id(config.project, view, versioning)
                self._drop_packed(conn, base, keep=table)
                # A view that moved to the packed layout: its per-feature rows are stale.
                conn.execute(f"DROP TABLE IF EXISTS {_quote_id(base)}")
            for view in [*plain, *tables_to_delete]:
                self._drop_packed(conn, _table_id(config.project, view, versioning), keep=None)

    @staticmethod
    def _drop_packed(conn: Any, base: str, keep: str | None) -> None:
        """Drop the view's packed tables of other layouts (all of them when ``keep`` is None)."""
        prefix = f"{base}__packed_"
        names = [
            row[0]
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if row[0].startswith(prefix) and row[0] != keep
        ]
        for name in names:
            conn.execute(f"DROP TABLE IF EXISTS {_quote_id(name)}")

    # --- Feast's write and read -----------------------------------------------------------------

    def online_write_batch(
        self,
        config: RepoConfig,
        table: FeatureView,
        data: list[tuple[EntityKeyProto, dict[str, ValueProto], dt.datetime, dt.datetime | None]],
        progress: Any,
    ) -> None:
        if not wants_packed(table):
            super().online_write_batch(config, table, data, progress)
            return
        layout = self._layout(config, table)
        rows = pack_protos(layout.types, data, config.entity_key_serialization_version)
        conn = self._get_conn(config)
        name = layout.table
        with conn:
            # `feast apply` from the command line builds Feast's tables only (its infra plan),
            # not this store's: the first write creates the packed table.
            conn.execute(create_sql(name))
            conn.executemany(upsert_sql(name), rows)
        if progress:
            progress(len(data))

    def online_read(
        self,
        config: RepoConfig,
        table: FeatureView,
        entity_keys: list[EntityKeyProto],
        requested_features: list[str] | None = None,
    ) -> list[tuple[dt.datetime | None, dict[str, ValueProto] | None]]:
        if not wants_packed(table):
            return super().online_read(config, table, entity_keys, requested_features)
        layout = self._layout(config, table)
        version = config.entity_key_serialization_version
        keys = [
            serialize_entity_key(k, entity_key_serialization_version=version) for k in entity_keys
        ]
        found = self._fetch(config, table, keys)
        hits = [found.get(key) for key in keys]
        records = iter(
            decode_payloads(layout.dtype, [h[1] for h in hits if h is not None], layout.table)
        )
        wanted = set(requested_features) if requested_features else None
        out: list[tuple[dt.datetime | None, dict[str, ValueProto] | None]] = []
        for hit in hits:
            if hit is None:
                out.append((None, None))
                continue
            record = next(records)
            values: dict[str, ValueProto] = {}
            for i, (name, kind) in enumerate(layout.types):
                if wanted is not None and name not in wanted:
                    continue
                proto = ValueProto()
                if record["present"][i]:
                    raw = record[f"v{i}"]
                    value = bool(raw) if kind == "BOOL" else raw.item()
                    setattr(proto, _PROTO_FIELD[kind], value)
                values[name] = proto
            out.append((from_micros(hit[0]), values))
        return out

    def _fetch(
        self, config: RepoConfig, table: FeatureView, keys: Sequence[bytes | None]
    ) -> dict[bytes, tuple[int, bytes]]:
        """``{key: (event µs, payload)}`` of the stored keys among ``keys`` (chunks of 500)."""
        conn = self._get_conn(config)
        table_name = self._layout(config, table).table
        found: dict[bytes, tuple[int, bytes]] = {}
        if self._tables is None:
            self._tables = set()
        if table_name not in self._tables:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table_name,)
            ).fetchone()
            if not exists:  # nothing written yet (or applied without this store's update)
                return found
            self._tables.add(table_name)
        unique = list(dict.fromkeys(k for k in keys if k is not None))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            rows = conn.execute(_select_keys(table_name, len(chunk)), chunk)
            # BLOB and INTEGER columns come back as bytes and int.
            found.update({key: (event, payload) for key, event, payload in rows})
        return found

    # --- the fast read ------------------------------------------------------------------------

    def read_matrix(
        self,
        config: RepoConfig,
        table: FeatureView,
        keys: Sequence[bytes | None],
        features: Sequence[str],
        *,
        oldest: dt.datetime | None = None,
    ) -> np.ndarray:
        """float64 ``[len(keys), len(features)]`` of a packed view for serialized entity keys
        (:func:`serialize_keys` or :func:`domains.ctr.online_encoding.encode_keys`; None: no
        key): NaN where the key is not stored, its row is older than ``oldest``, or the value is
        null."""
        return age_bounded(*self._rows(config, table, keys, features), oldest)

    def _rows(
        self, config: RepoConfig, table: FeatureView, keys: Sequence[bytes | None], features: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(values, event µs)`` of serialized ``keys``: float64 ``[K, len(features)]`` (NaN
        where not stored or null) and int64 ``[K]`` (:data:`NOT_STORED` where not stored)."""
        layout = self._layout(config, table)
        columns = layout.columns(table.name, features)
        out = np.full((len(keys), len(features)), np.nan, dtype=np.float64)
        events = np.full(len(keys), NOT_STORED, dtype=np.int64)
        found = self._fetch(config, table, keys)
        rows: list[int] = []
        payloads: list[bytes] = []
        for row, key in enumerate(keys):
            hit = found.get(key) if key is not None else None
            if hit is not None:
                rows.append(row)
                events[row] = hit[0]
                payloads.append(hit[1])
        if rows:
            records = decode_payloads(layout.dtype, payloads, layout.table)
            out[np.asarray(rows)] = records_matrix(records, layout.integer, columns)
        return out, events

    def read_rows(
        self,
        config: RepoConfig,
        table: FeatureView,
        join_keys: Sequence[str],
        keys: Sequence[Sequence[Any]],
        features: Sequence[str],
    ) -> tuple[np.ndarray, np.ndarray]:
        """The features of keys given as values (tuples in ``join_keys`` order), with each
        row's event time, for a caller that applies the age bound itself: float64
        ``[len(keys), len(features)]`` (NaN where not stored or null) and int64 event µs
        (:data:`NOT_STORED` where not stored)."""
        layout = self._layout(config, table)
        unknown = [k for k in join_keys if k not in layout.key_types]
        if unknown or len(join_keys) != len(layout.key_types):
            raise ValueError(
                f"view {table.name} is keyed by {sorted(layout.key_types)}, not {list(join_keys)}"
            )
        encoded = serialize_keys(layout.key_types, join_keys, keys)
        return self._rows(config, table, encoded, features)

    def data_version(self, config: RepoConfig) -> tuple[int, int]:
        """A value that changes whenever a committed write may have changed what a read
        answers: SQLite's ``data_version`` (commits by any other connection, another process's
        load included) with this connection's own changes (``total_changes``). Rows held
        under one value are what the store holds until it changes."""
        conn = self._get_conn(config)
        return conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes
