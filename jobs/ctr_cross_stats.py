"""Explicit cross statistics: pairs x windows of impressions, clicks and smoothed CTRs, at scale.

Run it on a generated log (write one with ``python -m jobs.impression_log``) or on ML-100k::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_stats --ds 2026-11-22 \\
        --source generated --log /tmp/log_1m
    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_stats --ds 1998-04-01 \\
        --source ml100k

For every configured pair of key columns (:class:`CrossPair`, e.g. user_segment x item_category)
and every window of ``w`` days ending at ``ds`` (events with ``ds - w days <= t < ds`` midnight
UTC; nothing at or after ``ds`` is read, so a training row at ``t >= ds`` never sees its own
future), one feature row per key seen in the longest window holds, per window: ``imp``, ``clk``,
the smoothed CTR ``ctr = (clk + a) / (imp + a + b)`` and the position-debiased CTR
``dctr = min(1, (clk + a') / (exam + a' + b'))`` with ``exam`` the expected examinations of
the impressions (sum of the position's examination probability; a key clicked more often than
its impressions were expected to be examined, as happens with few impressions at poorly
examined positions, would estimate a click probability above 1); plus recency (days since the key's
last impression and last click) and a time-decayed smoothed CTR (half-life weights). Rows carry
``event_timestamp = ds`` midnight: valid from then on for point-in-time joins.

The Beta(a, b) priors are fitted to the data by the method of moments, one per pair, window and
statistic (see :func:`beta_from_moments`), never a constant.

Passes over the input: (1) a pass for the examination probability of each position,
``min(1, ctr(position) / ctr(top position))`` (unbiased when positions are assigned
independently of relevance, as in the generator; on logs ranked by relevance it overstates the
bias and should come from a randomized slice instead); the same small aggregation counts input
rows, quarantined rows per reason, and clean rows inside and before the longest window. A batch
with no clean row in the window stops there with :class:`EmptyBatch` (its bad rows are still
quarantined; nothing is published). (2) one scan, one shuffle and one aggregation for all pairs
and windows (:func:`cross_aggregate`), cached because it is small next to the input; the
priors and per-pair writes then read the cache. Rows breaking a row rule are written to the
quarantine partition with a ``reason`` and the raw row as it came (``line``).

How the passes run and why (the measurements behind pass 2's plan) is
:mod:`jobs.ctr_cross_passes`; the pairs and knobs are :mod:`jobs.ctr_cross_config`, the
transforms :mod:`jobs.ctr_cross_transforms`, the lake layout :mod:`jobs.ctr_cross_lake`.

Outputs under the lake: ``features/ctr_cross/<source>/<pair>/dt=<ds>/`` per pair,
``quarantine/<source>_log/dt=<ds>/`` and ``reports/ctr_cross_stats_<source>/dt=<ds>/summary.json``
(counts, priors, position examination), which the gate reads. A run first deletes the gate's
earlier report on ``ds`` (``CrossLake.gate_report``): rebuilt statistics need a new verdict.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from jobs import ctr_log_sources as sources
from jobs import spark_sessions
from jobs.ctr_cross_config import (
    CROSSES,
    GENERATED_PAIRS,
    ITEM,
    ITEM_POS,
    MICROS_PER_DAY,
    ML100K_PAIRS,
    PAIRS_BY_NAME,
    SEG_CAT,
    SEG_ITEM,
    TIMESTAMP,
    USER,
    USER_CAT,
    CrossPair,
    CrossStatsConfig,
    EmptyBatch,
    ds_midnight,
    feature_columns,
    pairs_for,
    window_text,
)
from jobs.ctr_cross_lake import CrossLake
from jobs.ctr_cross_passes import (
    CrossAggregate,
    aggregate_conf,
    batch_counts,
    compute,
    constant_features,
    empty_window_prior,
    sql_conf,
    statistic_column,
    summarize_counts,
)
from jobs.ctr_cross_transforms import (
    STATISTICS,
    before_cutoff,
    beta_from_moments,
    clean_in_window,
    cross_aggregate,
    debiased,
    examination_by_position,
    in_lookback,
    item_catalogue,
    pair_features,
    rollup_parents,
    smoothed,
    trials_and_clicks,
    with_reason,
)

__all__ = [
    # The job (this module).
    "DS_HELP",
    "build_session",
    "default_config",
    "main",
    "read_log",
    "run",
    "sources",
    # Its parts, importable from here as before the split.
    "CROSSES",
    "GENERATED_PAIRS",
    "ITEM",
    "ITEM_POS",
    "MICROS_PER_DAY",
    "ML100K_PAIRS",
    "PAIRS_BY_NAME",
    "SEG_CAT",
    "SEG_ITEM",
    "STATISTICS",
    "TIMESTAMP",
    "USER",
    "USER_CAT",
    "CrossAggregate",
    "CrossLake",
    "CrossPair",
    "CrossStatsConfig",
    "EmptyBatch",
    "aggregate_conf",
    "batch_counts",
    "before_cutoff",
    "beta_from_moments",
    "clean_in_window",
    "compute",
    "constant_features",
    "cross_aggregate",
    "debiased",
    "ds_midnight",
    "empty_window_prior",
    "examination_by_position",
    "feature_columns",
    "in_lookback",
    "item_catalogue",
    "pair_features",
    "pairs_for",
    "rollup_parents",
    "smoothed",
    "sql_conf",
    "statistic_column",
    "summarize_counts",
    "trials_and_clicks",
    "window_text",
    "with_reason",
]


def build_session(settings: Settings, *, app: str = "cascade.ctr_cross_stats") -> SparkSession:
    """A session on ``settings.spark_master`` in UTC writing microsecond timestamps."""
    local = spark_sessions.on_this_machine(settings)
    return spark_sessions.build_session(
        app,
        master=settings.spark_master,
        conf={
            **spark_sessions.UTC_MICROS,
            # Few cores locally: more shuffle partitions than ~4x cores only add task overhead.
            "spark.sql.shuffle.partitions": "8" if local else "200",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "4g",
            **spark_sessions.stack_conf(settings),
        },
        local_ip=settings.host if local else None,
        log_level="WARN",
    )


def read_log(
    spark: SparkSession, source: str, log_path: Path | None, *, sources_file: Path | None = None
) -> tuple[DataFrame, DataFrame | None]:
    """(log in the input schema, adapter-level quarantine or None) for a registered source."""
    return sources.resolve(source, sources_file).read(spark, log_path)


def default_config(
    spark: SparkSession, source: str, log_path: Path | None, *, sources_file: Path | None = None
) -> CrossStatsConfig:
    """The engine's defaults with the pairs the source can key (:func:`pairs_for`)."""
    registered = sources.resolve(source, sources_file)
    return CrossStatsConfig(pairs=pairs_for(registered, registered.provided(spark, log_path)))


def run(
    ds: str,
    *,
    source: str = "generated",
    log_path: Path | None = None,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    config: CrossStatsConfig | None = None,
    sources_file: Path | None = None,
    history: bool = False,
) -> dict[str, Any]:
    """Build partition ``ds`` of every configured pair for one registered source; returns the
    summary. ``config`` defaults to the pairs the source can key (:func:`default_config`).

    ``history``: the log is a later partition's (a missing earlier partition rebuilt from it):
    its rows at or after ``ds`` are left out (:func:`before_cutoff`) instead of quarantined, and
    the summary says so (``history``, so the gate reads the log the same way).

    Raises :class:`EmptyBatch` when no clean row falls in the longest window (bad rows are
    quarantined first; no feature partition, summary or gate verdict is written). A build
    that fails or is refused removes the partition's earlier outputs, which its start left
    ungated (:meth:`CrossLake.remove_ungated`).
    A session passed in is left running; one built here is stopped before returning.
    """
    check_ds(ds)
    settings = settings or load_settings()
    registered = sources.resolve(source, sources_file)
    if registered.reads_landing and log_path is None:
        raise ValueError(f"source {source!r} reads a landed log: pass --log PATH")
    own = spark is None
    session = spark or build_session(settings)
    try:
        if config is None:
            config = default_config(session, source, log_path, sources_file=sources_file)
        return _run(
            ds,
            source=source,
            log_path=log_path,
            settings=settings,
            spark=session,
            config=config,
            sources_file=sources_file,
            history=history,
        )
    except BaseException:
        # The build deleted the gate's verdict first: an earlier build's files would stay
        # behind unchecked, so nothing of the partition is left but its quarantine.
        removed = CrossLake(Lake(settings.lake_root), source).remove_ungated(ds)
        if removed:
            print(
                f"[cross] ds={ds} not built: removed {len(removed)} ungated outputs of an "
                f"earlier build ({', '.join(str(p) for p in removed)})",
                flush=True,
            )
        raise
    finally:
        if own:
            session.stop()


def _write_quarantine(
    log: DataFrame,
    adapter_quarantine: DataFrame | None,
    *,
    source: str,
    config: CrossStatsConfig,
    cutoff: dt.datetime,
    path: Path,
    any_bad: bool,
) -> int:
    """Write the rows breaking a rule with their reason and raw line; returns the adapter's
    count. Bad rows are rare: the input is only re-read for them when ``any_bad``."""
    bad = with_reason(log, config.key_columns, cutoff=cutoff).filter(F.col("reason").isNotNull())
    raw = (
        F.col(sources.RAW_COLUMN)
        if sources.RAW_COLUMN in log.columns
        else F.struct(*sources.LOG_COLUMNS)
    )
    quarantine = bad.select(F.lit(source).alias("source"), F.to_json(raw).alias("line"), "reason")
    if not any_bad:
        quarantine = quarantine.limit(0)
    if adapter_quarantine is not None:
        quarantine = quarantine.unionByName(adapter_quarantine)
    quarantine.coalesce(1).write.mode("overwrite").parquet(str(path))
    return adapter_quarantine.count() if adapter_quarantine is not None else 0


def _run(
    ds: str,
    *,
    source: str,
    log_path: Path | None,
    settings: Settings,
    spark: SparkSession,
    config: CrossStatsConfig,
    sources_file: Path | None,
    history: bool = False,
) -> dict[str, Any]:
    """Extract, transform, load: the log read and checked, both passes, every output written,
    then the summary (which the gate reads) last."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    started = time.monotonic()
    cutoff = ds_midnight(ds)
    where = CrossLake(Lake(settings.lake_root), source)
    # The partition is being rebuilt: an earlier gate verdict no longer vouches for it.
    where.gate_report(ds).unlink(missing_ok=True)
    log, adapter_quarantine = read_log(spark, source, log_path, sources_file=sources_file)
    if history:
        log = before_cutoff(log, cutoff)
    print(
        f"[cross] {source} ds={ds}{' (history, from a later log)' if history else ''}: "
        f"{window_text(ds, config.windows)}",
        flush=True,
    )

    write_quarantine = functools.partial(
        _write_quarantine,
        log,
        adapter_quarantine,
        source=source,
        config=config,
        cutoff=cutoff,
        path=where.quarantine(ds),
    )
    try:
        aggregate, facts = compute(log, config, cutoff=cutoff)
    except EmptyBatch:
        where.summary(ds).unlink(missing_ok=True)
        write_quarantine(any_bad=True)
        print(f"[cross] bad rows of ds={ds} -> {where.quarantine(ds)}", flush=True)
        raise
    _print_facts(facts)
    try:
        written = _write_outputs(log, aggregate, facts, config, where, ds=ds, cutoff=cutoff)
    finally:
        aggregate.unpersist()

    quarantined = int(facts["batch"]["quarantined_rows"])
    adapter_bad = write_quarantine(any_bad=quarantined > 0)
    print(f"[cross] quarantined {quarantined + adapter_bad:,} rows -> {where.quarantine(ds)}")
    summary = {
        "ds": ds,
        "source": source,
        "pairs": [pair.name for pair in config.pairs],
        "history": history,
        "log_path": None if log_path is None else str(log_path),
        "sources_file": None if sources_file is None else str(sources_file),
        **_batch_summary(facts, adapter_bad),
        **written,
        "quarantine_path": str(where.quarantine(ds)),
        "windows_days": list(config.windows),
        "windows": window_text(ds, config.windows),
        "examination": {str(k): v for k, v in sorted(facts["examination"].items())},
        "priors": {
            pair: {tag: {"a": a, "b": b} for tag, (a, b) in tags.items()}
            for pair, tags in facts["priors"].items()
        },
        "constant_features": facts["constant_features"],
        "empty_windows": facts["empty_windows"],
        "seconds": round(time.monotonic() - started, 3),
    }
    summary_path = where.summary(ds)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2))
    summary["summary_path"] = str(summary_path)
    print(f"[cross] done in {summary['seconds']:.1f} s; summary -> {summary_path}")
    return summary


def _print_facts(facts: dict[str, Any]) -> None:
    """The batch's counts, and the warnings about columns that came out constant."""
    batch = facts["batch"]
    print(
        f"[cross] {batch['input_rows']:,} input rows, {batch['clean_rows_in_window']:,} clean in "
        f"the window, {batch['quarantined_rows']:,} quarantined {batch['quarantined_by_reason']}"
    )
    if facts["constant_features"]:
        print(
            "[cross] WARNING prior at its clamp (no spread between keys, the column is a "
            f"constant): {facts['constant_features']}",
            flush=True,
        )
    if facts["empty_windows"]:
        print(
            "[cross] WARNING empty window (no impression in it; the column is a constant at the "
            f"pair's rate over its nearest window with data): {facts['empty_windows']}",
            flush=True,
        )


def _write_outputs(
    log: DataFrame,
    aggregate: CrossAggregate,
    facts: dict[str, Any],
    config: CrossStatsConfig,
    where: CrossLake,
    *,
    ds: str,
    cutoff: dt.datetime,
) -> dict[str, Any]:
    """Write every pair's partition and the item catalogue as concurrent Spark jobs; returns
    the summary's ``rows``, ``paths`` (in the config's pair order) and ``catalogue``."""
    rows: dict[str, int] = {}
    paths: dict[str, str] = {}

    def write_pair(pair: CrossPair) -> None:
        frame = pair_features(
            aggregate.frame, pair, config, priors=facts["priors"][pair.name], cutoff=cutoff
        )
        path = where.pair(pair, ds)
        counted = Observation(f"rows {pair.name}")
        frame.observe(counted, F.count(F.lit(1)).alias("rows")).coalesce(
            config.output_files
        ).write.mode("overwrite").parquet(str(path))
        rows[pair.name] = int(counted.get["rows"])
        paths[pair.name] = str(path)
        print(f"[cross]   {pair.name}: {rows[pair.name]:,} rows -> {path}", flush=True)

    catalogue: dict[str, Any] = {}

    def write_catalogue() -> None:
        items = Observation("catalogue items")
        clean = clean_in_window(
            with_reason(log, config.key_columns, cutoff=cutoff),
            cutoff=cutoff,
            days=max(config.windows),
        )
        item_catalogue(clean).observe(items, F.count(F.lit(1)).alias("rows")).coalesce(
            1
        ).write.mode("overwrite").parquet(str(where.catalogue(ds)))
        catalogue.update(items=int(items.get["rows"]), path=str(where.catalogue(ds)))
        print(f"[cross]   catalogue: {catalogue['items']:,} items -> {catalogue['path']}")

    # Concurrent Spark jobs, longest first (the catalogue's scan of the log, then the pairs by
    # their rows) so no core waits on a lone straggler; a failed write raises here after the
    # others have finished.
    largest_first = sorted(config.pairs, key=lambda pair: -facts["pair_rows"][pair.name])
    writes = [write_catalogue, *[functools.partial(write_pair, pair) for pair in largest_first]]
    with ThreadPoolExecutor(max_workers=config.write_threads) as pool:
        for done in [pool.submit(write) for write in writes]:
            done.result()
    return {
        "rows": {pair.name: rows[pair.name] for pair in config.pairs},
        "paths": {pair.name: paths[pair.name] for pair in config.pairs},
        "catalogue": catalogue,
    }


def _batch_summary(facts: dict[str, Any], adapter_bad: int) -> dict[str, Any]:
    """The summary's row counts: pass 1's, with the rows the source's adapter quarantined."""
    batch = facts["batch"]
    quarantined = int(batch["quarantined_rows"])
    by_reason = dict(batch["quarantined_by_reason"])
    if adapter_bad:
        by_reason["adapter"] = adapter_bad
    return {
        "input_rows": int(batch["input_rows"]) + adapter_bad,
        "quarantined_rows": quarantined + adapter_bad,
        "adapter_quarantined_rows": adapter_bad,
        "quarantined_by_reason": by_reason,
        "future_rows_quarantined": int(by_reason.get(sources.FUTURE_REASON, 0)),
        "clean_rows_in_window": int(batch["clean_rows_in_window"]),
        "clean_rows_before_window": int(batch["clean_rows_before_window"]),
    }


DS_HELP = (
    "partition date YYYY-MM-DD. Every window ends at DS 00:00 UTC and excludes it: the 1-day "
    "window of 2026-11-22 is 2026-11-21; rows at or after DS are quarantined as misfiled"
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI: ``python -m jobs.ctr_cross_stats --ds YYYY-MM-DD --source NAME [--log PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_cross_stats", description=__doc__)
    parser.add_argument("--ds", required=True, help=DS_HELP)
    parser.add_argument(
        "--source",
        default="generated",
        help="a registered log source: generated, ml100k, or one from --sources-file or the "
        f"'{sources.ENTRY_POINT_GROUP}' entry points",
    )
    parser.add_argument("--log", type=Path, help="the landed log folder (ml100k: source dir)")
    parser.add_argument("--sources-file", type=Path, help="TOML file of [sources.NAME] tables")
    args = parser.parse_args(argv)
    return run(args.ds, source=args.source, log_path=args.log, sources_file=args.sources_file)


if __name__ == "__main__":
    main()
