import pytest

from pipelines import ctr_preranking


@pytest.mark.parametrize(
    ("kind", "launcher", "config"),
    [("fscd", "cascade_train", "pipeline"), ("mlp", "train", "ml100k")],
)
def test_train_step_launches_the_configured_network(
    monkeypatch: pytest.MonkeyPatch, kind: str, launcher: str, config: str
) -> None:
    from models.preranking import cascade_train, train

    calls: list[tuple] = []

    def fake(name: str):  # type: ignore[no-untyped-def]
        return lambda ds, *, settings, **knobs: calls.append((name, ds, knobs))

    monkeypatch.setattr(cascade_train, "launch_pipeline", fake("cascade_train"))
    monkeypatch.setattr(train, "launch", fake("train"))
    monkeypatch.setenv("CASCADE_PRERANKING_MODEL", kind)
    for name in ("CONFIG", "EPOCHS", "LR", "VALIDATION_FRACTION", "COST_BUDGET"):
        monkeypatch.delenv(f"CASCADE_PRERANKING_{name}", raising=False)
    ctr_preranking.train("2026-11-22")
    knobs: dict[str, object] = {"config": config, "epochs": None, "lr": None}
    if kind == "fscd":
        knobs["validation_fraction"] = knobs["cost_budget"] = None
    assert calls == [(launcher, "2026-11-22", knobs)]


def test_the_train_steps_knobs_reach_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `cascade step train --param ...` (the DVC stage) sets is what the trainer gets."""
    from cascade.step_runner import knob_environment
    from models.preranking import cascade_train

    calls: list[dict] = []
    monkeypatch.setattr(
        cascade_train, "launch_pipeline", lambda ds, *, settings, **knobs: calls.append(knobs)
    )
    step = ctr_preranking.PIPELINE.step("train")
    given = {
        "model": "fscd",
        "config": "debug",
        "epochs": "4",
        "lr": "0.01",
        "validation_fraction": "0.4",
        "cost_budget": "0.7",
    }
    for name, value in knob_environment(step, given).items():
        monkeypatch.setenv(name, value)
    ctr_preranking.train("2026-11-22")
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
