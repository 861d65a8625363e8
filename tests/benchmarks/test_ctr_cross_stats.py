"""``cascade bench ctr --quick`` end to end on a tiny generated log (smoke test)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.ctr_cross_stats import ctr_repeats, interleaved, log_folder, spark_cores
from benchmarks.registry import BENCHMARKS, run_benchmark


def test_variants_alternate_so_neither_always_runs_first() -> None:
    calls: list[str] = []

    def variant(name: str, seconds: float) -> Callable[[], float]:
        def run() -> float:
            calls.append(name)
            return seconds

        return run

    a, b = interleaved(variant("spark", 2.0), variant("duckdb", 1.0), repeats=4, warmup=True)

    warmup, timed = calls[:2], calls[2:]
    assert warmup == ["spark", "duckdb"]
    assert timed == ["spark", "duckdb", "duckdb", "spark", "spark", "duckdb", "duckdb", "spark"]
    assert a == [2.0] * 4 and b == [1.0] * 4


@pytest.mark.parametrize(
    ("master", "cores"), [("local[2]", 2), ("local[4, 3]", 4), ("local", 1), ("local[*]", None)]
)
def test_duckdb_gets_as_many_threads_as_spark_has_cores(master: str, cores: int | None) -> None:
    assert spark_cores(master) == (cores or os.cpu_count())


def test_every_size_is_repeated_alike_and_ctr_s_own_option_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CASCADE_BENCH_CTR_REPEATS", raising=False)
    monkeypatch.delenv("CASCADE_BENCH_REPEATS", raising=False)
    assert ctr_repeats(quick=False) == 3 and ctr_repeats(quick=True) == 1
    monkeypatch.setenv("CASCADE_BENCH_REPEATS", "5")  # --repeats given to every benchmark
    assert ctr_repeats(quick=False) == 5 and ctr_repeats(quick=True) == 5
    monkeypatch.setenv("CASCADE_BENCH_CTR_REPEATS", "2")  # cascade bench ctr --repeats 2
    assert ctr_repeats(quick=False) == 2


@pytest.mark.spark
@pytest.mark.slow
def test_quick_bench_writes_the_promised_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    # Smaller than --quick's 100k so the smoke test stays well under 30 s on a loaded machine.
    monkeypatch.setenv("CASCADE_BENCH_CTR_SIZES", "20000")
    out = tmp_path / "ctr.json"

    result = run_benchmark("ctr", out, quick=True)

    assert BENCHMARKS["ctr"] == "benchmarks.ctr_cross_stats:bench_ctr"
    written = json.loads(out.read_text())
    (size,) = written["sizes"]
    assert size["impressions"] == 20000 and result["sizes"][0]["impressions"] == 20000
    for key in ("job_s", "scan_s", "ratio", "rows_per_s", "peak_rss_mb"):
        assert size[key] > 0, key
    # pandas does less than the job, and the key says so; it is no peer.
    assert size["pandas_fixed_prior_counts_s"] > 0 and "no prior fit" in size["pandas_work"]
    assert "reference_s" not in size
    assert size["ratio"] == pytest.approx(size["job_s"] / size["scan_s"])
    # The DuckDB peer ran beside the job on as many threads as local[2] has cores.
    assert size["duckdb_s"] > 0 and size["duckdb_threads"] == 2
    assert size["spark_vs_duckdb"] == pytest.approx(size["job_s"] / size["duckdb_s"])
    assert written["spark_vs_duckdb"] == {"20000": size["spark_vs_duckdb"]}
    assert size["repeats"] == 1 and size["duckdb_s_runs"] == [size["duckdb_s"]]
    assert size["job_s_min"] == size["job_s"] == size["job_s_max"]
    assert size["duckdb_same_rows"] is True and size["duckdb_peak_rss_mb"] > 0
    # The floor is the pair with the most feature rows, and costs less than the whole job.
    rows = size["feature_rows"]
    assert rows[size["one_pair_count_pair"]] == max(rows.values())
    assert 0 < size["one_pair_count_s"] < size["job_s"]
    assert size["one_pair_count_ratio"] == pytest.approx(size["one_pair_count_s"] / size["scan_s"])
    assert size["quarantined_rows"] == 0
    # The pipeline ran from the landed log through the gate into the online store (bulk).
    steps = size["pipeline_steps_s"]
    assert list(steps) == ["stats", "validate", "feast"] and min(steps.values()) > 0
    assert size["pipeline_s"] == pytest.approx(sum(steps.values()), abs=0.05)
    assert size["pipeline_gate_passed"] is True and size["materialize_engine"] == "bulk"
    assert size["pipeline_gate_failed"] == [] and size["pipeline_skipped_because"] is None
    assert size["materialize_rows"] == sum(rows.values())
    assert size["materialize_rows_per_s"] == pytest.approx(
        size["materialize_rows"] / size["materialize_s"]
    )
    assert size["feature_rows"]["seg_cat"] == 16 * 24  # every segment x category is seen
    learned = size["learned_cross"]
    assert learned["pairs"] == size["feature_rows"]["user_cat"]
    assert 0 < learned["learned"]["rmse"] < 1 and learned["storage_saving"] < 1
    # The log sits in the folder named by its generator's digest, which the JSON records.
    log, digest = log_folder(tmp_path / "home" / "lake" / "bench" / "impressions", 20000)
    assert (log / "_SUCCESS").is_file() and size["log"] == str(log)
    assert size["input_digest"] == digest and written["input_digest"] != digest
    assert written["repeats"] == 1 and written["spread"]["sizes.0.job_s"]["n"] == 1


def test_every_pipeline_outcome_reports_the_same_keys() -> None:
    from benchmarks.ctr_cross_stats import PIPELINE_KEYS, pipeline_result

    skipped = pipeline_result(pipeline_skipped_because="above the maximum")
    failed = pipeline_result(pipeline_gate_passed=False, pipeline_gate_failed=["dctr_7d"])
    for outcome in (skipped, failed):
        assert tuple(outcome) == PIPELINE_KEYS
        assert outcome["pipeline_s"] is None and outcome["materialize_rows_per_s"] is None
    assert failed["pipeline_gate_failed"] == ["dctr_7d"]
    with pytest.raises(KeyError, match="not pipeline keys"):
        pipeline_result(pipeline_seconds=1.0)
