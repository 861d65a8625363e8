import pytest

from pipelines import ctr_preranking


@pytest.mark.parametrize(("kind", "launcher"), [("fscd", "cascade_train"), ("mlp", "train")])
def test_train_step_launches_the_configured_network(
    monkeypatch: pytest.MonkeyPatch, kind: str, launcher: str
) -> None:
    from models.preranking import cascade_train, train

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(
        cascade_train, "launch_pipeline", lambda ds, settings: calls.append(("cascade_train", ds))
    )
    monkeypatch.setattr(train, "launch", lambda ds, settings: calls.append(("train", ds)))
    monkeypatch.setenv("CASCADE_PRERANKING_MODEL", kind)
    ctr_preranking.train("2026-11-22")
    assert calls == [(launcher, "2026-11-22")]


def test_scoring_needs_a_user_and_items() -> None:
    with pytest.raises(ValueError, match="--user ID and --items"):
        ctr_preranking.score({"user": 1, "items": None})
