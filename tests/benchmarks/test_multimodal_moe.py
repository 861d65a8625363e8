"""The multimodal benchmark's wiring: registration, the corpus figures' guard, MFU only on CUDA
and against the peak of the training's dtype, recall on held-out templates, the dense-vs-MoE
table's arithmetic, and a ``--quick`` smoke run (one training process, a tiny corpus bench)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.multimodal_moe import (
    CORPUS_RESULT_ENV,
    PEAK_FLOPS,
    PEAK_FLOPS_FP32,
    corpus_figures,
    heldout_figures,
    mfu,
    mfu_details,
    training_dtype,
)
from benchmarks.provenance import non_finite
from benchmarks.registry import BENCHMARKS, OPTIONS, run_benchmark
from models.multimodal.config_registry import dense_twin, get_config
from models.multimodal.evaluate import side_by_side
from models.multimodal.model import parameter_counts
from models.multimodal.train import build_model


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
    monkeypatch.setenv("CASCADE_BENCH_MULTIMODAL_SKIP", "corpus")  # a smoke run: none at all
    figures = corpus_figures(tmp_path, quick=True)
    assert figures["pairs_per_s"] is None and "MULTIMODAL_SKIP=corpus" in figures["corpus_note"]


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


def test_mfu_divides_by_the_peak_of_the_dtype_the_training_ran_in() -> None:
    # The configs train in fp32 (no bf16 in their DeepSpeed config): the fp32 peak applies.
    assert training_dtype("debug") == training_dtype("base") == "fp32"
    device = "NVIDIA H100 80GB HBM3"
    details = mfu_details("debug", {"dense": 10.0, "moe": 8.0}, 2, device)
    assert details["mfu_dtype"] == "fp32" and details["mfu_peak_flops"] == PEAK_FLOPS_FP32["H100"]
    dense = dense_twin(get_config("debug"))
    tokens = dense.batch_size * (dense.model.patches + 2 * dense.model.max_tokens)
    active = parameter_counts(build_model(dense, 1))["active"]
    assert details["mfu"] == pytest.approx(6 * active * tokens * 10.0 / (67e12 * 2))
    assert PEAK_FLOPS["H100"] / PEAK_FLOPS_FP32["H100"] > 10  # the bf16 peak would hide 15x
    assert 0 < details["mfu_moe"] and "fp32" in details["mfu_note"]
    unknown = mfu_details("debug", {"dense": 10.0, "moe": 8.0}, 2, "Tesla T4")
    assert unknown["mfu"] is None and "no fp32 peak known" in unknown["mfu_note"]
    cpu = mfu_details("debug", {"dense": 10.0, "moe": 8.0}, 2, None)
    assert cpu["mfu"] is None and cpu["mfu_note"] == "no CUDA device: MFU not measured"


def test_heldout_template_figures_need_generated_pairs() -> None:
    on_corpus = heldout_figures("/data/corpus", {}, {})
    assert on_corpus["recall_at_1_heldout_templates"] is None
    assert "no template split" in on_corpus["heldout_templates_note"]
    with pytest.raises(RuntimeError, match="heldout_templates"):
        heldout_figures(None, {"i2t_recall_at_1": 0.5}, {})
    moe = {"heldout_templates_i2t_recall_at_1": 0.2, "heldout_templates_t2i_recall_at_1": 0.4}
    dense = {"heldout_templates_i2t_recall_at_1": 0.1, "heldout_templates_t2i_recall_at_1": 0.1}
    figures = heldout_figures(None, moe | {"heldout_templates_eval_pairs": 40.0}, dense)
    assert figures["recall_at_1_heldout_templates"] == pytest.approx(0.3)
    assert figures["dense_recall_at_1_heldout_templates"] == pytest.approx(0.1)
    assert "red square" in figures["heldout_templates"]


SMOKE_KEYS = (
    "moe_vs_dense_throughput", "moe_steps_per_s", "dense_steps_per_s", "moe_steps_per_s_runs",
    "dense_steps_per_s_runs", "moe_vs_dense_throughput_runs", "throughput_order", "repeats",
    "model_digest", "model_provenance", "recall_at_1_i2t", "recall_at_1_t2i", "recall_at_5_i2t",
    "recall_at_5_t2i", "dense_recall_at_1", "recall_heldout_templates_i2t",
    "recall_heldout_templates_t2i", "recall_at_1_heldout_templates",
    "dense_recall_at_1_heldout_templates", "expert_load_cv", "tokens_dropped", "mfu", "mfu_dtype",
    "mfu_note", "pairs_per_s", "quarantined", "duplicates_removed", "corpus_note", "side_by_side",
    "skipped", "git_commit", "input_digest", "machine", "spread",
)  # fmt: skip


def test_quick_run_writes_every_key_with_finite_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cascade bench multimodal --quick`` end to end, shrunk: one training process (no
    multi-process launch), two timed rounds, no corpus benchmark (its Spark session is
    ``bench multimodal-corpus``'s to measure; named in ``skipped``); no stack."""
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", "http://127.0.0.1:9")  # nothing listens: unused
    monkeypatch.setenv("CASCADE_TRAIN_PROCESSES", "1")
    monkeypatch.setenv("CASCADE_BENCH_REPEATS", "2")
    monkeypatch.setenv("CASCADE_BENCH_MULTIMODAL_SKIP", "corpus")
    monkeypatch.delenv(CORPUS_RESULT_ENV, raising=False)
    monkeypatch.delenv("CASCADE_BENCH_MULTIMODAL_CORPUS", raising=False)
    out = tmp_path / "multimodal.json"
    run_benchmark("multimodal", out, quick=True)
    result = json.loads(out.read_text())
    assert not set(SMOKE_KEYS) - set(result), set(SMOKE_KEYS) - set(result)
    assert non_finite(result) == []
    assert result["config"] == "debug" and result["throughput_order"] == ["moe", "dense"]
    assert len(result["moe_steps_per_s_runs"]) == len(result["dense_steps_per_s_runs"]) == 2
    assert result["spread"]["moe_vs_dense_throughput"]["n"] == 2
    assert result["moe_vs_dense_throughput"] > 0
    assert set(result["skipped"]) == {"corpus"} and result["pairs_per_s"] is None
    assert result["corpus_note"].startswith("skipped")
    for key in ("recall_at_1_i2t", "recall_heldout_templates_i2t", "dense_recall_at_1"):
        assert 0.0 <= result[key] <= 1.0
    assert result["heldout_templates_pairs"] > 0
    assert result["model_digest"].startswith("sha256:")
    if not torch.cuda.is_available():
        assert result["mfu"] is None and result["mfu_dtype"] == "fp32"
