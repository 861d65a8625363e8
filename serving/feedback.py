"""The serving feedback writer: what was scored (and by which version) and the clicks joined
later, written into the lake (:mod:`serving.feedback_rows` has the layout and the row format;
:mod:`serving.feedback_read` reads them back for the monitor). A request's row is written
before its candidates' rows and published before them.

The server calls :meth:`FeedbackLog.log` per request. A request is buffered as it came, one
chunk of column arrays, and each write turns the buffered chunks into one Arrow table,
written as a row group of the day's open part file. Part files are never rewritten, and
readers never see half a file (written under a temporary name, renamed when closed). With
``background`` the writing runs on a writer thread of its own, so a request only ever
appends; :meth:`close` writes what is left (the server calls it on shutdown).

A write that fails loses nothing already written and nothing silently: the open part file is
closed (its row groups written before the failure are published) or, when even that fails,
kept aside as ``.part-*.parquet.failed``; the rows of the failed write wait in a bounded retry
buffer for the next write. Rows that cannot be kept (the retry buffer is full, a row failed
``max_write_attempts`` writes, shutdown) are counted in ``dropped_rows`` and in the server's
``cascade_feedback_dropped_rows_total`` metric (:mod:`serving.metrics`).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from cascade.config import Settings, load_settings
from serving.feedback_rows import (
    REQUEST_COLUMNS,
    RESERVED,
    Chunk,
    Coded,
    Column,
    Gathered,
    ItemSnapshot,
    Repeat,
    feedback_dir,
    feedback_table,
    requests_table,
)
from serving.metrics import FEEDBACK_DROPPED_ROWS, FEEDBACK_RETRY_ROWS, FEEDBACK_WRITE_ERRORS

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class FeedbackConfig:
    """Buffering of the feedback writer."""

    flush_rows: int = 50_000
    """Write the buffer once it holds this many candidate rows (50 requests of 1,000
    candidates), as one row group of the day's open part file."""
    flush_s: float = 10.0
    """...or once its oldest row is this old; and close (publish) a part file this long
    after it was opened."""
    part_rows: int = 2_000_000
    """Close a part file once it holds this many rows (~25 MB)."""
    max_buffered_rows: int = 5_000_000
    """Rows held while waiting for the writer; beyond it new requests are dropped and counted
    (only when writing fails or stalls for a long time: a bound on memory, ~50 B a row)."""
    max_retry_rows: int = 500_000
    """Rows of failed writes kept for the next write; beyond it the oldest are dropped and
    counted (a disk that stays full must not grow the server without bound)."""
    max_write_attempts: int = 3
    """Writes a row may fail for another reason than I/O (a value the file cannot take)
    before it is dropped and counted; I/O errors are retried until the retry buffer is full."""

    def __post_init__(self) -> None:
        if self.flush_rows < 1 or self.flush_s <= 0 or self.part_rows < 1:
            raise ValueError("flush_rows and part_rows must be >= 1 and flush_s > 0")
        if self.max_buffered_rows < self.flush_rows:
            raise ValueError("max_buffered_rows must be >= flush_rows")
        if self.max_retry_rows < 0 or self.max_write_attempts < 1:
            raise ValueError("max_retry_rows must be >= 0 and max_write_attempts >= 1")


_TAKEN = frozenset((*RESERVED, *REQUEST_COLUMNS))
"""Names a request feature may not have."""


def _array(values: Any) -> np.ndarray:
    """``values`` as an array; numbers with None (a list from a frame) as float, None -> NaN."""
    array = np.array(values)
    if array.dtype == object and all(
        v is None or (isinstance(v, int | float | np.number) and not isinstance(v, bool))
        for v in array
    ):
        return np.array([np.nan if v is None else v for v in array], dtype=np.float64)
    return array


def _write_part(folder: Path, frame: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"part-{uuid.uuid4().hex}.parquet"
    tmp = folder / f".{name}.tmp"
    frame.to_parquet(tmp, index=False)
    tmp.replace(folder / name)
    return folder / name


def _parquet_options(table: pa.Table) -> dict[str, Any]:
    """How feedback parts are written, each choice the cheaper of those measured on 250,000
    rows: dictionary (run-length) encoding for the columns whose values repeat (a request's
    scalars, item features per item), none for the scores (all distinct: it only cost time),
    delta encoding for item ids (as small as a dictionary, half the time); statistics only
    for ts, user_id and item_id; no compression (snappy took longer than the write and saved
    ~10%). Written without the Arrow schema: the dictionary-typed string arrays read back as
    plain strings, not categoricals."""
    names = table.column_names
    plain = {"score", "shadow_score", "item_id"}
    return {
        "use_dictionary": [n for n in names if n not in plain],
        "column_encoding": {"item_id": "DELTA_BINARY_PACKED"} if "item_id" in names else {},
        "compression": "none",
        "store_schema": False,
        "write_statistics": [n for n in ("ts", "user_id", "item_id") if n in names],
    }


_Pending = tuple[Chunk, int]
"""A buffered request and the writes it failed so far."""


def _batches(chunks: list[_Pending], rows: int) -> list[list[_Pending]]:
    """``chunks`` in order, cut into runs of about ``rows`` rows (whole requests)."""
    batches: list[list[_Pending]] = [[]]
    count = 0
    for chunk in chunks:
        if count >= rows:
            batches.append([])
            count = 0
        batches[-1].append(chunk)
        count += chunk[0].rows
    return batches


class _OpenPart:
    """A part file being written: row groups go to a hidden temporary file, renamed to its
    ``part-*.parquet`` name when closed, so readers only ever see whole files."""

    def __init__(self, folder: Path, table: pa.Table, opened: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{uuid.uuid4().hex}.parquet"
        self.final = folder / name
        self.tmp = folder / f".{name}.tmp"
        self.schema = table.schema
        self.opened = opened
        self.rows = 0
        self.writer = pq.ParquetWriter(self.tmp, table.schema, **_parquet_options(table))

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows += table.num_rows

    def close(self) -> Path:
        self.writer.close()
        self.tmp.replace(self.final)
        return self.final

    def close_after_failure(self) -> Path | None:
        """After a failed write: close the file and publish the row groups written before the
        failure (the file's footer must say exactly those rows); else keep the file aside as
        ``.part-*.parquet.failed`` for a person to look at. Returns the published file."""
        try:
            self.writer.close()
            if self.rows == 0:
                self.tmp.unlink(missing_ok=True)
                return None
            found = pq.ParquetFile(self.tmp).metadata.num_rows
            if found != self.rows:
                raise ValueError(f"the file holds {found} rows, {self.rows} were written")
            self.tmp.replace(self.final)
            return self.final
        except Exception as exc:
            kept = self.tmp.with_name(f".{self.final.name}.failed")
            try:
                self.tmp.replace(kept)
            except OSError:
                kept = self.tmp
            log.error("feedback part %s could not be closed (%s); its %d rows are kept in %s",
                      self.final.name, exc, self.rows, kept)  # fmt: skip
            return None


class FeedbackLog:
    """Thread-safe buffered writer of scored candidates.

    Requests are buffered as they come (:meth:`log`); every ``flush_rows`` rows (or
    ``flush_s``) the buffer is written as one row group of the serving day's open part file,
    and a part file is closed, i.e. renamed into view, after ``flush_s`` or ``part_rows``.
    Small row groups spread the writing evenly (a 250,000-row part written at once was a
    60 ms burst of CPU beside the requests) and keep its arrays small enough to reuse
    memory; few, large files keep the day's folder readable. A crash loses the buffer and
    the open parts: at most ``flush_s`` (~2x at low traffic) of feedback, never half a file.

    ``background=True`` starts a writer thread: :meth:`log` then only appends (and wakes the
    writer when a write is due), and aged buffers and parts are written and closed even when
    no request comes; :meth:`close` writes and publishes the rest and stops it. Without it,
    :meth:`log` writes inline when due, as tests and batch callers want. :meth:`flush`
    writes and publishes everything now.
    """

    def __init__(
        self,
        lake_root: Path,
        config: FeedbackConfig | None = None,
        *,
        clock: Any = time.time,
        background: bool = False,
    ) -> None:
        self.lake_root = lake_root
        self.config = config or FeedbackConfig()
        self._clock = clock
        self._chunks: list[Chunk] = []
        self._rows = 0
        self._oldest: float | None = None
        self._lock = threading.Lock()
        """Guards the buffer: held for an append or a swap, never while writing."""
        self._write_lock = threading.Lock()
        """Serializes writing (the writer thread, flush, close) and guards the open parts."""
        self._parts: dict[str, _OpenPart] = {}
        self._request_parts: dict[str, _OpenPart] = {}
        self._snapshots_written: set[str] = set()
        self.dropped_rows = 0
        """Rows that will never be written: the buffer was full (``max_buffered_rows``), the
        retry buffer was full (``max_retry_rows``), a row failed ``max_write_attempts``
        writes, or writes still failed at :meth:`close`."""
        self.written_rows = 0
        """Rows in published (closed) part files."""
        self.write_errors = 0
        """Writes (of a row group, or of a part file's close) that failed."""
        self.stranded_rows = 0
        """Rows written to part files that could not be closed (kept aside as ``.failed``)."""
        self._retry: list[_Pending] = []
        self._retry_rows = 0
        self._retry_after = 0.0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._writer: threading.Thread | None = None
        if background:
            self._writer = threading.Thread(
                target=self._write_forever, name="feedback-writer", daemon=True
            )
            self._writer.start()

    def log(
        self,
        *,
        request_id: str,
        user_id: int,
        item_ids: Sequence[int] | np.ndarray,
        scores: Sequence[float] | np.ndarray,
        model_version: str,
        features: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        shadow_version: str | None = None,
        shadow_scores: Sequence[float] | np.ndarray | None = None,
        items: ItemSnapshot | None = None,
        request_features: Mapping[str, Any] | None = None,
        client_request_id: str | None = None,
    ) -> None:
        """Buffer one request: ``item_ids``, ``scores`` and the shadow scores hold one value
        per candidate; so does each feature, or it is one scalar for all candidates (the
        user's features), :class:`Coded` strings or :class:`Gathered` rows of a table.
        ``items``: the item table the candidates were scored with, logged by reference
        (the request row's ``item_snapshot``; written once, before the first row naming it).
        ``request_features``: scalars of the whole request (the user's features), written
        in its request row (as its ts, user and versions are) instead of on each candidate's.
        ``request_id``: the server's id of the request (clicks join on it);
        ``client_request_id``: the id the client sent, if any, kept in its own column and
        never joined on.
        Arrays are copied (not a Gathered's), the caller may reuse them."""
        now = self._clock()
        ids = np.array(item_ids, dtype=np.int64)
        n = len(ids)
        columns: dict[str, Column] = {
            "item_id": ids,
            "score": np.array(scores, dtype=np.float64),
        }
        if shadow_scores is not None:
            columns["shadow_score"] = np.array(shadow_scores, dtype=np.float64)
        for name, values in (features or {}).items():
            if name in RESERVED:
                raise ValueError(f"feature name {name!r} clashes with a feedback column")
            if isinstance(values, Gathered):
                columns[name] = values  # immutable by contract: no copy
            elif isinstance(values, Coded):
                columns[name] = Coded(np.array(values.codes, dtype=np.int32), values.vocabulary)
            elif isinstance(values, str | bytes) or np.ndim(values) == 0:
                columns[name] = Repeat(None if values is None else values)
            else:
                columns[name] = _array(values)
        request: dict[str, Any] | None = None
        if request_features:
            request = {}
            for name, value in request_features.items():
                if name in _TAKEN or name in columns:
                    raise ValueError(f"request feature {name!r} clashes with a feedback column")
                if type(value) is float:  # the common case, checked first
                    request[name] = value
                    continue
                if isinstance(value, np.generic):
                    value = value.item()
                if not (value is None or isinstance(value, str | int | float)) or isinstance(
                    value, bool
                ):
                    raise ValueError(
                        f"request feature {name!r} must be one number or string, not "
                        f"{type(value).__name__}"
                    )
                request[name] = value
        if items is not None and not (
            columns.keys().isdisjoint(items.columns)
            and (request or {}).keys().isdisjoint(items.columns)
        ):
            clash = sorted(set(items.columns) & (set(columns) | set(request or {})))
            raise ValueError(f"features {clash} are also columns of the item snapshot")
        for name, column in columns.items():
            if isinstance(column, Repeat):
                continue
            if isinstance(column, Coded):
                shape = column.codes.shape
            elif isinstance(column, Gathered):
                shape = column.rows.shape
            else:
                shape = column.shape
            if shape != (n,):
                raise ValueError(
                    f"feedback column {name!r} has shape {shape}; expected ({n},), one "
                    "value per candidate (or one scalar for all of them)"
                )
        chunk = Chunk(
            ts=now,
            request_id=str(request_id),
            user_id=int(user_id),
            model_version=str(model_version),
            shadow_version=None if shadow_version is None else str(shadow_version),
            rows=n,
            columns=columns,
            items=items,
            request=request,
            client_request_id=None if client_request_id is None else str(client_request_id),
        )
        with self._lock:
            if self._rows + n > self.config.max_buffered_rows:
                self.dropped_rows += n
                FEEDBACK_DROPPED_ROWS.labels(reason="buffer_full").inc(n)
                if self.dropped_rows == n:
                    log.warning(
                        "feedback buffer full (%d rows): dropping requests until the writer "
                        "catches up",
                        self._rows,
                    )
                return
            self._chunks.append(chunk)
            self._rows += n
            self._oldest = self._oldest if self._oldest is not None else now
            due = self._due(now)
        if due:
            if self._writer is not None and not self._closed.is_set():
                self._wake.set()
            else:
                self.flush()

    def _due(self, now: float) -> bool:
        """Caller holds the lock."""
        return (
            self._rows >= self.config.flush_rows
            or (self._oldest is not None and now - self._oldest >= self.config.flush_s)
            or (self._retry_rows > 0 and now >= self._retry_after)
        )

    @property
    def buffered_rows(self) -> int:
        return self._rows

    @property
    def retry_rows(self) -> int:
        """Rows of failed writes waiting for the next write."""
        return self._retry_rows

    def _write_buffer(self) -> None:
        """Write the rows waiting for a retry, then the buffered rows, as row groups of the
        open parts (caller holds ``_write_lock``); parts that reach ``part_rows`` are closed.
        A batch that fails goes to the retry buffer (after an I/O error, so do the batches
        after it, untried); nothing is raised."""
        with self._lock:
            fresh, self._chunks, self._rows, self._oldest = self._chunks, [], 0, None
        pending, self._retry, self._retry_rows = [*self._retry, *((c, 0) for c in fresh)], [], 0
        if not pending:
            FEEDBACK_RETRY_ROWS.set(0)
            return
        by_day: dict[str, list[_Pending]] = {}
        for item in pending:
            day = dt.datetime.fromtimestamp(item[0].ts, dt.UTC).strftime("%Y-%m-%d")
            by_day.setdefault(day, []).append(item)
        io_failed = False
        for ds, day_chunks in by_day.items():
            # A request that failed a write for another reason than I/O is tried alone: one
            # request whose values the file cannot take must not take the others down with it.
            suspects = [[item] for item in day_chunks if item[1] > 0]
            clean = [item for item in day_chunks if item[1] == 0]
            for group in [*suspects, *_batches(clean, self.config.flush_rows)]:
                if not group:
                    continue
                if io_failed:
                    self._keep_for_retry(group, failed=False)
                    continue
                try:
                    chunks = [c for c, _ in group]
                    self._write_snapshots(c.items for c in chunks)
                    self._write_requests(ds, requests_table(chunks))  # before their rows
                    self._write_row_group(ds, feedback_table(chunks))
                except Exception as exc:
                    io_failed = isinstance(exc, OSError)
                    self.write_errors += 1
                    FEEDBACK_WRITE_ERRORS.inc()
                    rows = sum(c.rows for c, _ in group)
                    log.error("writing %d feedback rows of %s failed (%s: %s); kept for a retry",
                              rows, ds, type(exc).__name__, exc)  # fmt: skip
                    self._keep_for_retry(group, failed=True, io_error=io_failed)
        FEEDBACK_RETRY_ROWS.set(self._retry_rows)

    def _keep_for_retry(
        self, group: list[_Pending], *, failed: bool, io_error: bool = True
    ) -> None:
        """Hold ``group`` for the next write. A failure other than I/O counts as an attempt
        of each of its requests; requests past ``max_write_attempts`` or over
        ``max_retry_rows`` (the oldest first) are dropped and counted."""
        for chunk, attempts in group:
            attempts += int(failed and not io_error)
            if attempts >= self.config.max_write_attempts:
                self._drop(chunk.rows, "write_failed")
                continue
            self._retry.append((chunk, attempts))
            self._retry_rows += chunk.rows
        while self._retry_rows > self.config.max_retry_rows:
            oldest, _ = self._retry.pop(0)
            self._retry_rows -= oldest.rows
            self._drop(oldest.rows, "retry_full")
        self._retry_after = self._clock() + self.config.flush_s

    def _drop(self, rows: int, reason: str) -> None:
        with self._lock:
            self.dropped_rows += rows
        FEEDBACK_DROPPED_ROWS.labels(reason=reason).inc(rows)
        log.warning("dropped %d feedback rows (%s); %d dropped so far", rows, reason,
                    self.dropped_rows)  # fmt: skip

    def _write_snapshots(self, snapshots: Any) -> None:
        """Write each item snapshot not written yet (before the rows that name it)."""
        for snapshot in snapshots:
            if snapshot is not None and snapshot.digest not in self._snapshots_written:
                snapshot.write(self.lake_root)
                self._snapshots_written.add(snapshot.digest)

    def _part_for(
        self,
        parts: dict[str, _OpenPart],
        kind: str,
        ds: str,
        table: pa.Table,
        publish: Callable[[str], object],
    ) -> _OpenPart:
        """Day ``ds``'s open part of ``parts`` for rows of ``table``'s schema: a part of
        another schema (e.g. shadow scoring switched on) is published first (``publish``)
        and a new one opened under ``kind``'s folder."""
        part = parts.get(ds)
        if part is not None and part.schema != table.schema:
            publish(ds)
            part = None
        if part is None:
            folder = feedback_dir(self.lake_root, kind, ds)
            part = parts[ds] = _OpenPart(folder, table, self._clock())
        return part

    def _write_row_group(self, ds: str, table: pa.Table) -> None:
        """Append ``table`` to day ``ds``'s open part (opened here if needed); publish the
        part once it holds ``part_rows``. When the write fails, the day's requests part is
        published and this part closed with the row groups it holds
        (:meth:`_OpenPart.close_after_failure`), and the error raised."""
        part = self._part_for(self._parts, "feedback", ds, table, self._publish)
        try:
            part.write(table)
        except Exception:
            self._parts.pop(ds, None)
            self._publish_requests(ds)  # the rows published below name requests in it
            if part.close_after_failure() is not None:
                self.written_rows += part.rows
            else:
                self.stranded_rows += part.rows
            raise
        if part.rows >= self.config.part_rows:
            self._publish(ds)

    def _write_requests(self, ds: str, table: pa.Table) -> None:
        """Append request rows to day ``ds``'s open requests part, as :meth:`_write_row_group`
        does for candidates. A group whose candidates then fail is retried whole, so a
        request may be written twice (readers keep one, see :func:`with_request_features`)."""
        part = self._part_for(
            self._request_parts, "feedback_requests", ds, table, self._publish_requests
        )
        try:
            part.write(table)
        except Exception:
            self._request_parts.pop(ds, None)
            part.close_after_failure()
            raise

    def _publish_requests(self, ds: str) -> None:
        """Close day ``ds``'s open requests part (if any) and rename it into view."""
        part = self._request_parts.pop(ds, None)
        if part is None:
            return
        try:
            part.close()
        except Exception as exc:
            self.write_errors += 1
            FEEDBACK_WRITE_ERRORS.inc()
            log.error("closing feedback requests part %s failed: %s", part.final.name, exc)
            part.close_after_failure()

    def _publish(self, ds: str) -> Path | None:
        """Close day ``ds``'s open parts and rename them into view, its requests first; the
        candidates' part, or None when it was not open or closing it failed (the file is kept
        aside, see :meth:`_OpenPart.close_after_failure`)."""
        self._publish_requests(ds)
        part = self._parts.pop(ds, None)
        if part is None:
            return None
        try:
            path = part.close()
        except Exception as exc:
            self.write_errors += 1
            FEEDBACK_WRITE_ERRORS.inc()
            log.error("closing feedback part %s failed: %s", part.final.name, exc)
            if part.close_after_failure() is None:
                self.stranded_rows += part.rows
                return None
            path = part.final
        self.written_rows += part.rows
        return path

    def write(self) -> None:
        """Write buffered rows (and those waiting for a retry) as row groups of the open parts,
        without publishing them (the writer thread's step; :meth:`flush` also publishes)."""
        with self._write_lock:
            self._write_buffer()

    def flush(self) -> list[Path]:
        """Write buffered rows (and those waiting for a retry) and publish every open part
        (one per serving day); returns the files published. Rows whose write fails stay in
        the retry buffer (:attr:`retry_rows`)."""
        with self._write_lock:
            self._write_buffer()
            days = sorted(set(self._parts) | set(self._request_parts))
            published = [self._publish(ds) for ds in days]
            return [path for path in published if path is not None]

    def _write_forever(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.config.flush_s / 4)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                with self._write_lock:
                    now = self._clock()
                    with self._lock:
                        due = self._due(now)
                    if due:
                        self._write_buffer()
                    open_parts = [*self._parts.items(), *self._request_parts.items()]
                    for ds in {
                        ds for ds, part in open_parts if now - part.opened >= self.config.flush_s
                    }:
                        self._publish(ds)
            except Exception:  # the server keeps serving; failed rows wait for a retry
                log.exception("writing serving feedback failed")

    def close(self) -> list[Path]:
        """Stop the writer thread (if any), write and publish everything buffered.
        Idempotent; later :meth:`log` calls write inline."""
        self._closed.set()
        self._wake.set()
        if self._writer is not None and self._writer is not threading.current_thread():
            self._writer.join(timeout=60)
        published = self.flush()
        with self._write_lock:
            if self._retry_rows:  # writes still fail: nothing left to retry them
                rows, self._retry, self._retry_rows = self._retry_rows, [], 0
                FEEDBACK_RETRY_ROWS.set(0)
                self._drop(rows, "shutdown")
        return published


def log_clicks(ds: str, clicks: pd.DataFrame, *, settings: Settings | None = None) -> Path:
    """Append the clicks observed for serving day ``ds`` (columns request_id, item_id, click)."""
    missing = {"request_id", "item_id", "click"} - set(clicks.columns)
    if missing:
        raise ValueError(f"clicks frame lacks columns {sorted(missing)}")
    settings = settings or load_settings()
    return _write_part(
        feedback_dir(settings.lake_root, "clicks", ds), clicks.reset_index(drop=True)
    )
