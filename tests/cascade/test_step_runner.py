import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest

from cascade import pipeline_registry, step_runner
from cascade.partitions import resolve_partition
from cascade.pipeline_spec import Pipeline


def with_step(monkeypatch: pytest.MonkeyPatch, pipeline: str, name: str, run) -> None:  # type: ignore[no-untyped-def]
    """Replace one step function of a registered pipeline for the test."""
    pipelines = dict(pipeline_registry.registered_pipelines())
    spec: Pipeline = pipelines[pipeline]
    steps = tuple(dataclasses.replace(s, run=run) if s.name == name else s for s in spec.steps)
    pipelines[pipeline] = dataclasses.replace(spec, steps=steps)
    monkeypatch.setattr(pipeline_registry, "_cache", pipelines)


def test_asset_triggered_run_takes_its_events_one_partition() -> None:
    extras = [
        {"payload": {"partition": "2026-11-21"}},
        {"payload": {"partition": "2026-11-21"}},
        {"payload": {}},
        "not a mapping",
    ]
    logical = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert resolve_partition(extras, logical, None) == "2026-11-21"  # type: ignore[arg-type]
    # Two partitions are two runs' work: never settled by building the newest alone.
    two = [*extras, {"payload": {"partition": "2026-11-20"}}]
    with pytest.raises(ValueError, match="2 partitions"):
        resolve_partition(two, logical, None)  # type: ignore[arg-type]


def test_scheduled_run_takes_logical_date_then_run_after_minus_the_lag() -> None:
    logical = dt.datetime(2026, 11, 22, 3, tzinfo=dt.UTC)
    assert resolve_partition([], logical, None) == "2026-11-22"
    assert resolve_partition([], None, logical + dt.timedelta(days=1)) == "2026-11-23"
    assert resolve_partition([], logical, None, lag_days=1) == "2026-11-21"
    with pytest.raises(ValueError, match="cannot resolve"):
        resolve_partition([], None, None)


def test_bad_event_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        resolve_partition([{"payload": {"partition": "22/11/2026"}}], None, None)


def test_run_step_records_a_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    with_step(monkeypatch, "ctr_preranking", "training_set", lambda ctx: {"ds": ctx.ds, "rows": 3})
    assert step_runner.run_step("training_set", "2026-11-22", "ctr_preranking") == {
        "ds": "2026-11-22",
        "rows": 3,
    }
    summary = step_runner.summary_path("training_set", "2026-11-22", "ctr_preranking")
    assert summary.is_relative_to(tmp_path)
    assert json.loads(summary.read_text())["rows"] == 3
    with pytest.raises(KeyError, match="unknown ctr_preranking step"):
        step_runner.run_step("nope", "2026-11-22", "ctr_preranking")
    with pytest.raises(KeyError, match="unknown pipeline"):
        step_runner.run_step("training_set", "2026-11-22", "nope")
    # The asr pipeline's summaries are kept apart from ctr_preranking's steps of the same name.
    with_step(monkeypatch, "asr", "train", lambda ctx: {"ds": ctx.ds, "asr": True})
    step_runner.run_step("train", "2026-11-22", "asr")
    asr_summary = step_runner.summary_path("train", "2026-11-22", "asr")
    assert asr_summary != step_runner.summary_path("train", "2026-11-22", "ctr_preranking")
    assert json.loads(asr_summary.read_text())["asr"] is True
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        step_runner.run_step("training_set", "2026-13-40", "ctr_preranking")


def test_cascade_step_runs_a_multimodal_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.cli import main

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    with_step(monkeypatch, "multimodal", "evaluate", lambda ctx: {"ds": ctx.ds, "mm": True})
    assert main(["step", "evaluate", "--pipeline", "multimodal", "--ds", "2026-11-22"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ds": "2026-11-22", "mm": True}
    summary = step_runner.summary_path("evaluate", "2026-11-22", "multimodal")
    assert summary.parent.parent.name == "step_mm_evaluate"
    assert pipeline_registry.get_pipeline("multimodal").step_names == (
        "corpus", "validate", "train", "evaluate", "register"
    )  # fmt: skip


def test_a_step_the_pipeline_lacks_is_one_clear_cli_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cascade.cli import main

    assert main(["step", "nope", "--pipeline", "asr", "--ds", "2026-11-22"]) == 2
    err = capsys.readouterr().err
    assert "unknown asr step 'nope'" in err and "corpus, validate" in err


def test_an_entry_point_shadowed_by_a_plain_module_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the DAG processor would import for the ``pipelines`` entry point if a DAG file of
    # that name sat first on sys.path: a module with no PIPELINE and no submodules.
    (tmp_path / "pipelines.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import sys

    monkeypatch.delitem(sys.modules, "pipelines", raising=False)
    with pytest.raises(pipeline_registry.PipelineRegistryError, match="defines no PIPELINE"):
        pipeline_registry.registered_pipelines(refresh=True)
    monkeypatch.delitem(sys.modules, "pipelines", raising=False)
    monkeypatch.setattr(pipeline_registry, "_cache", None)
