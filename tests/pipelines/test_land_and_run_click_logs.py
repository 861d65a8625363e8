"""Click logs, each standard format end to end: a small log with string user and item keys lands
with ``cascade land impressions``, and the ``ctr_cross`` pipeline's steps run on it through the
step runner (the entry of the DAG's tasks, ``cascade step`` and DVC): the landed log is kept,
the cross statistics are built from it, and the gate before Feast judges them. The event route:
the DAG's first task lands the log an event names by ``path``.

Publishing to Feast, the pre-ranker's training and registering need the stack and two DeepSpeed
processes: tests/e2e and the pre-ranking tests cover that part."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from cascade.events import make_event
from cascade.lake import Lake
from cascade.landing import landing_dir, landing_record
from tests.pipelines.standard_layouts import (
    clicks,
    first_task_claiming,
    land_with_cli,
    run_until_refused,
    write_click_log,
)

pytestmark = pytest.mark.spark

DS = "2026-11-22"
UNTIL_FEAST = ("log", "stats", "validate")
ROWS = 240


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession) -> Path:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_CROSS_HISTORY_DAYS", "0")  # the partition itself, no backfill
    return tmp_path / "home"


def a_days_log() -> pd.DataFrame:
    """Four hours of impressions on the day before DS: twelve users, four items, every other
    one clicked."""
    return clicks(ROWS, start=dt.datetime(2026, 11, 21, 0, 3), users=12)


@pytest.mark.slow  # 74-105 s each on a loaded 2-core machine (Spark: import, statistics, gate)
@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_a_landed_log_runs_to_the_gate(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    path = write_click_log(a_days_log(), tmp_path / f"clicks.{fmt}", fmt)

    record = land_with_cli(capsys, "impressions", path, DS)  # the format from the suffix

    assert record["format"] == fmt
    assert record["counts"] == {
        "rows": ROWS,
        "quarantined": 0,
        "user_id_collisions": 0,
        "item_id_collisions": 0,
    }
    run = run_until_refused("ctr_cross", DS, UNTIL_FEAST)
    assert run.refusal is None, run.refusal
    assert run.results["validate"]["success"]


def test_an_events_path_lands_in_the_first_task(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAG's first task, without Airflow: the claimed event names a folder of JSON lines."""
    export = write_click_log(a_days_log(), tmp_path / "producer" / "part-0.jsonl", "jsonl")
    event = make_event(
        "cascade.data.landed",
        {"dataset": "impressions", "partition": DS, "path": str(export.parent), "format": "jsonl"},
    )
    first = first_task_claiming(monkeypatch, "ctr_cross", [event])

    log = first(DS)

    landing = landing_dir(Lake(home / "lake"), "impressions", DS)
    record = landing_record(landing)
    assert record is not None and record["format"] == "jsonl"
    assert record["counts"]["rows"] == ROWS and record["counts"]["quarantined"] == 0
    assert log["source"] == "landed" and log["landed_from"] == "jsonl"
