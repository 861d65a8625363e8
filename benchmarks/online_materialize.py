"""Materialization into Feast's Redis online store: the ``bulk`` engine (one process) beside the
``spark`` engine (the executors of a Spark session) on the same pair partition.

    SPARK_LOCAL_IP=127.0.0.1 cascade bench online-materialize \\
        --rows 1000000 --master 'local[2]' --repeats 2 --out /tmp/online_materialize.json

A ``user_cat`` partition of ``--rows`` keys in the cross-statistics job's schema (15 features,
~15% of the values missing, written as ``--files`` parquet files as Spark writes a partition) is
loaded into a private Redis of the cluster stack (free port, generated password) by each engine
in turn, ``--repeats`` rounds, the order alternating, the database emptied before each load (so
every load writes every key). ``rows_per_s``: feature rows written per second of writing
(:func:`jobs.ctr_cross_features.materialize_cross`'s ``rows / write_s``: Feast's apply excluded;
for ``spark`` the Spark job's wall time, scan included). ``cpu_us_per_row``: CPU time of this
process, the Spark JVM and (``spark``) the executors' Python workers, per row, and
``redis_cpu_us_per_row`` the Redis server's: on a machine whose cores are busy with other work
the wall-clock figures say little about what more cores would give, the CPU figures do. Each
run's figures are kept; the median is reported per engine. The Spark session's start and the
Python workers' first imports happen in an untimed warm-up load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.stopping import Stopped, stop_on_signals
from cascade.config import FeatureStoreSettings, Settings
from cascade.data_services import redis_connection, redis_password_file
from cascade.lake import Lake
from cascade.state import write_secret
from jobs import ctr_cross_features as cf
from jobs import ctr_cross_stats as job
from jobs.online_materialize import SparkViewLoader
from jobs.spark_sessions import UTC_MICROS, build_session

DS = "2026-11-22"
PAIR = "user_cat"


def write_pair_partition(lake: Lake, rows: int, files: int, seed: int = 7, ds: str = DS) -> Path:
    """``rows`` distinct ``user_cat`` keys with the job's feature columns, in ``files`` files,
    as partition ``ds`` (refused when that partition exists)."""
    pair = next(p for p in job.CrossStatsConfig().pairs if p.name == PAIR)
    where = job.CrossLake(lake, "generated").pair(pair, ds)
    where.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for part, ids in enumerate(np.array_split(np.arange(rows), files)):
        n = len(ids)
        columns: dict[str, pa.Array] = {
            "user_id": pa.array(ids // 20, pa.int64()),
            "item_category": pa.array([f"cat-{i % 20}" for i in ids]),
            job.TIMESTAMP: pa.array([job.ds_midnight(ds)] * n, pa.timestamp("us", tz="UTC")),
        }
        for column in job.feature_columns(pair, (1, 7, 30)):
            gone = rng.random(n) < 0.15
            if "_imp_" in column or "_clk_" in column:
                columns[column] = pa.array(rng.integers(0, 5_000, n), pa.int64(), mask=gone)
            else:
                columns[column] = pa.array(rng.random(n), pa.float64(), mask=gone)
        pq.write_table(pa.table(columns), where / f"part-{part:05d}.parquet")
    return where


def _imports(_: int) -> int:
    import feast.infra.online_stores.redis  # noqa: F401
    import feast.utils  # noqa: F401

    return os.getpid()


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc``."""
    times = proc.cpu_times()
    return times.user + times.system


def spark_jvm(root: psutil.Process) -> psutil.Process:
    """The Spark driver's JVM (local mode: the executors too), a child of this process."""
    for proc in root.children(recursive=True):
        if proc.name() == "java":
            return proc
    raise RuntimeError("no Spark JVM under this process")


class RecordingLoader(SparkViewLoader):
    """The spark engine's loader, keeping each view's result (its tasks' CPU seconds)."""

    results: list[Any]

    def __call__(
        self, store: Any, view: Any, path: Path, start: dt.datetime, end: dt.datetime
    ) -> Any:
        result = super().__call__(store, view, path, start, end)
        self.results.append(result)
        return result


def redis_server(port: int) -> psutil.Process:
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "redis-server" and f":{port}" in " ".join(
            proc.info["cmdline"] or []
        ):
            return proc
    raise RuntimeError(f"no redis-server on port {port}")


def settings_over_stack(stack: Settings, home: Path, password: str | None = None) -> Settings:
    """The cluster profile in state folder ``home`` (its own lake and file registry) over the
    Redis of the private stack ``stack``: the stack's password file copied into ``home``, where
    executors read it (or ``password`` written there instead)."""
    (home / "feast").mkdir(parents=True, exist_ok=True)
    settings = Settings(
        home=home,
        profile="cluster",
        ports=stack.ports,
        feature_store=FeatureStoreSettings(
            feast_registry_url=f"sqlite:///{home / 'feast' / 'registry.db'}"
        ),
    )
    secret = redis_password_file(stack).read_text() if password is None else password + "\n"
    write_secret(redis_password_file(settings), secret)
    return settings


def bench(rows: int, master: str, repeats: int, files: int) -> dict[str, Any]:
    import redis

    from infra.stack import private_stack

    with tempfile.TemporaryDirectory(prefix="online-materialize-") as tmp:
        home = Path(tmp) / "home"
        stack_env = {"CASCADE_PROFILE": "cluster"}
        with private_stack(Path(tmp) / "stack", services=("redis",), env=stack_env) as stack:
            settings = settings_over_stack(stack, home)
            write_pair_partition(Lake(settings.lake_root), rows, files)
            password = redis_connection(stack).split("password=", 1)[1]
            client = redis.Redis(host=stack.host, port=stack.ports.redis, password=password)
            spark = build_session(
                "cascade.bench.online_materialize",
                master=master,
                conf={"spark.ui.showConsoleProgress": "false", **UTC_MICROS},
                local_ip="127.0.0.1",
                python_workers=True,
                log_level="ERROR",
            )
            loader = RecordingLoader(spark, settings)
            loader.results = []
            runs: dict[str, list[float]] = {"bulk": [], "spark": []}
            cpu: dict[str, list[float]] = {"bulk": [], "spark": []}
            redis_cpu: dict[str, list[float]] = {"bulk": [], "spark": []}
            me, server = psutil.Process(), redis_server(stack.ports.redis)
            jvm = spark_jvm(me)
            tasks: list[str] = []

            def load(engine: str) -> dict[str, Any]:
                client.flushdb()
                return cf.materialize_cross(
                    DS,
                    settings=settings,
                    pairs=[PAIR],
                    engine=engine,
                    loader=loader if engine == "spark" else None,
                )

            try:
                # Untimed: the executors' Python workers import Feast (reused by the loads).
                slots = spark.sparkContext.defaultParallelism
                spark.sparkContext.parallelize(range(slots), slots).map(_imports).collect()
                order = ["spark", "bulk"]
                for round_ in range(repeats):
                    for engine in order if round_ % 2 else reversed(order):
                        started = time.perf_counter()
                        before = cpu_s(me) + cpu_s(jvm), cpu_s(server)
                        loader.results.clear()
                        result = load(engine)
                        # The executors' Python workers report their own CPU time.
                        workers = sum(r.cpu_s for r in loader.results)
                        used = cpu_s(me) + cpu_s(jvm) + workers - before[0]
                        cpu[engine].append(used / rows * 1e6)
                        redis_cpu[engine].append((cpu_s(server) - before[1]) / rows * 1e6)
                        if result["rows"] != rows:
                            raise RuntimeError(f"{engine} wrote {result['rows']} of {rows} rows")
                        runs[engine].append(result["rows_per_s"])
                        print(
                            f"[bench online] {engine}: {result['rows_per_s']:,.0f} rows/s "
                            f"({time.perf_counter() - started:.1f} s)",
                            flush=True,
                        )
                        if engine == "spark":
                            tasks = result.get("writer_dirs", [])
            finally:
                client.flushdb()
                client.close()
                spark.stop()
    medians = {engine: statistics.median(values) for engine, values in runs.items()}
    return {
        "benchmark": "online_materialize",
        "pair": PAIR,
        "rows": rows,
        "files": files,
        "master": master,
        "cpus": os.cpu_count(),
        "repeats": repeats,
        "rows_per_s": medians,
        "rows_per_s_runs": runs,
        "spark_over_bulk": medians["spark"] / medians["bulk"],
        "cpu_us_per_row": {e: statistics.median(v) for e, v in cpu.items()},
        "redis_cpu_us_per_row": {e: statistics.median(v) for e, v in redis_cpu.items()},
        "load_average_1m": os.getloadavg()[0],
        "spark_writer_dirs": tasks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        with stop_on_signals("bench online-materialize"):  # its private Redis is stopped too
            result = bench(args.rows, args.master, args.repeats, args.files)
    except Stopped as stopped:
        raise SystemExit(stopped.exit_code) from None
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
