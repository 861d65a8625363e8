import pytest

from cascade.step_context import StepContext
from pipelines import ctr_preranking


def test_train_step_launches_the_fscd_cascade_with_the_pipeline_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from models.preranking import cascade_train

    calls: list[tuple] = []
    monkeypatch.setattr(
        cascade_train,
        "launch_pipeline",
        lambda ds, *, settings, **knobs: calls.append((ds, knobs)),
    )
    for name in ("CONFIG", "EPOCHS", "LR", "VALIDATION_FRACTION", "COST_BUDGET"):
        monkeypatch.delenv(f"CASCADE_PRERANKING_{name}", raising=False)
    ctr_preranking.train(StepContext.build(ctr_preranking.PIPELINE, "train", "2026-11-22"))
    knobs = {"config": "pipeline", "epochs": None, "lr": None}
    assert calls == [("2026-11-22", {**knobs, "validation_fraction": None, "cost_budget": None})]
    assert "model" not in ctr_preranking.PIPELINE.step("train").params  # one network, no choice


def test_the_train_steps_knobs_reach_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `cascade step train --param ...` (the DVC stage) sets is what the trainer gets,
    through the step's settings and not through the environment."""
    import os

    from models.preranking import cascade_train

    calls: list[dict] = []
    monkeypatch.setattr(
        cascade_train, "launch_pipeline", lambda ds, *, settings, **knobs: calls.append(knobs)
    )
    given = {
        "config": "debug",
        "epochs": "4",
        "lr": "0.01",
        "validation_fraction": "0.4",
        "cost_budget": "0.7",
    }
    before = dict(os.environ)
    ctr_preranking.train(
        StepContext.build(ctr_preranking.PIPELINE, "train", "2026-11-22", params=given)
    )
    assert dict(os.environ) == before
    assert calls == [
        {
            "config": "debug",
            "epochs": 4,
            "lr": 0.01,
            "validation_fraction": 0.4,
            "cost_budget": 0.7,
        }
    ]


def test_epochs_and_learning_rate_override_the_config() -> None:
    from models.preranking.config_registry import (
        get_cascade_config,
        override_args,
        with_overrides,
    )

    base = get_cascade_config("debug")
    changed = with_overrides(base, epochs=base.epochs + 1, lr=0.5)
    assert (changed.epochs, changed.lr) == (base.epochs + 1, 0.5)
    assert with_overrides(base) == base
    assert override_args(epochs=3, lr=0.5) == ["--epochs", "3", "--lr", "0.5"]
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        with_overrides(base, epochs=0)


def test_scoring_needs_a_user_and_items() -> None:
    with pytest.raises(ValueError, match="--user ID and --items"):
        ctr_preranking.score({"user": 1, "items": None})


def test_the_pipeline_runs_when_ctr_cross_publishes_a_partition() -> None:
    """Chained by data: ctr_cross's published statistics start it (no clock), a retrain
    request too; its first step reads what ctr_cross published."""
    from cascade.assets import ASSET_CTR_CROSS_FEATURES, CTR_EVENT_SELECTORS
    from pipelines import ctr_cross

    spec = ctr_preranking.PIPELINE
    assert spec.after == (ASSET_CTR_CROSS_FEATURES,) and spec.cron is None
    published = [s.name for s in ctr_cross.PIPELINE.steps if ASSET_CTR_CROSS_FEATURES in s.outlets]
    assert published == ["feast"]
    assert CTR_EVENT_SELECTORS == ("cascade.retrain.requested:model=preranking",)
    assert spec.step_names == ("training_set", "train", "compile", "register", "deploy")
    assert spec.step("training_set").spark


def test_the_training_days_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from cascade.config import load_group

    monkeypatch.setenv("CASCADE_PRERANKING_TRAIN_DAYS", "0")
    with pytest.raises(ValueError, match="TRAIN_DAYS must be >= 1, got 0"):
        load_group(ctr_preranking.PrerankingSettings)
    monkeypatch.setenv("CASCADE_PRERANKING_TRAIN_DAYS", "3")
    monkeypatch.setenv("CASCADE_PRERANKING_SOURCE", "Bad-Name")
    with pytest.raises(ValueError, match="CASCADE_PRERANKING_SOURCE"):
        load_group(ctr_preranking.PrerankingSettings)


def test_the_promotion_overrides_are_bounded_and_the_spec_holds_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cascade.config import SettingsError

    spec = ctr_preranking.PIPELINE
    for name in ("METRIC", "TOLERANCE"):
        monkeypatch.delenv(f"CASCADE_PRERANKING_PROMOTION_{name}", raising=False)
    assert spec.promotion() == spec.model.promotion  # type: ignore[union-attr]
    monkeypatch.setenv("CASCADE_PRERANKING_PROMOTION_METRIC", "logloss")
    monkeypatch.setenv("CASCADE_PRERANKING_PROMOTION_TOLERANCE", "0.02")
    rule = spec.promotion()
    assert rule is not None
    assert (rule.metric, rule.higher_is_better, rule.tolerance) == ("logloss", False, 0.02)
    assert rule.requires_compile_gate  # the spec's, no setting overrides it
    monkeypatch.setenv("CASCADE_PRERANKING_PROMOTION_TOLERANCE", "2")
    with pytest.raises(SettingsError, match="PROMOTION_TOLERANCE must be < 1"):
        spec.promotion()
