"""Benchmark of the cross statistics engine against a plain scan and a DuckDB peer.

    cascade bench ctr --out bench-results/ctr.json            # 1M, 10M, 30M impressions
    cascade bench ctr --out /tmp/ctr.json --quick             # ~100k, a smoke run
    cascade bench ctr-features --impressions 1000000 --repeats 3 --out FILE
    CASCADE_BENCH_CTR_SIZES=1000000,10000000 cascade bench ctr --out FILE

Per size, in one Spark session on ``local[2]`` (the default master): generate the log
(:mod:`jobs.impression_log`, seed 7) unless a previous run left it complete (``_SUCCESS``) in
``<lake>/bench/impressions/<digest>/n=N_seed=7``, the folder named by the digest of the
generator's code and its parameters (:func:`log_folder`): changed generator code or parameters
generate a new log, never reuse one that other code made. That digest is the size's
``input_digest``; the result's ``input_digest`` is one digest over every size's. Then time

* ``scan_s``: read every column of the input and drop it (Spark's ``noop`` sink: the plain
  cost of a full scan), and ``count_s``: read + count (Spark answers from parquet metadata);
* ``job_s``: :func:`jobs.ctr_cross_stats.run` (all default pairs x 1/7/30 d, priors, writes);
* ``duckdb_s``: the same statistics in DuckDB (:mod:`benchmarks.ctr_cross_duckdb`: the same
  rules and quarantine, fitted priors, debiasing, recency, decay, one parquet file per pair, the
  item catalogue; ``duckdb_same_rows``: both wrote as many rows per pair, quarantined rows and
  catalogue items) on
  as many threads as Spark's master has cores, in a child process of its own (timed inside it,
  so neither interpreter start nor imports count; its peak RSS is ``duckdb_peak_rss_mb``).
  ``spark_vs_duckdb = job_s / duckdb_s``. The two alternate (Spark, DuckDB, DuckDB, Spark,
  ...) after one untimed run of each, so neither always runs first; ``job_s_runs`` and
  ``duckdb_s_runs`` hold every timed run, ``*_min`` / ``*_max`` their spread;
* ``pandas_fixed_prior_counts_s``: NOT the same work, for scale only: per pair and window the
  counts and a CTR smoothed with a fixed-strength pooled prior, in pandas on one core (no prior
  fit, debiasing, recency, decay, quarantine or writes; only up to ``REFERENCE_MAX_ROWS``; the
  time includes reading the parquet). The like-for-like peer is DuckDB;
* ``one_pair_count_s``: read the input, group it by the keys of the pair with the most feature
  rows and count (one shuffle and one hash aggregation, no windows, no writes), under the
  job's aggregation options. No exact cross statistic on Spark costs less than this for that
  pair alone; ``one_pair_count_ratio`` is it over ``scan_s``, the floor of ``ratio``.

At the smallest size the learned cross features (:mod:`jobs.ctr_learned_cross`) are fitted
on the job's ``user_cat`` output (30-day smoothed CTR) and scored on held-out pairs:
``learned_cross`` holds their storage saving against the explicit table and their error
(RMSE, Spearman) predicting the held-out explicit statistic, beside the additive baseline.

``pipeline_s``: the ``ctr_cross`` pipeline from the landed log to the online store, once per
size (:func:`pipeline_run`): its ``stats``, ``validate`` (the GX gate) and ``feast`` steps as
the DAG runs them, in a fresh home whose lake holds the log as a landed partition;
``pipeline_steps_s`` splits it. ``materialize_rows_per_s``: that ``feast`` step's load of every
pair into the profile's online store (the local profile: the bulk writer,
:mod:`domains.ctr.online_bulk`, into SQLite): feature rows written per second of writing (Feast's
apply excluded). Both only up to ``PIPELINE_MAX_IMPRESSIONS`` (null above, and
``pipeline_skipped_because`` says so); a run stopped at the gate has ``pipeline_gate_passed``
false and the failed expectations in ``pipeline_gate_failed``. Every outcome reports the same
keys (:data:`PIPELINE_KEYS`).

``ratio = job_s / scan_s``; ``ns_per_row`` per size and its growth from the smallest to the
largest size; ``peak_rss_mb`` is the peak resident memory of this process plus the Spark JVM
(sampled every 0.2 s during the Spark job's runs). Every timed figure is the median of
``repeats`` runs at every size (``--repeats`` / ``CASCADE_BENCH_CTR_REPEATS``, else
``CASCADE_BENCH_REPEATS``, else 3; 1 with ``--quick``), and each size reports its ``repeats``:
a figure of one run is that run, not a median.
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from benchmarks.provenance import bench_repeats, digest_of, input_folder
from cascade.config import Settings, load_settings
from cascade.progress import track
from compilers.timing import median_seconds
from jobs import ctr_cross_stats as job
from jobs import impression_log
from jobs.spark_sessions import active_or_new

DS = "2026-11-22"
FULL_SIZES = (1_000_000, 10_000_000, 30_000_000)
QUICK_SIZES = (100_000,)
LEARNED_PAIR = ("user_cat", ("user_id", "item_category"))
"""The pair whose explicit statistic the learned cross features try to predict."""
PIPELINE_MAX_IMPRESSIONS = 10_000_000
"""Above this the pipeline run is skipped and its figures reported null: its ``feast`` step
loads ~0.9 feature rows per impression into the local SQLite store at ~13,000 rows/s (half an
hour at 30M)."""
REFERENCE_MAX_ROWS = 10_000_000
"""pandas holds the whole log in memory; above this it is skipped (and reported as null)."""
DUCKDB_MEMORY_LIMIT = "4GB"
"""DuckDB's buffer limit in the peer; beyond it the aggregation spills under the work dir."""
REPO_ROOT = Path(__file__).resolve().parents[1]
GENERATOR_MODULES = ("jobs.impression_log",)
"""The code that makes the benchmark's log; its source is part of the log folder's digest."""
DEFAULT_REPEATS = 3
PANDAS_WORK = (
    "pandas on 1 core: counts and fixed-prior smoothed CTRs only (no prior fit, debiasing, "
    "recency, decay, quarantine or writes): not the job's work"
)


def log_folder(inputs: Path, impressions: int) -> tuple[Path, str]:
    """``(folder, input digest)`` of the generated log of ``impressions`` rows: under
    ``inputs``, in a folder named by the digest of :data:`GENERATOR_MODULES`' code and the
    generator's parameters (:func:`benchmarks.provenance.input_folder`)."""
    config = impression_log.GeneratorConfig(impressions=impressions)
    folder, digest = input_folder(inputs, GENERATOR_MODULES, asdict(config))
    return folder / f"n={impressions}_seed={config.seed}", digest


def ctr_repeats(quick: bool) -> int:
    """Timed runs per figure, the same at every size: ``--repeats`` (this benchmark's
    ``CASCADE_BENCH_CTR_REPEATS``), else ``CASCADE_BENCH_REPEATS``, else 3 (1 with ``--quick``)."""
    own = load_settings().bench.ctr_repeats
    return own or bench_repeats(DEFAULT_REPEATS, quick=quick, quick_default=1)


def spark_cores(master: str) -> int:
    """Cores of a ``local[N]`` master (``local``: 1, ``local[*]`` or a cluster: this machine's)."""
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    return int(found.group(1)) if found else os.cpu_count() or 1


def duckdb_peer(log: Path, out: Path, *, threads: int) -> dict[str, Any]:
    """Run :mod:`benchmarks.ctr_cross_duckdb` in a child process; its summary (``seconds``
    timed inside the child, ``peak_rss_mb`` of the child)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "benchmarks.ctr_cross_duckdb",
        f"--log={log}",
        f"--ds={DS}",
        f"--out={out}",
        f"--threads={threads}",
        f"--memory-limit={DUCKDB_MEMORY_LIMIT}",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"the DuckDB peer failed (rc {done.returncode}): {' '.join(command)}\n"
            f"{done.stderr[-4000:]}"
        )
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def duckdb_version() -> str:
    from importlib.metadata import version

    return version("duckdb")


def interleaved(
    first: Callable[[], float], second: Callable[[], float], *, repeats: int, warmup: bool
) -> tuple[list[float], list[float]]:
    """Timed runs of two variants in the order A B B A A B ...: neither always goes first.
    Each callable returns its own duration; with ``warmup`` each runs once untimed first."""
    if warmup:
        first()
        second()
    a: list[float] = []
    b: list[float] = []
    for index in track(range(repeats), desc="bench timed runs", unit="runs"):
        if index % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def spread(name: str, samples: list[float]) -> dict[str, Any]:
    """``name`` (the median), ``name_min``, ``name_max`` and ``name_runs``."""
    return {
        name: statistics.median(samples),
        f"{name}_min": min(samples),
        f"{name}_max": max(samples),
        f"{name}_runs": samples,
    }


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


def pandas_fixed_prior_counts(path: Path, config: job.CrossStatsConfig) -> int:
    """Counts and fixed-prior smoothed CTRs per pair and window in pandas; returns output rows.

    Less than the job's work (see :data:`PANDAS_WORK`): the prior is the pooled mean with a
    fixed strength, nothing is debiased, decayed, quarantined or written.
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


PIPELINE_KEYS = (
    "pipeline_s",
    "pipeline_steps_s",
    "pipeline_gate_passed",
    "pipeline_gate_failed",
    "pipeline_skipped_because",
    "materialize_rows",
    "materialize_s",
    "materialize_rows_per_s",
    "materialize_engine",
)
"""The keys a size's pipeline run reports, whether it ran, stopped at the gate or was skipped
(null where the outcome has no value)."""


def pipeline_result(**values: Any) -> dict[str, Any]:
    """Every key of :data:`PIPELINE_KEYS`, ``values`` given, the others null."""
    unknown = sorted(set(values) - set(PIPELINE_KEYS))
    if unknown:
        raise KeyError(f"not pipeline keys: {unknown}")
    return {key: values.get(key) for key in PIPELINE_KEYS}


def pipeline_run(log: Path, home: Path) -> dict[str, Any]:
    """The ``ctr_cross`` pipeline from a landed log to the online store, once: the log is
    landed (linked) in a fresh home's lake, then its steps ``stats``, ``validate`` (the GX
    gate) and ``feast`` (the pair views applied, the partition loaded online by the profile's
    engine) run as the DAG runs them. ``pipeline_s`` is their sum; ``pipeline_steps_s`` each;
    the ``feast`` step's load gives ``materialize_*``."""
    from cascade.lake import Lake
    from cascade.step_context import StepContext
    from jobs.ctr_cross_stats_gate import GateFailed
    from pipelines import ctr_cross
    from pipelines.ctr_cross import PIPELINE

    settings = Settings(home=home)
    landing = ctr_cross.landing_dir(Lake(settings.lake_root), DS)
    landing.parent.mkdir(parents=True, exist_ok=True)
    landing.symlink_to(log, target_is_directory=True)
    steps: dict[str, float] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for name, step in (
        # One partition is measured: the days before it (its history) are not built.
        ("stats", functools.partial(ctr_cross.stats, history_days=0)),
        ("validate", ctr_cross.validate),
        ("feast", ctr_cross.feast),
    ):
        started = time.perf_counter()
        try:
            summaries[name] = step(StepContext.build(PIPELINE, name, DS, platform=settings))
        except GateFailed as failed:
            # A result too: the run stops at the gate as the DAG would, and says why.
            print(f"[bench ctr] the pipeline stopped at the gate: {failed}", flush=True)
            return pipeline_result(
                pipeline_steps_s=steps,
                pipeline_gate_passed=False,
                pipeline_gate_failed=failed.failed,
            )
        steps[name] = round(time.perf_counter() - started, 2)
        print(f"[bench ctr] pipeline step {name}: {steps[name]} s", flush=True)
    loaded = summaries["feast"]
    return pipeline_result(
        pipeline_s=round(sum(steps.values()), 2),
        pipeline_steps_s=steps,
        pipeline_gate_passed=True,
        pipeline_gate_failed=[],
        materialize_rows=loaded.get("rows"),
        materialize_s=loaded.get("write_s"),
        materialize_rows_per_s=loaded.get("rows_per_s"),
        materialize_engine=loaded.get("engine"),
    )


def bench_ctr(out: Path, quick: bool) -> dict[str, Any]:
    """``cascade bench ctr``: see the module docstring."""
    from pyspark.sql import functions as F

    settings = load_settings()
    sizes = settings.bench.ctr_sizes or (QUICK_SIZES if quick else FULL_SIZES)
    inputs = settings.lake_root / "bench" / "impressions"
    repeats = ctr_repeats(quick)
    config = job.CrossStatsConfig()
    threads = spark_cores(settings.spark_master)
    results: list[dict[str, Any]] = []
    # A session that was already running (a caller's, a test's) is reused and left running.
    with active_or_new(lambda: job.build_session(settings, app="cascade.bench.ctr")) as spark:
        for n in sizes:
            log, log_digest = log_folder(inputs, n)
            generated_s = None
            if not (log / "_SUCCESS").is_file():
                started = time.perf_counter()
                impression_log.write(spark, impression_log.GeneratorConfig(impressions=n), log)
                generated_s = time.perf_counter() - started
            warmup = 0 if quick else 1

            def scan(path: Path = log) -> None:
                spark.read.parquet(str(path)).write.format("noop").mode("overwrite").save()

            def count(path: Path = log) -> None:
                spark.read.parquet(str(path)).select(F.count(F.lit(1))).collect()

            scan_s = median_seconds(scan, repeats=repeats, warmup=1)
            count_s = median_seconds(count, repeats=repeats, warmup=0)
            summary: dict[str, Any] = {}
            duck: dict[str, Any] = {}
            peaks: list[int] = []
            with tempfile.TemporaryDirectory(prefix="ctr-bench-") as home:

                def run_job(
                    path: Path = log,
                    home: str = home,
                    summary: dict[str, Any] = summary,
                    peaks: list[int] = peaks,
                ) -> float:
                    with PeakMemory() as memory:
                        started = time.perf_counter()
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
                        seconds = time.perf_counter() - started
                    peaks.append(memory.peak_bytes)
                    return seconds

                def run_duckdb(
                    path: Path = log, home: str = home, duck: dict[str, Any] = duck
                ) -> float:
                    duck.update(duckdb_peer(path, Path(home) / "duckdb", threads=threads))
                    return float(duck["seconds"])

                job_runs, duckdb_runs = interleaved(
                    run_job, run_duckdb, repeats=repeats, warmup=bool(warmup)
                )
                if n <= PIPELINE_MAX_IMPRESSIONS:
                    pipeline = pipeline_run(log, Path(home) / "pipeline")
                else:
                    pipeline = pipeline_result(
                        pipeline_skipped_because=f"above PIPELINE_MAX_IMPRESSIONS "
                        f"({PIPELINE_MAX_IMPRESSIONS:,} impressions)"
                    )
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
            pandas_runs: list[float] = []
            if n <= REFERENCE_MAX_ROWS:
                for _ in range(repeats):
                    started = time.perf_counter()
                    pandas_fixed_prior_counts(log, config)
                    pandas_runs.append(time.perf_counter() - started)
            job_s = statistics.median(job_runs)
            duckdb_s = statistics.median(duckdb_runs)
            same_work = (
                duck["rows"],
                duck["quarantined_rows"],
                duck["catalogue"]["items"],
            ) == (summary["rows"], summary["quarantined_rows"], summary["catalogue"]["items"])
            if not same_work:
                print(
                    f"[bench ctr] WARNING the DuckDB peer wrote {duck['rows']} rows, quarantined "
                    f"{duck['quarantined_rows']}; Spark {summary['rows']}, "
                    f"{summary['quarantined_rows']}",
                    flush=True,
                )
            result = {
                "impressions": n,
                "input_digest": log_digest,
                "log": str(log),
                "generated_s": generated_s,
                "repeats": repeats,
                **spread("job_s", job_runs),
                **spread("duckdb_s", duckdb_runs),
                "spark_vs_duckdb": job_s / duckdb_s,
                # Per round, Spark's run over the DuckDB run beside it.
                "spark_vs_duckdb_runs": [j / d for j, d in zip(job_runs, duckdb_runs, strict=True)],
                "duckdb_threads": threads,
                "duckdb_memory_limit": DUCKDB_MEMORY_LIMIT,
                "duckdb_peak_rss_mb": duck.get("peak_rss_mb"),
                "duckdb_same_rows": same_work,
                "scan_s": scan_s,
                "count_s": count_s,
                "ratio": job_s / scan_s,
                "rows_per_s": n / job_s,
                "ns_per_row": job_s / n * 1e9,
                "peak_rss_mb": max(peaks) / 2**20,
                "one_pair_count_s": one_pair_count_s,
                "one_pair_count_pair": floor_pair.name,
                "one_pair_count_ratio": one_pair_count_s / scan_s,
                **(
                    spread("pandas_fixed_prior_counts_s", pandas_runs)
                    if pandas_runs
                    else {"pandas_fixed_prior_counts_s": None}
                ),
                "pandas_work": PANDAS_WORK if pandas_runs else None,
                "quarantined_rows": summary.get("quarantined_rows"),
                "feature_rows": summary.get("rows"),
                **pipeline,
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
        "duckdb": f"duckdb {duckdb_version()}, {threads} threads",
        "repeats": repeats,
        "input_digest": digest_of(r["input_digest"] for r in results),
        "spark_vs_duckdb": {str(r["impressions"]): r["spark_vs_duckdb"] for r in results},
        "sizes": results,
        "ns_per_row_growth": last["ns_per_row"] / first["ns_per_row"] - 1.0,
        "quick": quick,
    }
