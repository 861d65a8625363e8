"""The deployment gate passes a faithful artifact and blocks a broken one with its reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.compiled_inference import train_quickly
from compilers import gate
from compilers.gate import held_out_requests
from models.preranking.model import PreRanker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained() -> tuple[PreRanker, list[gate.Request]]:
    """A small pre-ranker with a real click signal and 40 held-out requests."""
    model, test = train_quickly(2_000, "debug", epochs=1)
    return model, held_out_requests(test)[:40]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compile for the module: later gate calls copy the package from here."""
    return tmp_path_factory.mktemp("compile-cache")


def run_gate(
    trained: tuple[PreRanker, list[gate.Request]], cache_dir: Path, out: Path, **limits: Any
) -> dict[str, Any]:
    model, sample = trained
    return gate.compile_gate(
        model, sample, out_dir=out, cache_dir=cache_dir, fast_build=True, **limits
    )


def test_gate_passes_a_faithful_artifact(
    trained: tuple[PreRanker, list[gate.Request]], cache_dir: Path, tmp_path: Path
) -> None:
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=0.5)
    assert result["passed"], result["reasons"]
    assert result["reasons"] == []
    assert Path(result["artifact"]).stat().st_size > 0
    assert result["max_abs_diff"] < 1e-4
    assert abs(result["auc_delta"]) < 1e-6 and 0.5 < result["eager_auc"] <= 1.0
    assert result["speedup_vs_eager"] > 0 and result["artifact_ms"] > 0
    assert result["passes"]["share_broadcast_computation"]["fired"] > 0


def test_gate_blocks_a_broken_artifact_with_readable_reasons(
    trained: tuple[PreRanker, list[gate.Request]],
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_load = gate.load_package

    def broken_load(path: Path) -> Callable[..., torch.Tensor]:
        run = real_load(path)
        # A miscompiled artifact: scores shifted and their order scrambled.
        return lambda *inputs: -run(*inputs) + 0.5

    monkeypatch.setattr(gate, "load_package", broken_load)
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=0.5)
    assert result["passed"] is False
    parity = [r for r in result["reasons"] if r.startswith("parity:")]
    accuracy = [r for r in result["reasons"] if r.startswith("accuracy:")]
    assert len(parity) == 1 and "above the tolerance" in parity[0]
    assert len(accuracy) == 1 and "beyond the budget of 0.0010" in accuracy[0]
    assert result["auc_delta"] < -0.001


def test_gate_blocks_a_non_finite_artifact(
    trained: tuple[PreRanker, list[gate.Request]],
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_load = gate.load_package

    def nan_load(path: Path) -> Callable[..., torch.Tensor]:
        run = real_load(path)
        return lambda *inputs: run(*inputs) * float("nan")

    monkeypatch.setattr(gate, "load_package", nan_load)
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=0.5)
    assert not result["passed"]
    assert any("non-finite scores" in r for r in result["reasons"])


def test_gate_blocks_a_slow_artifact(
    trained: tuple[PreRanker, list[gate.Request]], cache_dir: Path, tmp_path: Path
) -> None:
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=1e6)
    assert not result["passed"]
    (reason,) = result["reasons"]
    assert reason.startswith("latency:") and "below the required 1000000.00x" in reason


def test_gate_rejects_unusable_samples(
    trained: tuple[PreRanker, list[gate.Request]], cache_dir: Path, tmp_path: Path
) -> None:
    model, sample = trained
    with pytest.raises(ValueError, match="non-empty held-out sample"):
        gate.compile_gate(model, [], out_dir=tmp_path)
    inputs, labels = sample[0]
    with pytest.raises(ValueError, match="labels; they must be equal"):
        gate.compile_gate(model, [(inputs, labels[:-1])], out_dir=tmp_path)
    one_class = [(inputs, np.zeros_like(labels)) for inputs, labels in sample]
    result = gate.compile_gate(
        model, one_class, out_dir=tmp_path, cache_dir=cache_dir, fast_build=True, min_speedup=0.5
    )
    assert not result["passed"]
    assert any("single class" in r for r in result["reasons"])
