"""Great Expectations gate for the output of :mod:`jobs.ctr_cross_features`.

Run it after the job (exits non-zero and names the report when a suite fails)::

    .venv/bin/python -m jobs.ctr_cross_features_gate --ds 2026-11-22

One suite per CTR view (keys not null, at least one row, CTRs in [0, 1], clicks <= impressions,
impressions >= 1, event_timestamp <= ds midnight) and one on the labelled impressions (ids not
null, click in {0, 1}, event_timestamp strictly before ds midnight). Partitions are small, so
they are read with pandas and validated through GX Core's pandas data source in an ephemeral
context. The full result goes to ``Lake.reports("gx_ctr_features", ds) / "report.json"``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from cascade.config import Settings, load_settings
from cascade.ctr_schema import (
    ITEM_FEATURES,
    LABEL,
    TIMESTAMP,
    USER_FEATURES,
    USER_GENRE_FEATURES,
)
from cascade.lake import CTR_VIEWS, Lake, check_ds
from jobs.gx_suites import build_data_docs, run_suite

REPORT_KIND = "gx_ctr_features"

VIEW_KEYS: dict[str, tuple[str, ...]] = {
    "user": ("user_id",),
    "item": ("item_id",),
    "user_genre": ("user_id", "genre"),
}
"""Entity keys of each view (must never be null)."""

VIEW_COUNTS: dict[str, tuple[str, str, str]] = {
    "user": USER_FEATURES[:3],
    "item": ITEM_FEATURES[:3],
    "user_genre": USER_GENRE_FEATURES[:3],
}
"""(impressions, clicks, ctr) column names of each view."""


class GateFailed(RuntimeError):
    """A GX suite failed on a partition; the message names the report and the failures."""

    def __init__(self, report: Path, failed: list[str]) -> None:
        self.report = report
        self.failed = failed
        super().__init__(
            f"GX gate failed: {len(failed)} expectation(s) failed: {', '.join(failed)}. "
            f"See {report}; fix the job or its input and re-run it for this ds."
        )


def _suites(ds: str) -> dict[str, list[Any]]:
    """Expectations per dataset name (one per view plus ``impressions``)."""
    import great_expectations.expectations as gxe

    cutoff = dt.datetime.combine(dt.date.fromisoformat(ds), dt.time(), dt.UTC)
    suites: dict[str, list[Any]] = {}
    for view in CTR_VIEWS:
        impressions, clicks, ctr = VIEW_COUNTS[view]
        suites[view] = [
            *[gxe.ExpectColumnValuesToNotBeNull(column=key) for key in VIEW_KEYS[view]],
            gxe.ExpectColumnValuesToNotBeNull(column=TIMESTAMP),
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
            gxe.ExpectColumnValuesToBeBetween(column=ctr, min_value=0, max_value=1),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=impressions, column_B=clicks, or_equal=True
            ),
            gxe.ExpectColumnValuesToBeBetween(column=impressions, min_value=1),
            gxe.ExpectColumnValuesToBeBetween(column=TIMESTAMP, max_value=cutoff),
        ]
    suites["impressions"] = [
        gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToBeInSet(column=LABEL, value_set=[0, 1]),
        gxe.ExpectColumnValuesToBeBetween(column=TIMESTAMP, max_value=cutoff, strict_max=True),
    ]
    return suites


def _read_partition(path: Path) -> pd.DataFrame:
    if not path.is_dir():
        raise FileNotFoundError(
            f"partition {path} does not exist; run `python -m jobs.ctr_cross_features --ds ...` "
            "for this ds first"
        )
    return pd.read_parquet(path)


def validate(ds: str, *, settings: Settings | None = None, docs: Path | None = None) -> dict:
    """Validate the ``ds`` partitions; write the JSON report; raise :class:`GateFailed` on failure.

    Returns ``{"success": bool, "report": str(path), "evaluated": n, "failed": [names],
    "data_docs": index}`` (``success`` is always True when it returns); with ``docs`` the
    results are also rendered there as GX Data Docs (``data_docs`` is its ``index.html``).
    """
    check_ds(ds)
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    # Ephemeral context, no network: GX otherwise sends usage analytics on context creation.
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name="lake")

    paths = {view: lake.ctr_features(view, ds) for view in CTR_VIEWS}
    paths["impressions"] = lake.impressions(ds)
    datasets: list[dict[str, Any]] = []
    failed: list[str] = []
    evaluated = 0
    for name, expectations in _suites(ds).items():
        frame = _read_partition(paths[name])
        outcome = run_suite(
            context,
            source,
            suite_name=f"ctr_features_{name}",
            dataset=name,
            frame=frame,
            expectations=expectations,
        )
        evaluated += len(outcome.checks)
        failed.extend(outcome.failed)
        datasets.append(
            {
                "dataset": name,
                "path": str(paths[name]),
                "rows": len(frame),
                "success": outcome.success,
                "expectations": outcome.checks,
            }
        )

    report = lake.reports(REPORT_KIND, ds) / "report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "ds": ds,
        "success": not failed,
        "evaluated": evaluated,
        "failed": failed,
        "datasets": datasets,
        "data_docs": build_data_docs(context, docs),
    }
    # default=str: GX results hold numpy scalars and pandas Timestamps.
    report.write_text(json.dumps(body, indent=2, default=str), encoding="utf-8")
    print(f"[gate] {evaluated} expectations, {len(failed)} failed; report -> {report}")
    if failed:
        raise GateFailed(report, failed)
    return {
        "success": True,
        "report": str(report),
        "evaluated": evaluated,
        "failed": [],
        "data_docs": body["data_docs"],
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m jobs.ctr_cross_features_gate --ds YYYY-MM-DD``; exit 1 on failure."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_cross_features_gate")
    parser.add_argument("--ds", required=True, help="partition date YYYY-MM-DD")
    args = parser.parse_args(argv)
    try:
        validate(args.ds)
    except GateFailed as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
