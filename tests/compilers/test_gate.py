"""The deployment gate passes a faithful artifact and blocks a broken one with its reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from compilers import gate
from compilers.preranking_gate import cold_gate_sample
from domains.ctr.schema import LABEL
from models.preranking.config_registry import cascade_debug
from models.preranking.fields import FieldEncoder
from models.preranking.model import ColdPreRanker
from models.preranking.synthetic_data import synthetic_training_frame
from models.preranking.training_set import time_split

pytestmark = pytest.mark.slow

Trained = tuple[ColdPreRanker, list[Any]]


@pytest.fixture(scope="module")
def trained() -> Trained:
    """The FSCD pre-ranker's network over a few fields, fitted for one epoch of plain Adam on
    synthetic impressions with a click signal (so a scrambled artifact changes the AUC), and 40
    held-out requests."""
    frame = synthetic_training_frame(3_000, users=60, items=120, seed=1)
    train, test = time_split(frame, 0.3)
    config = cascade_debug()
    encoder = FieldEncoder(bins=config.bins).fit(train)
    torch.manual_seed(0)
    fields = ("user_id", "user_ctr", "item_id", "genre", "item_ctr", "ug_ctr")
    model = ColdPreRanker(config.net, fields, encoder.cardinalities())
    codes = encoder.encode(train)
    labels = torch.from_numpy(train[LABEL].to_numpy(np.float32))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for index in torch.randperm(len(labels), generator=torch.Generator().manual_seed(0)).split(256):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(codes[index]), labels[index]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), cold_gate_sample(test, encoder, max_users=40)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compile for the module: later gate calls copy the package from here."""
    return tmp_path_factory.mktemp("compile-cache")


def run_gate(trained: Trained, cache_dir: Path, out: Path, **limits: Any) -> dict[str, Any]:
    model, sample = trained
    return gate.compile_cold_gate(
        model, sample, out_dir=out, cache_dir=cache_dir, fast_build=True, **limits
    )


def test_gate_passes_a_faithful_artifact(trained: Trained, cache_dir: Path, tmp_path: Path) -> None:
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=0.01)
    assert result["passed"], result["reasons"]
    assert result["reasons"] == []
    assert Path(result["artifact"]).stat().st_size > 0
    assert result["max_abs_diff"] < 1e-4
    assert abs(result["auc_delta"]) < 1e-6 and 0.5 < result["eager_auc"] <= 1.0
    assert result["speedup_vs_eager"] > 0 and result["artifact_ms"] > 0


def test_gate_blocks_a_broken_artifact_with_readable_reasons(
    trained: Trained, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_load = gate.load_package

    def broken_load(path: Path) -> Callable[..., torch.Tensor]:
        run = real_load(path)
        # A miscompiled artifact: scores shifted and their order reversed.
        return lambda *inputs: -run(*inputs) + 0.5

    monkeypatch.setattr(gate, "load_package", broken_load)
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=0.01)
    assert result["passed"] is False
    parity = [r for r in result["reasons"] if r.startswith("parity:")]
    accuracy = [r for r in result["reasons"] if r.startswith("accuracy:")]
    assert len(parity) == 1 and "above the tolerance" in parity[0]
    assert len(accuracy) == 1 and "beyond the budget of 0.0010" in accuracy[0]
    assert result["auc_delta"] < -0.001


def test_gate_blocks_a_non_finite_artifact(
    trained: Trained, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_load = gate.load_package

    def nan_load(path: Path) -> Callable[..., torch.Tensor]:
        run = real_load(path)
        return lambda *inputs: run(*inputs) * float("nan")

    monkeypatch.setattr(gate, "load_package", nan_load)
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=0.01)
    assert not result["passed"]
    assert any("non-finite scores" in r for r in result["reasons"])


def test_gate_blocks_a_slow_artifact(trained: Trained, cache_dir: Path, tmp_path: Path) -> None:
    result = run_gate(trained, cache_dir, tmp_path, min_speedup=1e6)
    assert not result["passed"]
    (reason,) = result["reasons"]
    assert reason.startswith("latency:") and "below the required 1000000.00x" in reason


def test_gate_rejects_unusable_samples(trained: Trained, cache_dir: Path, tmp_path: Path) -> None:
    model, sample = trained
    with pytest.raises(ValueError, match="non-empty held-out sample"):
        gate.compile_cold_gate(model, [], out_dir=tmp_path)
    inputs, labels = sample[0]
    with pytest.raises(ValueError, match="candidates, .* labels"):
        gate.compile_cold_gate(model, [(inputs, labels[:-1])], out_dir=tmp_path)
    one_class = [(inputs, np.zeros_like(labels)) for inputs, labels in sample]
    result = gate.compile_cold_gate(
        model, one_class, out_dir=tmp_path, cache_dir=cache_dir, fast_build=True, min_speedup=0.01
    )
    assert not result["passed"]
    assert any("single class" in r for r in result["reasons"])
