"""Training curves on disk (what ``dvc plots show`` draws): one CSV per phase, and a resumed
phase's file is the one an uninterrupted run writes."""

from __future__ import annotations

import csv
from pathlib import Path

from cascade.training.curves import CurveLog


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


def test_a_resumed_phase_drops_the_killed_attempts_rows_past_its_checkpoint(
    tmp_path: Path,
) -> None:
    first = CurveLog(tmp_path)
    for step in (10, 20, 30):
        first.add(step, {"loss": 1.0 / step, "acc": 0.5}, phase="fp32")
    first.add(10, {"loss": 2.0}, phase="qat")
    # The attempt died after step 30; the retry resumes from the checkpoint at step 20.
    resumed = CurveLog(tmp_path)
    resumed.add(30, {"loss": 0.03, "acc": float("nan"), "extra": 1.0}, phase="fp32")
    resumed.add(40, {"loss": 0.025}, phase="fp32")
    assert _rows(tmp_path / "curves" / "fp32.csv") == [
        ["step", "acc", "loss"],
        ["10", "0.5", "0.1"],
        ["20", "0.5", "0.05"],
        ["30", "", "0.03"],
        ["40", "", "0.025"],
    ]
    assert _rows(tmp_path / "curves" / "qat.csv") == [["step", "loss"], ["10", "2.0"]]
