"""Feast's online-store encoding computed column by column with numpy and Arrow: entity keys
(``serialize_entity_key``, version 3), value blobs (``ValueProto`` wire bytes), ``value_text``
and SQLite's timestamps exactly as Feast writes them, and the check of a sample of each batch
against Feast's own converter (:class:`BulkEncodingMismatch` on any difference). The writers
that load the encoded rows are :mod:`domains.ctr.online_bulk`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SAMPLE_ROWS = 16
"""Rows per batch (plus up to as many rows with missing values) re-encoded by Feast's own
converter and compared byte for byte."""


class BulkEncodingMismatch(RuntimeError):
    """The bulk encoder produced bytes Feast would not have written: nothing further is loaded."""


class BulkUnsupported(ValueError):
    """A view or store the bulk path does not handle: use Feast's ``materialize`` for it."""


def _ragged(matrix: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """Row i = the first ``lengths[i]`` bytes of ``matrix[i]`` (a (n, w) uint8 array)."""
    n, width = matrix.shape
    mask = np.arange(width)[None, :] < lengths[:, None]
    data = np.ascontiguousarray(matrix)[mask]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())]
    )


def _fixed(matrix: np.ndarray) -> pa.BinaryArray:
    """Row i = all bytes of ``matrix[i]``."""
    n, width = matrix.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(matrix).tobytes())],
    )


def _varint(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of int64 values (negatives as 10-byte two's complement): (n, 10)
    bytes and each one's length."""
    u = values.astype(np.int64).view(np.uint64)
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = (u[:, None] >> shifts[None, :]) & np.uint64(0x7F)
    length = 1 + ((u[:, None] >> shifts[None, 1:]) != 0).sum(axis=1)
    more = np.arange(10)[None, :] < (length[:, None] - 1)
    groups = groups.astype(np.uint8) | (more.astype(np.uint8) << 7)
    return groups, length.astype(np.int64)


def _with_tag(tag: int, body: np.ndarray, lengths: np.ndarray, present: np.ndarray) -> tuple:
    n = body.shape[0]
    matrix = np.empty((n, body.shape[1] + 1), dtype=np.uint8)
    matrix[:, 0] = tag
    matrix[:, 1:] = body
    return matrix, np.where(present, lengths + 1, 0)


def _python_texts(values: list, present: np.ndarray) -> pa.StringArray:
    """``str`` of each value (as Feast's ``value_text``), null where the value is missing."""
    return pa.array(list(map(str, values)), pa.string(), mask=~present)


@dataclass
class Encoded:
    """One feature column: its value blobs (empty when missing) and texts (None when missing)."""

    blobs: pa.BinaryArray
    texts: pa.StringArray


def encode_values(column: pa.Array, value_type: Any) -> Encoded:
    """``ValueProto`` wire bytes and Feast's ``value_text`` of one feature column."""
    from feast.value_type import ValueType

    name = value_type.name
    if name in ("DOUBLE", "FLOAT"):
        floats = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
        present = ~np.isnan(floats)  # Feast writes NaN as a missing value, like a null
        if name == "DOUBLE":
            body = floats.astype("<f8").view(np.uint8).reshape(-1, 8)
            matrix, lengths = _with_tag(0x29, body, np.full(len(floats), 8), present)
            texts = _python_texts(floats.tolist(), present)
        else:
            single = floats.astype("<f4")
            body = single.view(np.uint8).reshape(-1, 4)
            matrix, lengths = _with_tag(0x35, body, np.full(len(floats), 4), present)
            texts = _python_texts(single.astype(np.float64).tolist(), present)
        return Encoded(_ragged(matrix, lengths), texts)
    if name in ("INT64", "INT32", "BOOL"):
        present = column.is_valid().to_numpy(zero_copy_only=False)
        ints = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        if name == "BOOL":
            tag, body, lengths = 0x38, ints.astype(np.uint8)[:, None], np.ones(len(ints), int)
            texts = _python_texts([bool(v) for v in ints.tolist()], present)
        else:
            tag = 0x20 if name == "INT64" else 0x18
            body, lengths = _varint(ints)
            texts = pc.cast(column.cast(pa.int64()), pa.string())  # str(int), null stays null
        matrix, lengths = _with_tag(tag, body, lengths, present)
        return Encoded(_ragged(matrix, lengths), texts)
    if name == "STRING":
        strings = column.cast(pa.string())
        present = strings.is_valid().to_numpy(zero_copy_only=False)
        data = strings.fill_null("").cast(pa.binary())
        sizes = pc.binary_length(data).to_numpy(zero_copy_only=False)
        body, lengths = _varint(sizes)
        header = _ragged(*_with_tag(0x12, body, lengths, present))
        blobs = pc.if_else(pa.array(present), pc.binary_join_element_wise(header, data, b""), b"")
        return Encoded(blobs, strings)
    raise BulkUnsupported(
        f"the bulk writer does not encode {ValueType(value_type).name} features; "
        "materialize this view with Feast (engine='feast')"
    )


def encode_keys(batch: pa.RecordBatch, join_keys: dict[str, Any]) -> tuple[pa.Array, np.ndarray]:
    """Feast's ``serialize_entity_key`` (version 3) of every row, and which rows have all keys."""
    from feast.infra.key_encoding_utils import serialize_entity_key_prefix

    names = sorted(join_keys)
    prefix = np.frombuffer(serialize_entity_key_prefix(names, 3), dtype=np.uint8)
    n = batch.num_rows
    valid = np.ones(n, dtype=bool)
    parts: list[pa.Array] = []
    for i, name in enumerate(names):
        column = batch.column(name)
        valid &= column.is_valid().to_numpy(zero_copy_only=False)
        kind = join_keys[name].name
        if kind in ("INT64", "INT32"):
            dtype, code, size = ("<i8", 4, 8) if kind == "INT64" else ("<i4", 3, 4)
            values = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            body = values.astype(dtype).view(np.uint8).reshape(n, size)
            header = np.frombuffer(struct.pack("<II", code, size), dtype=np.uint8)
            head = np.concatenate([prefix, header]) if i == 0 else header
            parts.append(_fixed(np.hstack([np.broadcast_to(head, (n, len(head))), body])))
        elif kind == "STRING":
            data = column.cast(pa.string()).fill_null("").cast(pa.binary())
            sizes = pc.binary_length(data).to_numpy(zero_copy_only=False).astype("<u4")
            header = np.empty((n, 8), dtype=np.uint8)
            header[:, :4] = np.frombuffer(struct.pack("<I", 2), dtype=np.uint8)
            header[:, 4:] = sizes.view(np.uint8).reshape(n, 4)
            if i == 0:
                header = np.hstack([np.broadcast_to(prefix, (n, len(prefix))), header])
            parts.extend([_fixed(header), data])
        else:
            raise BulkUnsupported(f"the bulk writer does not encode {kind} entity keys ({name})")
    keys = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, b"")
    return keys, valid


def epochs(column: pa.Array) -> list[int | None]:
    """SQLite's value of each timestamp exactly as Feast's store binds it: ``to_naive_utc``
    then the ``datetime`` adapter Feast registers (``int(naive.timestamp())``)."""
    from feast.infra.online_stores.sqlite import adapt_datetime_epoch
    from feast.utils import to_naive_utc

    if not pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("us", tz="UTC"))
    if column.type.tz is None:
        column = column.cast(pa.timestamp(column.type.unit, tz="UTC"))
    unique = column.unique()
    indices = pc.index_in(column, unique).to_numpy(zero_copy_only=False)
    mapped = [
        None if v is None else adapt_datetime_epoch(to_naive_utc(v)) for v in unique.to_pylist()
    ]
    if len(mapped) == 1:
        return mapped * len(column)
    lookup = np.array(mapped, dtype=object)
    return lookup[indices].tolist()


def sample_rows(batch: pa.RecordBatch, features: list[tuple[str, Any]]) -> list[int]:
    """The rows re-encoded by Feast: the first :data:`SAMPLE_ROWS`, and as many with a
    missing value (null or NaN)."""
    n = batch.num_rows
    incomplete = np.zeros(n, dtype=bool)
    for name, _ in features:
        column = batch.column(name)
        incomplete |= ~column.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_floating(column.type):
            incomplete |= np.isnan(column.to_numpy(zero_copy_only=False))
    return sorted(
        set(range(min(SAMPLE_ROWS, n))) | set(np.flatnonzero(incomplete)[:SAMPLE_ROWS].tolist())
    )


def check_against_feast(
    batch: pa.RecordBatch,
    view: Any,
    join_keys: dict[str, Any],
    rows: list[tuple],
    features: list[tuple[str, Any]],
) -> None:
    """Re-encode a sample of the batch with Feast's converter and compare every byte."""
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.infra.online_stores.helpers import extract_text_and_num
    from feast.infra.online_stores.sqlite import adapt_datetime_epoch
    from feast.utils import _convert_arrow_to_proto, to_naive_utc

    if batch.num_rows == 0:
        return
    picks = sample_rows(batch, features)
    expected = _convert_arrow_to_proto(batch.take(pa.array(picks)), view, join_keys)
    for row, (entity_key, values, event_ts, created_ts) in zip(picks, expected, strict=True):
        key, event, created, *columns = rows[row]
        if serialize_entity_key(entity_key, 3) != key:
            raise BulkEncodingMismatch(f"{view.name}: entity key of row {row} differs from Feast")
        if adapt_datetime_epoch(to_naive_utc(event_ts)) != event:
            raise BulkEncodingMismatch(f"{view.name}: event_ts of row {row} differs from Feast")
        feast_created = (
            None if created_ts is None else adapt_datetime_epoch(to_naive_utc(created_ts))
        )
        if feast_created != created:
            raise BulkEncodingMismatch(f"{view.name}: created_ts of row {row} differs from Feast")
        for i, (name, _) in enumerate(features):
            mine_blob, mine_text = columns[i], columns[len(features) + i]
            want_text, _ = extract_text_and_num(values[name], False)
            if values[name].SerializeToString() != mine_blob or want_text != mine_text:
                raise BulkEncodingMismatch(
                    f"{view.name}: feature {name} of row {row} (key {key!r}) is "
                    f"{mine_blob!r}/{mine_text!r}, Feast writes "
                    f"{values[name].SerializeToString()!r}/{want_text!r}"
                )
