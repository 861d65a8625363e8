"""The asr pipeline's compile step: compile the model trained for a partition, gate it, record it.

    cascade step compile --pipeline asr --ds 2026-11-22

Runs after ``train`` and before ``register``: builds the int8 AOTInductor package of the trained
ConvDFSMN (:func:`compilers.asr.compile_asr`) and gates it on the partition's held-out voices:
its transcripts must agree with the fake-quant model's it was compiled from (a compiler bug
shows up as disagreement, not as a small CER change) and its CER stay within the config's
``int8_max_cer_delta`` of the fp32 model's on the same utterances. The package and the gate's
report go to the training's MLflow run beside the model file
(:data:`models.asr.registration.SERVED_ARTIFACT_PATH`: what a registered version holds). A
failed gate does not fail the task: it is recorded, and the register step then keeps the
champion, stating the gate's reasons.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.artifacts import sha256_file
from cascade.config import Settings

GATE_UTTERANCES = 200
"""Held-out utterances the compile gate transcribes with both the package and the reference."""
MIN_AGREEMENT = 0.95
"""Share of those transcripts on which the int8 package must agree with the fake-quant model it
was compiled from (a compiler bug shows up as disagreement, not as a small CER change)."""
GATE_REPORT = "compile_gate.json"
"""The gate's report, beside the model file and its package."""


def compile_and_gate(
    settings: Settings, *, ds: str, trained: Mapping[str, Any], corpus: Path
) -> dict[str, Any]:
    """Build the int8 package of the training result ``trained`` and gate it on ``corpus``'s
    held-out voices; returns the gate's report and logs it with the package to the training's
    MLflow run."""
    import torch
    from mlflow.tracking import MlflowClient

    from compilers.asr import compile_asr
    from domains.speech.audio_features import HUMAN_VOICE_PREFIX
    from models.asr.artifact import FILENAME, load_artifact
    from models.asr.compiled import INT8_FILE, MAX_FRAMES, MIN_FRAMES, REPORT_FILE, load_compiled
    from models.asr.config_registry import get_config
    from models.asr.corpus import load_split
    from models.asr.evaluate import int8_model
    from models.asr.inference import transcribe
    from models.asr.metrics import cer
    from models.asr.registration import SERVED_ARTIFACT_PATH

    model_dir = Path(trained["int8_artifact"]).parent
    threads = torch.get_num_threads()
    report = compile_asr(model_dir, fp32=False, int8=True, onnx=False)
    torch.set_num_threads(threads)

    artifact = load_artifact(model_dir)
    package = load_compiled(model_dir / INT8_FILE, artifact.model.config)
    reference = int8_model(artifact)
    fp32 = load_artifact(Path(trained["fp32_artifact"]))
    data = load_split(corpus, "test", artifact.alphabet)
    keep = [
        not voice.startswith(HUMAN_VOICE_PREFIX) and MIN_FRAMES <= len(f) <= MAX_FRAMES
        for voice, f in zip(data.voices, data.features, strict=True)
    ]
    data = data.subset(keep)
    texts, features = data.texts[:GATE_UTTERANCES], data.features[:GATE_UTTERANCES]
    if not texts:
        raise ValueError(f"no held-out utterances in {corpus} to gate the package")
    hyps = {
        kind: [transcribe(model, artifact.alphabet, f).text for f in features]
        for kind, model in (("package", package), ("reference", reference), ("fp32", fp32.model))
    }
    agreement = sum(a == b for a, b in zip(hyps["package"], hyps["reference"], strict=True))
    agreement /= len(texts)
    cer_package, cer_fp32 = cer(texts, hyps["package"]), cer(texts, hyps["fp32"])
    max_delta = get_config(trained["config"]).int8_max_cer_delta
    reasons = []
    if agreement < MIN_AGREEMENT:
        reasons.append(
            f"the int8 package agrees with its fake-quant reference on {agreement:.1%} of "
            f"{len(texts)} transcripts (at least {MIN_AGREEMENT:.0%} required)"
        )
    if cer_package > cer_fp32 + max_delta:
        reasons.append(
            f"int8 package CER {cer_package:.4f} exceeds fp32 CER {cer_fp32:.4f} by more than "
            f"{max_delta}"
        )
    gate = {
        "ds": ds,
        "passed": not reasons,
        "reasons": reasons,
        "artifact": str(model_dir / INT8_FILE),
        "utterances": len(texts),
        "agreement": agreement,
        "cer_package": cer_package,
        "cer_fp32": cer_fp32,
        "cer_delta_points": 100 * (cer_package - cer_fp32),
        "max_cer_delta": max_delta,
        "compile_s": report["int8"]["compile_s"],
        # The files this gate ran, as registration must find them in the run (then signed).
        "tested": {
            name: sha256_file(model_dir / name) for name in (INT8_FILE, REPORT_FILE, FILENAME)
        },
    }
    (model_dir / GATE_REPORT).write_text(json.dumps(gate, indent=2))
    client = MlflowClient(tracking_uri=settings.tracking_uri)
    run_id = trained["run_id"]
    for name in (INT8_FILE, REPORT_FILE, GATE_REPORT):
        client.log_artifact(run_id, str(model_dir / name), SERVED_ARTIFACT_PATH)
    client.log_metric(run_id, "compile_int8_cer", cer_package)
    client.log_metric(run_id, "compile_agreement", agreement)
    client.set_tag(run_id, "compile_gate", "passed" if gate["passed"] else "failed")
    print(
        f"[asr] compile gate {'passed' if gate['passed'] else 'FAILED'}: agreement "
        f"{agreement:.1%}, CER package {cer_package:.2%} vs fp32 {cer_fp32:.2%} "
        f"({len(texts)} held-out utterances)",
        flush=True,
    )
    return gate
