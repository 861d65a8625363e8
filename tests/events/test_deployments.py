"""Rollback (by command and automatic), and the serving observer: feedback, shadow, error rate."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cascade.config import Settings
from cascade.deployments import (
    ROLLED_BACK_TAG,
    ErrorRatePolicy,
    auto_rollback,
    rollback,
)
from cascade.registry import CHAMPION, PREVIOUS_CHAMPION_TAG
from serving.feedback import FeedbackConfig, FeedbackLog, log_clicks
from serving.feedback_read import load_joined_feedback
from serving.shadow import ObserverConfig, ServingObserver
from serving.shadow_report import shadow_report


class FakeAliases:
    def __init__(self, champion: str, previous: dict[str, str]) -> None:
        self.aliases = {("preranking", CHAMPION): champion}
        self.tags = {("preranking", v, PREVIOUS_CHAMPION_TAG): p for v, p in previous.items()}

    def alias_version(self, model: str, alias: str) -> str | None:
        return self.aliases.get((model, alias))

    def version_tag(self, model: str, version: str, key: str) -> str | None:
        return self.tags.get((model, version, key))

    def set_alias(self, model: str, alias: str, version: str) -> None:
        self.aliases[(model, alias)] = version

    def set_version_tag(self, model: str, version: str, key: str, value: str) -> None:
        self.tags[(model, version, key)] = value

    def locked(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


def test_rollbacks_chain_back_through_promotions_and_stop_at_the_first(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    aliases = FakeAliases("3", {"3": "2", "2": "1", "1": ""})
    first = rollback(
        model="preranking", reason="bad", settings=settings, aliases=aliases, publish=False
    )
    assert (first["from_version"], first["to_version"]) == ("3", "2")
    assert json.loads(aliases.tags[("preranking", "3", ROLLED_BACK_TAG)])["reason"] == "bad"
    rollback(model="preranking", settings=settings, aliases=aliases, publish=False)
    assert aliases.alias_version("preranking", CHAMPION) == "1"
    with pytest.raises(ValueError, match="records no previous champion"):
        rollback(model="preranking", settings=settings, aliases=aliases, publish=False)


def test_automatic_rollback_only_past_the_policy_and_only_once(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    aliases = FakeAliases("3", {"3": "2"})
    policy = ErrorRatePolicy(max_error_rate=0.1, min_requests=50)
    kwargs: dict[str, Any] = dict(
        model="preranking", policy=policy, settings=settings, aliases=aliases, publish=False
    )
    assert auto_rollback(served_version="3", requests=40, errors=40, **kwargs) is None
    assert auto_rollback(served_version="3", requests=100, errors=10, **kwargs) is None
    done = auto_rollback(served_version="3", requests=100, errors=11, **kwargs)
    assert done is not None and done["automatic"] and done["to_version"] == "2"
    assert done["moved"]
    # Another replica seeing the same errors: version 3 is no longer champion.
    again = auto_rollback(served_version="3", requests=100, errors=50, **kwargs)
    assert again is not None and not again["moved"] and again["champion_version"] == "2"
    assert "no longer v3" in again["skipped"]
    assert aliases.alias_version("preranking", CHAMPION) == "2"


def _serving_fakes() -> Any:
    if "serving_fakes" in sys.modules:  # already imported by tests/serving in this session
        return sys.modules["serving_fakes"]
    path = Path(__file__).parents[1] / "serving" / "serving_fakes.py"
    spec = importlib.util.spec_from_file_location("serving_fakes", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Registered first: its dataclasses look their module up while being defined.
    sys.modules["serving_fakes"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_shadow_scores_are_logged_beside_the_champion_without_changing_responses(
    tmp_path: Path,
) -> None:
    from kserve import InferRequest
    from kserve.protocol.infer_type import InferInput

    from serving.preranking import PreRankingModel, ServingConfig

    fakes = _serving_fakes()
    champion_file = tmp_path / "champion.json"
    fakes.write_champion(champion_file, "3", seed=3)
    base = fakes.backends(champion_file)

    def version(settings: Settings, alias: str) -> str | None:
        return "9" if alias == "challenger" else base.champion_version(settings, alias)

    def load(settings: Settings, alias: str) -> Any:
        if alias == "challenger":
            return fakes.engine_loaded("9", seed=9)
        return base.load_champion(settings, alias)

    backends = dataclasses.replace(base, champion_version=version, load_champion=load)
    settings = Settings(home=tmp_path / "home")
    plain = PreRankingModel(settings=settings, config=ServingConfig(), backends=backends)
    shadowed = PreRankingModel(settings=settings, config=ServingConfig(), backends=backends)
    feedback = FeedbackLog(settings.lake_root, FeedbackConfig(flush_rows=100_000))
    shadowed.observer = ServingObserver(
        shadowed, ObserverConfig(feedback=True, shadow_alias="challenger"), feedback=feedback
    )
    plain.load(), shadowed.load()

    def infer(model: PreRankingModel, user_id: int, item_ids: list[int], rid: str) -> Any:
        request = InferRequest(
            model_name="preranking",
            infer_inputs=[
                InferInput("user_id", [1], "INT64", [user_id]),
                InferInput("item_ids", [len(item_ids)], "INT64", item_ids),
            ],
            request_id=rid,
        )
        return asyncio.run(model.predict(request))

    items = [1, 5, 9, 13, 40]
    for user_id in range(1, 7):
        expected = infer(plain, user_id, items, f"p{user_id}").outputs[0].data
        got = infer(shadowed, user_id, items, f"r{user_id}").outputs[0].data
        np.testing.assert_allclose(got, expected)
    shadowed.observer.drain()
    ds = feedback_day = next((settings.lake_root / "feedback" / "preranking").iterdir()).name[3:]
    frame = load_joined_feedback(feedback_day, settings=settings)
    assert len(frame) == 6 * len(items)
    assert set(frame.model_version) == {"3"} and set(frame.shadow_version) == {"9"}
    assert not np.allclose(frame.score, frame.shadow_score)
    assert shadowed.observer.requests == {"3": 6} and shadowed.observer.dropped == 0
    # The served features are logged per candidate, as the monitor's drift check needs them.
    row = frame[(frame.user_id == 2) & (frame.item_id == 5)].iloc[0]
    assert row.user_imp_7d == fakes.user_value("user_imp_7d", 2) == 20.0
    assert row.item_imp_7d == fakes.item_value("item_imp_7d", 5) == 26.0
    assert row.genre == fakes.genre_of(5)
    assert set(frame.columns) >= {*fakes.USER_FIELDS, *fakes.ITEM_FIELDS, "genre"}
    log_clicks(
        ds, frame[["request_id", "item_id"]].assign(click=frame.item_id % 2), settings=settings
    )
    report = shadow_report(load_joined_feedback(ds, settings=settings))
    assert report["requests"] == 6 and report["shadow_versions"] == ["9"]
    assert 0 <= report["top1_agreement"] <= 1 and report["champion_online_auc"] is not None


def test_observer_rolls_back_when_errors_cross_the_policy(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def fake_rollback(**kwargs: Any) -> dict[str, Any] | None:
        calls.append(kwargs)
        policy = ErrorRatePolicy(max_error_rate=0.2, min_requests=10)
        if (
            kwargs["requests"] >= policy.min_requests
            and kwargs["errors"] / kwargs["requests"] > 0.2
        ):
            return {"to_version": "2"}
        return None

    class Model:
        settings = Settings(home=tmp_path)

    class Served:
        version = "3"

    observer = ServingObserver(Model(), ObserverConfig(auto_rollback=True), rollback=fake_rollback)
    ok = np.zeros(1, dtype=np.float32)
    for i in range(10):
        observer.observed(Served(), f"r{i}", 1, np.array([1]), ok)
    for _ in range(3):
        observer.failed(Served())
    observer.drain()
    assert [c["errors"] for c in calls] == [1, 2, 3]
    # The third error crossed 20 % over >= 10 requests: rolled back, counts reset.
    assert observer.requests == {} and observer.errors == {}
