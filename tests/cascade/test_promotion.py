"""The promotion gate: compile gate, metric direction and tolerance, and no alias move when the
champion changed between the decision and the move."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cascade.config import Settings
from cascade.pipeline_spec import Promotion
from cascade.promotion import Baseline, NewVersion, Scores, compare, decide, register_and_promote
from cascade.registry import CHALLENGER, CHAMPION, DECISION_TAG, PREVIOUS_CHAMPION_TAG
from cascade.tracking_auth import (
    PASSWORD_VAR,
    PROMOTER,
    USERNAME_VAR,
    WRITER,
    ensure_tracking_credentials,
    role_credentials,
)

NAME = "toy"


@dataclass
class Version:
    name: str
    version: str
    run_id: str
    tags: dict[str, str] = field(default_factory=dict)


class FakeRegistry:
    """The client calls the gate makes, on an in-memory registry. ``before_move`` runs right
    before the champion alias is read again (another process moving it meanwhile)."""

    def __init__(self) -> None:
        self.versions: dict[str, Version] = {}
        self.aliases: dict[str, str] = {}
        self.moves: list[tuple[str, str]] = []
        self.before_recheck: Any = None
        self._reads = 0

    def create_registered_model(self, name: str, description: str = "") -> None:
        pass

    def search_model_versions(self, query: str) -> list[Version]:
        run_id = query.split("run_id='")[1].rstrip("'")
        return [v for v in self.versions.values() if v.run_id == run_id]

    def create_model_version(self, name: str, **kwargs: Any) -> Version:
        version = Version(name, str(len(self.versions) + 1), kwargs["run_id"], dict(kwargs["tags"]))
        self.versions[version.version] = version
        return version

    def get_model_version_by_alias(self, name: str, alias: str) -> Version:
        if alias == CHAMPION:
            self._reads += 1
            if self._reads == 2 and self.before_recheck is not None:
                self.before_recheck(self)
        if alias not in self.aliases:
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

            raise MlflowException("no alias", error_code=RESOURCE_DOES_NOT_EXIST)
        return self.versions[self.aliases[alias]]

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        self.aliases[alias] = version
        self.moves.append((alias, version))

    def set_model_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.versions[version].tags[key] = value


def toy_version(run_id: str, **tags: str) -> NewVersion:
    return NewVersion(
        name=NAME, model_description="", run_id=run_id, source="s", tags=tags, description=""
    )


def version_of(client: FakeRegistry, run_id: str, score: float) -> Version:
    return client.create_model_version(NAME, run_id=run_id, tags={"score": repr(score)})


def tag_scores(challenger: float) -> Any:
    return lambda champion: Scores(
        challenger=challenger, champion=float(champion.tags["score"]), rows="the same rows"
    )


HIGHER = Promotion(metric="auc", higher_is_better=True, tolerance=0.01)
LOWER = Promotion(metric="cer", higher_is_better=False, tolerance=0.01)


@pytest.mark.parametrize(
    ("promotion", "challenger", "passed"),
    [
        (HIGHER, 0.70, True),
        (HIGHER, 0.691, True),  # worse, within the tolerance
        (HIGHER, 0.689, False),
        (LOWER, 0.70, True),
        (LOWER, 0.709, True),
        (LOWER, 0.711, False),
        (Promotion(metric="auc", higher_is_better=True), 0.6999, False),
    ],
)
def test_compare_respects_direction_and_tolerance(
    promotion: Promotion, challenger: float, passed: bool
) -> None:
    verdict = compare(
        promotion,
        Scores(challenger=challenger, champion=0.70, rows="the same 10 rows", details={"rows": 10}),
        champion="3",
    )
    assert verdict["passed"] is passed and verdict["rows"] == 10
    assert verdict["metric"] == promotion.metric
    if not passed:
        direction = "below" if promotion.higher_is_better else "above"
        assert f"{direction} champion {promotion.metric}" in verdict["reason"]
        assert "worse than champion v3" in verdict["reason"]


def test_first_version_needs_a_passed_compile_report_when_required() -> None:
    required = Promotion(metric="auc", higher_is_better=True, requires_compile_gate=True)
    client = FakeRegistry()
    first = version_of(client, "r1", 0.7)
    refused = decide(
        client, NAME, first, promotion=required, score=tag_scores(0.7), compile_gate=None
    )
    assert not refused.promoted and refused.champion_version is None
    assert refused.reasons == [
        "compile gate: no report; the compile step must pass before a promotion"
    ]
    assert client.aliases == {CHALLENGER: "1"}

    failed = decide(
        client,
        NAME,
        first,
        promotion=required,
        score=tag_scores(0.7),
        compile_gate={"passed": False, "reasons": ["parity"]},
    )
    assert not failed.promoted and failed.reasons == ["compile gate: parity"]

    passed = decide(
        client,
        NAME,
        first,
        promotion=required,
        score=tag_scores(0.7),
        compile_gate={"passed": True, "reasons": []},
    )
    assert passed.promoted and client.aliases[CHAMPION] == "1"
    # Where no compile step is required, a missing report does not block.
    second = version_of(client, "r2", 0.7)
    unrequired = decide(
        client, NAME, second, promotion=HIGHER, score=tag_scores(0.7), compile_gate=None
    )
    assert unrequired.promoted and unrequired.previous_champion == "1"
    assert client.versions["2"].tags[PREVIOUS_CHAMPION_TAG] == "1"


def test_refuses_a_worse_challenger_in_the_metric_direction() -> None:
    client = FakeRegistry()
    decide(client, NAME, version_of(client, "r1", 0.30), promotion=LOWER, score=tag_scores(0.30),
           compile_gate=None)  # fmt: skip
    worse = decide(client, NAME, version_of(client, "r2", 0.35), promotion=LOWER,
                   score=tag_scores(0.35), compile_gate=None)  # fmt: skip
    assert not worse.promoted and worse.champion_version == "1"
    assert worse.comparison is not None and worse.comparison["champion"] == 0.30
    assert "above champion cer" in worse.reasons[0]
    assert client.aliases == {CHAMPION: "1", CHALLENGER: "2"}


def test_alias_stays_when_the_champion_changed_before_the_move() -> None:
    client = FakeRegistry()
    decide(client, NAME, version_of(client, "r1", 0.70), promotion=HIGHER,
           score=tag_scores(0.70), compile_gate=None)  # fmt: skip
    other = version_of(client, "r-other", 0.90)

    def someone_promotes_another(registry: FakeRegistry) -> None:
        registry.aliases[CHAMPION] = other.version

    client.before_recheck = someone_promotes_another
    client._reads = 0
    result = register_and_promote(
        client,
        toy_version("r3", score="0.8"),
        promotion=HIGHER,
        score=tag_scores(0.80),
        compile_gate=None,
        report=lambda d: {
            "promoted": d.promoted,
            "champion": d.champion_version,
            "reasons": d.reasons,
        },  # fmt: skip
    )
    assert result["promoted"] is False and result["champion"] == other.version
    assert "changed from v1 to v2" in result["reasons"][0]
    assert client.aliases[CHAMPION] == other.version  # not moved to v3
    assert (CHAMPION, "3") not in client.moves
    new = client.versions["3"]
    # Not stored: registering again decides against the new champion.
    assert DECISION_TAG not in new.tags and PREVIOUS_CHAMPION_TAG not in new.tags
    client.before_recheck = None
    again = register_and_promote(
        client,
        NewVersion(
            name=NAME, model_description="", run_id="r3", source="s", tags={}, description=""
        ),  # fmt: skip
        promotion=HIGHER,
        score=tag_scores(0.80),
        compile_gate=None,
        report=lambda d: {"promoted": d.promoted, "previous": d.previous_champion},
    )
    assert again == {"promoted": False, "previous": "2"}
    assert json.loads(client.versions["3"].tags[DECISION_TAG]) == again


def test_a_challenger_under_the_baseline_is_refused_with_or_without_a_champion() -> None:
    """Better than the champion is not enough: a challenger that does not beat the model-free
    baseline (item popularity) on the same rows stays a challenger, and the decision says why."""
    client = FakeRegistry()

    def popularity(challenger: float) -> Baseline:
        return Baseline(
            name="item popularity", metric="auc", challenger=challenger, baseline=0.55,
            rows="the same 600 held-out rows",
        )  # fmt: skip

    def decided(run_id: str, auc: float, floor: Baseline) -> Any:
        return decide(client, NAME, version_of(client, run_id, auc), promotion=HIGHER,
                      score=tag_scores(auc), compile_gate=None, baseline=floor)  # fmt: skip

    first = decided("r1", 0.52, popularity(0.52))
    assert not first.promoted and first.champion_version is None
    assert first.reasons == [
        "challenger auc 0.5200 does not beat the item popularity baseline's 0.5500 on the same "
        "600 held-out rows"
    ]
    assert first.record()["baseline"] == {
        "name": "item popularity", "metric": "auc", "challenger": 0.52, "baseline": 0.55,
        "rows": "the same 600 held-out rows", "passed": False, "reason": first.reasons[0],
    }  # fmt: skip

    champion = decided("r2", 0.60, popularity(0.60))
    assert champion.promoted and champion.record()["baseline"]["passed"] is True

    # Within the champion's tolerance (0.595 vs 0.60) yet not above popularity's 0.60.
    def high_floor(challenger: float) -> Baseline:
        return Baseline(name="item popularity", metric="auc", challenger=challenger,
                        baseline=0.60, rows="the same 600 held-out rows")  # fmt: skip

    under = decided("r3", 0.595, high_floor(0.595))
    assert under.comparison is not None and under.comparison["passed"]
    assert not under.promoted and client.aliases[CHAMPION] == "2"
    assert "does not beat the item popularity baseline's 0.6000" in under.reasons[0]


def test_a_spec_rule_changes_only_through_documented_settings_fields() -> None:
    """The spec holds the rule; a settings field named by the rule replaces a value only when
    set, and a spec naming a field its settings lack, or one without a docstring, is refused."""
    from typing import ClassVar, Literal

    from pydantic.dataclasses import dataclass as settings_class

    from cascade.pipeline_spec import Pipeline, RegisteredModel, Step
    from cascade.settings_fields import SETTINGS_CONFIG

    @settings_class(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
    class ToySettings:
        env_pattern: ClassVar[str] = "CASCADE_TOY_{}"
        title: ClassVar[str] = "Pipeline toy"

        metric: Literal["auc", "logloss"] | None = None
        """The promotion metric instead of the spec's."""
        tolerance: float | None = None
        """The promotion tolerance instead of the spec's."""
        undocumented: float | None = None

    rule = Promotion(
        metric="auc",
        higher_is_better=True,
        tolerance=0.01,
        metrics={"auc": True, "logloss": False},
        metric_setting="metric",
        tolerance_setting="tolerance",
    )

    def spec(promotion: Promotion) -> Pipeline:
        return Pipeline(
            name="toy",
            description="",
            cron="0 1 * * *",
            settings=ToySettings,
            model=RegisteredModel(name=NAME, promotion=promotion),
            steps=(Step(name="fit", run=lambda ctx: {}),),
        )

    toy = spec(rule)
    assert toy.promotion(ToySettings()) == rule
    changed = toy.promotion(ToySettings(metric="logloss", tolerance=0.2))
    assert changed is not None
    assert (changed.metric, changed.higher_is_better, changed.tolerance) == ("logloss", False, 0.2)
    assert toy.promotion_variables() == {
        "metric": "CASCADE_TOY_METRIC",
        "tolerance": "CASCADE_TOY_TOLERANCE",
    }
    described = toy.describe(ToySettings(tolerance=0.3))["registered_model"]["promotion"]
    assert (described["metric"], described["tolerance"]) == ("auc", 0.3)
    with pytest.raises(ValueError, match="'missing', which its settings class ToySettings lacks"):
        spec(Promotion(metric="auc", higher_is_better=True, tolerance_setting="missing"))
    with pytest.raises(ValueError, match="'undocumented' overrides the promotion tolerance"):
        spec(Promotion(metric="auc", higher_is_better=True, tolerance_setting="undocumented"))
    with pytest.raises(ValueError, match="needs `metrics` to list 'auc'"):
        Promotion(metric="auc", higher_is_better=True, metric_setting="metric")


class RecordingRegistry(FakeRegistry):
    """Records the MLflow user in this process's environment at each registry write."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: set[str | None] = set()

    def create_model_version(self, name: str, **kwargs: Any) -> Version:
        self.writers.add(os.environ.get(USERNAME_VAR))
        return super().create_model_version(name, **kwargs)

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        self.writers.add(os.environ.get(USERNAME_VAR))
        super().set_registered_model_alias(name, alias, version)


def test_the_gate_writes_the_registry_as_the_promoter_and_only_while_it_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path / "state")
    ensure_tracking_credentials(settings)
    writer, promoter = role_credentials(settings, WRITER), role_credentials(settings, PROMOTER)
    assert writer is not None and promoter is not None
    monkeypatch.setenv(USERNAME_VAR, writer[0])  # what the task's environment holds
    monkeypatch.setenv(PASSWORD_VAR, writer[1])
    client = RecordingRegistry()
    result = register_and_promote(
        client,
        toy_version("r1", score="0.7"),
        promotion=HIGHER,
        score=tag_scores(0.70),
        compile_gate=None,
        report=lambda d: {"promoted": d.promoted},
        settings=settings,
    )
    assert result == {"promoted": True} and client.aliases[CHAMPION] == "1"
    assert client.writers == {promoter[0]}
    assert os.environ[USERNAME_VAR] == writer[0] and os.environ[PASSWORD_VAR] == writer[1]
