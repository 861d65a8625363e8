"""``cascade bench ctr --quick`` end to end on a tiny generated log (smoke test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.registry import BENCHMARKS, run_benchmark

pytestmark = [pytest.mark.spark, pytest.mark.slow]


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
    for key in ("job_s", "scan_s", "ratio", "rows_per_s", "peak_rss_mb", "reference_s"):
        assert size[key] > 0, key
    assert size["ratio"] == pytest.approx(size["job_s"] / size["scan_s"])
    # The floor is the pair with the most feature rows, and costs less than the whole job.
    rows = size["feature_rows"]
    assert rows[size["one_pair_count_pair"]] == max(rows.values())
    assert 0 < size["one_pair_count_s"] < size["job_s"]
    assert size["one_pair_count_ratio"] == pytest.approx(size["one_pair_count_s"] / size["scan_s"])
    assert size["quarantined_rows"] == 0
    # The job's partition went into the online store by the bulk path.
    assert size["materialize_rows"] == sum(rows.values())
    assert size["materialize_rows_per_s"] == pytest.approx(
        size["materialize_rows"] / size["materialize_s"]
    )
    assert size["feature_rows"]["seg_cat"] == 16 * 24  # every segment x category is seen
    learned = size["learned_cross"]
    assert learned["pairs"] == size["feature_rows"]["user_cat"]
    assert 0 < learned["learned"]["rmse"] < 1 and learned["storage_saving"] < 1
    assert (tmp_path / "home" / "lake" / "bench" / "impressions" / "n=20000_seed=7").is_dir()
