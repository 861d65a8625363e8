"""MLflow model registry: register a trained pre-ranking model and decide its promotion.

The new version always gets the ``challenger`` alias. ``champion`` moves to it only if

- it is not worse than the champion on ``settings.promotion_metric`` (AUC or log loss) by more
  than ``settings.promotion_tolerance``, both models scored on the same held-out rows: the
  latest ``test_fraction`` of the challenger's training set, which the champion never saw
  trained on either when it is older; and
- it passed the compile gates (``compilers.gate``: parity and latency of the compiled
  artifact) when the pipeline ran them, i.e. when ``Lake.reports("compile", ds)`` holds a result.

The first version is promoted when it passes the compile gate. Every refusal is stated in
``reasons``. Run for one partition date after training::

    python -c "from cascade.registry import register_and_promote as r; print(r('2026-01-31'))"
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cascade.config import PROMOTION_METRICS, Settings, load_settings
from cascade.lake import Lake, check_ds

CHAMPION = "champion"
CHALLENGER = "challenger"
DECISION_TAG = "cascade.promotion"
"""Model-version tag holding the decision as JSON, so a repeated call returns the same answer."""
TEST_AUC_TAG = "test_auc"
"""Model-version tag holding the hold-out AUC measured at training time."""
GATE_KEYS = ("passed", "reasons", "artifact", "max_abs_diff", "auc_delta", "speedup_vs_eager")
"""What the registry's decision keeps of the compile gate's report."""
PREVIOUS_CHAMPION_TAG = "cascade.previous_champion"
"""Written before the champion alias moves, so a retry after a crash still knows it."""


def _read_train_result(lake: Lake, ds: str) -> dict[str, Any]:
    path = lake.reports("train", ds) / "result.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no training result {path}; train first "
            f"(models.preranking.train.launch({ds!r}) writes it)"
        )
    result = json.loads(path.read_text())
    missing = [k for k in ("run_id", "test_auc", "model_uri") if k not in result]
    if missing:
        raise ValueError(f"training result {path} lacks {missing}; rerun training for ds={ds}")
    if result.get("ds") not in (None, "", ds):
        raise ValueError(f"training result {path} is for ds={result['ds']}, not {ds}; retrain")
    return result


def _write_report(lake: Lake, ds: str, report: dict[str, Any]) -> None:
    out = lake.reports("register", ds)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, out / "result.json")


def version_by_alias(client: Any, name: str, alias: str) -> Any | None:
    """The ``ModelVersion`` behind ``name@alias``, or None if the model or alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        # Both "no such registered model" and "no such alias" mean: nothing there yet.
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def registry_client(settings: Settings) -> Any:
    """A client on the settings' tracking + registry store (also made the global URIs: the
    registry store resolves a models:/m-<id> source through the global tracking URI)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = settings.tracking_uri
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_registered_model(client: Any, name: str, description: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description=description)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def version_of_run(client: Any, name: str, run_id: str) -> tuple[Any | None, dict | None]:
    """The version already registered from ``run_id`` (newest) and its stored decision, so a
    repeated registration returns the first answer instead of registering twice."""
    existing = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    if not existing:
        return None, None
    version = max(existing, key=lambda v: int(v.version))
    stored = version.tags.get(DECISION_TAG)
    return version, None if stored is None else json.loads(stored)


def held_out_rows(lake: Lake, ds: str, test_fraction: float) -> Any:
    """The rows both models are compared on: the latest ``test_fraction`` of ``ds``'s training
    set by event time (the challenger's own hold-out)."""
    from models.preranking.train import load_training_frame, time_split

    path = lake.training_set("preranking", ds) / "data.parquet"
    if not path.exists():
        raise FileNotFoundError(
            f"no training set {path} to compare champion and challenger on; run the "
            f"training-set step for ds={ds}"
        )
    return time_split(load_training_frame(path), test_fraction)[1]


def compare_on_held_out(
    challenger: Any,
    champion: Any,
    rows: Any,
    *,
    metric: str,
    tolerance: float,
    challenger_encoder: Any = None,
    champion_encoder: Any = None,
) -> dict[str, Any]:
    """Score both models on ``rows``; ``passed`` when the challenger is not worse than the
    champion by more than ``tolerance`` on ``metric``. Either may be a PreRanker or a
    ColdPreRanker (which reads ``rows`` through its field encoder)."""
    from models.preranking.train import evaluate

    higher_is_better = PROMOTION_METRICS[metric]
    new = evaluate(challenger, rows, challenger_encoder)[metric]
    old = evaluate(champion, rows, champion_encoder)[metric]
    passed = new >= old - tolerance if higher_is_better else new <= old + tolerance
    verdict = {
        "metric": metric,
        "challenger": new,
        "champion": old,
        "rows": len(rows),
        "tolerance": tolerance,
        "passed": bool(passed),
    }
    if not passed:
        direction = "below" if higher_is_better else "above"
        verdict["reason"] = (
            f"challenger {metric} {new:.4f} is {direction} champion {metric} {old:.4f} by more "
            f"than the tolerance {tolerance} on the same {len(rows)} held-out rows"
        )
    return verdict


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


def register_and_promote(ds: str, *, settings: Settings | None = None) -> dict:
    """Register the model trained for ``ds`` and move the aliases; returns and writes the decision.

    Returns ``{"version", "promoted", "test_auc", "champion_version", "champion_auc",
    "previous_champion"}`` (versions as strings; ``previous_champion`` None for the first one),
    also written to ``Lake.reports("register", ds) / "result.json"``. Calling it again for the
    same training run registers nothing new and returns the first decision.
    """
    check_ds(ds)
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    trained = _read_train_result(lake, ds)
    name = settings.registered_model
    client = registry_client(settings)

    ensure_registered_model(client, name, "Pre-ranking CTR model (Cascade)")
    run_id = trained["run_id"]
    version, stored = version_of_run(client, name, run_id)
    if stored is not None:
        _write_report(lake, ds, stored)
        return stored
    if version is None:
        model_uri = trained["model_uri"]
        version = client.create_model_version(
            name,
            source=model_uri,
            run_id=run_id,
            # Links the version to MLflow 3's logged model (models:/m-<id>).
            model_id=model_uri.removeprefix("models:/")
            if model_uri.startswith("models:/m-")
            else None,
            tags={"ds": ds, TEST_AUC_TAG: repr(float(trained["test_auc"])), "run_id": run_id},
            description=f"trained for ds={ds} with config {trained.get('config')}",
        )
    new_version = str(version.version)
    new_auc = float(trained["test_auc"])

    champion = version_by_alias(client, name, CHAMPION)
    reasons: list[str] = []
    comparison: dict[str, Any] | None = None
    gate = compile_gate_report(lake, ds)
    if gate is not None and not gate["passed"]:
        reasons += [f"compile gate: {r}" for r in gate.get("reasons") or ["failed"]]
    if champion is None:
        previous, previous_auc = None, None
    elif str(champion.version) == new_version:
        # A retry after the alias moved but before the decision was stored.
        previous = version.tags.get(PREVIOUS_CHAMPION_TAG) or None
        previous_auc = None
    else:
        from models.preranking.inference import load_trained, load_version

        previous = str(champion.version)
        previous_auc = _version_auc(client, champion)
        challenger = load_trained(lake.reports("train", ds))
        champion_model = load_version(settings, previous)
        comparison = compare_on_held_out(
            challenger.model,
            champion_model.model,
            held_out_rows(lake, ds, challenger.test_fraction),
            metric=settings.promotion_metric,
            tolerance=settings.promotion_tolerance,
            challenger_encoder=challenger.encoder,
            champion_encoder=champion_model.encoder,
        )
        if not comparison["passed"]:
            reasons.append(comparison["reason"])
    promoted = not reasons

    client.set_registered_model_alias(name, CHALLENGER, new_version)
    if promoted:
        client.set_model_version_tag(name, new_version, PREVIOUS_CHAMPION_TAG, previous or "")
        client.set_registered_model_alias(name, CHAMPION, new_version)
    report = {
        "version": new_version,
        "promoted": promoted,
        "test_auc": new_auc,
        "champion_version": new_version if promoted else previous,
        "champion_auc": new_auc if promoted else previous_auc,
        "previous_champion": previous,
        "ds": ds,
        "run_id": run_id,
        "tolerance": settings.promotion_tolerance,
        "metric": settings.promotion_metric,
        "comparison": comparison,
        "compile_gate": None if gate is None else {k: gate.get(k) for k in GATE_KEYS},
        "reasons": reasons,
    }
    client.set_model_version_tag(name, new_version, DECISION_TAG, json.dumps(report))
    _write_report(lake, ds, report)
    return report


def registry_report_path(ds: str, settings: Settings | None = None) -> Path:
    """Where :func:`register_and_promote` writes its decision for ``ds``."""
    settings = settings or load_settings()
    return Lake(settings.lake_root).reports("register", ds) / "result.json"
