"""The one Spark session builder of the jobs, and borrowing the running session for steps and
benchmarks.

Every job, the job tests and the benchmarks get their session from :func:`build_session`; the
app name and the per-job configuration are its parameters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

UTC_MICROS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}
"""Session settings of jobs whose output Feast and pandas read: neither reads INT96 or
nanosecond timestamps, and UTC keeps grid times exact."""


def build_session(
    app: str,
    *,
    master: str,
    conf: Mapping[str, str] | None = None,
    local_ip: str | None = None,
    python_workers: bool = False,
    log_level: str | None = None,
) -> Any:
    """A SparkSession on ``master`` named ``app`` with ``conf`` (``getOrCreate``: the running
    session, configured with ``conf``, when there is one).

    ``local_ip``: the address the JVM binds unless ``SPARK_LOCAL_IP`` is set (it otherwise binds
    to whatever the hostname resolves to). ``python_workers``: Python workers run this
    interpreter (the venv), not whatever ``python3`` is on PATH, unless ``PYSPARK_PYTHON`` is
    set. ``log_level``: the SparkContext's log level, when given.
    """
    from pyspark.sql import SparkSession

    if local_ip is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", local_ip)
    if python_workers:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level is not None:
        spark.sparkContext.setLogLevel(log_level)
    return spark


def on_this_machine(settings: Any) -> bool:
    """The settings' master runs on this machine: ``local[N]``, or the cluster stack's own
    standalone master (loopback, a few cores), where a driver binds to loopback and a few
    shuffle partitions suffice."""
    master = settings.spark_master
    return master.startswith("local") or master == settings.stack_spark_master


def stack_conf(settings: Any) -> dict[str, str]:
    """What a session needs for the cluster stack's standalone master (its authentication
    secret, the event log; :func:`cascade.data_services.spark_client_conf`); empty otherwise."""
    from cascade.data_services import spark_client_conf

    return spark_client_conf(settings)


@contextmanager
def active_or_new(build: Callable[[], Any]) -> Iterator[Any]:
    """``build()``'s session (a builder's ``getOrCreate``: it returns, and configures, the
    running session when there is one), stopped on exit only when no session was running
    before: a caller's or a test's session is left running."""
    from pyspark.sql import SparkSession

    borrowed = SparkSession.getActiveSession() is not None
    session = build()
    try:
        yield session
    finally:
        if not borrowed:
            session.stop()
