"""Speech, each standard layout end to end: a small corpus written in the layout lands with
``cascade land speech``, and the ``asr`` pipeline's steps run on it through the step runner (the
entry of the DAG's tasks, ``cascade step`` and DVC) up to the gate before training. Two readers
whose voices all hash to the training split are refused by the gate, which names the empty test
split (the model is evaluated on held-out voices); a reader held out for the test split passes
it. The event route: the DAG's first task lands the batch an event names by ``path``.

Training, compiling and registering need the stack (MLflow) and two DeepSpeed processes: the
stack tests (tests/e2e) cover that part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cascade.events import make_event
from cascade.lake import Lake
from cascade.landing import landing_dir
from jobs.audio_corpus_gate import CorpusGateFailed
from tests.pipelines.standard_layouts import (
    SPEECH_WRITERS,
    first_task_claiming,
    land_with_cli,
    run_until_refused,
    utterances,
)

pytestmark = pytest.mark.spark

DS = "2026-11-22"
UNTIL_TRAINING = ("corpus", "validate")
HELD_OUT = ("1000", "1019")
"""Readers whose voices split into train and test (the split is a hash of the voice)."""
TRAIN_ONLY = ("1000", "1001")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession) -> Path:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize(
    ("fmt", "speakers"),
    [
        # 331 s on a loaded 2-core machine (the first: Spark and GX warm up); the others 23-42 s
        pytest.param("jsonl", HELD_OUT, marks=pytest.mark.slow),
        ("kaldi", TRAIN_ONLY),
        ("librispeech", TRAIN_ONLY),
        ("common_voice", TRAIN_ONLY),
    ],
)
def test_a_landed_corpus_runs_to_the_gate(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    speakers: tuple[str, ...],
) -> None:
    path = SPEECH_WRITERS[fmt](tmp_path / "source", utterances(speakers, 3))

    record = land_with_cli(capsys, "speech", path, DS, "--format", fmt)

    assert record["format"] == fmt and record["path"] == str(path.resolve())
    assert record["counts"] == {"utterances": 6, "speakers": 2, "quarantined": 0, "seconds": 9}
    run = run_until_refused("asr", DS, UNTIL_TRAINING)
    corpus = run.results["corpus"]
    assert corpus["utterances"] == 6 and corpus["quarantined"] == 0
    assert corpus["landed_from"] == fmt
    if speakers == HELD_OUT:
        assert run.refusal is None
        assert corpus["splits"]["test"] == 3 and corpus["splits"]["train"] == 3
        assert run.results["validate"]["success"] and run.results["validate"]["voices"] == 2
    else:
        assert isinstance(run.refusal, CorpusGateFailed) and "validate" not in run.results
        assert corpus["splits"] == {"train": 6, "dev": 0, "test": 0}
        assert str(run.refusal).startswith("speech corpus gate failed: ")
        assert run.refusal.report["failed"] == [
            "splits.expect_column_values_to_be_between(test_utterances)"
        ]


def test_an_events_path_lands_in_the_first_task_and_runs_to_the_gate(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAG's first task, without Airflow: the claimed event names a LibriSpeech folder."""
    batch = SPEECH_WRITERS["librispeech"](tmp_path / "producer", utterances(HELD_OUT, 2))
    event = make_event(
        "cascade.data.landed",
        {"dataset": "speech", "partition": DS, "path": str(batch), "format": "librispeech"},
    )
    first = first_task_claiming(monkeypatch, "asr", [event])

    corpus = first(DS)

    landing = landing_dir(Lake(home / "lake"), "speech", DS)
    assert json.loads((landing / "_LANDED.json").read_text())["format"] == "librispeech"
    assert corpus["utterances"] == 4 and corpus["landed_from"] == "librispeech"
    assert corpus["splits"]["test"] == 2
    validated = run_until_refused("asr", DS, ("validate",))
    assert validated.refusal is None and validated.results["validate"]["success"]
