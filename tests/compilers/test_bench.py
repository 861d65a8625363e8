"""`cascade bench compilers --quick` runs end to end and reports what it measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cascade.bench import BENCHMARKS, run_benchmark


def test_compilers_benchmark_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    assert BENCHMARKS["compilers"] == "compilers.bench:run"
    result = run_benchmark("compilers", tmp_path / "out.json", quick=True)
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["benchmark"] == "compilers" and written["quick"] is True
    assert set(written["sizes"]) == {"1x100", "1x1000"}
    assert all(entry["eager_ms"] > 0 for entry in written["sizes"].values())
    assert result["shapes_tried"] >= 20
    assert result["passes"]["share_broadcast_computation"]["fired"] > 0
    # The exact passes keep the ranking; RSQ int8 is measured, not assumed.
    assert abs(result["passes_graph_auc_delta"]) < 1e-3
    assert math.isfinite(result["rsq_int8_auc_delta"])
    assert 0.5 < result["eager_auc"] <= 1.0
