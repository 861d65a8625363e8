"""``cascade bench serving --quick``: the private stack, the real server and the load
generator run end to end and report the figures the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.registry import BENCHMARKS, OPTIONS, run_benchmark

pytestmark = pytest.mark.slow


def test_quick_serving_benchmark_reports_latency_without_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The seconds-long first network: the FSCD champion is served in the e2e pipeline run.
    monkeypatch.setenv("CASCADE_BENCH_SERVING_MODEL", "mlp")
    assert BENCHMARKS["serving"] == "benchmarks.serving_load:run"
    assert set(OPTIONS["serving"]) == {"candidates", "clients", "seconds", "workers"}
    out = tmp_path / "serving.json"
    result = run_benchmark(
        "serving",
        out,
        quick=True,
        options={"candidates": "200", "clients": "2", "seconds": "1", "workers": "1"},
    )
    assert json.loads(out.read_text())["benchmark"] == "serving"
    for key in ("p50_ms", "p99_ms", "rps", "errors", "candidates", "clients", "duration_s"):
        assert key in result, key
    assert result["errors"] == 0 and result["requests"] > 10
    assert (result["candidates"], result["clients"], result["workers"]) == (200, 2, 1)
    assert 0 < result["p50_ms"] <= result["p99_ms"] and result["rps"] > 0
    assert result["machine"]["cpus"] >= 1 and result["warmup_s"] > 0
    assert result["bad_requests_all_4xx"], result["bad_request_status"]
    assert result["setup"]["model_version"] == "1" and result["setup"]["model"] == "mlp"
    assert result["backend"] == "eager-shared"  # a PreRanker: no compiled package to load
    # Every candidate of every good answer (warm-up included) was logged, none lost at stop.
    assert result["setup"]["feedback_logging"]
    assert result["feedback_rows_expected"] == result["answered_total"] * 200 > 0
    assert result["feedback_complete"], (result["feedback_rows_logged"], result["answered_total"])
