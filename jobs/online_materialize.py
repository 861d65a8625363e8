"""Feast's Redis online store loaded by Spark executors: each Spark partition of a published
partition is encoded and written into Redis by the executor that holds it.

Run (cluster profile; ``cascade step feast --pipeline ctr_cross`` does this for every pair)::

    CASCADE_PROFILE=cluster SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m jobs.online_materialize \\
        --ds 2026-11-22 --source generated --pair user_cat

The driver applies nothing and reads nothing itself: it plans a scan of the partition's
parquet (rows in Feast's materialization window, the view's columns), spreads it over at least
as many Spark partitions as the session has task slots, and runs :func:`write_batches` on each
(``mapInArrow``: Arrow record batches straight from the scan). An executor encodes its batches
with :class:`domains.ctr.online_bulk.RedisBulkWriter`, the single-process bulk engine's writer, so
the hashes are Feast's own layout byte for byte, and every batch is checked against Feast's
converter on a sample as there. Each task answers one row of counts; the driver sums them.

The Redis password never travels with the tasks: an executor reads it where the driver did,
from the stack's password file (0600, :func:`cascade.data_services.redis_password_file`) or
from ``CASCADE_REDIS`` in its own environment. The driver first signs in itself with the same
password, so a wrong one stops the load at once with :class:`RedisPasswordRejected` (naming
where the password came from, never the password), before any task starts.

Timestamps: Spark hands the batches over with the session's time zone; the writer turns each
event time into an absolute ``Timestamp``, so the zone does not change the stored bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from cascade.config import Settings, load_settings
from domains.ctr import online_bulk, online_encoding

REDIS_ENV = "CASCADE_REDIS"
"""The environment variable of a Redis connection string (``cascade.config``'s setting)."""
ARROW_BATCH_ROWS = 20_000
"""Rows per Arrow batch handed to an executor's writer (Spark's default is 10,000)."""

STATS_SCHEMA = (
    "partition int, rows long, skipped long, kept_newer long, batches long, "
    "seconds double, cpu_s double, host string, workdir string"
)
_STATS_ARROW = pa.schema(
    [
        ("partition", pa.int32()),
        *((name, pa.int64()) for name in ("rows", "skipped", "kept_newer", "batches")),
        ("seconds", pa.float64()),
        ("cpu_s", pa.float64()),
        ("host", pa.string()),
        ("workdir", pa.string()),
    ]
)


class RedisPasswordRejected(RuntimeError):
    """Redis refused the password (or asked for one that was not given)."""


@dataclass(frozen=True)
class RedisTarget:
    """Where the executors write, without the password: Feast's connection string with its
    ``password=`` item removed, and where to read that password."""

    connection: str
    """``host:port[,db=N,...]``: no password."""
    password_file: str | None = None
    """The stack's password file."""
    password_env: str | None = None
    """An environment variable holding the whole connection string (password included)."""

    @property
    def source(self) -> str:
        """Where the password comes from, for messages (never the password)."""
        if self.password_file:
            return f"password file {self.password_file}"
        if self.password_env:
            return f"${self.password_env}"
        return "no password"

    @property
    def address(self) -> str:
        return self.connection.split(",", 1)[0]

    def connection_string(self) -> str:
        """The full connection string, password read now (on the executor that calls it)."""
        if self.password_file:
            try:
                password = Path(self.password_file).read_text().strip()
            except OSError as exc:
                raise RedisPasswordRejected(
                    f"cannot read the Redis password file {self.password_file} on "
                    f"{socket.gethostname()}: {exc.strerror}; every executor must see the "
                    "stack's state folder, or set CASCADE_REDIS in their environment"
                ) from None
            return f"{self.connection},password={password}"
        if self.password_env:
            value = os.environ.get(self.password_env)
            if not value:
                raise RedisPasswordRejected(
                    f"${self.password_env} is not set on {socket.gethostname()}: the executors "
                    "read the Redis password from their own environment; set it there "
                    "(for Spark standalone: in the workers' environment)"
                )
            return value
        return self.connection


def _without_password(connection: str) -> tuple[str, bool]:
    items = connection.split(",")
    kept = [item for item in items if not item.startswith("password=")]
    return ",".join(kept), len(kept) != len(items)


def redis_target(settings: Settings) -> RedisTarget:
    """The Redis of ``settings``' online store as a :class:`RedisTarget`: the stack's own
    (password file) unless ``CASCADE_REDIS`` names another one (then the executors read that
    variable from their environment)."""
    from cascade.data_services import redis_connection, redis_password_file

    configured = settings.feature_store.redis
    connection, has_password = _without_password(redis_connection(settings))
    if not configured:
        return RedisTarget(connection, password_file=str(redis_password_file(settings)))
    if not has_password:
        return RedisTarget(connection)
    from cascade.config import load_settings

    if load_settings().feature_store.redis != configured:  # what the environment says
        raise RedisPasswordRejected(
            f"the Redis connection of these settings carries a password that is not in "
            f"${REDIS_ENV}: executors read it from their environment, never from the tasks; "
            f"export {REDIS_ENV} (driver and executors) or use the stack's own Redis"
        )
    return RedisTarget(connection, password_env=REDIS_ENV)


def _auth_failure(exc: BaseException) -> bool:
    import redis

    if isinstance(exc, redis.AuthenticationError):
        return True
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and ("NOAUTH" in text or "WRONGPASS" in text)


def _rejected(target: RedisTarget) -> RedisPasswordRejected:
    return RedisPasswordRejected(
        f"Redis at {target.address} refused the password from {target.source}: the file or "
        "variable does not match the server's requirepass; fix it (the stack writes the file "
        "when it first starts Redis) and rerun"
    )


def _client(target: RedisTarget) -> Any:
    from feast.infra.online_stores.redis import RedisOnlineStore, RedisOnlineStoreConfig

    config = RedisOnlineStoreConfig(connection_string=target.connection_string())
    return RedisOnlineStore()._get_client(config)


def check_password(target: RedisTarget) -> None:
    """Sign in to Redis as the executors will; :class:`RedisPasswordRejected` if refused."""
    import redis

    client = _client(target)
    try:
        client.ping()
    except redis.RedisError as exc:
        if _auth_failure(exc):
            raise _rejected(target) from None
        raise
    finally:
        client.close()


@dataclass(frozen=True)
class ViewPlan:
    """What a task needs to write one view: no store, no registry, no password."""

    view_proto: bytes
    project: str
    versioning: bool
    online: dict[str, Any]
    """The Redis online store's config without its connection string."""
    target: RedisTarget
    check: bool = True


def _executor_writer(plan: ViewPlan) -> online_bulk.RedisBulkWriter:
    """The bulk engine's Redis writer, rebuilt on an executor from ``plan``."""
    from feast.feature_view import FeatureView
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig
    from feast.protos.feast.core.FeatureView_pb2 import FeatureView as FeatureViewProto

    view = FeatureView.from_proto(FeatureViewProto.FromString(plan.view_proto))
    online = RedisOnlineStoreConfig(
        **plan.online, connection_string=plan.target.connection_string()
    )
    config = SimpleNamespace(
        project=plan.project,
        online_store=online,
        entity_key_serialization_version=3,
        registry=SimpleNamespace(enable_online_feature_view_versioning=plan.versioning),
    )
    return online_bulk.RedisBulkWriter(SimpleNamespace(config=config), view)


def write_batches(plan: ViewPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark partition into Redis (runs on an executor): one row of counts out."""
    import redis
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    cpu = time.process_time()
    writer = _executor_writer(plan)
    try:
        result = writer.write(batches, check=plan.check, progress=False)
    except redis.RedisError as exc:
        if _auth_failure(exc):
            raise _rejected(plan.target) from None
        raise
    finally:
        writer.client.close()
    yield pa.RecordBatch.from_pylist(
        [
            {
                "partition": partition,
                "rows": result.rows,
                "skipped": result.skipped_missing_key,
                "kept_newer": result.kept_newer,
                "batches": result.batches,
                "seconds": result.seconds,
                "cpu_s": time.process_time() - cpu,
                "host": socket.gethostname(),
                # A standalone executor runs in <worker dir>/<app>/<executor>: which worker.
                "workdir": os.getcwd(),
            }
        ],
        schema=_STATS_ARROW,
    )


@dataclass
class SparkLoadResult(online_bulk.BulkResult):
    """A view's load by the executors: the bulk engine's counts, summed over the tasks."""

    partitions: int = 0
    cpu_s: float = 0.0
    """CPU seconds of the tasks' Python workers (encoding, checks, Redis client)."""
    tasks: list[dict[str, Any]] = field(default_factory=list)
    """One entry per Spark partition: its counts, host and executor working folder."""


def _window_frame(spark: Any, writer: online_bulk.RedisBulkWriter, path: Path, start, end):
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(path))
    columns = [*writer.join_keys, *writer.features, writer.timestamp_field]
    if writer.created_field:
        columns.append(writer.created_field)
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise ValueError(f"{path} lacks the columns {absent} of view {writer.view.name}")
    ts = F.col(writer.timestamp_field)
    return frame.select(*columns).where((ts >= F.lit(start)) & (ts <= F.lit(end)))


def write_view(
    spark: Any,
    store: Any,
    view: Any,
    path: str | Path,
    start: dt.datetime,
    end: dt.datetime,
    *,
    target: RedisTarget,
    partitions: int | None = None,
    check: bool = True,
) -> SparkLoadResult:
    """Load the rows of ``path`` with ``start <= event timestamp <= end`` into ``view``'s
    Redis hashes from the executors of ``spark``, over at least ``partitions`` Spark
    partitions (default: the session's task slots). Does not touch the registry."""
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig

    online = store.config.online_store
    if not isinstance(online, RedisOnlineStoreConfig):
        raise online_encoding.BulkUnsupported(f"{view.name}: the online store is not Redis")
    online_bulk.check_supported(store)
    # The driver's writer checks the view and builds nothing it sends.
    writer = online_bulk.RedisBulkWriter(store, view)
    writer.client.close()
    check_password(target)
    versioning = bool(
        getattr(store.config.registry, "enable_online_feature_view_versioning", False)
    )
    plan = ViewPlan(
        view_proto=view.to_proto().SerializeToString(),
        project=store.config.project,
        versioning=versioning,
        online=online.model_dump(exclude={"connection_string"}),
        target=target,
        check=check,
    )
    frame = _window_frame(spark, writer, Path(path), start, end)
    wanted = partitions or spark.sparkContext.defaultParallelism
    if frame.rdd.getNumPartitions() < wanted:
        frame = frame.repartition(wanted)
    started = time.perf_counter()
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH_ROWS))
    try:
        rows = frame.mapInArrow(lambda batches: write_batches(plan, batches), STATS_SCHEMA)
        tasks = [row.asDict() for row in rows.collect()]
    except Exception as exc:
        # A task's own message (a refused password, an unreadable file), not Spark's trace.
        told = re.search(rf"{RedisPasswordRejected.__name__}: (.+)", str(exc))
        if told:
            raise RedisPasswordRejected(told.group(1).strip()) from None
        raise
    finally:
        if previous is None:
            spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        else:
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    result = SparkLoadResult(view=view.name, partitions=len(tasks), tasks=tasks)
    result.seconds = time.perf_counter() - started
    for task in tasks:
        result.rows += task["rows"]
        result.skipped_missing_key += task["skipped"]
        result.kept_newer += task["kept_newer"]
        result.batches += task["batches"]
        result.cpu_s += task["cpu_s"]
    return result


class SparkViewLoader:
    """The ``spark`` engine of :func:`jobs.ctr_cross_features.materialize_cross`: loads each view
    through :func:`write_view` on ``spark``'s executors, signing in to the Redis of
    ``settings`` (:func:`redis_target`)."""

    def __init__(
        self, spark: Any, settings: Settings, *, partitions: int | None = None, check: bool = True
    ) -> None:
        self.spark = spark
        self.target = redis_target(settings)
        self.partitions = partitions
        self.check = check

    def __call__(
        self, store: Any, view: Any, path: Path, start: dt.datetime, end: dt.datetime
    ) -> SparkLoadResult:
        return write_view(
            self.spark,
            store,
            view,
            path,
            start,
            end,
            target=self.target,
            partitions=self.partitions,
            check=self.check,
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from jobs.ctr_cross_features import materialize_cross
    from jobs.ctr_cross_stats import build_session
    from jobs.spark_sessions import active_or_new

    parser = argparse.ArgumentParser(prog="python -m jobs.online_materialize", description=__doc__)
    parser.add_argument("--ds", required=True, help="partition date YYYY-MM-DD")
    parser.add_argument("--source", default="generated", help="impression log source")
    parser.add_argument("--pair", action="append", help="a pair to load (default: every pair)")
    parser.add_argument("--partitions", type=int, help="Spark partitions (default: task slots)")
    args = parser.parse_args(argv)
    settings = load_settings()
    app = "cascade.online_materialize"
    with active_or_new(lambda: build_session(settings, app=app)) as spark:
        loader = SparkViewLoader(spark, settings, partitions=args.partitions)
        summary = materialize_cross(
            args.ds,
            settings=settings,
            source=args.source,
            engine="spark",
            pairs=args.pair,
            loader=loader,
        )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
