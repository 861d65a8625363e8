"""``benchmarks.kept_trainings``: a long benchmark's trainings reused only at the same commit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from benchmarks import preranking_cross
from benchmarks.kept_trainings import MARKER, KeptTrainings

CLEAN = {"git_commit": "c0ffee", "git_dirty": False}


def trainer(calls: list[Path], run_dir: Path, value: float) -> Any:
    def train() -> dict[str, Any]:
        run_dir.mkdir(parents=True)
        (run_dir / "model.pt").write_text("weights")
        calls.append(run_dir)
        return {"fscd_auc": value, "model_digest": f"sha256:{value}"}

    return train


def test_a_training_is_reused_only_at_the_same_clean_commit_with_the_same_inputs(
    tmp_path: Path,
) -> None:
    run_dir, inputs, calls = tmp_path / "keep" / "arm-seed0", {"config": "c", "seed": 0}, []
    first = KeptTrainings(tmp_path / "keep", state=CLEAN)
    assert first.run(run_dir, inputs, trainer(calls, run_dir, 0.7)) == {
        "fscd_auc": 0.7,
        "model_digest": "sha256:0.7",
    }
    assert json.loads((run_dir / MARKER).read_text())["git_commit"] == "c0ffee"
    again = KeptTrainings(tmp_path / "keep", state=CLEAN)
    assert again.run(run_dir, inputs, trainer(calls, run_dir, 0.1))["fscd_auc"] == 0.7
    assert len(calls) == 1 and again.summary()["reused"] == 1 and again.summary()["trained"] == 0
    # Anything else trains afresh, in an emptied folder.
    for state, other in (
        (CLEAN, {"config": "c", "seed": 1}),
        ({"git_commit": "beef", "git_dirty": False}, inputs),
        ({"git_commit": "c0ffee", "git_dirty": True}, inputs),
    ):
        kept = KeptTrainings(tmp_path / "keep", state=state)
        assert kept.run(run_dir, other, trainer(calls, run_dir, 0.2))["fscd_auc"] == 0.2
        assert kept.summary()["trained"] == 1
    assert len(calls) == 4
    # Without a keep folder nothing is kept or read.
    plain = KeptTrainings(None, state=CLEAN)
    solo = tmp_path / "solo"
    plain.run(solo, inputs, trainer(calls, solo, 0.3))
    assert not (solo / MARKER).exists() and plain.summary()["dir"] is None


def test_a_cross_training_is_kept_per_rows_and_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Path, int]] = []

    def fake(setup: Any, data: Path, fields: Path, run_dir: Path, seed: int, config: Any) -> Any:
        run_dir.mkdir(parents=True)
        calls.append((run_dir, seed))
        return {"fscd_auc": 0.5 + seed, "model_digest": "sha256:x"}

    monkeypatch.setattr(preranking_cross, "_train", fake)
    data, fields = tmp_path / "data.parquet", tmp_path / "fields.json"
    pd.DataFrame({"a": [1, 2, 3]}).to_parquet(data)
    fields.write_text("[]")
    setup, run_dir = preranking_cross.QUICK, tmp_path / "keep" / "with_cross-seed0"

    def train() -> dict[str, Any]:
        kept = KeptTrainings(tmp_path / "keep", state=CLEAN)
        return preranking_cross.train(setup, data, fields, run_dir, 0, kept=kept)

    assert train()["fscd_auc"] == 0.5
    assert train()["fscd_auc"] == 0.5
    assert len(calls) == 1
    # Other rows (the training set built again with other values): trained again.
    pd.DataFrame({"a": [1, 2, 4]}).to_parquet(data)
    train()
    assert len(calls) == 2
    fields.write_text('[{"name": "x"}]')
    train()
    assert len(calls) == 3
