"""Compile the ASR model (ConvDFSMN + CTC) into artifacts that serve 1-20 s of audio unchanged.

    cascade asr compile --model MODEL_DIR [--out MODEL_DIR] [--calibration CORPUS]

``MODEL_DIR`` holds an ``asr_model.pt`` (:mod:`models.asr.artifact`). The command writes beside
it (or into ``--out``):

- ``asr_fp32.pt2``: the exact pass pipeline, packaged with AOTInductor;
- ``asr_int8.pt2``: the same plus RSQ int8 (``rsq_quantize``) of every Conv1d and Linear,
  clipping each layer's input at the range the model file's ``quantization.activation_ranges``
  gives (what quantization-aware training learned) or, for a float model, at ranges calibrated
  on a few utterances of ``--calibration`` (a corpus built by :mod:`jobs.audio_corpus`);
- ``asr.onnx``: the fp32 model for ONNX Runtime (the benchmark's baseline);
- ``asr_compiled.json``: the pass reports, build times and the digest of the ``asr_model.pt``
  the artifacts were built from (serving refuses artifacts of another model file).

One export covers every length: the time axis is ``Dim("frames")`` from :data:`MIN_FRAMES` to
:data:`MAX_FRAMES` (:class:`~domains.speech.audio_features.CorpusConfig` ``max_seconds`` of
audio), batch 1 (serving transcribes one utterance per request).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from compilers.export import INT8_INDUCTOR_CONFIG, Artifact, package_artifact
from compilers.passes.rsq_arithmetic import rsq_levels
from compilers.pipeline import DEFAULT_PASSES, PASS_ORDER, PassContext
from models.asr.artifact import AsrArtifact
from models.asr.compiled import (
    FP32_FILE,
    INT8_FILE,
    MAX_FRAMES,
    MIN_AUDIO_FRAMES,
    MIN_FRAMES,
    ONNX_FILE,
    REPORT_FILE,
    model_digest,
)
from models.asr.model import ConvDFSMN
from models.asr.rsq import quantize_weight

INT8_PASSES: tuple[str, ...] = tuple(
    sorted({*DEFAULT_PASSES, "rsq_quantize"} - {"winograd_conv1d"}, key=PASS_ORDER.index)
)
"""The int8 pipeline: Winograd would turn the 3-tap front-end conv into matmuls that RSQ does
not quantize, so the quantized graph keeps every Conv1d a convolution."""


ASR_WINOGRAD = "never"
"""Winograd F(2,3) stays off for the ASR graphs: its 2-frame tiling of a symbolic length leaves
a guard (``T <= 2 * ((T + 1) // 2)``) that export cannot prove over the whole ``frames`` range,
so re-exporting failed wherever "auto" found it faster (it did with 2 threads, not with 1)."""


def asr_dynamic_shapes() -> tuple[dict[int, Any]]:
    """Batch 1, a dynamic number of frames."""
    return ({1: Dim("frames", min=MIN_FRAMES, max=MAX_FRAMES)},)


def asr_example(n_mels: int, frames: int = 400, *, seed: int = 0) -> tuple[torch.Tensor]:
    """Random log-mel-like features ``[1, frames, n_mels]`` (export traces, never scores them)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, frames, n_mels, generator=generator) * 2 - 6,)


# --- quantization: ranges and the eager reference ----------------------------------------------

QUANTIZED_LAYERS = (nn.Conv1d, nn.Linear)


@torch.no_grad()
def calibrate_activation_ranges(
    model: ConvDFSMN, batches: Sequence[torch.Tensor]
) -> dict[str, float]:
    """Module path -> largest input magnitude of every Conv1d and Linear over ``batches``
    (feature tensors ``[B, T, n_mels]``): the ``activation_ranges`` of a model file's
    ``quantization`` for a model trained without quantization awareness."""
    ranges: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, QUANTIZED_LAYERS):

            def record(_module: nn.Module, inputs: tuple[torch.Tensor, ...], name: str = name):
                ranges[name] = max(ranges.get(name, 0.0), float(inputs[0].abs().max()))

            hooks.append(module.register_forward_pre_hook(record))
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            model(batch)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return ranges


def _fold_batch_norms(module: nn.Module) -> None:
    """Conv1d followed by BatchNorm1d inside a Sequential -> one conv (as the pass folds)."""
    for child in module.children():
        _fold_batch_norms(child)
    if not isinstance(module, nn.Sequential):
        return
    names = list(module._modules)
    for first, second in zip(names, names[1:], strict=False):
        conv, norm = module._modules[first], module._modules[second]
        if isinstance(conv, nn.Conv1d) and isinstance(norm, nn.BatchNorm1d):
            module._modules[first] = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, norm)
            module._modules[second] = nn.Identity()


def fake_quant_model(model: ConvDFSMN, quantization: dict[str, Any]) -> ConvDFSMN:
    """The eager reference of the int8 artifact: a copy of ``model`` with BatchNorm folded,
    every Conv1d/Linear named in ``quantization["activation_ranges"]`` on per-output-channel
    symmetric int8 weights, and its input rounded to ``range / levels`` steps and clipped to
    ``±range`` (range-scaled quantization, arXiv 2010.14841), computed in float."""
    bits = int(quantization.get("bits", 8))
    ranges = dict(quantization.get("activation_ranges") or {})
    levels = 2 ** (bits - 1) - 1
    reference = copy.deepcopy(model).eval()
    _fold_batch_norms(reference)
    for name, module in reference.named_modules():
        if not isinstance(module, QUANTIZED_LAYERS) or not ranges.get(name, 0.0) > 0:
            continue
        module.weight.data = quantize_weight(module.weight.data, levels)
        step = float(ranges[name]) / levels

        def quantize_input(
            _module: nn.Module, inputs: tuple[torch.Tensor, ...], step: float = step
        ) -> tuple[torch.Tensor, ...]:
            return (rsq_levels(inputs[0], step, levels) * step, *inputs[1:])

        module.register_forward_pre_hook(quantize_input)
    return reference


# --- compiling ---------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CompiledAsrArtifacts:
    """What :func:`compile_asr` wrote."""

    fp32: Artifact
    int8: Artifact
    report: dict[str, Any]


def int8_context(artifact: AsrArtifact, calibration: Sequence[torch.Tensor] | None) -> PassContext:
    """The RSQ pass settings for ``artifact``: its own ranges when it carries them, else
    calibration on ``calibration`` (feature tensors ``[1, T, n_mels]``)."""
    quantization = artifact.quantization or {}
    ranges = quantization.get("activation_ranges") or None
    if ranges is None and not calibration:
        raise ValueError(
            "the int8 artifact needs activation ranges: the model file has no "
            "quantization.activation_ranges (it was not trained quantization-aware), so pass "
            "calibration utterances (--calibration CORPUS)"
        )
    return PassContext(
        calibration_inputs=[(x,) for x in calibration] if calibration else None,
        rsq_input_ranges={str(k): float(v) for k, v in ranges.items()} if ranges else None,
        rsq_bits=int(quantization.get("bits", 8)),
        winograd="never",
    )


def compile_asr_model(
    artifact: AsrArtifact,
    out: Path,
    *,
    int8: bool,
    calibration: Sequence[torch.Tensor] | None = None,
    cache_dir: Path | None = None,
    fast_build: bool = False,
) -> Artifact:
    """One AOTInductor package of ``artifact``'s model: fp32 (exact passes) or RSQ int8."""
    model = artifact.model.eval()
    example = asr_example(artifact.n_mels)
    if not int8:
        return package_artifact(
            model,
            example,
            asr_dynamic_shapes(),
            out,
            passes=DEFAULT_PASSES,
            context=PassContext(winograd=ASR_WINOGRAD),
            cache_dir=cache_dir,
            fast_build=fast_build,
        )
    return package_artifact(
        model,
        example,
        asr_dynamic_shapes(),
        out,
        passes=INT8_PASSES,
        context=int8_context(artifact, calibration),
        cache_dir=cache_dir,
        fast_build=fast_build,
        inductor_config=INT8_INDUCTOR_CONFIG,
    )


def export_onnx(model: ConvDFSMN, n_mels: int, path: Path) -> Path:
    """The fp32 model as ONNX with a dynamic time axis (dynamo exporter)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model.eval(),
            asr_example(n_mels),
            str(path),
            dynamic_shapes=asr_dynamic_shapes(),
            input_names=["features"],
            output_names=["log_probs"],
            dynamo=True,
        )
    return path


def compile_asr(
    model_dir: Path,
    out_dir: Path | None = None,
    *,
    calibration: Sequence[torch.Tensor] | None = None,
    cache_dir: Path | None = None,
    fast_build: bool = False,
    fp32: bool = True,
    int8: bool = True,
    onnx: bool = True,
) -> dict[str, Any]:
    """Build the fp32 package (``fp32``), the int8 one (``int8``) and the ONNX file (``onnx``)
    of the model in ``model_dir`` into ``out_dir`` (default: ``model_dir``); returns the report
    also written to :data:`REPORT_FILE`."""
    from models.asr.artifact import load_artifact as load_asr

    out_dir = Path(out_dir or model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    artifact = load_asr(model_dir)
    report: dict[str, Any] = {
        "model_digest": model_digest(model_dir),
        "min_frames": MIN_FRAMES,
        "min_audio_frames": MIN_AUDIO_FRAMES,
        "max_frames": MAX_FRAMES,
        "threads": torch.get_num_threads(),
    }
    if fp32:
        start = time.perf_counter()
        package = compile_asr_model(
            artifact, out_dir / FP32_FILE, int8=False, cache_dir=cache_dir, fast_build=fast_build
        )
        report["fp32"] = {**package.report, "compile_s": time.perf_counter() - start}
        print(f"[compilers.asr] fp32 package in {report['fp32']['compile_s']:.1f} s", flush=True)
    if int8:
        start = time.perf_counter()
        package = compile_asr_model(
            artifact,
            out_dir / INT8_FILE,
            int8=True,
            calibration=calibration,
            cache_dir=cache_dir,
            fast_build=fast_build,
        )
        report["int8"] = {**package.report, "compile_s": time.perf_counter() - start}
        print(f"[compilers.asr] int8 package in {report['int8']['compile_s']:.1f} s", flush=True)
    if onnx:
        start = time.perf_counter()
        export_onnx(artifact.model, artifact.n_mels, out_dir / ONNX_FILE)
        report["onnx"] = {"export_s": time.perf_counter() - start}
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, default=str))
    return report


def count_recompiles(
    model: nn.Module, n_mels: int, lengths: Sequence[int], *, backend: str = "inductor"
) -> tuple[dict[str, int], Callable[..., Any]]:
    """Dynamo graphs compiled while ``torch.compile(model, dynamic=True)`` runs every length
    in ``lengths`` (frames): ``compiles`` 1 and ``recompiles`` 0 when one graph serves them
    all; and the compiled callable, warm for every length."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    compiled = torch.compile(model.eval(), backend=backend, dynamic=True)
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for frames in lengths:
            compiled(*asr_example(n_mels, frames, seed=frames))
    compiles = int(counters["stats"]["unique_graphs"] - before)
    counts = {"compiles": compiles, "recompiles": max(0, compiles - 1), "lengths": len(lengths)}
    return counts, compiled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="folder with asr_model.pt")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default --model)")
    parser.add_argument(
        "--calibration",
        type=Path,
        default=None,
        help="corpus folder whose train split calibrates a float model's ranges",
    )
    parser.add_argument("--calibration-utterances", type=int, default=32)
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse packages from here")
    parser.add_argument("--no-onnx", action="store_true")
    args = parser.parse_args(argv)
    calibration = None
    if args.calibration is not None:
        from models.asr.artifact import load_artifact as load_asr

        n_mels = load_asr(args.model).n_mels
        calibration = corpus_features(
            args.calibration, "train", n_mels, limit=args.calibration_utterances
        )
    report = compile_asr(
        args.model,
        args.out,
        calibration=calibration,
        cache_dir=args.cache_dir,
        onnx=not args.no_onnx,
    )
    print(json.dumps({k: v for k, v in report.items() if k not in ("fp32", "int8")}, indent=2))
    return 0


def corpus_features(
    corpus: Path, split: str, n_mels: int, *, limit: int | None = None
) -> list[torch.Tensor]:
    """Feature tensors ``[1, T, n_mels]`` of a corpus split (first ``limit`` utterances by id)."""
    import pandas as pd

    from domains.speech.audio_features import features_of

    shards = Path(corpus) / "shards" / f"split={split}"
    if not shards.exists():
        raise FileNotFoundError(f"no {split} split at {shards}; build the corpus first")
    frame = pd.read_parquet(shards, columns=["utterance_id", "features"]).sort_values(
        "utterance_id"
    )
    if limit is not None:
        frame = frame.head(limit)
    return [torch.from_numpy(features_of(row, n_mels))[None] for _, row in frame.iterrows()]


if __name__ == "__main__":
    raise SystemExit(main())
