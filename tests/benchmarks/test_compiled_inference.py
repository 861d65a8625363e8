"""`cascade bench compilers --quick` runs end to end and reports what it measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.registry import BENCHMARKS, run_benchmark


def test_compilers_benchmark_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    assert BENCHMARKS["compilers"] == "benchmarks.compiled_inference:run"
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


@pytest.mark.slow
def test_fscd_table_compares_the_deployed_network_and_its_package(tmp_path: Path) -> None:
    from benchmarks.compiled_fscd import fscd_compile_table

    table = fscd_compile_table(
        tmp_path,
        sizes=(50,),
        shapes=(1, 3, 17, 200),
        rows=3_000,
        variants=("eager_rows", "eager", "cascade", "cascade_bf16"),
        rounds=1,
        repeats=2,
        fast_build=True,
    )
    entry = table["sizes"]["1x50"]
    assert entry["eager_ms"] > 0 and entry["cascade_ms"] > 0 and entry["eager_rows_ms"] > 0
    assert entry["speedup_vs_eager"] == pytest.approx(entry["eager_ms"] / entry["cascade_ms"])
    # Exact compilation: the ranking does not move; one package serves every candidate count.
    assert (
        abs(table["auc_delta"]["cascade"]) < 1e-6 and abs(table["auc_delta"]["eager_rows"]) < 1e-6
    )
    assert table["recompiles"]["cascade"] == {"compiles": 1, "recompiles": 0}
    # The bf16 package moves the ranking by rounding only, and says which layers it converted.
    assert abs(table["auc_delta"]["cascade_bf16"]) < 0.01
    assert entry["bf16_speedup_vs_eager"] == pytest.approx(
        entry["eager_ms"] / entry["cascade_bf16_ms"]
    )
    assert table["bf16_gemm"]["bf16_layers"] >= 1
    assert table["shapes_tried"] == 4 and table["requests"] > 10
    assert 0.5 < table["eager_auc"] <= 1.0
    assert table["passes"]["share_broadcast_computation"]["fired"] >= 0


def test_headline_table_puts_the_deployed_network_on_top() -> None:
    from benchmarks.compiled_inference import headline_table

    sizes = {
        "1x1000": {"eager_ms": 0.3, "cascade_ms": 0.1, "speedup_vs_eager": 3.0},
        "1x10000": {"eager_ms": 3.0, "cascade_ms": 0.75, "speedup_vs_eager": 4.0},
    }
    fscd = {
        "sizes": sizes,
        "auc_delta": {"cascade": 0.0, "cascade_bf16": 2e-5},
        "recompiles": {"cascade": {"compiles": 1, "recompiles": 0}},
        "shapes_tried": 21,
        "compile_s": {"cascade": 6.0},
        "passes": {"fuse_memory_bound_chains": {"fired": 1}},
    }
    mlp = {"threads": 1, "eager_ms": 2.0, "sizes": {}}
    table = headline_table(fscd, mlp=mlp)
    # The keys come from the largest size of the deployed network, not the MLP's.
    assert table["network"] == "fscd" and table["eager_ms"] == 3.0
    assert table["speedup_vs_eager"] == 4.0 and table["cascade_ms"] == 0.75
    assert table["auc_delta"] == 0.0 and table["bf16_auc_delta"] == 2e-5
    assert table["auc_deltas"] == fscd["auc_delta"] and table["mlp"] is mlp
    for key in ("recompiles", "shapes_tried", "compile_s", "passes", "sizes"):
        assert table[key] == fscd[key]
