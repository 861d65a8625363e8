"""Register a trained ASR model and put it through the promotion gate
(:func:`cascade.registration.register_model`).

A version is the training run's :data:`SERVED_ARTIFACT_PATH` folder: the int8 model file (the
training logs it), its compiled package and the compile gate's report (the compile step,
:mod:`compilers.asr_gate`, adds them) and the files of an MLflow pyfunc
(:mod:`models.asr.pyfunc`), copied into a write-once release. Challenger and champion are
scored by CER on the same held-out voices, the partition's test split; the champion's files
are read only once they match what its registration recorded. Run for one partition date after
the compile step::

    cascade step register --pipeline asr --ds 2026-01-31
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.config import Settings
from cascade.pipeline_spec import Promotion
from cascade.promotion import Decision, Scores
from cascade.registration import Package, pyfunc_folder, register_model
from cascade.registry import download_verified
from models.asr import REGISTERED_MODEL

SERVED_ARTIFACT_PATH = "int8"
"""Folder of the training's MLflow run that a registered version points at: the int8 model file
(training logs it) and its compiled ``.pt2`` (the compile step adds it)."""


def held_out_cer(artifact: Path, corpus: Path) -> dict[str, Any]:
    """The served (int8) model's CER and WER on the corpus test split (held-out voices), and
    how many reference characters it has no output for (its alphabet never held them)."""
    from models.asr.evaluate import evaluate_artifacts

    evaluation = evaluate_artifacts(artifact, artifact, corpus, split="test")
    return {
        "cer": evaluation["cer_int8"],
        "wer": evaluation["wer_int8"],
        "utterances": evaluation["utterances"],
        "unseen_characters": evaluation["unseen_characters"],
    }


def register_and_promote(
    settings: Settings,
    *,
    ds: str,
    trained: Mapping[str, Any],
    compile_gate: Mapping[str, Any],
    corpus: Path,
    promotion: Promotion,
) -> dict[str, Any]:
    """Register the int8 model of the training result ``trained`` (with its compiled artifact)
    as a new version of ``asr`` (alias ``challenger``); move ``champion`` to it when the compile
    gate passed and its CER on ``corpus``'s held-out voices is within the tolerance of the
    champion's CER on the same utterances. Calling it again returns the first decision."""
    run_id = trained["run_id"]

    def score(champion: Any) -> Scores:
        challenger_cer = held_out_cer(Path(trained["int8_artifact"]), corpus)
        # The champion's files are read only once they match what its registration recorded.
        with tempfile.TemporaryDirectory(prefix="asr-champion-") as scratch:
            champion_dir = download_verified(
                settings, REGISTERED_MODEL, str(champion.version), Path(scratch)
            )
            champion_cer = held_out_cer(champion_dir, corpus)
        utterances = challenger_cer["utterances"]
        return Scores(
            challenger=challenger_cer["cer"],
            champion=champion_cer["cer"],
            rows=f"the same {utterances} held-out utterances",
            details={
                "utterances": utterances,
                # A champion fitted to older data may lack characters this partition holds.
                "unseen_characters": {
                    "challenger": challenger_cer["unseen_characters"],
                    "champion": champion_cer["unseen_characters"],
                },
            },
        )

    def report(decision: Decision) -> dict[str, Any]:
        return {
            "ds": ds,
            **decision.record(),
            "run_id": run_id,
            "cer_int8": trained["cer_int8"],
            "cer_fp32": trained["cer_fp32"],
            "compile_gate": {k: compile_gate.get(k) for k in ("passed", "reasons", "artifact")},
        }

    def package(settings: Settings, run_id: str) -> Package:
        from models.asr.pyfunc import save_pyfunc

        folder = pyfunc_folder(settings, run_id, SERVED_ARTIFACT_PATH, save_pyfunc)
        return Package(
            parts={"": folder},
            tags={"ds": ds, "cer_int8": repr(float(trained["cer_int8"])), "run_id": run_id},
        )

    return register_model(
        settings,
        name=REGISTERED_MODEL,
        model_description="Speech recognition, ConvDFSMN int8 (Cascade)",
        run_id=run_id,
        description=f"trained for ds={ds} with config {trained.get('config')}",
        package=package,
        promotion=promotion,
        score=score,
        compile_gate=compile_gate,
        report=report,
    )
