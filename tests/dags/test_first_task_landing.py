"""The first task of a pipeline DAG: it lands the batch a data-landed event names by ``path``
(through the dataset's importer) before its step reads the landing folder, and a partition with
nothing landed ends the run as skipped. The step itself is a stand-in here (this is the task's
wiring; the steps have their own tests)."""

from __future__ import annotations

import collections
import json
import types
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cascade import dag_factory, step_runner
from cascade.events import make_event
from cascade.lake import Lake
from cascade.landing import is_landed, landing_dir
from cascade.pipeline_registry import get_pipeline

DS = "2026-11-22"


def _speech_batch(root: Path) -> Path:
    (root / "wav").mkdir(parents=True)
    tone = (0.1 * np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000) * 32767).astype("<i2")
    with wave.open(str(root / "wav" / "u1.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(tone.tobytes())
    line = {"utterance_id": "u1", "text": "hello", "language": "en", "voice": "v1"}
    (root / "transcripts.jsonl").write_text(json.dumps(line) + "\n")
    return root


def test_the_first_task_lands_an_events_path_and_skips_when_nothing_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    spec = get_pipeline("asr")
    first = dag_factory._step_task(spec, spec.steps[0]).function
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(dag_factory, "claimed_events", lambda: events)
    outlets: Any = collections.defaultdict(types.SimpleNamespace)
    monkeypatch.setattr(dag_factory, "outlet_events", lambda: outlets)

    # A cron run (no event) with nothing landed: skipped, saying why; nothing made up.
    with pytest.raises(AirflowSkipException, match=f"nothing landed for {DS}"):
        first(DS)
    landing = landing_dir(Lake(tmp_path / "home" / "lake"), "speech", DS)
    assert not landing.exists()

    # An event naming a batch elsewhere: landed through the importer, then the step runs.
    batch = _speech_batch(tmp_path / "producer")
    event = make_event(
        "cascade.data.landed",
        {"dataset": "speech", "partition": DS, "path": str(batch), "format": "jsonl"},
    )
    events.append(event.model_dump(mode="json"))
    ran: list[bool] = []

    def step(name: str, ds: str, pipeline: str, *_: Any, **__: Any) -> dict[str, Any]:
        ran.append(is_landed(landing) and (landing / "transcripts.jsonl").is_file())
        return {"ds": ds}

    monkeypatch.setattr(step_runner, "run_step", step)
    assert first(DS)["ds"] == DS
    assert ran == [True]
    assert json.loads((landing / "_LANDED.json").read_text())["path"] == str(batch.resolve())
