"""Great Expectations gate for :mod:`jobs.ctr_cross_stats`: input log and output features.

Run it after the job (exit 1 and the report's path when the batch fails, so the DAG stops
before Feast)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.ctr_cross_stats_gate --ds 2026-11-22 \\
        --source generated --log /tmp/log_1m

Row-level rules are applied by the job itself (bad rows go to the quarantine partition with a
``reason``; see :func:`jobs.ctr_log_sources.row_rules`). This gate checks the batch:

* input (the clean rows the job aggregated): ids and click not null, click in {0, 1},
  ``ds - lookback <= event_timestamp < ds`` (no future leakage), position >= 1;
* every pair's output: keys and timestamp not null, ``event_timestamp == ds``, CTRs in [0, 1],
  clicks <= impressions per window, impressions nested across windows (1d <= 7d <= 30d),
  recency within the lookback, and the row count within ``row_count_tolerance`` of the
  previous partition's (from its summary);
* the share of quarantined input rows is at most ``max_quarantine_fraction``.

Suites run on Spark DataFrames through GX Core's Spark data source (ephemeral context), so
they scale with the job. The JSON report goes to ``reports/gx_ctr_cross_<source>/dt=<ds>/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from jobs import ctr_cross_stats as job
from jobs.gx_suites import run_suite


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
    pair: job.CrossPair,
    config: job.CrossStatsConfig,
    *,
    cutoff: dt.datetime,
    previous_rows: int | None,
) -> list[Any]:
    import great_expectations.expectations as gxe

    name, windows = pair.name, config.windows
    if previous_rows is None:
        rows = gxe.ExpectTableRowCountToBeBetween(min_value=1)
    else:
        tolerance = config.row_count_tolerance
        rows = gxe.ExpectTableRowCountToBeBetween(
            min_value=max(1, int(previous_rows * (1 - tolerance))),
            max_value=int(previous_rows * (1 + tolerance)) + 1,
        )
    checks: list[Any] = [
        *[gxe.ExpectColumnValuesToNotBeNull(column=k) for k in pair.keys],
        gxe.ExpectColumnValuesToBeBetween(
            column="event_timestamp", min_value=cutoff, max_value=cutoff
        ),
        rows,
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


def _previous_summary(where: job.CrossLake, ds: str) -> dict[str, Any] | None:
    """The summary of the newest earlier partition of this source, if any."""
    root = where.summary(ds).parent.parent
    earlier = sorted(p for p in root.glob("dt=*") if p.name.removeprefix("dt=") < ds)
    for folder in reversed(earlier):
        path = folder / "summary.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


def validate(
    ds: str,
    *,
    source: str = "generated",
    log_path: Path | None = None,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    config: job.CrossStatsConfig | None = None,
) -> dict[str, Any]:
    """Validate partition ``ds``; write the report; raise :class:`GateFailed` on failure."""
    check_ds(ds)
    settings = settings or load_settings()
    if config is None:
        pairs = job.ML100K_PAIRS if source == "ml100k" else job.GENERATED_PAIRS
        config = job.CrossStatsConfig(pairs=pairs)
    own = spark is None
    session = spark or job.build_session(settings, app="cascade.ctr_cross_stats_gate")
    try:
        return _validate(ds, source, log_path, settings, session, config)
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

    log, _ = job.read_log(spark, source, log_path)
    checked = job.with_reason(log, config.key_columns).filter(F.col("reason").isNull())
    datasets: dict[str, tuple[DataFrame, list[Any]]] = {
        "input": (
            job.in_lookback(checked, cutoff=cutoff, days=max(config.windows)).drop("age_us"),
            input_suite(cutoff, max(config.windows)),
        )
    }
    for pair in config.pairs:
        path = where.pair(pair, ds)
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is missing; run jobs.ctr_cross_stats for {ds}")
        before = None if previous is None else previous.get("rows", {}).get(pair.name)
        datasets[pair.name] = (
            spark.read.parquet(str(path)),
            output_suite(pair, config, cutoff=cutoff, previous_rows=before),
        )

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    data_source = context.data_sources.add_spark(name="lake")
    failed: list[str] = []
    report_sets: list[dict[str, Any]] = []
    for name, (frame, expectations) in datasets.items():
        outcome = run_suite(
            context,
            data_source,
            suite_name=f"ctr_cross_{name}",
            dataset=name,
            frame=frame,
            expectations=expectations,
        )
        failed.extend(outcome.failed)
        report_sets.append({"dataset": name, "success": outcome.success, "checks": outcome.checks})

    fraction = summary["quarantined_rows"] / max(1, summary["input_rows"])
    quarantine_ok = fraction <= config.max_quarantine_fraction
    if not quarantine_ok:
        failed.append(f"quarantine_fraction({fraction:.4f} > {config.max_quarantine_fraction})")
    report = lake.reports(f"gx_ctr_cross_{source}", ds) / "report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "ds": ds,
        "source": source,
        "success": not failed,
        "failed": failed,
        "quarantine_fraction": fraction,
        "previous_partition": None if previous is None else previous["ds"],
        "datasets": report_sets,
    }
    report.write_text(json.dumps(body, indent=2, default=str))
    print(f"[cross-gate] {len(failed)} failed; quarantine {fraction:.4%}; report -> {report}")
    if failed:
        raise GateFailed(report, failed)
    return {"success": True, "report": str(report), "failed": []}


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m jobs.ctr_cross_stats_gate --ds YYYY-MM-DD --source NAME [--log PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_cross_stats_gate")
    parser.add_argument("--ds", required=True)
    parser.add_argument("--source", choices=job.SOURCES, default="generated")
    parser.add_argument("--log", type=Path)
    args = parser.parse_args(argv)
    try:
        validate(args.ds, source=args.source, log_path=args.log)
    except GateFailed as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
