"""ASR compilation: one export for every length, int8 that matches its fake-quant reference,
fp32 packages that match eager, ONNX Runtime that matches eager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compilers.asr import (
    INT8_PASSES,
    asr_dynamic_shapes,
    asr_example,
    fake_quant_model,
    int8_context,
)
from compilers.export import compile_graph
from models.asr.artifact import load_artifact
from models.asr.compiled import (
    FP32_FILE,
    INT8_FILE,
    MAX_FRAMES,
    MIN_FRAMES,
    ONNX_FILE,
    REPORT_FILE,
    load_compiled,
    model_digest,
    onnxruntime_asr,
)
from tests.asr_models import TINY, tiny_artifact

LENGTHS = (MIN_FRAMES, 9, 37, 100, 401, MAX_FRAMES)


def test_calibrated_ranges_name_every_conv_and_linear() -> None:
    ranges = tiny_artifact(quantized=True).quantization["activation_ranges"]  # type: ignore[index]
    assert set(ranges) == {
        "front.0", "front.3", "output",
        *(f"blocks.{b}.{layer}" for b in range(2) for layer in ("affine", "project", "memory")),
    }  # fmt: skip
    assert all(value > 0 for value in ranges.values())


def test_int8_graph_uses_the_model_files_ranges_and_matches_the_fake_quant_model() -> None:
    artifact = tiny_artifact(quantized=True)
    context = int8_context(artifact, None)
    graph = compile_graph(
        artifact.model,
        asr_example(TINY.n_mels),
        asr_dynamic_shapes(),
        passes=INT8_PASSES,
        context=context,
        reexport=False,
    )
    rsq = graph.report.to_dict()["passes"]["rsq_quantize"]
    assert rsq["fired"] == 9 and rsq["ranges_from_model"] == 9 and rsq["calibrated"] == 0
    reference = fake_quant_model(artifact.model, artifact.quantization or {})
    for frames in (MIN_FRAMES, 123, 800):
        (x,) = asr_example(TINY.n_mels, frames, seed=frames)
        with torch.no_grad():
            expected, got, fp32 = reference(x), graph.graph_module(x), artifact.model(x)
        # The graph runs the int8 GEMM pattern as float ops (dequantized operands), the
        # reference sums the integers first: a product landing on a rounding tie can move the
        # next layer's activation by one step, so a few values may differ by a step's effect.
        gap = (got - expected).abs()
        assert gap.max() < 0.03 and (gap > 2e-3).float().mean() < 0.02, float(gap.max())
        # and the quantization is real: int8 differs from fp32 by more than rounding
        assert (expected - fp32).abs().max() > 1e-3


def test_float_model_needs_calibration_for_int8() -> None:
    with pytest.raises(ValueError, match="calibration"):
        int8_context(tiny_artifact(quantized=False), None)
    context = int8_context(tiny_artifact(quantized=False), [asr_example(TINY.n_mels, 200)[0]])
    assert context.rsq_input_ranges is None and len(context.calibration_inputs or []) == 1


@pytest.mark.slow
def test_packages_and_onnx_serve_every_length_and_match(compiled_asr_dir: Path) -> None:
    report = json.loads((compiled_asr_dir / REPORT_FILE).read_text())
    assert report["model_digest"] == model_digest(compiled_asr_dir)
    assert report["int8"]["passes"]["rsq_quantize"]["fired"] == 9
    assert report["int8"]["passes"]["rsq_quantize"]["ranges_from_model"] == 9
    artifact = load_artifact(compiled_asr_dir)
    model = artifact.model
    reference = fake_quant_model(model, artifact.quantization or {})
    fp32 = load_compiled(compiled_asr_dir / FP32_FILE, model.config)
    int8 = load_compiled(compiled_asr_dir / INT8_FILE, model.config)
    ort = onnxruntime_asr(compiled_asr_dir / ONNX_FILE, model.config)
    for frames in LENGTHS:  # one package each: any failure is a length it cannot serve
        (x,) = asr_example(TINY.n_mels, frames, seed=frames)
        with torch.no_grad():
            eager, fake = model(x), reference(x)
        torch.testing.assert_close(fp32(x), eager, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ort(x), eager, atol=1e-4, rtol=1e-4)
        got = int8(x)
        assert got.shape == eager.shape
        # int8 GEMMs round differently from float fake-quant on a few values: compare the
        # log-probs loosely and the decoded path (argmax) tightly.
        assert (got - fake).abs().max() < 0.05
        assert (got.argmax(-1) == fake.argmax(-1)).float().mean() >= 0.98
    with pytest.raises(ValueError, match="outside the compiled range"):
        int8(asr_example(TINY.n_mels, MIN_FRAMES - 1)[0])
