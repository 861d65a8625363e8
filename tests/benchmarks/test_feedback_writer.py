"""The feedback writer benchmark's smoke run: both layouts timed, the same rows read back."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks import feedback_writer


def test_both_layouts_are_timed_and_read_back_the_same_rows(tmp_path: Path) -> None:
    out = tmp_path / "feedback.json"
    feedback_writer.main(
        [
            "--requests",
            "30",
            "--candidates",
            "40",
            "--items",
            "60",
            "--repeats",
            "2",
            "--out",
            str(out),
        ]  # fmt: skip
    )
    result = json.loads(out.read_text())
    assert result["same_rows"] is True
    assert set(result["cpu_ms_per_request"]) == {"copied", "by_reference"}
    for layout in feedback_writer.LAYOUTS:
        runs = result[f"{layout}_cpu_ms_per_request_runs"]
        assert len(runs) == 2 and all(math.isfinite(v) and v > 0 for v in runs)
        assert result["spread"][f"{layout}_cpu_ms_per_request"]["n"] == 2
    assert math.isfinite(result["copied_over_by_reference"])
    assert result["git_commit"] and result["input_digest"] and result["repeats"] == 2
