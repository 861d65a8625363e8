"""Register a trained image-text model and put it through the promotion gate
(:func:`cascade.registration.register_model`).

A version is the training run's :data:`MODEL_ARTIFACT_PATH` folder (:mod:`models.multimodal.stored`)
with the files of an MLflow pyfunc (:mod:`models.multimodal.pyfunc`), copied into a write-once
release. Challenger and champion are compared by mean recall@1 on the same rows, the partition's
held-out split: the champion's stored model is scored there with its own caption tokenizer (the
tokenizer is refitted per corpus). A champion stored without its tokenizer is compared by its
:data:`MEAN_RECALL_TAG` tag, measured on its own partition, and the decision says so. Run for
one partition date after the evaluate step::

    cascade step register --pipeline multimodal --ds 2026-01-31
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.multimodal import REGISTERED_MODEL

if TYPE_CHECKING:
    from cascade.config import Settings
    from cascade.pipeline_spec import Promotion
    from cascade.promotion import Decision
    from cascade.registration import Package

MODEL_ARTIFACT_PATH = "model"
"""Folder of the training's MLflow run that a registered version points at: the final
DeepSpeed checkpoint's module states (experts in their own files), the model's config, its
corpus's caption tokenizer, their digests and the run's result (:mod:`models.multimodal.stored`)."""
MEAN_RECALL_TAG = "mean_recall_at_1"
"""Model-version tag: the version's mean of image->text and text->image recall@1."""
RECALL_KEYS = ("i2t_recall_at_1", "i2t_recall_at_5", "t2i_recall_at_1", "t2i_recall_at_5")


def mean_recall_at_1(result: Mapping[str, Any]) -> float:
    return (float(result["i2t_recall_at_1"]) + float(result["t2i_recall_at_1"])) / 2


def register_and_promote(
    settings: Settings,
    *,
    ds: str,
    evaluation: Mapping[str, Any],
    corpus: Path,
    scratch: Path,
    promotion: Promotion,
) -> dict[str, Any]:
    """Register the model of the evaluate step's result ``evaluation`` as a new version of
    ``multimodal`` (alias ``challenger``); move ``champion`` to it when its mean recall@1 is
    within the tolerance of the champion's on ``corpus``'s held-out split (the champion scored
    under ``scratch``). Calling it again returns the first decision."""
    # Imported here: the pipeline's spec reads this module's names when the DAGs are parsed.
    from cascade.promotion import Scores
    from cascade.registration import Package, pyfunc_folder, register_model
    from cascade.registry import download_verified
    from models.multimodal.stored import NoStoredTokenizer, score_stored_model

    run_id = evaluation["run_id"]
    recall = float(evaluation["mean_recall_at_1"])
    eval_pairs = int(evaluation["eval_pairs"])
    rows = f"ds={ds} test split, {eval_pairs} pairs"

    def tagged(champion: Any, why: str) -> Scores:
        if MEAN_RECALL_TAG not in champion.tags:
            raise RuntimeError(
                f"champion v{champion.version} of {REGISTERED_MODEL!r} cannot be scored on "
                f"{rows} ({why}) and has no {MEAN_RECALL_TAG!r} tag to compare with; tag it (or "
                "move the alias) and run step 'register' again"
            )
        return Scores(
            challenger=recall,
            champion=float(champion.tags[MEAN_RECALL_TAG]),
            rows=f"{rows} for the challenger, its own partition's for the champion",
            details={
                "rows": rows,
                "same_rows": False,
                "champion_ds": champion.tags.get("ds"),
                "champion_scored_by": f"its {MEAN_RECALL_TAG!r} tag: {why}",
            },
        )

    def score(champion: Any) -> Scores:
        with tempfile.TemporaryDirectory(prefix="mm-champion-") as download:
            # Its files are read only once they match what its registration recorded.
            folder = download_verified(
                settings, REGISTERED_MODEL, str(champion.version), Path(download)
            )
            try:
                scored = score_stored_model(
                    settings,
                    folder,
                    corpus,
                    scratch / f"champion-v{champion.version}",
                    limit=eval_pairs,
                )
            except NoStoredTokenizer as exc:
                return tagged(champion, str(exc))
        if int(scored["eval_pairs"]) != eval_pairs:
            raise RuntimeError(
                f"champion v{champion.version} was scored on {scored['eval_pairs']} pairs of "
                f"ds={ds}'s test split, the challenger on {eval_pairs}"
            )
        return Scores(
            challenger=recall,
            champion=mean_recall_at_1(scored),
            rows=f"the same {rows}",
            details={
                "rows": rows,
                "same_rows": True,
                "champion_ds": champion.tags.get("ds"),
                "champion_tag": champion.tags.get(MEAN_RECALL_TAG),
                **{f"champion_{k}": float(scored[k]) for k in RECALL_KEYS},
            },
        )

    def report(decision: Decision) -> dict[str, Any]:
        return {
            "ds": ds,
            **decision.record(),
            "run_id": run_id,
            "config": evaluation.get("config"),
            MEAN_RECALL_TAG: recall,
            **{k: evaluation[k] for k in RECALL_KEYS},
            "dense_mean_recall_at_1": (evaluation.get("dense") or {}).get("mean_recall_at_1"),
        }

    def package(settings: Settings, run_id: str) -> Package:
        from models.multimodal.pyfunc import save_pyfunc

        folder = pyfunc_folder(settings, run_id, MODEL_ARTIFACT_PATH, save_pyfunc)
        return Package(
            parts={"": folder}, tags={"ds": ds, MEAN_RECALL_TAG: repr(recall), "run_id": run_id}
        )

    return register_model(
        settings,
        name=REGISTERED_MODEL,
        model_description="Image-text retrieval, MoE transformer (Cascade)",
        run_id=run_id,
        description=f"trained for ds={ds} with config {evaluation.get('config')}",
        package=package,
        promotion=promotion,
        score=score,
        compile_gate=None,
        report=report,
    )
