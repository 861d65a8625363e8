"""Register a trained pre-ranking model and put it through the promotion gate
(:func:`cascade.registration.register_model`).

The challenger must also beat item popularity's AUC on its held-out rows
(:func:`popularity_baseline`; the decision's ``baseline`` records both). Champion and
challenger are scored on the same held-out rows: the latest ``test_fraction`` of
the challenger's training set, which the champion never saw trained on either when it is
older, on the promotion rule's metric (AUC or log loss, :data:`models.preranking.PROMOTION_METRICS`)
within its tolerance: the ``ctr_preranking`` spec's rule with what its settings override
(``cascade pipelines --json`` shows it). The compile gate's report is
``Lake.reports("compile", ds)``. Run for one partition date after training::

    cascade step register --pipeline ctr_preranking --ds 2026-01-31
"""

from __future__ import annotations

import json
from typing import Any

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from cascade.pipeline_spec import Promotion
from cascade.promotion import Baseline, Decision, Scores
from cascade.registration import Package, register_model
from cascade.registry import registry_client, registry_report_path
from cascade.results import write_result
from models.preranking import PROMOTION_METRICS, REGISTERED_MODEL
from models.preranking.inference import TEST_AUC_TAG, release_parts

GATE_KEYS = ("passed", "reasons", "artifact", "max_abs_diff", "auc_delta", "speedup_vs_eager")
"""What the registry's decision keeps of the compile gate's report."""


def _read_train_result(lake: Lake, ds: str) -> dict[str, Any]:
    path = lake.reports("train", ds) / "result.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no training result {path}; train first (the ctr_preranking train step writes it)"
        )
    result = json.loads(path.read_text())
    missing = [k for k in ("run_id", "test_auc", "model_uri") if k not in result]
    if missing:
        raise ValueError(f"training result {path} lacks {missing}; rerun training for ds={ds}")
    if result.get("ds") not in (None, "", ds):
        raise ValueError(f"training result {path} is for ds={result['ds']}, not {ds}; retrain")
    return result


def held_out_rows(lake: Lake, ds: str, test_fraction: float) -> Any:
    """The rows both models are compared on: the latest ``test_fraction`` of ``ds``'s training
    set by event time (the challenger's own hold-out)."""
    from models.preranking.training_set import ROW_COLUMNS, load_training_frame, time_split

    path = lake.training_set("preranking", ds) / "data.parquet"
    if not path.exists():
        raise FileNotFoundError(
            f"no training set {path} to compare champion and challenger on; run the "
            f"training-set step for ds={ds}"
        )
    return time_split(load_training_frame(path, required=ROW_COLUMNS), test_fraction)[1]


def popularity_baseline(lake: Lake, ds: str, challenger: Any, recorded_auc: float) -> Baseline:
    """Item popularity (each item's clicks in the rows before the hold-out) against the
    ``challenger`` (a loaded trained model) on the held-out rows of ``ds``'s training set,
    both by AUC: the baseline a registered pre-ranker must beat
    (:func:`models.preranking.fscd_metrics.popularity_auc` holds the trainer to the same on
    validation). A challenger that cannot read those rows is taken at ``recorded_auc``, its
    training's figure on the same hold-out."""
    from sklearn.metrics import roc_auc_score

    from domains.ctr.schema import LABEL
    from models.preranking.fscd_data import item_clicks
    from models.preranking.training_set import (
        ROW_COLUMNS,
        evaluate,
        load_training_frame,
        time_split,
    )

    path = lake.training_set("preranking", ds) / "data.parquet"
    if not path.exists():
        raise FileNotFoundError(
            f"no training set {path} to score the popularity baseline on; run the "
            f"training-set step for ds={ds}"
        )
    frame = load_training_frame(path, required=ROW_COLUMNS)
    before, held_out = time_split(frame, challenger.test_fraction)
    scores = held_out["item_id"].map(item_clicks(before)).fillna(0.0)
    labels = held_out[LABEL]
    auc = float(roc_auc_score(labels, scores)) if labels.nunique() > 1 else 0.5
    rows = f"the same {len(held_out)} held-out rows"
    if unread_columns(challenger, held_out):
        measured, rows = recorded_auc, f"{rows} (the challenger's recorded AUC)"
    else:
        measured = float(evaluate(challenger.model, held_out, challenger.encoder)["auc"])
    return Baseline(
        name="item popularity", metric="auc", challenger=measured, baseline=auc, rows=rows
    )


def unread_columns(loaded: Any, rows: Any) -> list[str]:
    """The columns a loaded model reads that ``rows`` lack: its field set's (the FSCD
    pre-ranker) or the dense contract's (the plain one)."""
    from domains.ctr.schema import MODEL_FEATURES

    encoder = getattr(loaded, "encoder", None)
    names = encoder.fields.names if encoder is not None else MODEL_FEATURES
    return [name for name in names if name not in rows.columns]


def compile_gate_report(lake: Lake, ds: str) -> dict[str, Any] | None:
    """The compile step's gate result for ``ds``, or None when the pipeline did not run it."""
    path = lake.reports("compile", ds) / "result.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    if "passed" not in report:
        raise ValueError(f"compile gate report {path} has no 'passed'; rerun the compile step")
    return report


def _version_auc(client: Any, version: Any) -> float:
    tag = version.tags.get(TEST_AUC_TAG)
    if tag is not None:
        return float(tag)
    metric = client.get_run(version.run_id).data.metrics.get("test_auc")
    if metric is None:
        raise ValueError(
            f"model version {version.name}/{version.version} has no test_auc tag or run metric; "
            "tag it with test_auc or retrain it"
        )
    return float(metric)


def register_and_promote(
    ds: str, *, promotion: Promotion, settings: Settings | None = None
) -> dict:
    """Register the model trained for ``ds`` and move the aliases; returns and writes the decision.

    Returns ``{"version", "promoted", "test_auc", "champion_version", "champion_auc",
    "previous_champion", ...}`` (versions as strings; ``previous_champion`` None for the first
    one), also written to ``Lake.reports("register", ds) / "result.json"``. Calling it again for
    the same training run registers nothing new and returns the first decision.
    ``promotion`` is the rule in force (``PIPELINE.promotion()`` of ``ctr_preranking``): its
    metric, one of :data:`~models.preranking.PROMOTION_METRICS` in its direction, and its
    tolerance; with ``requires_compile_gate`` a missing compile report refuses (otherwise it
    means the pipeline did not run the step).
    """
    from models.preranking.inference import load_trained, load_version
    from models.preranking.training_set import evaluate

    check_ds(ds)
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    trained = _read_train_result(lake, ds)
    if PROMOTION_METRICS.get(promotion.metric) != promotion.higher_is_better:
        raise ValueError(
            f"the pre-ranker is compared on one of {sorted(PROMOTION_METRICS)} in its direction, "
            f"not {promotion.metric!r} (higher_is_better={promotion.higher_is_better})"
        )
    client = registry_client(settings)
    run_id, model_uri = trained["run_id"], trained["model_uri"]
    new_auc = float(trained["test_auc"])
    champion_auc: dict[str, float] = {}

    def score(champion: Any) -> Scores:
        champion_auc[str(champion.version)] = _version_auc(client, champion)
        challenger = load_trained(lake.reports("train", ds))
        champion_model = load_version(settings, str(champion.version))
        rows = held_out_rows(lake, ds, challenger.test_fraction)
        absent = unread_columns(champion_model, rows)
        if absent:
            # A champion trained on other features (another source, the feature set before
            # it) cannot score these rows: the comparison falls back to its recorded hold-out.
            return Scores(
                challenger=new_auc,
                champion=champion_auc[str(champion.version)],
                rows=(
                    f"their own held-out rows (champion v{champion.version} reads fields this "
                    f"training set lacks: {absent[:5]})"
                ),
                details={"rows": len(rows), "champion_fields_absent": absent},
            )
        return Scores(
            challenger=evaluate(challenger.model, rows, challenger.encoder)[promotion.metric],
            champion=evaluate(champion_model.model, rows, champion_model.encoder)[promotion.metric],
            rows=f"the same {len(rows)} held-out rows",
            details={"rows": len(rows)},
        )

    gate = compile_gate_report(lake, ds)
    baseline = popularity_baseline(lake, ds, load_trained(lake.reports("train", ds)), new_auc)

    def report(decision: Decision) -> dict[str, Any]:
        return {
            **decision.record(),
            "test_auc": new_auc,
            "champion_auc": new_auc
            if decision.promoted
            else champion_auc.get(str(decision.champion_version)),
            "ds": ds,
            "run_id": run_id,
            "tolerance": promotion.tolerance,
            "metric": promotion.metric,
            "compile_gate": None if gate is None else {k: gate.get(k) for k in GATE_KEYS},
        }

    def package(settings: Settings, run_id: str) -> Package:
        # The write-once release folder, not the logged model: a tracking server refuses a
        # source outside the logged model's location when the version names its model_id, so
        # the logged model is kept as a tag.
        return Package(
            parts=release_parts(settings, model_uri, run_id),
            tags={
                "ds": ds,
                TEST_AUC_TAG: repr(new_auc),
                "run_id": run_id,
                "logged_model": model_uri,
            },
        )

    result = register_model(
        settings,
        name=REGISTERED_MODEL,
        model_description="Pre-ranking CTR model (Cascade)",
        run_id=run_id,
        description=f"trained for ds={ds} with config {trained.get('config')}",
        package=package,
        promotion=promotion,
        score=score,
        compile_gate=gate,
        report=report,
        baseline=baseline,
    )
    path = registry_report_path(ds, settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(path, result)
    return result
