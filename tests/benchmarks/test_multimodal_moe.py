"""The multimodal benchmark's wiring: registration, the corpus figures' guard, MFU only on CUDA,
and the dense-vs-MoE table's arithmetic (the runs themselves are covered by the training test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.multimodal_moe import CORPUS_RESULT_ENV, corpus_figures, mfu
from benchmarks.registry import BENCHMARKS, OPTIONS
from models.multimodal.evaluate import side_by_side


def test_registered_with_its_options() -> None:
    assert BENCHMARKS["multimodal"] == "benchmarks.multimodal_moe:run"
    assert set(OPTIONS["multimodal"]) == {"config", "corpus"}


def test_corpus_figures_are_none_with_a_reason_without_the_corpus_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CORPUS_RESULT_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "benchmarks.multimodal_corpus", None)  # import fails
    figures = corpus_figures(tmp_path, quick=True)
    assert figures["pairs_per_s"] is None and figures["duplicates_removed"] is None
    assert (
        "not importable" in figures["corpus_note"] and CORPUS_RESULT_ENV in figures["corpus_note"]
    )

    given = tmp_path / "corpus.json"
    given.write_text(json.dumps({"pairs_per_s": 812.5, "quarantined": 7, "duplicates_removed": 3}))
    monkeypatch.setenv(CORPUS_RESULT_ENV, str(given))
    figures = corpus_figures(tmp_path, quick=True)
    assert (figures["pairs_per_s"], figures["quarantined"], figures["duplicates_removed"]) == (
        812.5,
        7,
        3,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_mfu_is_not_measured_without_cuda() -> None:
    assert mfu("debug", 10.0, 2) is None


def test_side_by_side_reports_recall_per_compute() -> None:
    def result(name: str, r1: float, flops: float, seconds: float) -> dict[str, object]:
        return {
            "config": name,
            "i2t_recall_at_1": r1,
            "t2i_recall_at_1": r1,
            "i2t_recall_at_5": 1.0,
            "t2i_recall_at_5": 1.0,
            "active_params": 100,
            "total_params": 400 if name == "moe" else 100,
            "train_seconds": seconds,
            "train_flops": flops,
            "final_loss": 1.0,
        }

    table = side_by_side(result("moe", 0.6, 2e15, 30.0), result("dense", 0.4, 2e15, 20.0))
    assert table["moe"]["recall_at_1_per_pflop"] == pytest.approx(0.3)
    assert table["moe_over_dense_recall_at_1"] == pytest.approx(1.5)
    assert table["moe_over_dense_recall_at_1_per_second"] == pytest.approx((0.6 / 30) / (0.4 / 20))
