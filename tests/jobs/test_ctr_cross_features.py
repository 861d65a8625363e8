"""Transforms of the CTR feature job on hand-built rows, and the job end to end on tiny files."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from cascade.config import Settings
from cascade.lake import Lake
from jobs import ctr_cross_features as job

pytestmark = pytest.mark.spark

DS = "2026-11-22"
CUTOFF = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
WEEK = dt.timedelta(days=7)
US = dt.timedelta(microseconds=1)
# Spark hands back naive datetimes in the session time zone (UTC in these tests).
T0 = CUTOFF.replace(tzinfo=None)


def impressions(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    """(user_id, item_id, genre, event_timestamp, click) rows as the job's labelled schema."""
    return spark.createDataFrame(
        rows, "user_id long, item_id long, genre string, event_timestamp timestamp, click int"
    )


def snapshots(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return job.assign_snapshot(impressions(spark, rows), cutoff=CUTOFF, snapshot_days=7)


def closed_form(clicks: int, shown: int, p: float, m: float) -> float:
    return (clicks + m * p) / (shown + m * p + m * (1 - p))


def test_ds_midnight_is_utc_and_rejects_bad_dates() -> None:
    assert job.ds_midnight(DS) == CUTOFF
    with pytest.raises(ValueError, match="not YYYY-MM-DD"):
        job.ds_midnight("22/11/2026")


def test_config_rejects_a_non_positive_prior() -> None:
    with pytest.raises(ValueError, match="prior_strength must be > 0"):
        job.CtrJobConfig(prior_strength=0)


def test_before_cutoff_drops_the_cutoff_instant_and_later(spark: SparkSession) -> None:
    frame = impressions(
        spark,
        [
            (1, 1, "Drama", T0 - US, 1),
            (1, 2, "Drama", T0, 1),
            (1, 3, "Drama", T0 + WEEK, 0),
        ],
    )

    assertDataFrameEqual(
        job.before_cutoff(frame, cutoff=CUTOFF).select("item_id"), [Row(item_id=1)]
    )


def test_snapshot_is_the_first_grid_time_strictly_after_the_event(spark: SparkSession) -> None:
    got = snapshots(
        spark,
        [
            (1, 1, "Drama", T0 - US, 1),  # just before ds -> ds
            (1, 2, "Drama", T0 - WEEK, 1),  # exactly on ds-7d -> the NEXT one, ds
            (1, 3, "Drama", T0 - WEEK - US, 1),  # just before ds-7d -> ds-7d
            (1, 4, "Drama", T0 - 3 * WEEK + dt.timedelta(days=2), 0),  # mid-week -> ds-14d
        ],
    ).select("item_id", "snapshot_ts")

    assertDataFrameEqual(
        got,
        [
            Row(item_id=1, snapshot_ts=T0),
            Row(item_id=2, snapshot_ts=T0),
            Row(item_id=3, snapshot_ts=T0 - WEEK),
            Row(item_id=4, snapshot_ts=T0 - 2 * WEEK),
        ],
    )


def test_cumulative_counts_only_at_snapshots_with_new_impressions(spark: SparkSession) -> None:
    rows = [
        (1, 1, "Drama", T0 - 3 * WEEK - US, 1),  # snapshot ds-3w
        (1, 2, "Drama", T0 - 3 * WEEK - 2 * US, 0),  # snapshot ds-3w
        (1, 3, "Drama", T0 - US, 1),  # snapshot ds (nothing in ds-2w, ds-1w)
        (2, 1, "Comedy", T0 - WEEK - US, 0),  # snapshot ds-1w
    ]

    got = job.cumulative_counts(snapshots(spark, rows), ["user_id"])

    assertDataFrameEqual(
        got,
        [
            Row(user_id=1, event_timestamp=T0 - 3 * WEEK, impressions=2, clicks=1),
            Row(user_id=1, event_timestamp=T0, impressions=3, clicks=2),
            Row(user_id=2, event_timestamp=T0 - WEEK, impressions=1, clicks=0),
        ],
    )
    assert dict(got.dtypes)["impressions"] == "bigint"
    assert dict(got.dtypes)["clicks"] == "bigint"


def test_user_view_smoothing_equals_the_closed_form(spark: SparkSession) -> None:
    rows = [
        (1, 1, "Drama", T0 - WEEK - US, 1),
        (1, 2, "Drama", T0 - US, 1),
        (1, 3, "Comedy", T0 - US, 0),
        (2, 1, "Drama", T0 - US, 0),
    ]
    users = spark.createDataFrame([(1, 30), (2, 41)], "user_id long, age long")
    p, m = 0.25, 20.0

    got = job.user_features(snapshots(spark, rows), users, prior_rate=p, prior_strength=m)

    assert got.columns == [
        "user_id",
        "event_timestamp",
        "user_impressions",
        "user_clicks",
        "user_ctr",
        "user_age",
    ]
    assertDataFrameEqual(
        got,
        [
            Row(
                user_id=1,
                event_timestamp=T0 - WEEK,
                user_impressions=1,
                user_clicks=1,
                user_ctr=closed_form(1, 1, p, m),
                user_age=30,
            ),
            Row(
                user_id=1,
                event_timestamp=T0,
                user_impressions=3,
                user_clicks=2,
                user_ctr=closed_form(2, 3, p, m),
                user_age=30,
            ),
            Row(
                user_id=2,
                event_timestamp=T0,
                user_impressions=1,
                user_clicks=0,
                user_ctr=closed_form(0, 1, p, m),
                user_age=41,
            ),
        ],
        rtol=1e-12,
    )
    # A sparse key with no clicks is pulled to the prior, not to 0: (0 + 5) / (1 + 20).
    assert got.filter("user_id = 2").first().user_ctr == pytest.approx(5 / 21)


def test_item_view_carries_year_and_genre(spark: SparkSession) -> None:
    rows = [(1, 7, "Drama", T0 - US, 1), (2, 8, "unknown", T0 - US, 0)]
    items = spark.createDataFrame(
        [(7, 1995, "Drama"), (8, None, "unknown")], "item_id long, release_year int, genre string"
    )

    got = job.item_features(snapshots(spark, rows), items, prior_rate=0.5, prior_strength=2.0)

    assertDataFrameEqual(
        got,
        [
            Row(
                item_id=7,
                event_timestamp=T0,
                item_impressions=1,
                item_clicks=1,
                item_ctr=2 / 3,
                item_release_year=1995,
                item_genre="Drama",
            ),
            Row(
                item_id=8,
                event_timestamp=T0,
                item_impressions=1,
                item_clicks=0,
                item_ctr=1 / 3,
                item_release_year=None,
                item_genre="unknown",
            ),
        ],
        rtol=1e-12,
    )
    assert dict(got.dtypes)["item_release_year"] == "bigint"


def test_user_genre_view_is_keyed_on_user_and_genre(spark: SparkSession) -> None:
    rows = [
        (1, 1, "Drama", T0 - WEEK - US, 1),
        (1, 2, "Drama", T0 - US, 0),
        (1, 3, "Comedy", T0 - US, 1),
    ]

    got = job.user_genre_features(snapshots(spark, rows), prior_rate=0.5, prior_strength=2.0)

    assertDataFrameEqual(
        got,
        [
            Row(
                user_id=1,
                genre="Drama",
                event_timestamp=T0 - WEEK,
                ug_impressions=1,
                ug_clicks=1,
                ug_ctr=2 / 3,
            ),
            Row(
                user_id=1,
                genre="Drama",
                event_timestamp=T0,
                ug_impressions=2,
                ug_clicks=1,
                ug_ctr=0.5,
            ),
            Row(
                user_id=1,
                genre="Comedy",
                event_timestamp=T0,
                ug_impressions=1,
                ug_clicks=1,
                ug_ctr=2 / 3,
            ),
        ],
        rtol=1e-12,
    )


def test_label_impressions_keeps_items_without_metadata(spark: SparkSession) -> None:
    raw = spark.createDataFrame(
        [(1, 7, T0 - US, 1), (1, 99, T0 - US, 0)],
        "user_id long, item_id long, event_timestamp timestamp, click int",
    )
    items = spark.createDataFrame(
        [(7, 1995, "Drama")], "item_id long, release_year int, genre string"
    )

    assertDataFrameEqual(
        job.label_impressions(raw, items),
        [
            Row(user_id=1, item_id=7, genre="Drama", event_timestamp=T0 - US, click=1),
            Row(user_id=1, item_id=99, genre="unknown", event_timestamp=T0 - US, click=0),
        ],
    )


def _seconds(moment: dt.datetime) -> str:
    return str(int(moment.replace(tzinfo=dt.UTC).timestamp()))


def test_run_uses_no_impression_at_or_after_ds_and_counts_quarantine(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    source = tmp_path / "ml"
    source.mkdir()
    inter = [
        "user_id:token\titem_id:token\trating:float\ttimestamp:float",
        f"1\t10\t5\t{_seconds(T0 - WEEK)}",  # on the grid: counted at ds
        f"1\t11\t2\t{_seconds(T0 - 2 * WEEK)}",
        f"2\t10\t4\t{_seconds(T0 - dt.timedelta(seconds=1))}",
        f"1\t10\t5\t{_seconds(T0)}",  # at ds: excluded
        f"2\t11\t5\t{_seconds(T0 + WEEK)}",  # after ds: excluded
        "3\t10\t9\t0",  # bad rating: quarantined
    ]
    (source / "ml-100k.inter").write_text("\n".join(inter) + "\n")
    (source / "ml-100k.user").write_text(
        "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
        "1\t20\tM\tx\t1\n2\t30\tF\ty\t2\n"
    )
    (source / "ml-100k.item").write_text(
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "10\tA\t1990\tDrama Comedy\n11\tB\t1991\tComedy\n"
    )
    settings = Settings(home=tmp_path / "home")

    result = job.run(DS, settings=settings, spark=spark, config=job.CtrJobConfig(source_dir=source))

    assert result["impressions"] == 3
    assert result["quarantined"] == 1
    # item 10: both pre-ds impressions land in snapshot ds; item 11 in ds-7d.
    assert result["rows"] == {"user": 3, "item": 2, "user_genre": 3}
    lake = Lake(settings.lake_root)
    assert result["paths"] == {v: str(lake.ctr_features(v, DS)) for v in result["rows"]}
    bad = pd.read_parquet(lake.quarantine("ml100k", DS))
    assert bad.reason.tolist() == ["rating outside 1..5"]

    labelled = pd.read_parquet(lake.impressions(DS))
    assert labelled.event_timestamp.max() < pd.Timestamp(CUTOFF)
    users = pd.read_parquet(result["paths"]["user"])
    assert str(users.event_timestamp.dtype) == "datetime64[us, UTC]"
    assert users.event_timestamp.max() <= pd.Timestamp(CUTOFF)
    # Only the 3 pre-ds impressions are in the totals (the two at/after ds are not).
    latest = users.sort_values("event_timestamp").groupby("user_id").last()
    assert latest.user_impressions.to_dict() == {1: 2, 2: 1}
    assert latest.user_clicks.to_dict() == {1: 1, 2: 1}
    assert result["prior_rate"] == pytest.approx(2 / 3)

    again = job.run(DS, settings=settings, spark=spark, config=job.CtrJobConfig(source_dir=source))
    assert again["rows"] == result["rows"], "a re-run must overwrite, not append"
