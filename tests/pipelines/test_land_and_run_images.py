"""Image-text, each standard layout end to end: a small set of captioned pictures written in the
layout lands with ``cascade land images``, and the ``multimodal`` pipeline's steps run on it
through the step runner (the entry of the DAG's tasks, ``cascade step`` and DVC) up to the gate
before training; a batch whose captions the corpus job refuses (a language it does not take)
ends at the gate, which names the empty manifest. The event route: the DAG's first task lands
the batch an event names by ``path``.

Training and registering need the stack (MLflow) and two DeepSpeed processes: the stack tests
(tests/e2e) cover that part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cascade.events import make_event
from cascade.lake import Lake
from cascade.landing import landing_dir
from jobs.multimodal_corpus_gate import MultimodalGateFailed
from tests.pipelines.standard_layouts import (
    IMAGE_WRITERS,
    first_task_claiming,
    land_with_cli,
    run_until_refused,
)

pytestmark = pytest.mark.spark

DS = "2026-11-22"
UNTIL_TRAINING = ("corpus", "validate")
PAIRS = 12


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession) -> Path:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize(
    "fmt",
    [
        # 252 s on a loaded 2-core machine (the first: Spark and GX warm up); the others 46-47 s
        pytest.param("coco", marks=pytest.mark.slow),
        "image_folder",
        "webdataset",
    ],
)
def test_a_landed_batch_runs_to_the_gate(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    path = IMAGE_WRITERS[fmt](tmp_path / "source", PAIRS)

    record = land_with_cli(capsys, "images", path, DS, "--format", fmt)

    assert record["format"] == fmt
    assert record["counts"] == {"pairs": PAIRS, "images": PAIRS, "quarantined": 0}
    run = run_until_refused("multimodal", DS, UNTIL_TRAINING)
    assert run.refusal is None, run.refusal
    corpus = run.results["corpus"]
    assert corpus["landed_from"] == fmt and corpus["quarantined"] == 0
    assert corpus["kept"] + sum(corpus["duplicates_removed"].values()) == PAIRS
    validate = run.results["validate"]
    assert validate["success"] and validate["rows"] == corpus["kept"]


def test_a_batch_of_captions_whose_tags_contradict_their_script_ends_at_the_gate(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captions in any language are kept; English captions all tagged Chinese are not."""
    batch = IMAGE_WRITERS["image_folder"](tmp_path / "source", 4)
    lines = (batch / "captions.jsonl").read_text().splitlines()
    retagged = [json.dumps({**json.loads(line), "language": "zh"}) for line in lines]
    (batch / "captions.jsonl").write_text("\n".join(retagged) + "\n")

    land_with_cli(capsys, "images", batch, DS)  # the format guessed from the folder
    run = run_until_refused("multimodal", DS, UNTIL_TRAINING)

    assert run.results["corpus"]["kept"] == 0 and run.results["corpus"]["quarantined"] == 4
    assert isinstance(run.refusal, MultimodalGateFailed)
    assert "manifest.expect_table_row_count_to_be_between" in str(run.refusal)


def test_an_events_path_lands_in_the_first_task_and_runs_to_the_gate(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAG's first task, without Airflow: the claimed event names a COCO captions file and
    leaves the format to be guessed."""
    captions = IMAGE_WRITERS["coco"](tmp_path / "producer", 6)
    event = make_event(
        "cascade.data.landed", {"dataset": "images", "partition": DS, "path": str(captions)}
    )
    first = first_task_claiming(monkeypatch, "multimodal", [event])

    corpus = first(DS)

    landing = landing_dir(Lake(home / "lake"), "images", DS)
    assert json.loads((landing / "_LANDED.json").read_text())["format"] == "coco"
    assert corpus["landed_from"] == "coco" and corpus["kept"] > 0
    validated = run_until_refused("multimodal", DS, ("validate",))
    assert validated.refusal is None and validated.results["validate"]["success"]
