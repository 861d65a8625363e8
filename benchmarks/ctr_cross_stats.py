"""Benchmark of the cross statistics engine against a plain scan and a pandas reference.

    cascade bench ctr --out bench-results/ctr.json            # 1M, 10M, 30M impressions
    cascade bench ctr --out /tmp/ctr.json --quick             # ~100k, a smoke run
    CASCADE_BENCH_CTR_SIZES=1000000,10000000 cascade bench ctr --out FILE

Per size, in one Spark session on ``local[2]`` (the default master): generate the log if it is
not in ``<lake>/bench/impressions/`` yet (:mod:`jobs.impression_log`, seed 7), then time

* ``scan_s``: read every column of the input and drop it (Spark's ``noop`` sink: the plain
  cost of a full scan), and ``count_s``: read + count (Spark answers from parquet metadata);
* ``job_s``: :func:`jobs.ctr_cross_stats.run` (all default pairs x 1/7/30 d, priors, writes);
* ``reference_s``: the same counts and smoothed CTRs in pandas on one core (only up to
  ``REFERENCE_MAX_ROWS``; the time includes reading the parquet);
* ``one_pair_count_s``: read the input, group it by the keys of the pair with the most feature
  rows and count (one shuffle and one hash aggregation, no windows, no writes), under the
  job's aggregation options. No exact cross statistic on Spark costs less than this for that
  pair alone; ``one_pair_count_ratio`` is it over ``scan_s``, the floor of ``ratio``.

At the smallest size the learned cross features (:mod:`jobs.ctr_learned_cross`) are fitted
on the job's ``user_cat`` output (30-day smoothed CTR) and scored on held-out pairs:
``learned_cross`` holds their storage saving against the explicit table and their error
(RMSE, Spearman) predicting the held-out explicit statistic, beside the additive baseline.

``materialize_rows_per_s``: the job's partition (every pair) loaded into a fresh local
online store by :func:`cascade.feature_store.materialize_cross` (bulk path,
:mod:`cascade.online_bulk`): feature rows written per second of writing (Feast's apply
excluded), once per size up to ``MATERIALIZE_MAX_IMPRESSIONS`` (null above).

``ratio = job_s / scan_s``; ``ns_per_row`` per size and its growth from the smallest to the
largest size; ``peak_rss_mb`` is the peak resident memory of this process plus the Spark JVM
(sampled every 0.2 s during the job). Medians over ``repeats`` runs.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from cascade.config import Settings, load_settings
from cascade.feature_store import materialize_cross
from compilers.timing import median_seconds
from jobs import ctr_cross_stats as job
from jobs import impression_log
from jobs.spark_sessions import active_or_new

DS = "2026-11-22"
FULL_SIZES = (1_000_000, 10_000_000, 30_000_000)
QUICK_SIZES = (100_000,)
LEARNED_PAIR = ("user_cat", ("user_id", "item_category"))
"""The pair whose explicit statistic the learned cross features try to predict."""
MATERIALIZE_MAX_IMPRESSIONS = 1_000_000
"""Above this the online-store load (minutes at SQLite's pace) is skipped and reported null."""
REFERENCE_MAX_ROWS = 10_000_000
"""pandas holds the whole log in memory; above this it is skipped (and reported as null)."""


class PeakMemory:
    """Samples the RSS of this process and its children (the Spark JVM) in a thread."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:  # a child may exit between listing and reading
                    pass
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def pandas_reference(path: Path, config: job.CrossStatsConfig) -> int:
    """Counts and smoothed CTRs per pair and window in pandas; returns output rows.

    The prior here is the pooled mean with a fixed strength (the reference measures the cost
    of the aggregation, not the prior fit).
    """
    import numpy as np
    import pandas as pd

    frame = pd.read_parquet(path)
    cutoff = pd.Timestamp(job.ds_midnight(DS))
    age = (cutoff - frame["event_timestamp"]).dt.total_seconds() / 86_400
    frame = frame[(age > 0) & (age <= max(config.windows))].copy()
    age = age[frame.index]
    for w in config.windows:
        inside = (age <= w).to_numpy()
        frame[f"imp_{w}"] = inside.astype(np.int64)
        frame[f"clk_{w}"] = inside * frame["click"].to_numpy()
    sums = [c for w in config.windows for c in (f"imp_{w}", f"clk_{w}")]
    rows = 0
    for pair in config.pairs:
        grouped = frame.groupby(list(pair.keys), sort=False)[sums].sum()
        for w in config.windows:
            mean = grouped[f"clk_{w}"].sum() / max(1, grouped[f"imp_{w}"].sum())
            grouped[f"ctr_{w}"] = (grouped[f"clk_{w}"] + 20 * mean) / (grouped[f"imp_{w}"] + 20)
        rows += len(grouped)
    return rows


def learned_cross_scores(features: Path) -> dict[str, Any]:
    """Fit and score :mod:`jobs.ctr_learned_cross` on one pair's written features."""
    import pandas as pd

    from jobs import ctr_learned_cross as learned

    pair, keys = LEARNED_PAIR
    frame = pd.read_parquet(features)
    return learned.evaluate(
        frame,
        keys=keys,
        target=f"{pair}_ctr_30d",
        weight=f"{pair}_imp_30d",
        config=learned.LearnedCrossConfig(),
    )


def bench_ctr(out: Path, quick: bool) -> dict[str, Any]:
    """``cascade bench ctr``: see the module docstring."""
    from pyspark.sql import functions as F

    settings = load_settings()
    sizes = settings.bench.ctr_sizes or (QUICK_SIZES if quick else FULL_SIZES)
    inputs = settings.lake_root / "bench" / "impressions"
    config = job.CrossStatsConfig()
    results: list[dict[str, Any]] = []
    # A session that was already running (a caller's, a test's) is reused and left running.
    with active_or_new(lambda: job.build_session(settings, app="cascade.bench.ctr")) as spark:
        for n in sizes:
            log = inputs / f"n={n}_seed=7"
            generated_s = None
            if not (log / "_SUCCESS").is_file():
                started = time.perf_counter()
                impression_log.write(spark, impression_log.GeneratorConfig(impressions=n), log)
                generated_s = time.perf_counter() - started
            repeats = 1 if quick or n > 1_000_000 else 3
            warmup = 0 if quick else 1

            def scan(path: Path = log) -> None:
                spark.read.parquet(str(path)).write.format("noop").mode("overwrite").save()

            def count(path: Path = log) -> None:
                spark.read.parquet(str(path)).select(F.count(F.lit(1))).collect()

            scan_s = median_seconds(scan, repeats=repeats, warmup=1)
            count_s = median_seconds(count, repeats=repeats, warmup=0)
            summary: dict[str, Any] = {}
            with tempfile.TemporaryDirectory(prefix="ctr-bench-") as home:

                def run_job(
                    path: Path = log, home: str = home, summary: dict[str, Any] = summary
                ) -> None:
                    summary.update(
                        job.run(
                            DS,
                            source="generated",
                            log_path=path,
                            spark=spark,
                            config=config,
                            settings=Settings(home=Path(home)),
                        )
                    )

                with PeakMemory() as memory:
                    job_s = median_seconds(run_job, repeats=repeats, warmup=warmup)
                materialized: dict[str, Any] = {}
                if n <= MATERIALIZE_MAX_IMPRESSIONS:
                    materialized = materialize_cross(DS, settings=Settings(home=Path(home)))
                learned_cross = None
                if n == min(sizes) and LEARNED_PAIR[0] in summary.get("paths", {}):
                    learned_cross = learned_cross_scores(Path(summary["paths"][LEARNED_PAIR[0]]))
            floor_pair = next(
                p for p in config.pairs if p.name == max(summary["rows"], key=summary["rows"].get)
            )

            def one_pair_count(path: Path = log, keys: tuple[str, ...] = floor_pair.keys) -> None:
                counted = spark.read.parquet(str(path)).groupBy(*keys).count()
                counted.write.format("noop").mode("overwrite").save()

            with job.sql_conf(spark, job.aggregate_conf(config)):
                one_pair_count_s = median_seconds(one_pair_count, repeats=repeats, warmup=warmup)
            reference_s = None
            if n <= REFERENCE_MAX_ROWS:
                reference_s = median_seconds(
                    lambda path=log: pandas_reference(path, config), repeats=1, warmup=0
                )
            result = {
                "impressions": n,
                "generated_s": generated_s,
                "repeats": repeats,
                "job_s": job_s,
                "scan_s": scan_s,
                "count_s": count_s,
                "ratio": job_s / scan_s,
                "rows_per_s": n / job_s,
                "ns_per_row": job_s / n * 1e9,
                "peak_rss_mb": memory.peak_bytes / 2**20,
                "one_pair_count_s": one_pair_count_s,
                "one_pair_count_pair": floor_pair.name,
                "one_pair_count_ratio": one_pair_count_s / scan_s,
                "reference_s": reference_s,
                "reference": "pandas (1 core)" if reference_s is not None else None,
                "quarantined_rows": summary.get("quarantined_rows"),
                "feature_rows": summary.get("rows"),
                "materialize_rows": materialized.get("rows"),
                "materialize_s": materialized.get("write_s"),
                "materialize_rows_per_s": materialized.get("rows_per_s"),
                "learned_cross": learned_cross,
            }
            print(f"[bench ctr] {result}", flush=True)
            results.append(result)
    first, last = results[0], results[-1]
    return {
        "benchmark": "ctr",
        "ds": DS,
        "spark_master": settings.spark_master,
        "pairs": [p.name for p in config.pairs],
        "windows_days": list(config.windows),
        "sizes": results,
        "ns_per_row_growth": last["ns_per_row"] / first["ns_per_row"] - 1.0,
        "quick": quick,
    }
