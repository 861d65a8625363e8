"""Great Expectations gate for :mod:`jobs.ctr_cross_stats`: input log and output features.

Run it after the job (exit 1 and the report's path when the batch fails, so the DAG stops
before Feast)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_stats_gate --ds 2026-11-22 \\
        --source generated --log /tmp/log_1m

Row-level rules are applied by the job itself (bad rows go to the quarantine partition with a
``reason``; see :func:`jobs.ctr_log_sources.row_rules`). This gate checks the batch:

* input: every row breaking a row rule was quarantined (the count equals the job's summary);
  the clean rows in the lookback have ids, click in {0, 1}, ``ds - lookback <=
  event_timestamp < ds`` (no future leakage) and position >= 1;
* every pair's output: keys and timestamp not null, ``event_timestamp == ds``, CTRs in [0, 1],
  clicks <= impressions per window, impressions nested across windows (1d <= 7d <= 30d),
  recency within the lookback, and the row count within ``row_count_tolerance`` of the
  previous partition's (from its summary);
* the item catalogue: one row per item id (its row count equals the job's), ids not null,
  ``impressions >= 1``, ``last_seen`` inside the lookback;
* the share of quarantined input rows is at most ``max_quarantine_fraction``.

Two layers, because Great Expectations on a Spark frame runs one Spark job per metric (tens
of scans of a 10M-row log and of every output, minutes on ``local[2]``):

* Spark-native checks over every row: each rule is one ``count(rule broken)`` column, and all
  of a dataset's counts are collected by an Observation in ONE pass, the same pass that draws
  a uniform random sample of the dataset;
* the GX suites run on that sample (``sample_rows`` rows at most, through GX's pandas data
  source), so the report keeps GX's per-expectation results (unexpected values, partial lists).

The batch fails when a Spark-native count is not zero, an expectation fails, the row count
moves too much, or too many rows were quarantined. The JSON report goes to
``reports/gx_ctr_cross_<source>/dt=<ds>/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from jobs import ctr_cross_stats as job
from jobs.gx_suites import build_data_docs, run_suite

SAMPLE_ROWS = 50_000
"""About this many rows of each dataset (a uniform random sample) go through the GX suites."""
SAMPLE_SEED = 17


class GateFailed(RuntimeError):
    """The batch failed: the message names the report and the failed expectations."""

    def __init__(self, report: Path, failed: list[str]) -> None:
        self.report = report
        self.failed = failed
        super().__init__(
            f"GX gate failed: {len(failed)} check(s) failed: {', '.join(failed)}. See {report}; "
            "fix the job or its input and re-run both for this ds (Feast was not touched)."
        )


def input_suite(cutoff: dt.datetime, lookback_days: int) -> list[Any]:
    """GX expectations of the clean input rows in the lookback (run on a sample)."""
    import great_expectations.expectations as gxe

    start = cutoff - dt.timedelta(days=lookback_days)
    return [
        gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
        gxe.ExpectColumnValuesToBeInSet(column="click", value_set=[0, 1]),
        gxe.ExpectColumnValuesToBeBetween(
            column="event_timestamp", min_value=start, max_value=cutoff, strict_max=True
        ),
        gxe.ExpectColumnValuesToBeBetween(column="position", min_value=1),
    ]


def output_suite(
    pair: job.CrossPair, config: job.CrossStatsConfig, *, cutoff: dt.datetime
) -> list[Any]:
    """GX expectations of one pair's features (run on a sample; the row count is checked
    over the whole output by :func:`row_count_bounds`)."""
    import great_expectations.expectations as gxe

    name, windows = pair.name, config.windows
    checks: list[Any] = [
        *[gxe.ExpectColumnValuesToNotBeNull(column=k) for k in pair.keys],
        gxe.ExpectColumnValuesToBeBetween(
            column="event_timestamp", min_value=cutoff, max_value=cutoff
        ),
        gxe.ExpectColumnValuesToBeBetween(column=f"{name}_decay_ctr", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(
            column=f"{name}_days_since_imp", min_value=0, max_value=max(windows)
        ),
    ]
    for w in windows:
        checks += [
            gxe.ExpectColumnValuesToBeBetween(column=f"{name}_ctr_{w}d", min_value=0, max_value=1),
            gxe.ExpectColumnValuesToBeBetween(column=f"{name}_dctr_{w}d", min_value=0, max_value=1),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=f"{name}_imp_{w}d", column_B=f"{name}_clk_{w}d", or_equal=True
            ),
        ]
    for shorter, longer in zip(windows, windows[1:], strict=False):
        checks.append(
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=f"{name}_imp_{longer}d", column_B=f"{name}_imp_{shorter}d", or_equal=True
            )
        )
    return checks


def input_rules(cutoff: dt.datetime, lookback_days: int) -> list[tuple[str, Column]]:
    """(label, broken) of the clean input rows in the lookback: the Spark-native twin of
    :func:`input_suite`, counted over every row."""
    start = cutoff - dt.timedelta(days=lookback_days)
    ts = F.col(job.TIMESTAMP)
    return [
        ("input.user_id_not_null", F.col("user_id").isNull()),
        ("input.item_id_not_null", F.col("item_id").isNull()),
        ("input.click_in_0_1", F.col("click").isNull() | ~F.col("click").isin(0, 1)),
        (
            "input.event_timestamp_in_lookback",
            ts.isNull() | (ts < F.lit(start)) | (ts >= F.lit(cutoff)),
        ),
        ("input.position_at_least_1", F.col("position") < 1),
    ]


def catalogue_rules(cutoff: dt.datetime, lookback_days: int) -> list[tuple[str, Column]]:
    """(label, broken) of the item catalogue (:func:`jobs.ctr_cross_stats.item_catalogue`)."""
    seen = F.col("last_seen")
    start = cutoff - dt.timedelta(days=lookback_days)
    return [
        ("catalogue.item_id_not_null", F.col("item_id").isNull()),
        (
            "catalogue.impressions_at_least_1",
            F.col("impressions").isNull() | (F.col("impressions") < 1),
        ),
        (
            "catalogue.last_seen_in_lookback",
            seen.isNull() | (seen < F.lit(start)) | (seen >= F.lit(cutoff)),
        ),
    ]


def catalogue_suite() -> list[Any]:
    """GX expectations of the item catalogue's sample."""
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
        gxe.ExpectColumnValuesToBeUnique(column="item_id"),
    ]


def output_rules(
    pair: job.CrossPair, config: job.CrossStatsConfig, *, cutoff: dt.datetime
) -> list[tuple[str, Column]]:
    """(label, broken) of one pair's features: the Spark-native twin of :func:`output_suite`."""
    name, windows = pair.name, config.windows

    def outside(column: str, low: float, high: float) -> Column:
        value = F.col(column)
        return value.isNull() | (value < low) | (value > high)

    rules = [(f"{name}.{k}_not_null", F.col(k).isNull()) for k in pair.keys]
    rules += [
        (f"{name}.event_timestamp_is_ds", F.col(job.TIMESTAMP) != F.lit(cutoff)),
        (f"{name}.decay_ctr_in_0_1", outside(f"{name}_decay_ctr", 0, 1)),
        (f"{name}.days_since_imp_in_lookback", outside(f"{name}_days_since_imp", 0, max(windows))),
    ]
    for w in windows:
        rules += [
            (f"{name}.ctr_{w}d_in_0_1", outside(f"{name}_ctr_{w}d", 0, 1)),
            (f"{name}.dctr_{w}d_in_0_1", outside(f"{name}_dctr_{w}d", 0, 1)),
            (f"{name}.clk_{w}d_le_imp", F.col(f"{name}_clk_{w}d") > F.col(f"{name}_imp_{w}d")),
        ]
    for shorter, longer in zip(windows, windows[1:], strict=False):
        rules.append(
            (
                f"{name}.imp_{shorter}d_le_imp_{longer}d",
                F.col(f"{name}_imp_{shorter}d") > F.col(f"{name}_imp_{longer}d"),
            )
        )
    return rules


def row_count_bounds(config: job.CrossStatsConfig, previous_rows: int | None) -> tuple[int, int]:
    """[low, high] of a pair's row count: at least 1, and within ``row_count_tolerance`` of the
    previous partition's count when there is one."""
    if previous_rows is None:
        return 1, 2**63 - 1
    tolerance = config.row_count_tolerance
    return (
        max(1, int(previous_rows * (1 - tolerance))),
        int(previous_rows * (1 + tolerance)) + 1,
    )


def count_and_sample(
    frame: DataFrame,
    rules: list[tuple[str, Column]],
    *,
    expected_rows: int,
    label: str,
    sample_rows: int = SAMPLE_ROWS,
) -> tuple[dict[str, int], Any]:
    """One pass over ``frame``: (``rows`` and the count of each rule's broken rows, a uniform
    random sample of about ``sample_rows`` rows as pandas with UTC-aware timestamps)."""
    import pandas as pd

    observation = Observation(f"gate {label}")
    counted = frame.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        *[F.count(F.when(broken, F.lit(1))).alias(name) for name, broken in rules],
    )
    fraction = min(1.0, sample_rows / max(1, expected_rows))
    sample = counted.sample(withReplacement=False, fraction=fraction, seed=SAMPLE_SEED).toPandas()
    if job.TIMESTAMP in sample.columns:
        sample[job.TIMESTAMP] = pd.to_datetime(sample[job.TIMESTAMP], utc=True)
    return {name: int(value) for name, value in observation.get.items()}, sample


def _previous_summary(where: job.CrossLake, ds: str) -> dict[str, Any] | None:
    """The summary of the newest earlier partition of this source, if any."""
    root = where.summary(ds).parent.parent
    earlier = sorted(p for p in root.glob("dt=*") if p.name.removeprefix("dt=") < ds)
    for folder in reversed(earlier):
        path = folder / "summary.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


def constant_column_warnings(summary: dict[str, Any]) -> list[str]:
    """The job summary's constant columns, one warning each: priors at their clamp and empty
    windows. Flagged, not failed: such a column is legal, only useless to a model."""
    reasons = (
        ("constant_features", "prior at its clamp"),
        ("empty_windows", "empty window (no impression in it)"),
    )
    return [
        f"{pair}: {reason}, constant column {column}"
        for key, reason in reasons
        for pair, columns in summary.get(key, {}).items()
        for column in columns
    ]


def validate(
    ds: str,
    *,
    source: str = "generated",
    log_path: Path | None = None,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    config: job.CrossStatsConfig | None = None,
    sources_file: Path | None = None,
    docs: Path | None = None,
) -> dict[str, Any]:
    """Validate partition ``ds``; write the report; raise :class:`GateFailed` on failure.
    ``config`` defaults to the pairs the job's summary lists (the pairs it computed); with
    ``docs`` the GX results are also rendered there as Data Docs (``data_docs``)."""
    check_ds(ds)
    settings = settings or load_settings()
    own = spark is None
    session = spark or job.build_session(settings, app="cascade.ctr_cross_stats_gate")
    try:
        if config is None:
            summary = job.CrossLake(Lake(settings.lake_root), source).summary(ds)
            named = json.loads(summary.read_text()).get("pairs") if summary.is_file() else None
            if named:
                config = job.CrossStatsConfig(pairs=tuple(job.PAIRS_BY_NAME[n] for n in named))
            else:
                config = job.default_config(session, source, log_path, sources_file=sources_file)
        return _validate(ds, source, log_path, settings, session, config, sources_file, docs)
    finally:
        if own:
            session.stop()


def _validate(
    ds: str,
    source: str,
    log_path: Path | None,
    settings: Settings,
    spark: SparkSession,
    config: job.CrossStatsConfig,
    sources_file: Path | None = None,
    docs: Path | None = None,
) -> dict[str, Any]:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network from a task
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    lake = Lake(settings.lake_root)
    where = job.CrossLake(lake, source)
    summary_path = where.summary(ds)
    if not summary_path.is_file():
        raise FileNotFoundError(
            f"{summary_path} is missing; run `python -m jobs.ctr_cross_stats --ds {ds} "
            f"--source {source}` first"
        )
    summary = json.loads(summary_path.read_text())
    previous = _previous_summary(where, ds)
    cutoff = job.ds_midnight(ds)

    lookback = max(config.windows)
    log, _ = job.read_log(spark, source, log_path, sources_file=sources_file)
    if summary.get("history"):  # built from a later partition's log: read as the job read it
        log = job.before_cutoff(log, cutoff)
    # One pass over the input: all rows are counted before the clean-row filter, the input
    # rules after it, and the sample is drawn from the clean rows in the lookback.
    everything = Observation(f"gate {source} input rows")
    checked = job.with_reason(log, config.key_columns, cutoff=cutoff).observe(
        everything,
        F.count(F.lit(1)).alias("rows"),
        F.count(F.col("reason")).alias("rule_breaking_rows"),
    )
    clean = job.in_lookback(
        checked.filter(F.col("reason").isNull()), cutoff=cutoff, days=lookback
    ).drop("age_us", "reason")
    datasets: dict[str, tuple[DataFrame, list[tuple[str, Column]], list[Any], int]] = {
        "input": (
            clean,
            input_rules(cutoff, lookback),
            input_suite(cutoff, lookback),
            int(summary["input_rows"]),
        )
    }
    bounds: dict[str, tuple[int, int]] = {}
    for pair in config.pairs:
        path = where.pair(pair, ds)
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is missing; run jobs.ctr_cross_stats for {ds}")
        before = None if previous is None else previous.get("rows", {}).get(pair.name)
        bounds[pair.name] = row_count_bounds(config, before)
        datasets[pair.name] = (
            spark.read.parquet(str(path)),
            output_rules(pair, config, cutoff=cutoff),
            output_suite(pair, config, cutoff=cutoff),
            int(summary["rows"].get(pair.name, 0)),
        )
    failed: list[str] = []
    catalogue = summary.get("catalogue")
    if catalogue is not None:  # partitions written before the catalogue have none
        items = spark.read.parquet(catalogue["path"])
        expected = int(catalogue["items"])
        datasets["catalogue"] = (
            items,
            catalogue_rules(cutoff, lookback),
            catalogue_suite(),
            expected,
        )
        bounds["catalogue"] = (expected, expected)
        counted = items.agg(F.count(F.lit(1)), F.count_distinct("item_id")).first()
        if counted[0] != counted[1]:
            failed.append(f"catalogue.item_id_unique({counted[0]} rows, {counted[1]} ids)")

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    data_source = context.data_sources.add_pandas(name="lake_sample")
    report_sets: list[dict[str, Any]] = []
    for name, (frame, rules, expectations, expected_rows) in datasets.items():
        counts, sample = count_and_sample(frame, rules, expected_rows=expected_rows, label=name)
        native = [
            {"check": label, "success": counts[label] == 0, "broken_rows": counts[label]}
            for label, _ in rules
        ]
        if name in bounds:
            low, high = bounds[name]
            ok = low <= counts["rows"] <= high
            native.append(
                {"check": f"{name}.row_count", "success": ok, "rows": counts["rows"],
                 "min": low, "max": high}
            )  # fmt: skip
        failed.extend(c["check"] for c in native if not c["success"])
        outcome = run_suite(
            context,
            data_source,
            suite_name=f"ctr_cross_{name}",
            dataset=name,
            frame=sample,
            expectations=expectations,
        )
        failed.extend(outcome.failed)
        report_sets.append(
            {
                "dataset": name,
                "success": outcome.success and all(c["success"] for c in native),
                "rows": counts["rows"],
                "sample_rows": len(sample),
                "native_checks": native,
                "checks": outcome.checks,
            }
        )
    seen = everything.get
    if int(seen["rule_breaking_rows"]) + summary.get("adapter_quarantined_rows", 0) != int(
        summary["quarantined_rows"]
    ):
        failed.append(
            f"input.quarantine_complete({seen['rule_breaking_rows']} rows break a rule, "
            f"the job quarantined {summary['quarantined_rows']})"
        )

    fraction = summary["quarantined_rows"] / max(1, summary["input_rows"])
    quarantine_ok = fraction <= config.max_quarantine_fraction
    if not quarantine_ok:
        failed.append(f"quarantine_fraction({fraction:.4f} > {config.max_quarantine_fraction})")
    warnings = constant_column_warnings(summary)
    report = where.gate_report(ds)
    report.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "ds": ds,
        "source": source,
        "success": not failed,
        "failed": failed,
        "warnings": warnings,
        "quarantine_fraction": fraction,
        "previous_partition": None if previous is None else previous["ds"],
        "datasets": report_sets,
        "data_docs": build_data_docs(context, docs),
    }
    report.write_text(json.dumps(body, indent=2, default=str))
    print(
        f"[cross-gate] {len(failed)} failed, {len(warnings)} warnings; quarantine "
        f"{fraction:.4%}; report -> {report}"
    )
    for warning in warnings:
        print(f"[cross-gate] WARNING {warning}")
    if failed:
        raise GateFailed(report, failed)
    return {
        "success": True,
        "report": str(report),
        "failed": [],
        "warnings": warnings,
        "data_docs": body["data_docs"],
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m jobs.ctr_cross_stats_gate --ds YYYY-MM-DD --source NAME [--log PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_cross_stats_gate")
    parser.add_argument("--ds", required=True, help=job.DS_HELP)
    parser.add_argument("--source", default="generated", help="a registered log source")
    parser.add_argument("--log", type=Path, help="the landed log folder (ml100k: source dir)")
    parser.add_argument("--sources-file", type=Path, help="TOML file of [sources.NAME] tables")
    args = parser.parse_args(argv)
    try:
        validate(args.ds, source=args.source, log_path=args.log, sources_file=args.sources_file)
    except GateFailed as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
