"""The capacity plan's arithmetic, and docs/scaling.md quoting what the code computes."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.capacity import Day, Measured, plan
from cascade.config import REPO_ROOT


def test_plan_numbers_and_what_bounds_it() -> None:
    result = plan()
    assert result["spark_core_us_per_row"] == 7.4
    assert result["spark_executors"] == 62 and result["bound"] == "spark_cross_stats"
    assert result["materialize_writers"] == 5
    assert result["redis_bytes_per_row"] == 391 and result["redis_maxmemory_gib"] == 55
    assert result["serving_replicas"] == 9 and result["celery_workers"] == 2
    # Twice the peak needs twice the replicas; a 10x faster server makes serving need one.
    assert plan(day=replace(Day(), peak_requests_per_s=20_000))["serving_replicas"] == 18
    assert plan(replace(Measured(), serving_requests_per_s=19_050))["serving_replicas"] == 1
    # A 1-day window instead of 30 shrinks Spark below serving: the bound moves.
    assert plan(day=replace(Day(), window_days=1))["bound"] == "serving"


def test_the_doc_quotes_the_plan() -> None:
    text = (REPO_ROOT / "docs" / "scaling.md").read_text()
    result = plan()
    for figure in (
        f"{result['spark_core_hours']} core-hours",
        f"{result['spark_cores']} cores = {result['spark_executors']} executors",
        f"{result['materialize_writer_hours']} writer-hours",
        f"{result['materialize_writers']} writers",
        f"{result['redis_bytes_per_row']} B per feature row",
        f"{result['redis_live_gib']} GiB live",
        f"{result['redis_maxmemory_gib']} GiB",
        f"{result['serving_requests_per_s_per_replica']:,} requests/s per replica",
        f"{result['serving_replicas']} replicas",
        f"{result['celery_workers']} workers, {result['celery_slots']} slots",
    ):
        assert figure in text.replace("**", ""), figure
