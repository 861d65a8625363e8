"""``cascade bench preranking --quick``: the benchmark runs end to end and reports sane numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.bench import BENCHMARKS, run_benchmark


def test_quick_preranking_benchmark_writes_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert BENCHMARKS["preranking"] == "models.preranking.bench:run"
    out = tmp_path / "preranking.json"
    result = run_benchmark("preranking", out, quick=True)
    assert json.loads(out.read_text())["benchmark"] == "preranking"
    assert result["config"] == "debug" and result["machine"]["cpus"] >= 1
    assert result["torch_samples_per_s"] > 0 and result["deepspeed_samples_per_s_1proc"] > 0
    assert result["ds_vs_torch_throughput"] == pytest.approx(
        result["deepspeed_samples_per_s_1proc"] / result["torch_samples_per_s"]
    )
    assert result["ds_vs_torch_cpu_time"] > 0
    assert result["throughput_setup"]["zero_stage"] == 0  # the debug config's stage
    assert 0 < result["score_1000_ms"] < 1_000
    assert result["score_1000_shared_speedup"] > 0
