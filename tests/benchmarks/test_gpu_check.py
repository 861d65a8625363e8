"""The GPU check's ``--quick`` mode on the CPU (gloo): every model trains on its fixed batch
through DeepSpeed and the loss falls, each trainer's own loop runs, the request path compiles
(``aot_eager``) to the eager scores, and the JSON carries every key with its provenance. The
full mode is for a CUDA device (``docs/results/gpu_check.json`` holds one run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from benchmarks.gpu_check import plan_for
from benchmarks.provenance import non_finite
from cascade.config import REPO_ROOT
from cascade.training.launch import extension_build_env

TRAINING_KEYS = {
    "precision",
    "zero_stage",
    "optimizer",
    "deepspeed_config",
    "parameters",
    "engine_device",
    "batch_size",
    "warmup_steps",
    "timed_steps",
    "step_ms_runs",
    "steps_per_s",
    "samples_per_s",
    "loss_first",
    "loss_last",
    "loss_fell",
    "peak_memory_bytes",
    "flops_per_step",
    "achieved_tflops",
    "mfu",
    "trainer_loop",
}


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpu_check")
    out = tmp / "gpu_check.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CASCADE_HOME": str(tmp / "home")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    # The launcher's shared cache: DeepSpeed's CPU comm extension compiles once, not per test.
    extension_build_env(env)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(json.loads(out.read_text()))


def trained(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "preranking": result["preranking"],
        "asr": result["asr"],
        "multimodal": result["multimodal"]["as_trained"],
    }


@pytest.mark.slow
def test_every_model_trains_through_deepspeed_and_its_loss_falls(
    quick_result: dict[str, Any],
) -> None:
    plan = plan_for(quick=True)
    assert quick_result["environment"]["backend"] == "gloo"
    for name, model in trained(quick_result).items():
        assert "error" not in model, (name, model.get("traceback"))
        assert TRAINING_KEYS <= set(model), (name, TRAINING_KEYS - set(model))
        assert model["timed_steps"] == plan.timed_steps
        assert len(model["losses"]) == plan.total_steps
        assert model["steps_per_s"] > 0 and model["samples_per_s"] > 0
        assert model["loss_fell"] and model["loss_last"] < model["loss_first"], name
        assert model["flops_per_step"] > 0 and model["mfu"] > 0
        assert model["peak_memory_bytes"] is None  # no CUDA device here
        assert model["trainer_loop"]["ok"], (name, model["trainer_loop"])
    assert quick_result["asr"]["trainer_loop"]["steps"] == {
        "fp32": plan.loop_steps,
        "qat": plan.loop_steps,
    }
    multimodal = quick_result["multimodal"]["as_trained"]
    assert multimodal["mfu_6nd"] > 0
    assert multimodal["precision"] == "fp32"  # the trainer's config has no bf16 section
    assert 0.0 <= multimodal["retrieval_metrics"]["i2t_recall_at_1"] <= 1.0


@pytest.mark.slow
def test_collectives_the_compiled_request_path_and_provenance(
    quick_result: dict[str, Any],
) -> None:
    collectives = quick_result["collectives"]
    assert collectives["collective_device"] == "cpu"
    assert collectives["all_reduced_helper"] == {"ok": True, "value": 1.5}
    inductor = quick_result["inductor"]
    assert "1000 candidates" in inductor["request"] and inductor["eager_ms"] > 0
    compiled = inductor["aot_eager"]
    assert "error" not in compiled, compiled.get("traceback")
    assert compiled["max_abs_diff_vs_eager"] < 1e-4 and compiled["ms"] > 0
    for key in ("machine", "git_commit", "input_digest", "spread", "seconds"):
        assert key in quick_result
    assert "preranking.step_ms" in quick_result["spread"]
    assert non_finite(quick_result) == []
