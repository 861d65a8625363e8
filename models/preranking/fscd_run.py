"""One FSCD cascade run inside an initialized process group: every phase in order (finished
phases skipped, the current one resumed), then on rank 0 the evaluation, the choice of λ, the
files under ``OUT`` and the MLflow run with the chosen model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from torch import nn

from cascade.config import Settings, load_settings
from cascade.lake import TRAINING_PROVENANCE
from cascade.results import write_result
from cascade.training.curves import CurveLog
from cascade.training.launch import rank_world
from cascade.training.resumable_run import RUN_MARKER, failed_on_error, open_resumable_run
from models.preranking.config_registry import CascadeTrainConfig
from models.preranking.fscd_data import Prepared, prepare
from models.preranking.fscd_metrics import (
    choose_fscd,
    evaluate_models,
    headline_metrics,
    plot_tradeoff,
    popularity_auc,
)
from models.preranking.fscd_phases import phases, train_phase
from models.preranking.inference import CROSS_SOURCE_PARAM
from models.preranking.model import ColdPreRanker

EXPERIMENT = "preranking-cascade"


def _mlflow_run(settings: Settings, out: Path, config: CascadeTrainConfig) -> str:
    """Start (or, on resume, reopen) the run recorded in ``OUT/mlflow_run.json``."""
    params = {k: str(v) for k, v in _flat(config.to_dict()).items()}
    data = Path(config.data)
    source = training_source(data)
    if source is not None:
        params[CROSS_SOURCE_PARAM] = source
    return open_resumable_run(
        settings,
        EXPERIMENT,
        out / RUN_MARKER,
        f"cascade-{config.name}",
        params,
        inputs={f"{data.parent.name}/{data.name}": data},
    )


def training_source(data: Path) -> str | None:
    """The source the :data:`~cascade.lake.TRAINING_PROVENANCE` file beside ``data`` names,
    None without one."""
    path = Path(data).parent / TRAINING_PROVENANCE
    if not path.is_file():
        return None
    source = json.loads(path.read_text()).get("source")
    return str(source) if source else None


def _flat(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            flat.update(_flat(item, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def train_cascade(config: CascadeTrainConfig, out: Path, ds: str = "") -> dict[str, Any] | None:
    """The whole run inside an initialized process group; the result on rank 0. ``ds``: the
    partition the data belongs to (the pipeline's train step), recorded in ``result.json``."""
    import mlflow

    started = time.monotonic()
    rank, world = rank_world()
    out.mkdir(parents=True, exist_ok=True)
    data = prepare(config)
    settings = load_settings()
    if rank == 0:
        run_id = _mlflow_run(settings, out, config)
        write_result(out / "encoder.json", data.encoder.state())
        data.fields.save(out)
        print(
            f"[cascade] config={config.name} world={world} train={len(data.train_labels)} "
            f"validation={len(data.validation.labels)} test={len(data.test.labels)} run={run_id} "
            f"pid={os.getpid()}",
            flush=True,
        )

    curves = CurveLog(out)

    def log(phase: str, step: int, value: float) -> None:
        if rank == 0:
            print(f"[cascade] {phase} step={step} loss={value:.4f}", flush=True)
            mlflow.log_metric(f"loss.{phase}", value, step=step)
            curves.add(step, {"loss": value}, phase=phase)

    with failed_on_error(rank):
        models: dict[str, nn.Module] = {}
        selections: dict[str, Any] = {}
        for phase in phases(config):
            if phase.kind == "fscd":
                selector = models.pop(f"select_{phase.strength:g}")
                assert isinstance(selector, ColdPreRanker)
                # Empty or constant fields carry nothing, whatever their gate says.
                kept = tuple(f for f in selector.kept_fields() if f not in data.unusable)
                if not kept:
                    # Nothing kept: the most probable usable field rather than no model.
                    probability = dict(
                        zip(selector.gate_fields, selector.keep_probability().tolist(), strict=True)
                    )
                    usable = [f for f in selector.gate_fields if f not in data.unusable]
                    kept = (max(usable, key=lambda f: probability[f]),)
                selections[phase.name] = {
                    "keep_probability": dict(
                        zip(selector.gate_fields, selector.keep_probability().tolist(), strict=True)
                    ),
                    "kept": list(kept),
                }
                models[phase.name] = train_phase(phase, config, data, out, fields=kept, log=log)
            else:
                models[phase.name] = train_phase(phase, config, data, out, log=log)
        result = None
        if rank == 0:
            result = finish(
                config, data, models, selections, out, started=started, world=world, ds=ds
            )
    return result


def finish(
    config: CascadeTrainConfig,
    data: Prepared,
    models: dict[str, nn.Module],
    selections: dict[str, Any],
    out: Path,
    *,
    started: float,
    world: int,
    ds: str = "",
) -> dict[str, Any]:
    """Rank 0: choose λ on validation, report test; write the tables, metrics, plot and
    result; log them to MLflow.

    The chosen FSCD model is what the run deploys: its weights, config, kept fields and the
    field encoder go to ``OUT/fscd_model`` and to MLflow as a pyfunc from code
    (:func:`~models.preranking.inference.log_pyfunc`; ``result["model_uri"]``, what the
    registry registers); ``result["test_auc"]`` is its test AUC, the figure the registry
    compares champions by."""
    import mlflow

    from models.preranking.inference import (
        COLD_DIR_ARTIFACT,
        log_cold_model,
    )

    validation_rows = evaluate_models(models, data.validation, data.costs, config)
    rows = evaluate_models(models, data.test, data.costs, config)
    baseline = {
        "validation_auc": popularity_auc(data.validation),
        "test_auc": popularity_auc(data.test),
    }
    metrics = headline_metrics(validation_rows, rows, config, baseline)
    metrics["train_seconds"] = time.monotonic() - started
    floor = baseline["validation_auc"] if config.beat_baseline else None
    chosen_name = choose_fscd(validation_rows, config.cost_budget, floor)["model"]
    chosen = next(r for r in rows if r["model"] == chosen_name)
    recall_key = f"recall_at_{config.recall_k}"
    goals = {
        "auc_ratio_at_least_0.98": metrics["auc_ratio"] >= 0.98,
        "cost_ratio_at_most_0.5": metrics["cost_ratio"] <= 0.5,
        "beats_two_tower": metrics["fscd_auc"] > metrics["two_tower_auc"],
        "beats_popularity_on_validation": (
            metrics["fscd_validation_auc"] > metrics["popularity_validation_auc"]
        ),
    }
    evaluation = {
        "config": config.name,
        "world_size": world,
        "recall_k": config.recall_k,
        "selected_on": "validation",
        "chosen": chosen["model"],
        "split_rows": {
            "train": len(data.train_labels),
            "validation": len(data.validation.labels),
            "test": len(data.test.labels),
        },
        "rows": rows,
        "validation_rows": validation_rows,
        "popularity_baseline": baseline,
        "degenerate_fields": data.degenerate,
    }
    write_result(out / "evaluation.json", evaluation)
    write_result(out / "selections.json", selections)
    write_result(out / "metrics.json", metrics)
    write_tradeoff_csv(out / TRADEOFF_CSV, validation_rows, rows)
    plot_tradeoff(
        validation_rows, rows, chosen["model"], out / "tradeoff.png", budget=config.cost_budget
    )
    run = mlflow.active_run()
    assert run is not None
    mlflow.log_metrics(metrics)
    # The deployed model's hold-out AUC under the name the registry and the dense-feature
    # training use.
    mlflow.log_metric("test_auc", metrics["fscd_auc"])
    for r in rows:
        mlflow.log_metrics(
            {
                f"{r['model']}.{k}": float(r[k])
                for k in ("auc", "gauc", recall_key, "cost", "cost_ratio")
            }
        )
    mlflow.log_metrics({f"{r['model']}.validation_auc": float(r["auc"]) for r in validation_rows})
    mlflow.log_dict(evaluation, "evaluation.json")
    mlflow.log_dict(
        {
            "chosen": chosen["model"],
            "fields": chosen["fields"],
            "cost": chosen["cost"],
            "cost_ratio": chosen["cost_ratio"],
            "selections": selections,
        },
        "selected_features.json",
    )
    mlflow.log_artifact(str(out / "tradeoff.png"))
    mlflow.log_artifact(str(out / "encoder.json"))
    mlflow.log_artifact(str(out / "fields.json"))
    fscd_model = models[chosen["model"]]
    assert isinstance(fscd_model, ColdPreRanker)
    info = log_cold_model(out / COLD_DIR_ARTIFACT, fscd_model, config, data.encoder, data.example)
    result = {
        **metrics,
        "goals": goals,
        "chosen": chosen["model"],
        "fscd_fields": chosen["fields"],
        "run_id": run.info.run_id,
        "model_uri": info.model_uri,
        "model_kind": "fscd",
        "test_auc": metrics["fscd_auc"],
        "config": config.name,
        "ds": ds,
        "world_size": world,
    }
    write_result(out / "result.json", result)
    mlflow.end_run()
    print(f"[cascade] done: {json.dumps(metrics)}", flush=True)
    return result


TRADEOFF_CSV = "tradeoff.csv"
"""AUC against feature cost of every model on both splits (what ``dvc plots show`` draws)."""


def write_tradeoff_csv(
    path: Path, validation_rows: list[dict[str, Any]], test_rows: list[dict[str, Any]]
) -> None:
    """One row per model and split: ``model,split,cost_ratio,auc,gauc``."""
    import csv

    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "split", "cost_ratio", "auc", "gauc"])
        for split, rows in (("validation", validation_rows), ("test", test_rows)):
            for r in rows:
                writer.writerow([r["model"], split, r["cost_ratio"], r["auc"], r["gauc"]])
    tmp.replace(path)
