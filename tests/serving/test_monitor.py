"""Drift (PSI), online AUC, the generated shift and the monitor task on a lake."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from cascade.assets import TOPIC_DRIFT_DETECTED, TOPIC_RETRAIN_REQUESTED
from cascade.config import Settings
from serving.feedback import FeedbackConfig, FeedbackLog, log_clicks
from serving.monitor import (
    MonitorConfig,
    evaluate_day,
    generate_serving_logs,
    monitor_day,
    online_auc,
    psi_categorical,
    psi_numeric,
    run_demo,
    verdict_events,
)


def test_psi_is_near_zero_for_the_same_distribution_and_large_for_a_shift() -> None:
    rng = np.random.default_rng(1)
    reference = rng.normal(0, 1, 20_000)
    assert psi_numeric(reference, rng.normal(0, 1, 5_000)) < 0.02
    assert psi_numeric(reference, rng.normal(1, 1, 5_000)) > 0.5
    # Values beyond the reference's range land in the open outer bins, not nowhere.
    assert psi_numeric(reference, np.full(100, 50.0)) > 5


def test_categorical_psi_counts_unseen_categories_as_drift() -> None:
    reference = ["a"] * 500 + ["b"] * 500
    assert psi_categorical(reference, ["a"] * 50 + ["b"] * 50) == pytest.approx(0, abs=1e-9)
    assert psi_categorical(reference, ["a"] * 50 + ["c"] * 50) > 1


def test_online_auc_matches_sklearn_with_ties_and_is_none_for_one_class() -> None:
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 5, 1000).astype(float)
    clicks = (rng.random(1000) < 0.1 + scores / 10).astype(int)
    assert online_auc(scores, clicks) == pytest.approx(roc_auc_score(clicks, scores))
    assert online_auc(scores, np.zeros(1000)) is None


def test_the_demo_flags_the_shift_day_first_and_nothing_before(tmp_path: Path) -> None:
    summary = run_demo(tmp_path, days=8, shift_offset=5, rows_per_day=1500)
    assert summary["first_flagged_day"] == summary["shift_day"] == "2026-11-06"
    assert summary["flagged_days"] == ["2026-11-06", "2026-11-07", "2026-11-08"]
    shifted = summary["days"][-1]
    assert shifted["online_auc"] < MonitorConfig().auc_floor < summary["days"][0]["online_auc"]
    assert (tmp_path / "monitor_series.png").stat().st_size > 0


def test_a_retrain_verdict_publishes_drift_then_a_request_that_names_it() -> None:
    config = MonitorConfig()
    reference, logs = generate_serving_logs(
        start=dt.date(2026, 11, 1), days=2, shift_day=dt.date(2026, 11, 2), rows_per_day=1000
    )
    calm = evaluate_day("2026-11-01", reference, logs[logs.ds == "2026-11-01"], config)
    assert not calm.retrain and verdict_events(calm, config) == []
    shifted = evaluate_day("2026-11-02", reference, logs[logs.ds == "2026-11-02"], config)
    drift, retrain = verdict_events(shifted, config)
    assert drift.type == TOPIC_DRIFT_DETECTED and retrain.type == TOPIC_RETRAIN_REQUESTED
    assert retrain.payload["caused_by"] == [drift.id]
    assert set(drift.payload["drifted_features"]) >= {"user_ctr", "genre"}


def test_too_few_rows_gives_no_verdict() -> None:
    reference, logs = generate_serving_logs(
        start=dt.date(2026, 11, 1), days=1, shift_day=dt.date(2026, 11, 1), rows_per_day=50
    )
    verdict = evaluate_day("2026-11-01", reference, logs, MonitorConfig())
    assert not verdict.retrain and "min_rows" in verdict.reasons[0]


def test_monitor_day_reads_feedback_and_clicks_from_the_lake(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    reference, logs = generate_serving_logs(
        start=dt.date(2026, 11, 22), days=1, shift_day=dt.date(2026, 11, 22), rows_per_day=600
    )
    training = settings.lake_root / "training" / "preranking" / "dt=2026-11-20"
    training.mkdir(parents=True)
    reference.to_parquet(training / "part-0.parquet")
    day = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC).timestamp()
    feedback = FeedbackLog(settings.lake_root, FeedbackConfig(flush_rows=10_000), clock=lambda: day)
    for start in range(0, len(logs), 6):
        chunk = logs.iloc[start : start + 6]
        feedback.log(
            request_id=f"r{start}",
            user_id=1,
            item_ids=list(range(len(chunk))),
            scores=chunk["score"].to_numpy(),
            model_version="3",
            features={c: chunk[c].tolist() for c in ("user_ctr", "item_ctr", "genre")},
        )
    feedback.flush()
    clicks = pd.DataFrame(
        {
            "request_id": [f"r{(i // 6) * 6}" for i in range(len(logs))],
            "item_id": [i % 6 for i in range(len(logs))],
            "click": logs["click"].to_numpy(),
        }
    )
    log_clicks("2026-11-22", clicks[clicks.click == 1], settings=settings)
    report = monitor_day("2026-11-22", settings=settings, publish=False)
    assert report["rows"] == len(logs) and report["retrain"]
    assert report["online_auc"] == pytest.approx(online_auc(logs["score"], logs["click"]))
    assert "item_impressions" in report["reasons"][0]  # not logged: named, not crashed
    written = json.loads(
        (settings.lake_root / "reports" / "monitor" / "dt=2026-11-22" / "report.json").read_text()
    )
    assert written["events"] == report["events"] and Path(written["plot"]).exists()

    # The day's figures and plot are in MLflow too; a rerun of the day logs into the same run.
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(report["mlflow_run_id"])
    assert run.data.metrics["online_auc"] == pytest.approx(report["online_auc"])
    assert run.data.metrics["psi_user_ctr"] == pytest.approx(report["psi"]["user_ctr"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"psi.png", "report.json"}
    assert report["retrain_requested"] and len(report["events"]) == 2
    # A run a new champion started announces the drift but requests no retraining (the
    # retrained champion would otherwise start its own retraining).
    again = monitor_day("2026-11-22", settings=settings, publish=False, request_retrain=False)
    assert again["mlflow_run_id"] == report["mlflow_run_id"]
    assert again["retrain"] and not again["retrain_requested"] and len(again["events"]) == 1


def test_the_reference_is_the_newest_training_sets_parquet_beside_its_declarations(
    tmp_path: Path,
) -> None:
    """The pipeline's training-set folder holds ``fields.json`` and ``training.json`` beside
    the parquet file; the monitor's reference is the rows alone."""
    from serving.feedback_read import load_reference

    settings = Settings(home=tmp_path)
    root = settings.lake_root / "training" / "preranking"
    for ds, ctr in (("2026-11-21", 0.1), ("2026-11-22", 0.2)):
        folder = root / f"dt={ds}"
        folder.mkdir(parents=True)
        pd.DataFrame({"user_id": [1, 2], "user_ctr_7d": [ctr, ctr]}).to_parquet(
            folder / "data.parquet"
        )
        (folder / "fields.json").write_text('{"version": 1, "fields": []}')
        (folder / "training.json").write_text('{"source": "generated"}')
    reference = load_reference(settings=settings)
    assert reference["user_ctr_7d"].tolist() == [0.2, 0.2]


def test_a_version_of_the_engine_is_checked_on_the_statistics_it_declares(tmp_path: Path) -> None:
    """A reference with field declarations (the pipeline's ``fields.json``): every declared
    number the logs carry gets a PSI (the user and item statistics), the declared ones the
    logs lack (per-candidate cross fields) are named, ids are not compared as numbers; a
    shifted item statistic is drift. Without declarations the legacy names are compared."""
    from serving.feedback_read import load_reference

    rng = np.random.default_rng(4)
    n = 4000
    declarations = [
        {"name": "user_id", "kind": "user", "categorical": True},
        {"name": "item_id", "kind": "item", "categorical": True},
        {"name": "genre", "kind": "item", "categorical": True},
        {"name": "user_ctr_7d", "kind": "user", "categorical": False},
        {"name": "item_ctr_7d", "kind": "item", "categorical": False},
        {"name": "user_cat_ctr_7d", "kind": "cross", "categorical": False},
    ]
    settings = Settings(home=tmp_path)
    folder = settings.lake_root / "training" / "preranking" / "dt=2026-11-22"
    folder.mkdir(parents=True)
    pd.DataFrame(
        {
            "user_id": rng.integers(0, 900, n),
            "item_id": rng.integers(0, 1600, n),
            "genre": rng.choice(["Action", "Drama"], n),
            "user_ctr_7d": rng.beta(2, 20, n),
            "item_ctr_7d": rng.beta(2, 20, n),
            "user_cat_ctr_7d": rng.beta(2, 20, n),
            "click": rng.integers(0, 2, n),
        }
    ).to_parquet(folder / "data.parquet")
    (folder / "fields.json").write_text(json.dumps({"version": 1, "fields": declarations}))
    reference = load_reference(settings=settings)
    assert [f["name"] for f in reference.attrs["fields"]] == [d["name"] for d in declarations]

    def day(item_shift: float) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "user_id": rng.integers(0, 900, n),
                "item_id": rng.integers(0, 1600, n),
                "genre": rng.choice(["Action", "Drama"], n),
                "user_ctr_7d": rng.beta(2, 20, n),
                "item_ctr_7d": rng.beta(2, 20, n) + item_shift,
                "score": rng.random(n),
                "click": rng.integers(0, 2, n),
            }
        )

    config = MonitorConfig()
    calm = evaluate_day("2026-11-23", reference, day(0.0), config)
    assert set(calm.psi) == {"user_ctr_7d", "item_ctr_7d", "genre"}
    assert calm.unchecked == ["user_cat_ctr_7d"] and not calm.drifted
    shifted = evaluate_day("2026-11-24", reference, day(0.2), config)
    assert set(shifted.drifted) == {"item_ctr_7d"} and shifted.retrain
    # No declarations: the MovieLens-shaped names, none of which this reference has.
    plain_reference = pd.DataFrame(reference)
    plain_reference.attrs = {}
    plain = evaluate_day("2026-11-23", plain_reference, day(0.0), config)
    assert set(plain.psi) == {"genre"}
    assert plain.unchecked == ["user_ctr", "item_ctr", "item_impressions"]
    # Declarations that are not a list are refused, not ignored.
    (folder / "fields.json").write_text('{"fields": {"user_ctr_7d": "number"}}')
    with pytest.raises(ValueError, match="must be a list"):
        load_reference(settings=settings)


def test_a_day_where_every_declared_field_drifts_still_makes_valid_events() -> None:
    """Dozens of drifted statistics: the retrain request's reason is cut to the events' text
    limit, the drift event names every one."""
    rng = np.random.default_rng(8)
    names = [f"user_stat_{i:02d}_with_a_long_name" for i in range(60)]
    reference = pd.DataFrame({n: rng.random(1000) for n in names})
    reference.attrs["fields"] = [{"name": n, "categorical": False} for n in names]
    serving = pd.DataFrame({n: rng.random(1000) + 2 for n in names})
    serving["score"], serving["click"] = rng.random(1000), rng.integers(0, 2, 1000)
    config = MonitorConfig()
    verdict = evaluate_day("2026-11-23", reference, serving, config)
    assert len(verdict.drifted) == 60
    drift, retrain = verdict_events(verdict, config)
    assert len(drift.payload["drifted_features"]) == 60
    assert len(retrain.payload["reason"]) <= 2000 and retrain.payload["reason"].endswith("...")
