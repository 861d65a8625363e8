"""No pipeline makes up its data: with nothing landed for the partition the first step of the
speech, image and click-log pipelines ends the run as skipped ("nothing landed for DS"),
records it for the run report, and nothing after it runs; `cascade step` says so with the
not-ready exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade import cli
from cascade.config import Settings
from cascade.errors import NothingLanded
from cascade.lake import Lake
from cascade.run_report import collect_steps
from cascade.step_runner import TIMING_FILE, run_step, summary_path

DS = "2026-11-22"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    return Settings(home=tmp_path / "home")


@pytest.mark.parametrize(
    ("pipeline", "first", "folder", "fix"),
    [
        ("asr", "corpus", "speech", "--source synthetic"),
        ("multimodal", "corpus", "images", "--source generated"),
        ("ctr_cross", "log", "impressions", "--source generated"),
    ],
)
def test_the_first_step_skips_a_partition_with_nothing_landed(
    settings: Settings,
    pipeline: str,
    first: str,
    folder: str,
    fix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lake = Lake(settings.lake_root)
    with pytest.raises(NothingLanded, match=f"^nothing landed for {DS}: .*cascade land {folder}"):
        run_step(first, DS, pipeline)

    # Nothing was made up: no landing folder, no corpus or features, no later step's result.
    assert not (lake.root / "landing" / folder).exists()
    assert not (lake.root / "corpora").exists() and not (lake.root / "features").exists()
    timing = json.loads(summary_path(first, DS, pipeline).with_name(TIMING_FILE).read_text())
    assert timing["status"] == "skipped" and timing["error"].startswith(f"nothing landed for {DS}")
    steps = {s.step: s for s in collect_steps(lake, DS, [pipeline])}
    assert steps[first].status == "skipped" and "nothing landed" in str(steps[first].error)
    assert {s.status for name, s in steps.items() if name != first} == {"not run"}

    assert cli.main(["step", first, "--pipeline", pipeline, "--ds", DS]) == cli.EXIT_NOT_READY
    error = capsys.readouterr().err
    assert f"nothing landed for {DS}" in error and fix in error
