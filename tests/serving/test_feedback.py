"""The feedback log: requests buffered as columns, written as row groups of part files by a
writer thread, read back as one row per scored candidate; nothing lost on close."""

from __future__ import annotations

import datetime as dt
import io
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cascade.config import Settings
from serving.feedback import FeedbackConfig, FeedbackLog
from serving.feedback_read import load_joined_feedback, with_item_features, with_request_features
from serving.feedback_rows import Coded, Gathered, ItemSnapshot, feedback_dir, item_snapshot_path

DAY = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC).timestamp()
ITEM_CTR = np.array([0.1, 0.2, np.nan, 0.4])  # the item table's column; row 2 unknown
ITEM_GENRE = np.array([0, 1, -1, 1])  # codes into GENRES; row 2 has no genre
GENRES = ("Action", "Comedy")


def parts(root: Path) -> list[Path]:
    return sorted((root / "feedback").rglob("part-*.parquet"))


def read(root: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in parts(root)], ignore_index=True)


def requests_of(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / "feedback_requests")


def read_joined(root: Path) -> pd.DataFrame:
    """The candidates' rows with their request rows' columns."""
    return with_request_features(read(root), requests_of(root))


def log_request(feedback: FeedbackLog, n: int, request: str, user: int = 7) -> None:
    rows = np.arange(n) % 5 - 1  # -1: an item the table does not hold
    feedback.log(
        request_id=request,
        user_id=user,
        item_ids=np.arange(n) + 100,
        scores=np.linspace(0, 1, n, dtype=np.float32),
        model_version="3",
        features={
            "user_ctr": 0.25,  # one value for every candidate
            "item_ctr": Gathered(rows, ITEM_CTR),
            "genre": Gathered(rows, ITEM_GENRE, GENRES),
        },
    )


def test_rows_read_back_one_per_candidate_with_their_features(tmp_path: Path) -> None:
    feedback = FeedbackLog(tmp_path, clock=lambda: DAY)
    log_request(feedback, 5, "r1", user=7)
    feedback.log(
        request_id="r2",
        user_id=8,
        item_ids=[1, 2],
        scores=[0.5, 0.75],
        model_version="3",
        features={
            "user_ctr": [0.5, 0.5],
            "item_ctr": [0.3, None],
            "genre": Coded(np.array([1, -1]), GENRES),
        },
        shadow_version="4",
        shadow_scores=[0.1, 0.2],
        client_request_id="r1",  # a client naming another request: kept apart, never joined
    )
    (part,) = feedback.flush()
    assert part.parent == feedback_dir(tmp_path, "feedback", "2026-11-22")
    raw = pd.read_parquet(part)
    assert len(raw) == 7 and feedback.written_rows == 7 and feedback.buffered_rows == 0
    # A candidate's row holds only its own values; the request's are in its request row.
    assert list(raw.columns) == [
        "request_id", "item_id", "score", "shadow_score", "user_ctr", "item_ctr", "genre",
    ]  # fmt: skip
    requests = pd.read_parquet(feedback_dir(tmp_path, "feedback_requests", "2026-11-22"))
    assert requests.request_id.tolist() == ["r1", "r2"]
    assert requests.candidates.tolist() == [5, 2]
    frame = with_request_features(raw, requests)
    assert list(frame.columns) == [
        "ts", "request_id", "user_id", "item_id", "score", "model_version",
        "shadow_version", "shadow_score", "client_request_id", "user_ctr", "item_ctr", "genre",
        "item_snapshot",
    ]  # fmt: skip
    assert frame.item_snapshot.isna().all()  # logged without an item table
    assert frame.client_request_id.tolist() == [None] * 5 + ["r1"] * 2
    assert str(frame.ts.dtype) == "datetime64[ns, UTC]"
    assert (frame.ts == pd.Timestamp(DAY, unit="s", tz="UTC")).all()
    assert frame.request_id.tolist() == ["r1"] * 5 + ["r2"] * 2
    assert frame.user_id.tolist() == [7] * 5 + [8] * 2 and frame.user_id.dtype == np.int64
    assert frame.item_id.tolist() == [100, 101, 102, 103, 104, 1, 2]
    np.testing.assert_allclose(frame.score[:5], np.linspace(0, 1, 5, dtype=np.float32))
    assert frame.model_version.tolist() == ["3"] * 7
    assert frame.shadow_version.tolist() == [None] * 5 + ["4"] * 2
    assert frame.shadow_score[:5].isna().all() and frame.shadow_score[5:].tolist() == [0.1, 0.2]
    assert frame.user_ctr.tolist() == [0.25] * 5 + [0.5] * 2
    # Rows -1, 0, 1, 2, 3 of the item table: unknown item, 0.1, 0.2, unknown feature, 0.4.
    np.testing.assert_array_equal(frame.item_ctr, [np.nan, 0.1, 0.2, np.nan, 0.4, 0.3, np.nan])
    assert frame.genre.tolist() == [None, "Action", "Comedy", None, "Comedy", "Comedy", None]
    assert frame.genre.dtype == object  # plain strings, not categoricals
    assert not list(tmp_path.rglob("*.tmp"))


def test_requests_scored_before_and_after_an_item_table_refresh_share_a_row_group(
    tmp_path: Path,
) -> None:
    # A refresh builds new item columns; the requests of one flush index both tables.
    feedback = FeedbackLog(tmp_path, clock=lambda: DAY)
    log_request(feedback, 3, "before")
    refreshed_ctr = np.array([0.9, np.nan, 0.7])
    refreshed_genre = np.array([1, 0, -1])
    feedback.log(
        request_id="after",
        user_id=9,
        item_ids=[1, 2, 3, 4],
        scores=[0.1, 0.2, 0.3, 0.4],
        model_version="3",
        features={
            "user_ctr": float("nan"),  # the user has no features yet
            "item_ctr": Gathered(np.array([2, 1, 0, -1]), refreshed_ctr),
            "genre": Gathered(np.array([0, 2, 1, -1]), refreshed_genre, GENRES),
        },
    )
    (part,) = feedback.flush()
    assert pq.ParquetFile(part).metadata.num_row_groups == 1
    frame = pd.read_parquet(part)
    assert frame.user_ctr.isna().tolist() == [False] * 3 + [True] * 4
    assert str(frame.item_ctr.dtype) == "float64" and frame.genre.dtype == object
    np.testing.assert_array_equal(frame.item_ctr, [np.nan, 0.1, 0.2, 0.7, np.nan, 0.9, np.nan])
    assert pq.read_table(part).column("item_ctr").null_count == 3  # NaN stored as null
    assert frame.genre.tolist() == [None, "Action", "Comedy", "Comedy", None, "Action", None]


TABLE_IDS = np.array([100, 101, 102, 103])
"""Item ids of the rows of ITEM_CTR / ITEM_GENRE."""


def snapshot(ctr: np.ndarray = ITEM_CTR, genre: np.ndarray = ITEM_GENRE) -> ItemSnapshot:
    return ItemSnapshot(TABLE_IDS, {"item_ctr": ctr, "genre": Coded(genre, GENRES)})


def test_item_features_logged_by_reference_join_back_to_the_copied_values(
    tmp_path: Path,
) -> None:
    """The item table written once and named by every row, and the user's features written
    once per request, read back (joined) as the same rows as copying them into each row; a
    refreshed table is a second snapshot."""
    rng = np.random.default_rng(3)
    by_copy = FeedbackLog(tmp_path / "copy", clock=lambda: DAY)
    by_reference = FeedbackLog(tmp_path / "ref", clock=lambda: DAY)
    tables = [snapshot(), snapshot(np.array([0.5, np.nan, 0.6, 0.7]), np.array([1, 1, 0, -1]))]
    for n in range(40):
        table = tables[n // 30]  # the table is refreshed after 30 requests
        items = rng.choice([*TABLE_IDS, 999], size=6)  # 999: not in the table
        rows = np.array([list(TABLE_IDS).index(i) if i in TABLE_IDS else -1 for i in items])
        common = dict(request_id=f"r{n}", user_id=n, item_ids=items, scores=rng.random(6),
                      model_version="3")  # fmt: skip
        genre = table.columns["genre"]
        user = {"user_ctr": None if n == 3 else n / 40, "segment": f"s{n % 3}"}
        gathered = {
            "item_ctr": Gathered(rows, table.columns["item_ctr"]),
            "genre": Gathered(rows, genre.codes, genre.vocabulary),
        }
        by_copy.log(**common, features={**user, **gathered})
        by_reference.log(**common, request_features=user, items=table)
    by_copy.flush()
    by_reference.flush()
    raw = read(tmp_path / "ref")
    assert not {"item_ctr", "genre", "user_ctr", "segment", "item_snapshot"} & set(raw.columns)
    written = sorted((tmp_path / "ref" / "feedback_items").rglob("*.parquet"))
    assert written == sorted(item_snapshot_path(tmp_path / "ref", t.digest) for t in tables)
    asked = requests_of(tmp_path / "ref")
    assert len(asked) == 40 and asked.candidates.tolist() == [6] * 40
    assert asked.item_snapshot.tolist() == [tables[0].digest] * 30 + [tables[1].digest] * 10
    joined = with_item_features(with_request_features(raw, asked), tmp_path / "ref")
    want = read_joined(tmp_path / "copy").drop(columns="item_snapshot")
    pd.testing.assert_frame_equal(joined[want.columns], want)


def test_item_snapshots_are_checked_when_read(tmp_path: Path, caplog: Any) -> None:
    feedback = FeedbackLog(tmp_path, clock=lambda: DAY)
    table = snapshot()
    feedback.log(request_id="r", user_id=1, item_ids=[100, 103], scores=[0.1, 0.2],
                 model_version="3", items=table)  # fmt: skip
    feedback.flush()
    raw = read_joined(tmp_path)
    # A snapshot changed in the lake no longer hashes to its name: refused, not joined.
    path = item_snapshot_path(tmp_path, table.digest)
    kept = path.read_bytes()
    changed = pd.read_parquet(path)
    changed.loc[0, "item_ctr"] = 0.9
    changed.to_parquet(path, index=False)
    with pytest.raises(ValueError, match="does not hash to its name"):
        with_item_features(raw, tmp_path)
    path.write_bytes(kept)
    assert with_item_features(raw, tmp_path).item_ctr.tolist() == [0.1, 0.4]
    # A snapshot gone from the lake: the rows stay, without item features, and it is said.
    item_snapshot_path(tmp_path, table.digest).unlink()
    gone = with_item_features(raw, tmp_path)
    assert len(gone) == 2 and "item_ctr" not in gone
    assert "is missing" in caplog.text
    # A name that is not a digest is never turned into a path.
    tampered = raw.assign(item_snapshot="../../etc/passwd")
    with pytest.raises(ValueError, match="SHA-256 hex digest"):
        with_item_features(tampered, tmp_path)
    # A snapshot column may not shadow a feature or a feedback column.
    with pytest.raises(ValueError, match="also columns of the item snapshot"):
        feedback.log(request_id="r", user_id=1, item_ids=[100], scores=[0.1],
                     model_version="3", features={"item_ctr": 0.5}, items=table)  # fmt: skip
    with pytest.raises(ValueError, match="clashes"):
        ItemSnapshot(TABLE_IDS, {"score": ITEM_CTR})
    with pytest.raises(ValueError, match="unique"):
        ItemSnapshot(np.array([1, 1]), {"item_ctr": np.array([0.1, 0.2])})


def test_rows_are_not_written_before_their_snapshot(tmp_path: Path) -> None:
    """When the snapshot cannot be written the rows naming it wait for a retry; once it can,
    both are written."""
    feedback = FeedbackLog(tmp_path, clock=lambda: DAY)
    table = snapshot()
    blocker = tmp_path / "feedback_items"
    blocker.write_text("not a folder")  # the snapshot's folder cannot be made
    feedback.log(request_id="r", user_id=1, item_ids=[100, 101], scores=[0.1, 0.2],
                 model_version="3", items=table)  # fmt: skip
    assert feedback.flush() == []
    assert feedback.retry_rows == 2 and parts(tmp_path) == [] and feedback.write_errors == 1
    blocker.unlink()
    (part,) = feedback.flush()
    assert parts(tmp_path) == [part]
    joined = with_item_features(read_joined(tmp_path), tmp_path)
    np.testing.assert_array_equal(joined.item_ctr, [0.1, 0.2])


def test_a_request_row_is_written_before_its_candidates_and_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the candidates' write fails after the request rows were written, the retry writes
    the request rows again: the join keeps one per request. Request features are scalars whose
    names clash with nothing."""
    settings = Settings(home=tmp_path)
    feedback = FeedbackLog(settings.lake_root, clock=lambda: DAY)
    for n in range(3):
        feedback.log(request_id=f"r{n}", user_id=n, item_ids=[100, 101], scores=[0.1, 0.2],
                     model_version="3", request_features={"user_ctr": n / 10})  # fmt: skip
    write_row_group = feedback._write_row_group
    calls = []

    def failing_once(ds: str, table: Any) -> None:
        calls.append(ds)
        if len(calls) == 1:
            raise OSError("disk full")
        write_row_group(ds, table)

    monkeypatch.setattr(feedback, "_write_row_group", failing_once)
    assert feedback.flush() == [] and feedback.retry_rows == 6
    (part,) = feedback.flush()
    asked = pd.read_parquet(settings.lake_root / "feedback_requests")
    assert sorted(asked.request_id) == ["r0", "r0", "r1", "r1", "r2", "r2"]  # written twice
    joined = load_joined_feedback("2026-11-22", settings=settings)
    assert len(joined) == 6 and joined.user_ctr.tolist() == [0.0, 0.0, 0.1, 0.1, 0.2, 0.2]
    assert pq.ParquetFile(part).metadata.num_rows == 6
    for bad, match in (
        ({"score": 1.0}, "clashes"),
        ({"user_ctr": [0.1, 0.2]}, "one number or string"),
        ({"user_ctr": True}, "one number or string"),
    ):
        with pytest.raises(ValueError, match=match):
            feedback.log(request_id="x", user_id=1, item_ids=[1], scores=[0.1],
                         model_version="3", request_features=bad)  # fmt: skip
    with pytest.raises(ValueError, match="clashes"):
        feedback.log(request_id="x", user_id=1, item_ids=[1], scores=[0.1], model_version="3",
                     features={"user_ctr": 0.1}, request_features={"user_ctr": 0.2})  # fmt: skip


def test_ids_and_scores_must_be_one_per_candidate(tmp_path: Path) -> None:
    feedback = FeedbackLog(tmp_path, clock=lambda: DAY)
    for ids, scores, bad in (
        ([1, 2], [0.1], "'score' has shape (1,); expected (2,)"),
        ([[1, 2]], [0.1], "'item_id' has shape (1, 2); expected (1,)"),
        ([1], [[0.1]], "'score' has shape (1, 1); expected (1,)"),
    ):
        with pytest.raises(ValueError, match=re.escape(bad)):
            feedback.log(request_id="r", user_id=1, item_ids=ids, scores=scores,
                         model_version="3")  # fmt: skip
    assert feedback.buffered_rows == 0


def test_writer_thread_loses_nothing_when_closed(tmp_path: Path) -> None:
    config = FeedbackConfig(flush_rows=2_500, part_rows=10_000, flush_s=30)
    feedback = FeedbackLog(tmp_path, config, background=True)

    def client(k: int) -> None:
        for n in range(40):
            log_request(feedback, 1_000, f"c{k}-{n}")

    clients = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    feedback.close()
    frame = read(tmp_path)
    assert len(frame) == 120_000 and feedback.written_rows == 120_000
    assert frame.groupby("request_id").size().eq(1_000).all() and frame.request_id.nunique() == 120
    assert feedback.dropped_rows == 0 and not list(tmp_path.rglob("*.tmp"))
    files = parts(tmp_path)
    assert len(files) >= 10  # parts closed at part_rows ...
    assert max(pq.ParquetFile(p).metadata.num_row_groups for p in files) >= 2  # ... of row groups
    log_request(feedback, 10, "after-close")  # a closed log still takes rows, written inline
    feedback.flush()
    assert len(read(tmp_path)) == 120_010


def test_aged_rows_are_written_and_published_without_new_requests(tmp_path: Path) -> None:
    feedback = FeedbackLog(tmp_path, FeedbackConfig(flush_s=0.2), background=True)
    log_request(feedback, 3, "lonely")
    deadline = time.monotonic() + 10
    while not parts(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(read(tmp_path)) == 3
    feedback.close()


def test_a_new_schema_starts_a_new_part(tmp_path: Path) -> None:
    feedback = FeedbackLog(tmp_path, FeedbackConfig(flush_rows=2), clock=lambda: DAY)
    log_request(feedback, 2, "plain")
    feedback.log(
        request_id="shadowed",
        user_id=1,
        item_ids=[5, 6],
        scores=[0.1, 0.2],
        model_version="3",
        features={"user_ctr": 0.25},
        shadow_version="4",
        shadow_scores=[0.3, 0.4],
    )
    feedback.flush()
    assert len(parts(tmp_path)) == 2
    frame = read(tmp_path).sort_values("item_id")
    assert frame.request_id.tolist() == ["shadowed"] * 2 + ["plain"] * 2
    assert frame.item_ctr.isna().tolist() == [True, True, True, False]
    assert frame.shadow_score.notna().tolist() == [True, True, False, False]


def test_rows_go_to_the_day_they_were_scored(tmp_path: Path) -> None:
    now = [DAY]
    feedback = FeedbackLog(tmp_path, clock=lambda: now[0])
    log_request(feedback, 2, "today")
    now[0] += 86_400
    log_request(feedback, 3, "tomorrow")
    feedback.flush()
    days = {p.parent.name: len(pd.read_parquet(p)) for p in parts(tmp_path)}
    assert days == {"dt=2026-11-22": 2, "dt=2026-11-23": 3}


def test_a_stalled_writer_bounds_the_buffer_and_counts_what_it_drops(tmp_path: Path) -> None:
    config = FeedbackConfig(flush_rows=100, max_buffered_rows=250)
    feedback = FeedbackLog(tmp_path, config, background=True)
    with feedback._write_lock:  # the writer cannot write
        for n in range(4):
            log_request(feedback, 100, f"r{n}")
        assert feedback.buffered_rows == 200 and feedback.dropped_rows == 200
    feedback.close()
    assert len(read(tmp_path)) == 200


def test_bad_feedback_columns_are_refused(tmp_path: Path) -> None:
    feedback = FeedbackLog(tmp_path)
    with pytest.raises(ValueError, match="one value per candidate"):
        feedback.log(
            request_id="r",
            user_id=1,
            item_ids=[1, 2],
            scores=[0.1, 0.2],
            model_version="3",
            features={"item_ctr": [0.1]},
        )
    with pytest.raises(ValueError, match="clashes"):
        feedback.log(
            request_id="r",
            user_id=1,
            item_ids=[1],
            scores=[0.1],
            model_version="3",
            features={"score": [0.1]},
        )
    with pytest.raises(ValueError, match="max_buffered_rows"):
        FeedbackConfig(flush_rows=10, max_buffered_rows=5)


def metric(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


class FailingWrites:
    """Makes the part files' row-group writes fail while ``error`` is set (``when`` picks the
    tables: all by default), as a full disk or a value the file cannot take would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from serving import feedback as module

        self.error: Exception | None = None
        self.when = lambda table: True
        self.calls = 0
        original = module._OpenPart.write

        def write(part: module._OpenPart, table: object) -> None:
            self.calls += 1
            if self.error is not None and self.when(table):
                raise self.error
            original(part, table)

        monkeypatch.setattr(module._OpenPart, "write", write)


def test_a_failed_write_keeps_the_rows_already_written_and_retries_the_failed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = FailingWrites(monkeypatch)
    failing.when = lambda table: "item_id" in table.column_names  # the candidates' rows
    config = FeedbackConfig(flush_rows=1000, flush_s=3600, max_buffered_rows=10_000)
    feedback = FeedbackLog(tmp_path, config, clock=lambda: DAY)
    errors_before = metric("cascade_feedback_write_errors_total")
    log_request(feedback, 5, "a")
    feedback.write()  # one row group in each open (hidden) part: requests, candidates
    assert parts(tmp_path) == [] and len(list(tmp_path.rglob(".part-*.tmp"))) == 2

    failing.error = OSError(28, "No space left on device")
    log_request(feedback, 7, "b")
    feedback.write()
    # The part was closed with the row group written before the failure, and published, after
    # the requests part its rows name.
    assert list(read(tmp_path).request_id) == ["a"] * 5
    assert list(requests_of(tmp_path).request_id) == ["a", "b"]
    assert feedback.written_rows == 5 and feedback.retry_rows == 7
    assert feedback.write_errors == 1 and feedback.dropped_rows == 0
    assert metric("cascade_feedback_write_errors_total") == errors_before + 1
    assert metric("cascade_feedback_retry_rows") == 7
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.failed"))

    failing.error = None  # the disk has room again: the next write takes the kept rows
    log_request(feedback, 3, "c")
    feedback.flush()
    frame = read(tmp_path)
    assert frame.groupby("request_id").size().to_dict() == {"a": 5, "b": 7, "c": 3}
    assert feedback.written_rows == 15 and feedback.retry_rows == 0
    assert feedback.dropped_rows == 0 and metric("cascade_feedback_retry_rows") == 0


def test_the_retry_buffer_is_bounded_and_what_it_drops_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = FailingWrites(monkeypatch)
    failing.error = OSError(5, "Input/output error")
    config = FeedbackConfig(flush_rows=1000, flush_s=3600, max_retry_rows=10)
    feedback = FeedbackLog(tmp_path, config, clock=lambda: DAY)
    full_before = metric("cascade_feedback_dropped_rows_total", reason="retry_full")
    shutdown_before = metric("cascade_feedback_dropped_rows_total", reason="shutdown")
    for name in ("a", "b", "c"):
        log_request(feedback, 4, name)
        feedback.write()
    # 12 rows failed; 10 fit the retry buffer: the oldest request (4 rows) was dropped.
    assert feedback.retry_rows == 8 and feedback.dropped_rows == 4
    assert metric("cascade_feedback_dropped_rows_total", reason="retry_full") == full_before + 4
    assert feedback.write_errors == 3
    feedback.close()  # still failing at shutdown: nothing is left to retry them
    assert feedback.dropped_rows == 12 and feedback.retry_rows == 0 and parts(tmp_path) == []
    assert metric("cascade_feedback_dropped_rows_total", reason="shutdown") == shutdown_before + 8


def test_a_request_the_file_cannot_take_is_dropped_alone_after_its_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = FailingWrites(monkeypatch)
    failing.error = ValueError("a value the file cannot take")
    failing.when = lambda table: "bad" in table.column("request_id").to_pylist()
    config = FeedbackConfig(flush_rows=1000, flush_s=3600, max_write_attempts=2)
    feedback = FeedbackLog(tmp_path, config, clock=lambda: DAY)
    before = metric("cascade_feedback_dropped_rows_total", reason="write_failed")
    for name in ("a", "bad", "c"):
        log_request(feedback, 3, name)
    feedback.write()  # one batch of the three requests fails
    assert feedback.retry_rows == 9 and feedback.write_errors == 1
    feedback.write()  # each request alone: a and c are written, bad fails its second attempt
    assert feedback.retry_rows == 0 and feedback.dropped_rows == 3
    assert metric("cascade_feedback_dropped_rows_total", reason="write_failed") == before + 3
    feedback.close()
    assert read(tmp_path).groupby("request_id").size().to_dict() == {"a": 3, "c": 3}


def test_a_part_broken_by_an_io_error_is_kept_aside_and_its_rows_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real I/O failure under the Parquet writer (the disk fills up while a part is open):
    the writer's file cannot be finished, so it is kept as ``.failed``, never deleted."""

    class FillingDisk(io.FileIO):
        full = False

        def write(self, data: Any) -> int:
            if FillingDisk.full:
                raise OSError(28, "No space left on device")
            return super().write(data)

    real = pq.ParquetWriter
    monkeypatch.setattr(
        pq, "ParquetWriter", lambda where, schema, **kw: real(FillingDisk(where, "w"), schema, **kw)
    )
    feedback = FeedbackLog(tmp_path, FeedbackConfig(flush_s=3600), clock=lambda: DAY)
    log_request(feedback, 5, "a")
    feedback.write()
    FillingDisk.full = True
    log_request(feedback, 2, "b")
    feedback.flush()
    # Both open parts, the candidates' and their requests', are kept aside.
    failed = sorted(p.parent.parent.parent.name for p in tmp_path.rglob(".part-*.parquet.failed"))
    assert failed == ["feedback", "feedback_requests"]
    assert feedback.stranded_rows == 5 and feedback.retry_rows == 2 and parts(tmp_path) == []
    assert feedback.write_errors >= 1
    FillingDisk.full = False  # room again: the kept rows are written
    feedback.close()
    assert list(read(tmp_path).request_id) == ["b", "b"] and feedback.dropped_rows == 0
