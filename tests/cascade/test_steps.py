import datetime as dt
import json
from pathlib import Path

import pytest

from cascade import steps


def test_asset_triggered_run_takes_newest_event_partition() -> None:
    extras = [
        {"payload": {"partition": "2026-11-20"}},
        {"payload": {"partition": "2026-11-21"}},
        {"payload": {}},
        "not a mapping",
    ]
    logical = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert steps.resolve_partition(extras, logical, None) == "2026-11-21"


def test_scheduled_run_takes_logical_date_then_run_after() -> None:
    logical = dt.datetime(2026, 11, 22, 3, tzinfo=dt.UTC)
    assert steps.resolve_partition([], logical, None) == "2026-11-22"
    assert steps.resolve_partition([], None, logical + dt.timedelta(days=1)) == "2026-11-23"
    with pytest.raises(ValueError, match="cannot resolve"):
        steps.resolve_partition([], None, None)


def test_bad_event_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        steps.resolve_partition([{"payload": {"partition": "22/11/2026"}}], None, None)


def test_run_step_records_a_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setitem(steps.STEPS, "features", lambda ds: {"ds": ds, "rows": 3})
    assert steps.run_step("features", "2026-11-22") == {"ds": "2026-11-22", "rows": 3}
    summary = steps.summary_path("features", "2026-11-22")
    assert summary.is_relative_to(tmp_path)
    assert json.loads(summary.read_text())["rows"] == 3
    with pytest.raises(KeyError, match="unknown ctr_preranking step"):
        steps.run_step("nope", "2026-11-22")
    with pytest.raises(KeyError, match="unknown pipeline"):
        steps.run_step("features", "2026-11-22", "nope")
    # The asr pipeline's summaries are kept apart from ctr_preranking's steps of the same name.
    monkeypatch.setitem(steps.ASR_STEPS, "train", lambda ds: {"ds": ds, "asr": True})
    steps.run_step("train", "2026-11-22", "asr")
    asr_summary = steps.summary_path("train", "2026-11-22", "asr")
    assert asr_summary != steps.summary_path("train", "2026-11-22")
    assert json.loads(asr_summary.read_text())["asr"] is True
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        steps.run_step("features", "2026-13-40")


def test_cascade_step_runs_a_multimodal_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.cli import main

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setitem(steps.MULTIMODAL_STEPS, "evaluate", lambda ds: {"ds": ds, "mm": True})
    assert main(["step", "evaluate", "--pipeline", "multimodal", "--ds", "2026-11-22"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ds": "2026-11-22", "mm": True}
    summary = steps.summary_path("evaluate", "2026-11-22", "multimodal")
    assert summary.parent.parent.name == "step_mm_evaluate"
    assert list(steps.PIPELINES["multimodal"]) == [
        "corpus", "validate", "train", "evaluate", "register"
    ]  # fmt: skip


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
    steps.train("2026-11-22")
    assert calls == [(launcher, "2026-11-22")]
