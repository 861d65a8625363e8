"""The capacity plan of ``docs/scaling.md``, as code: measured per-row and per-request costs in,
executors, writers, Redis memory and replicas out.

    python -m benchmarks.capacity            # the plan's table for the default day
    python -m benchmarks.capacity --json

Each input is a figure measured on the 2-core development machine, named with the command that
measured it; the estimates that are not measured say so. ``tests/benchmarks/test_capacity.py``
keeps the doc's numbers and the manifests' replica counts equal to what this computes.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Measured:
    """Per-row and per-request costs measured on 2 cores (medians)."""

    cross_job_s: float = 111.0
    """``cascade bench ctr-features --impressions 30000000``: the cross statistics job, 30M
    impressions (the whole 30-day window), ``local[2]`` (docs/benchmarks.md)."""
    cross_job_rows: int = 30_000_000
    cross_job_cores: int = 2
    feature_rows_per_impression: float = 8.8 / 10
    """Same command at 10M impressions: 8.8M feature rows (docs/benchmarks.md)."""
    materialize_rows_per_s: float = 6_300.0
    """``cascade bench ctr-features --impressions 1000000 --repeats 3``
    (``materialize_rows_per_s``: one writer encoding Feast's keys and values, 1.9M rows); the
    run behind docs/benchmarks.md's DuckDB paragraph."""
    serving_requests_per_s: float = 1_905.0
    """``cascade bench serving --candidates 1000 --clients 8``: two server processes on 2
    cores, 1 user x 1,000 candidates, features included (an earlier run; the published one is
    the ``serving`` block of docs/benchmarks.md)."""
    serving_cores: int = 2
    features_per_row: int = 15
    """Features per cross feature row (the ``ctr_cross`` pair views)."""


@dataclass(frozen=True)
class Day:
    """The day to plan for."""

    impressions: int = 1_000_000_000
    feature_rows: int = 100_000_000
    peak_requests_per_s: float = 10_000.0
    window_days: int = 30
    """The longest window of the cross statistics: the job rescans this many days of log."""
    job_window_s: float = 3_600.0
    """Wall time the daily Spark job may take: one hour from ``ctr_cross``'s 02:00 start, so the
    pre-ranker its published partition starts is trained and deployed in the morning."""
    materialize_window_s: float = 3_600.0
    """Wall time the online store's load may take."""


@dataclass(frozen=True)
class Assumptions:
    """Not measured here: stated, so the plan can be redone when they are."""

    spark_efficiency: float = 0.5
    """Fraction of the 2-core per-row rate a distributed executor core keeps (network shuffle
    instead of a local one)."""
    executor_cores: int = 2
    """Cores per executor (``infra/k8s/spark-applications.yaml``)."""
    serving_utilization: float = 0.6
    """Replicas run at this fraction of their measured throughput at peak (p99 headroom)."""
    redis_key_bytes: int = 63
    """Feast's serialized composite key (two int64 entity values, names, project)."""
    redis_key_overhead_bytes: int = 56
    """Redis' dict entry, object header and allocator rounding per key."""
    redis_field_bytes: int = 17
    """One field of the key's hash as a listpack entry: 4-byte feature-name hash, a 9-byte
    double ValueProto, about 2 bytes of entry overhead each."""
    redis_fragmentation: float = 1.5
    """Allocator fragmentation and headroom for rewrites (maxmemory above the live set)."""
    pipelines: int = 5
    """DAGs that may run at once (``max_active_runs=1`` each; a run's steps are a chain)."""
    celery_concurrency: int = 4
    """Task slots per Celery worker (``infra/k8s/airflow-values.yaml``)."""


def plan(
    measured: Measured | None = None, day: Day | None = None, assume: Assumptions | None = None
) -> dict[str, float | int | str]:
    """The plan: each figure with the arithmetic of ``docs/scaling.md``."""
    m, d, a = measured or Measured(), day or Day(), assume or Assumptions()
    core_us_per_row = m.cross_job_s * m.cross_job_cores / m.cross_job_rows * 1e6
    rows_scanned = d.impressions * d.window_days
    spark_core_s = rows_scanned * core_us_per_row / 1e6
    spark_cores = spark_core_s / (d.job_window_s * a.spark_efficiency)
    executors = math.ceil(spark_cores / a.executor_cores)

    writer_s = d.feature_rows / m.materialize_rows_per_s
    writers = math.ceil(writer_s / d.materialize_window_s)

    row_bytes = (
        a.redis_key_bytes
        + a.redis_key_overhead_bytes
        + a.redis_field_bytes * (m.features_per_row + 1)
    )
    live_gib = d.feature_rows * row_bytes / 2**30
    maxmemory_gib = math.ceil(live_gib * a.redis_fragmentation)

    per_replica = m.serving_requests_per_s * a.serving_utilization
    replicas = math.ceil(d.peak_requests_per_s / per_replica)

    celery_workers = max(2, math.ceil(a.pipelines / a.celery_concurrency))
    bound = (
        "spark_cross_stats"
        if executors * a.executor_cores > replicas * m.serving_cores
        else ("serving")
    )
    return {
        "spark_core_us_per_row": round(core_us_per_row, 2),
        "spark_rows_scanned": rows_scanned,
        "spark_core_hours": round(spark_core_s / 3600, 1),
        "spark_cores": round(spark_cores, 1),
        "spark_executors": executors,
        "materialize_writer_hours": round(writer_s / 3600, 2),
        "materialize_writers": writers,
        "redis_bytes_per_row": row_bytes,
        "redis_live_gib": round(live_gib, 1),
        "redis_maxmemory_gib": maxmemory_gib,
        "serving_requests_per_s_per_replica": round(per_replica),
        "serving_replicas": replicas,
        "serving_cores": replicas * m.serving_cores,
        "celery_workers": celery_workers,
        "celery_slots": celery_workers * a.celery_concurrency,
        "bound": bound,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="the plan as JSON")
    args = parser.parse_args(argv)
    result = plan()
    if args.json:
        print(
            json.dumps(
                {
                    "plan": result,
                    "measured": asdict(Measured()),
                    "day": asdict(Day()),
                    "assumptions": asdict(Assumptions()),
                },
                indent=2,
            )
        )
    else:
        for key, value in result.items():
            print(f"{key:<36} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
