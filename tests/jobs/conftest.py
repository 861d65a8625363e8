"""Shared fixtures for the Spark job tests: one small local Spark session for the whole run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from jobs.spark_sessions import UTC_MICROS, build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[1] session in UTC writing microsecond timestamps, as the job configures its own."""
    session = build_session(
        "cascade-tests-jobs",
        master="local[1]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            **UTC_MICROS,
        },
        local_ip="127.0.0.1",
        python_workers=True,
        log_level="ERROR",
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def one_partition_of_cross_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ctr_cross`` runs here build the partition a test names, not the week before it (the
    production default, ``CASCADE_CROSS_HISTORY_DAYS=7``); a test of the history sets its own."""
    monkeypatch.setenv("CASCADE_CROSS_HISTORY_DAYS", "0")
