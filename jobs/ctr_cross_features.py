"""CTR cross features: weekly point-in-time user, item and user x genre counts and smoothed CTRs.

Run it (writes one ``dt=<ds>`` partition per view, overwriting it, so re-runs are idempotent)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_features --ds 2026-11-22

Only impressions strictly before ``ds`` (midnight UTC) are used. Snapshot times lie on a weekly
grid ending at ``ds`` (ds, ds-7d, ds-14d, ...); an impression belongs to the first snapshot time
strictly after its timestamp. A feature row holds the key's cumulative counts up to its snapshot
and is emitted only for snapshots where the key had new impressions, so a point-in-time join
(latest row with ``event_timestamp <= t``) returns exactly the counts of impressions before the
grid time at or before ``t``. Column names come from :mod:`cascade.ctr_schema`.

CTRs are Bayesian-smoothed toward the global click rate ``p`` of the input::

    ctr = (clicks + m * p) / (impressions + m)

Outputs (under ``Lake(settings.lake_root)``): ``ctr_features(view, ds)`` for the views in
``cascade.lake.CTR_VIEWS``, the labelled impressions at ``impressions(ds)`` and the rejected raw
rows at ``quarantine("ml100k", ds)``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from cascade.config import Settings, load_settings
from cascade.ctr_schema import (
    ITEM_FEATURES,
    ITEM_GENRE,
    LABEL,
    TIMESTAMP,
    USER_FEATURES,
    USER_GENRE_FEATURES,
)
from cascade.lake import CTR_VIEWS, Lake, check_ds
from jobs import movielens, spark_sessions

MICROS_PER_DAY = 86_400_000_000


@dataclass(kw_only=True)
class CtrJobConfig:
    """Knobs of the CTR feature job (the defaults are what the DAG runs)."""

    prior_strength: float = 20.0
    """m: pseudo-impressions of the smoothing prior; a key with m impressions weighs its own
    CTR and the global rate equally. Larger values pull sparse keys harder toward the mean."""
    snapshot_days: int = 7
    """Spacing of the snapshot grid that ends at ``ds``, in days."""
    output_files: int = 1
    """Parquet files per written partition (ML-100k is a few MB; more only adds small files)."""
    source_dir: Path | None = None
    """Folder of the ML-100k atomic files; None means the copy inside the recbole package."""

    def __post_init__(self) -> None:
        if not self.prior_strength > 0:
            raise ValueError(
                f"prior_strength must be > 0, got {self.prior_strength}; 20 is the default"
            )
        if self.snapshot_days < 1:
            raise ValueError(f"snapshot_days must be >= 1, got {self.snapshot_days}")
        if self.output_files < 1:
            raise ValueError(f"output_files must be >= 1, got {self.output_files}")


def ds_midnight(ds: str) -> dt.datetime:
    """Midnight UTC that opens partition date ``ds`` (the cut-off: no impression at/after it)."""
    return dt.datetime.combine(dt.date.fromisoformat(check_ds(ds)), dt.time(), dt.UTC)


# --- transforms: DataFrame -> DataFrame, no I/O -------------------------------------------


def before_cutoff(impressions: DataFrame, *, cutoff: dt.datetime) -> DataFrame:
    """Impressions with ``event_timestamp`` strictly before ``cutoff`` (no future leaks in)."""
    return impressions.filter(F.col(TIMESTAMP) < F.lit(cutoff))


def label_impressions(impressions: DataFrame, items: DataFrame) -> DataFrame:
    """Labelled impressions: user_id, item_id, genre, event_timestamp, click.

    ``genre`` is the item's primary genre; an item missing from ``items`` gets ``'unknown'`` so
    that no impression is lost from the counts.
    """
    genres = items.select("item_id", "genre")
    return impressions.join(genres, "item_id", "left").select(
        "user_id",
        "item_id",
        F.coalesce(F.col("genre"), F.lit("unknown")).alias("genre"),
        TIMESTAMP,
        F.col(LABEL).cast("int").alias(LABEL),
    )


def assign_snapshot(
    impressions: DataFrame, *, cutoff: dt.datetime, snapshot_days: int
) -> DataFrame:
    """Add ``snapshot_ts``: the first grid time (cutoff - k * period) strictly after the event.

    With ``d = cutoff - ts > 0`` (microseconds) the snapshot index is ``k = (d - 1) // period``,
    so a timestamp exactly on a grid time moves to the next one.
    Rows at or after ``cutoff`` get a null snapshot; call :func:`before_cutoff` first.
    """
    period = snapshot_days * MICROS_PER_DAY
    event_us = F.unix_micros(F.col(TIMESTAMP))
    delta = F.unix_micros(F.lit(cutoff)) - event_us
    # cutoff - k * period == event + 1 + pmod(d - 1, period): long arithmetic, no division.
    snapshot_us = event_us + 1 + F.pmod(delta - 1, F.lit(period))
    snapshot = F.when(delta > 0, F.timestamp_micros(snapshot_us))
    return impressions.withColumn("snapshot_ts", snapshot)


def cumulative_counts(snapshotted: DataFrame, keys: list[str]) -> DataFrame:
    """Per key and snapshot with new impressions: cumulative impressions and clicks (long).

    Output columns: ``keys``, ``event_timestamp`` (= snapshot time), ``impressions``, ``clicks``.
    """
    per_snapshot = snapshotted.groupBy(*keys, "snapshot_ts").agg(
        F.count(F.lit(1)).cast("long").alias("new_impressions"),
        F.sum(F.col(LABEL)).cast("long").alias("new_clicks"),
    )
    history = (
        Window.partitionBy(*keys)
        .orderBy("snapshot_ts")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return per_snapshot.select(
        *keys,
        F.col("snapshot_ts").alias(TIMESTAMP),
        F.sum("new_impressions").over(history).cast("long").alias("impressions"),
        F.sum("new_clicks").over(history).cast("long").alias("clicks"),
    )


def smoothed_ctr(
    clicks: Column, impressions: Column, *, prior_rate: float, prior_strength: float
) -> Column:
    """(clicks + a) / (impressions + a + b), a = m * p, b = m * (1 - p): a double in (0, 1)."""
    a = prior_strength * prior_rate
    b = prior_strength * (1.0 - prior_rate)
    return ((clicks + F.lit(a)) / (impressions + F.lit(a + b))).cast("double")


def user_features(
    snapshotted: DataFrame, users: DataFrame, *, prior_rate: float, prior_strength: float
) -> DataFrame:
    """User view: user_id, event_timestamp, user_impressions, user_clicks, user_ctr, user_age."""
    impressions_col, clicks_col, ctr_col, age_col = USER_FEATURES
    counts = cumulative_counts(snapshotted, ["user_id"])
    ages = users.select("user_id", F.col("age").cast("long").alias(age_col))
    return counts.join(ages, "user_id", "left").select(
        "user_id",
        TIMESTAMP,
        F.col("impressions").alias(impressions_col),
        F.col("clicks").alias(clicks_col),
        smoothed_ctr(
            F.col("clicks"),
            F.col("impressions"),
            prior_rate=prior_rate,
            prior_strength=prior_strength,
        ).alias(ctr_col),
        age_col,
    )


def item_features(
    snapshotted: DataFrame, items: DataFrame, *, prior_rate: float, prior_strength: float
) -> DataFrame:
    """Item view: item_id, event_timestamp, item_impressions, item_clicks, item_ctr,
    item_release_year, item_genre."""
    impressions_col, clicks_col, ctr_col, year_col = ITEM_FEATURES
    counts = cumulative_counts(snapshotted, ["item_id"])
    attributes = items.select(
        "item_id",
        F.col("release_year").cast("long").alias(year_col),
        F.col("genre").alias(ITEM_GENRE),
    )
    return counts.join(attributes, "item_id", "left").select(
        "item_id",
        TIMESTAMP,
        F.col("impressions").alias(impressions_col),
        F.col("clicks").alias(clicks_col),
        smoothed_ctr(
            F.col("clicks"),
            F.col("impressions"),
            prior_rate=prior_rate,
            prior_strength=prior_strength,
        ).alias(ctr_col),
        year_col,
        F.coalesce(F.col(ITEM_GENRE), F.lit("unknown")).alias(ITEM_GENRE),
    )


def user_genre_features(
    snapshotted: DataFrame, *, prior_rate: float, prior_strength: float
) -> DataFrame:
    """User x genre view: user_id, genre, event_timestamp, ug_impressions, ug_clicks, ug_ctr."""
    impressions_col, clicks_col, ctr_col = USER_GENRE_FEATURES
    counts = cumulative_counts(snapshotted, ["user_id", "genre"])
    return counts.select(
        "user_id",
        "genre",
        TIMESTAMP,
        F.col("impressions").alias(impressions_col),
        F.col("clicks").alias(clicks_col),
        smoothed_ctr(
            F.col("clicks"),
            F.col("impressions"),
            prior_rate=prior_rate,
            prior_strength=prior_strength,
        ).alias(ctr_col),
    )


# --- session, extract, load -----------------------------------------------------------------


def _timestamp_conf(spark: SparkSession) -> None:
    for key, value in spark_sessions.UTC_MICROS.items():
        spark.conf.set(key, value)


def build_session(settings: Settings) -> SparkSession:
    """A SparkSession on ``settings.spark_master`` configured for this job's outputs."""
    local = spark_sessions.on_this_machine(settings)
    return spark_sessions.build_session(
        "cascade.ctr_cross_features",
        master=settings.spark_master,
        conf={
            **spark_sessions.UTC_MICROS,
            # ML-100k is tiny: the default 200 shuffle partitions only add task overhead.
            "spark.sql.shuffle.partitions": "4" if local else "200",
            "spark.ui.showConsoleProgress": "false",
            **spark_sessions.stack_conf(settings),
        },
        local_ip=settings.host if local else None,
        log_level="WARN",
    )


def _write(frame: DataFrame, path: Path, files: int, **metrics: Column) -> dict[str, Any]:
    """Overwrite ``path`` with ``frame``; return ``rows`` and ``metrics`` seen by the write.

    An Observation collects them in the write's own pass, so no second Spark job recounts.
    """
    observation = Observation(f"write {path.parent.name}/{path.name}")
    observed = frame.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        *[column.alias(name) for name, column in metrics.items()],
    )
    observed.coalesce(files).write.mode("overwrite").parquet(str(path))
    return observation.get


def run(
    ds: str,
    *,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    config: CtrJobConfig | None = None,
) -> dict:
    """Build the ``ds`` partition of every CTR view; returns counts and written paths.

    Returns ``{"ds", "rows": {view: n}, "impressions": n, "quarantined": n,
    "paths": {view: str}, "impressions_path", "quarantine_path", "prior_rate": p}``.
    A session passed in is left running; one built here is stopped before returning.
    """
    check_ds(ds)
    settings = settings or load_settings()
    config = config or CtrJobConfig()
    if spark is not None:
        return _run(ds, lake=Lake(settings.lake_root), spark=spark, config=config)
    spark = build_session(settings)
    try:
        return _run(ds, lake=Lake(settings.lake_root), spark=spark, config=config)
    finally:
        spark.stop()


def _run(ds: str, *, lake: Lake, spark: SparkSession, config: CtrJobConfig) -> dict:
    _timestamp_conf(spark)
    cutoff = ds_midnight(ds)
    started = time.monotonic()

    # extract
    source = movielens.read_ml100k(spark, config.source_dir)
    # Both dimension tables are read by several writes below; parse them once.
    users, items = source.users.cache(), source.items.cache()
    print(f"[ctr] read {movielens.DATASET} from {config.source_dir or 'recbole package'}")

    quarantine_path = lake.quarantine(movielens.DATASET, ds)
    quarantined = _write(source.quarantine, quarantine_path, config.output_files)["rows"]
    print(f"[ctr] quarantined {quarantined} raw rows -> {quarantine_path}")

    # transform
    labelled = label_impressions(before_cutoff(source.impressions, cutoff=cutoff), items)
    impressions_path = lake.impressions(ds)
    written = _write(labelled, impressions_path, config.output_files, click_rate=F.avg(LABEL))
    n_impressions = written["rows"]
    print(f"[ctr] {n_impressions} labelled impressions before {cutoff:%Y-%m-%dT%H:%MZ}")
    print(f"[ctr]   -> {impressions_path}")
    if n_impressions == 0:
        raise ValueError(
            f"no impressions before ds={ds}: nothing to build features from; "
            f"pick a later --ds or check the source in {config.source_dir or 'recbole'}"
        )

    # Read back the written partition so every view is computed from exactly what was stored.
    stored = spark.read.parquet(str(impressions_path))
    prior_rate = float(written["click_rate"])
    print(f"[ctr] global click rate p={prior_rate:.4f}, prior strength m={config.prior_strength}")
    snapshotted = assign_snapshot(stored, cutoff=cutoff, snapshot_days=config.snapshot_days).cache()
    smoothing = {"prior_rate": prior_rate, "prior_strength": config.prior_strength}
    views = {
        "user": user_features(snapshotted, users, **smoothing),
        "item": item_features(snapshotted, items, **smoothing),
        "user_genre": user_genre_features(snapshotted, **smoothing),
    }

    # load
    rows: dict[str, int] = {}
    paths: dict[str, str] = {}
    for view in CTR_VIEWS:
        frame = views[view]
        path = lake.ctr_features(view, ds)
        rows[view] = _write(frame, path, config.output_files)["rows"]
        paths[view] = str(path)
        print(f"[ctr] view {view}: {rows[view]} rows -> {path}")
    for cached in (snapshotted, users, items):
        cached.unpersist()
    print(f"[ctr] done in {time.monotonic() - started:.1f} s")
    return {
        "ds": ds,
        "rows": rows,
        "impressions": n_impressions,
        "quarantined": quarantined,
        "paths": paths,
        "impressions_path": str(impressions_path),
        "quarantine_path": str(quarantine_path),
        "prior_rate": prior_rate,
    }


def main(argv: list[str] | None = None) -> dict:
    """CLI: ``python -m jobs.ctr_cross_features --ds YYYY-MM-DD [--prior-strength M]``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_cross_features", description=__doc__)
    parser.add_argument("--ds", required=True, help="partition date YYYY-MM-DD (UTC cut-off)")
    parser.add_argument(
        "--prior-strength", type=float, default=CtrJobConfig.prior_strength, help="m (default 20)"
    )
    args = parser.parse_args(argv)
    return run(args.ds, config=CtrJobConfig(prior_strength=args.prior_strength))


if __name__ == "__main__":
    main()
