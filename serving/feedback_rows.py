"""The serving feedback's rows: where they are kept in the lake, the item snapshots they refer
to, the column forms a request is buffered in, and the Arrow tables a buffer is written as.

    lake/feedback/preranking/dt=YYYY-MM-DD/part-*.parquet   one row per scored candidate
    lake/feedback_items/preranking/<sha256>.parquet         an item table scored with
    lake/feedback_requests/preranking/dt=YYYY-MM-DD/part-*.parquet   one row per request
    lake/clicks/preranking/dt=YYYY-MM-DD/part-*.parquet     (request_id, item_id, click)

What is the same for every candidate of a request is written once, in the request's row
(``feedback_requests``: :data:`REQUEST_COLUMNS`, then the user's features given as
``request_features``); a candidate's row holds only what is its own (:data:`ROW_COLUMNS`, then
any per-candidate feature) and is joined back to its request by ``request_id``. The item side
of a candidate's features is logged by reference: the server's item table is the same for
every request until it is refreshed, so it is written once as an :class:`ItemSnapshot`
(``item_id`` and each column, named by the SHA-256 of its content) and each request row names
it in ``item_snapshot``. :func:`serving.feedback_read.load_joined_feedback` joins all three
back into one row per candidate with its request's columns and its item features. Copying ~15
item columns into every row of every request was half of the writer's CPU; repeating the
request's six scalars on each of its 1,000 rows was half of what was left.

A request is buffered as it came, one :class:`Chunk` of column arrays (its 1,000 candidates
are not turned into 1,000 row objects; a caller may give per-candidate features as row
numbers into a table it holds, :class:`Gathered`); :func:`feedback_table` and
:func:`requests_table` turn buffered chunks into one Arrow table with a few vectorized
concatenations and gathers. The writer is :mod:`serving.feedback`.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cascade.lake import check_ds

MODEL = "preranking"


def feedback_dir(root: Path, kind: str, ds: str) -> Path:
    if kind not in ("feedback", "clicks", "feedback_requests"):
        raise ValueError(f"unknown feedback kind {kind!r}")
    return root / kind / MODEL / f"dt={check_ds(ds)}"


ITEM_SNAPSHOT = "item_snapshot"
"""The feedback column naming the :class:`ItemSnapshot` a row's item features are in."""
_DIGEST = re.compile(r"[0-9a-f]{64}")


def item_snapshot_path(root: Path, digest: str) -> Path:
    """Where the item snapshot named ``digest`` (64 hex digits) is kept."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"an item snapshot is named by a SHA-256 hex digest, not {digest!r}")
    return root / "feedback_items" / MODEL / f"{digest}.parquet"


@dataclass(frozen=True, slots=True)
class Coded:
    """A string feature as codes into a vocabulary (code -1: null). Logging ``genre`` this way
    costs one int per candidate instead of one Python string, and the flush builds the column
    from the codes in one step."""

    codes: np.ndarray
    vocabulary: tuple[str, ...]

    def strings(self) -> np.ndarray:
        """Object array of the strings, None for code -1."""
        return np.array([*self.vocabulary, None], dtype=object)[self.codes]


@dataclass(frozen=True, slots=True)
class Gathered:
    """A per-candidate feature as row numbers into a column held elsewhere (the server's
    in-memory item table): a request logs its candidates' rows once for all such features,
    and the values are taken from the column in one step when the buffer is written.

    Row -1 is a missing value (null). Neither ``rows`` nor ``column`` may change after the
    call (the server never changes an item table; a refresh builds a new one).
    """

    rows: np.ndarray
    column: np.ndarray
    """``[M]`` numbers, or codes into ``vocabulary`` (-1: null)."""
    vocabulary: tuple[str, ...] | None = None

    def _taken(self) -> tuple[np.ndarray, np.ndarray]:
        missing = self.rows < 0
        if len(self.column) == 0:
            return missing, np.zeros(len(self.rows), dtype=self.column.dtype)
        return missing, self.column[np.where(missing, 0, self.rows)]

    def codes(self) -> np.ndarray:
        """The candidates' codes into ``vocabulary`` (-1 where missing)."""
        missing, taken = self._taken()
        return np.where(missing, -1, taken)

    def values(self) -> np.ndarray:
        """The candidates' values: float64 (NaN where missing) or strings (None)."""
        if self.vocabulary is not None:
            return Coded(self.codes(), self.vocabulary).strings()
        missing, taken = self._taken()
        values = taken.astype(np.float64)
        values[missing] = np.nan
        return values


def snapshot_digest(ids: Any, columns: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of an item table: the ids (int64), then per column its name and values,
    numbers as float64 (every NaN the same bits) and strings as UTF-8 each marked present or
    missing. The same from the in-memory columns and from the Parquet file they were written
    to (read back as float64 with NaN, and strings with None)."""
    h = hashlib.sha256(np.ascontiguousarray(np.asarray(ids), dtype=np.int64).tobytes())
    for name, values in columns.items():
        h.update(b"\0" + str(name).encode())
        array = np.asarray(values)
        if array.dtype.kind in "fiub":
            numbers = array.astype(np.float64)
            h.update(b"n" + np.where(np.isnan(numbers), np.nan, numbers).tobytes())
        else:
            h.update(b"s")
            for value in array.tolist():
                missing = value is None or (isinstance(value, float) and math.isnan(value))
                h.update(b"\0" if missing else b"\1" + str(value).encode() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class ItemSnapshot:
    """An item table as the server scored with it: ``ids`` (int64 ``[M]``, unique) and per
    column ``[M]`` numbers (NaN: unknown) or :class:`Coded` strings. Logged once, referenced
    by ``digest`` from every row scored with it (see the module docstring). Neither ``ids``
    nor a column may change after it is built (a refresh builds a new table)."""

    ids: np.ndarray
    columns: Mapping[str, np.ndarray | Coded]

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids)
        if ids.ndim != 1 or len(np.unique(ids)) != len(ids):
            raise ValueError("an item snapshot's ids must be one-dimensional and unique")
        for name, column in self.columns.items():
            if name in RESERVED:
                raise ValueError(f"item snapshot column {name!r} clashes with a feedback column")
            values = column.codes if isinstance(column, Coded) else np.asarray(column)
            if values.shape != ids.shape:
                raise ValueError(
                    f"item snapshot column {name!r} has shape {values.shape}; ids {ids.shape}"
                )

    @property
    def digest(self) -> str:
        """:func:`snapshot_digest` of the ids and columns: what a reader recomputes from the
        written file before it trusts it."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            columns = {
                name: column.strings() if isinstance(column, Coded) else column
                for name, column in self.columns.items()
            }
            cached = self.__dict__["_digest"] = snapshot_digest(self.ids, columns)
        return cached

    def table(self) -> pa.Table:
        arrays: dict[str, pa.Array] = {"item_id": pa.array(np.asarray(self.ids, np.int64))}
        for name, column in self.columns.items():
            if isinstance(column, Coded):
                arrays[name] = _strings(column.codes, column.vocabulary)
            else:
                arrays[name] = _numeric(np.asarray(column, dtype=np.float64))
        return pa.table(arrays)

    def write(self, root: Path) -> Path:
        """Write the snapshot under ``root`` unless it is there (written under a temporary name
        and renamed, so a reader never sees half a file); returns its path."""
        path = item_snapshot_path(root, self.digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            pq.write_table(self.table(), tmp, store_schema=False)
            tmp.replace(path)
        return path


@dataclass(frozen=True, slots=True)
class Repeat:
    """One value for every candidate of a request (the user's features)."""

    value: Any


Column = np.ndarray | Coded | Gathered | Repeat


@dataclass(frozen=True, slots=True)
class Chunk:
    """One logged request: its scalars once, its candidates as columns."""

    ts: float
    request_id: str
    user_id: int
    model_version: str
    shadow_version: str | None
    rows: int
    columns: dict[str, Column]
    """``item_id``, ``score``, ``shadow_score`` (when shadowed) and the features."""
    items: ItemSnapshot | None = None
    """The item snapshot the request row names (``item_snapshot``), written before it."""
    request: dict[str, Any] | None = None
    """Features with one value for the request (the user's), written as its request row."""
    client_request_id: str | None = None
    """The id the client sent (untrusted: ``request_id`` is the server's own)."""


_FIXED = ("item_id", "score", "shadow_score")
RESERVED = (
    "ts", "request_id", "client_request_id", "user_id", "model_version", "shadow_version",
    ITEM_SNAPSHOT, *_FIXED,
)  # fmt: skip


def _strings(codes: np.ndarray, vocabulary: Sequence[str], *, in_range: bool = False) -> pa.Array:
    """Strings as a dictionary array (code -1: null). Parquet stores those as it stores plain
    strings, minus the hashing, and the part files are written without the Arrow schema, so
    readers get plain strings back (not categoricals). ``in_range``: the codes were built
    against ``vocabulary`` here, so Arrow's pass checking each against it is skipped."""
    codes = codes.astype(np.int32, copy=False)
    missing = codes < 0
    indices = pa.array(codes, mask=missing) if missing.any() else pa.array(codes)
    return pa.DictionaryArray.from_arrays(
        indices, pa.array(list(vocabulary), type=pa.string()), safe=not in_range
    )


def _repeat_strings(values: list[str | None], counts: np.ndarray) -> pa.Array:
    """``values[k]`` (None: null) repeated ``counts[k]`` times."""
    distinct = list(dict.fromkeys(v for v in values if v is not None))
    position = {v: i for i, v in enumerate(distinct)}
    codes = np.array([position.get(v, -1) for v in values], dtype=np.int32)  # type: ignore[arg-type]
    return _strings(np.repeat(codes, counts), distinct, in_range=True)


def _is_text(value: Any) -> bool:
    return isinstance(value, str | bytes)


def _dense(part: Column | None, rows: int, textual: bool) -> np.ndarray:
    if isinstance(part, np.ndarray):
        return part
    if isinstance(part, Coded):
        return part.strings()
    if isinstance(part, Gathered):
        return part.values()
    if isinstance(part, Repeat):
        return np.full(rows, part.value, dtype=object if textual else None)
    return np.full(rows, None if textual else np.nan, dtype=object if textual else float)


def _column(chunks: list[Chunk], counts: np.ndarray, name: str) -> pa.Array:
    """Column ``name`` over the chunks; rows of a chunk without it are null."""
    parts = [c.columns.get(name) for c in chunks]
    present = [p for p in parts if p is not None]
    if all(isinstance(p, Repeat) for p in parts):  # one value per request
        values = [p.value for p in present]  # type: ignore[union-attr]
        if any(_is_text(v) for v in values):
            return _repeat_strings([None if v is None else str(v) for v in values], counts)
        return _numeric(np.repeat(np.array(values, dtype=np.float64), counts))
    first = parts[0]
    if isinstance(first, Gathered) and all(
        isinstance(p, Gathered) and p.column is first.column and p.vocabulary == first.vocabulary
        for p in parts
    ):  # one gather over all requests
        rows = np.concatenate([p.rows for p in parts])  # type: ignore[union-attr]
        return _arrow(Gathered(rows, first.column, first.vocabulary))
    if all(isinstance(p, Coded) for p in parts):
        vocabulary = parts[0].vocabulary  # type: ignore[union-attr]
        if all(p.vocabulary == vocabulary for p in parts):  # type: ignore[union-attr]
            codes = np.concatenate([p.codes for p in parts])  # type: ignore[union-attr]
            return _strings(codes, vocabulary)
    textual = any(
        isinstance(p, Coded)
        or (isinstance(p, Gathered) and p.vocabulary is not None)
        or (isinstance(p, Repeat) and _is_text(p.value))
        or (isinstance(p, np.ndarray) and p.dtype.kind in "OUS")
        for p in present
    )
    arrays = [_dense(p, c.rows, textual) for p, c in zip(parts, chunks, strict=True)]
    values = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    if textual or values.dtype.kind in "OUS":
        return pa.array(values, type=pa.string(), from_pandas=True)
    return _numeric(values)


def _arrow(gathered: Gathered) -> pa.Array:
    if gathered.vocabulary is not None:
        return _strings(gathered.codes(), gathered.vocabulary)
    return _numeric(gathered.values())


def _numeric(values: np.ndarray) -> pa.Array:
    """NaN stored as null, as pandas' to_parquet stores it (an explicit mask: pyarrow's own
    ``from_pandas`` NaN scan took 60x longer)."""
    if values.dtype.kind == "f":
        missing = np.isnan(values)
        if missing.any():
            return pa.array(values, mask=missing)
    return pa.array(values)


def _ts_ns(chunks: list[Chunk]) -> np.ndarray:
    """Each chunk's time in ns, to the microsecond (as datetime.fromtimestamp keeps it; stored
    as ns like pandas did)."""
    return np.array([round(c.ts * 1e6) * 1000 for c in chunks], dtype=np.int64)


ROW_COLUMNS = ("request_id", "item_id", "score", "shadow_score")
"""The leading columns of a candidate's row; its per-candidate features follow."""
REQUEST_COLUMNS = (
    "ts", "request_id", "user_id", "model_version", "shadow_version", "client_request_id",
    ITEM_SNAPSHOT, "candidates",
)  # fmt: skip
"""The leading columns of a request's row; the features given as ``request_features`` follow."""
JOINED_COLUMNS = (
    "ts", "request_id", "user_id", "item_id", "score", "model_version", "shadow_version",
    "shadow_score", "client_request_id",
)  # fmt: skip
"""The leading columns of a candidate's row joined back with its request's
(:func:`serving.feedback_read.load_joined_feedback`)."""


def feedback_table(chunks: list[Chunk]) -> pa.Table:
    """The candidates' rows of ``chunks``: :data:`ROW_COLUMNS`, then the per-candidate
    features in first-seen order. ``request_id`` is a dictionary column over the chunks (one
    entry per request, no hashing of 1,000 equal strings); ``item_id`` and ``score`` are the
    chunks' own arrays, chunked, not copied into one."""
    counts = np.array([c.rows for c in chunks], dtype=np.int64)
    total = int(counts.sum())
    features: dict[str, None] = {}
    for chunk in chunks:
        features.update(dict.fromkeys(k for k in chunk.columns if k not in _FIXED))
    request = np.repeat(np.arange(len(chunks), dtype=np.int32), counts)
    arrays: dict[str, pa.Array | pa.ChunkedArray] = {
        "request_id": _strings(request, [c.request_id for c in chunks], in_range=True),
        "item_id": _own_arrays(chunks, "item_id", pa.int64()),
        "score": _own_arrays(chunks, "score", pa.float64()),
        "shadow_score": (
            _column(chunks, counts, "shadow_score")
            if any("shadow_score" in c.columns for c in chunks)
            else pa.nulls(total, pa.float64())
        ),
    }
    for name in features:
        arrays[name] = _column(chunks, counts, name)
    return pa.table(arrays)


def _own_arrays(chunks: list[Chunk], name: str, kind: pa.DataType) -> pa.ChunkedArray:
    """Column ``name`` that every chunk holds as its own array of ``kind``: wrapped, not
    copied (the chunks' arrays are never changed once logged)."""
    return pa.chunked_array([pa.array(c.columns[name], type=kind) for c in chunks], type=kind)


def requests_table(chunks: list[Chunk]) -> pa.Table:
    """One row per chunk: :data:`REQUEST_COLUMNS`, then the request features in first-seen
    order (null where a request lacks one)."""
    names: dict[str, None] = {}
    for chunk in chunks:
        names.update(dict.fromkeys(chunk.request or {}))
    arrays: dict[str, pa.Array] = {
        "ts": pa.array(_ts_ns(chunks), type=pa.timestamp("ns", tz="UTC")),
        "request_id": pa.array([c.request_id for c in chunks], type=pa.string()),
        "user_id": pa.array([c.user_id for c in chunks], type=pa.int64()),
        "model_version": pa.array([c.model_version for c in chunks], type=pa.string()),
        "shadow_version": pa.array([c.shadow_version for c in chunks], type=pa.string()),
        "client_request_id": pa.array([c.client_request_id for c in chunks], type=pa.string()),
        ITEM_SNAPSHOT: pa.array(
            [None if c.items is None else c.items.digest for c in chunks], type=pa.string()
        ),
        "candidates": pa.array([c.rows for c in chunks], type=pa.int64()),
    }
    for name in names:
        values = [(c.request or {}).get(name) for c in chunks]
        if any(_is_text(v) for v in values):
            arrays[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
        else:
            numbers = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            arrays[name] = _numeric(numbers)
    return pa.table(arrays)
