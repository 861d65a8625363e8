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
