"""Landing a partition: atomic staging, explicit re-landing that keeps the old batch readable
until the new one is complete, the event it publishes (through the watchers' real stream
filter), a data-landed event's ``path`` landed through the same importer, the command, and a
batch with nothing good: one error, nothing landed, nothing published."""

from __future__ import annotations

import json
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cascade import cli
from cascade.errors import UsageError
from cascade.events import parse_event
from cascade.lake import Lake
from cascade.landing import (
    LANDED_FILE,
    SUCCESS_MARKER,
    get_dataset,
    land,
    land_event_paths,
    landing_dir,
)
from cascade.pipeline_spec import Dataset

DS = "2026-11-22"


def _batch(root: Path, rows: list[str]) -> Path:
    root.mkdir(parents=True)
    (root / "rows.txt").write_text("\n".join(rows) + "\n")
    return root


def _copy_rows(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
    rows = (source / "rows.txt").read_text().splitlines()
    (dest / "rows.txt").write_text("\n".join(rows) + "\n")
    return {"rows": len(rows)}


TEXT = Dataset(name="text", formats={"txt": _copy_rows})


def test_a_batch_lands_with_its_markers_and_counts(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    record = land(lake, TEXT, DS, path=_batch(tmp_path / "in", ["a", "b", "c"]))

    final = landing_dir(lake, "text", DS)
    assert record["landed"] == str(final) and record["counts"] == {"rows": 3}
    assert (final / SUCCESS_MARKER).is_file()
    assert json.loads((final / LANDED_FILE).read_text())["format"] == "txt"
    # Nothing of the staging folder is left beside the partition.
    assert sorted(p.name for p in final.parent.iterdir()) == [f"dt={DS}"]


def test_relanding_needs_replace_and_keeps_the_old_batch_until_the_new_is_complete(
    tmp_path: Path,
) -> None:
    lake = Lake(tmp_path / "lake")
    final = landing_dir(lake, "text", DS)
    land(lake, TEXT, DS, path=_batch(tmp_path / "old", ["old"]))

    with pytest.raises(UsageError, match="already landed .* pass --replace"):
        land(lake, TEXT, DS, path=_batch(tmp_path / "new", ["new-1", "new-2"]))
    assert (final / "rows.txt").read_text() == "old\n"

    seen_during_import: list[str] = []

    def slow_import(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
        # While the new batch is being written, readers still find the old one, complete.
        seen_during_import.append((final / "rows.txt").read_text())
        assert (final / SUCCESS_MARKER).is_file()
        return _copy_rows(source, dest, ds=ds)

    replacing = Dataset(name="text", formats={"txt": slow_import})
    record = land(lake, replacing, DS, path=tmp_path / "new", replace=True)
    assert seen_during_import == ["old\n"]
    assert (final / "rows.txt").read_text() == "new-1\nnew-2\n" and record["counts"]["rows"] == 2

    def failing_import(source: Path, dest: Path, *, ds: str) -> dict[str, int]:
        (dest / "rows.txt").write_text("half\n")
        raise ValueError(f"{source}: line 2 is corrupt")

    broken = Dataset(name="text", formats={"txt": failing_import})
    with pytest.raises(ValueError, match="line 2 is corrupt"):
        land(lake, broken, DS, path=tmp_path / "new", replace=True)
    # A failed re-landing leaves the partition as it was, and no staging folder behind.
    assert (final / "rows.txt").read_text() == "new-1\nnew-2\n"
    assert sorted(p.name for p in final.parent.iterdir()) == [f"dt={DS}"]


def _speech_batch(root: Path) -> Path:
    """One real utterance (a second of 16 kHz tone) and a manifest line that is not JSON."""
    (root / "wav").mkdir(parents=True)
    tone = (0.1 * np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000) * 32767).astype("<i2")
    with wave.open(str(root / "wav" / "u1.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(tone.tobytes())
    lines = [
        json.dumps({"utterance_id": "u1", "text": "hello", "language": "en", "voice": "v1"}),
        "not json",
    ]
    (root / "transcripts.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_the_published_event_carries_path_format_and_counts_through_the_watcher(
    tmp_path: Path,
) -> None:
    from tests.events.memory_stream import run_stream

    lake = Lake(tmp_path / "lake")
    published: list = []
    record = land(
        lake,
        get_dataset("speech"),
        DS,
        path=_speech_batch(tmp_path / "batch"),
        fmt="jsonl",
        publish=published.append,
    )
    counts = record["counts"]
    assert (counts["utterances"], counts["speakers"], counts["quarantined"]) == (1, 1, 1)
    (event,) = published
    wire = event.model_dump_json().encode()
    assert parse_event(wire).payload == {
        "dataset": "speech",
        "partition": DS,
        "path": str(landing_dir(lake, "speech", DS)),
        "format": "jsonl",
        "source": None,
        "counts": counts,
    }
    stream = run_stream([wire], selectors=("cascade.data.landed:dataset=speech",))
    assert stream.error is None and not stream.dead_letters
    (fired,) = stream.fired
    assert fired["id"] == event.id and fired["source"] == "cascade-land"
    assert fired["payload"]["path"] == record["landed"]
    assert (fired["payload"]["format"], fired["payload"]["counts"]) == ("jsonl", record["counts"])


def test_an_events_path_lands_through_the_same_importer_once(tmp_path: Path) -> None:
    from cascade.events import make_event

    lake = Lake(tmp_path / "lake")
    batch = _speech_batch(tmp_path / "elsewhere")
    event = make_event(
        "cascade.data.landed", {"dataset": "speech", "partition": DS, "path": str(batch)}
    ).model_dump(mode="json")
    other_day = {**event, "id": "other", "payload": {**event["payload"], "partition": "2026-11-21"}}

    (record,) = land_event_paths(lake, [event, other_day], DS, ["speech"])
    final = landing_dir(lake, "speech", DS)
    assert record["format"] == "jsonl" and record["path"] == str(batch.resolve())
    assert (final / "transcripts.jsonl").is_file() and (final / SUCCESS_MARKER).is_file()
    assert not landing_dir(lake, "speech", "2026-11-21").exists()
    # Redelivered, or the event `cascade land` publishes (its path is the partition): no-op.
    assert land_event_paths(lake, [event], DS, ["speech"]) == []
    published = json.loads(json.dumps(event))
    published["payload"]["path"] = str(final)
    assert land_event_paths(lake, [published], DS, ["speech"]) == []


def test_the_command_lists_datasets_and_refuses_a_second_landing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["land", "--help"])
    listing = capsys.readouterr().out
    for dataset, formats in (
        ("impressions", "csv, jsonl, parquet"),
        ("speech", "common_voice, jsonl, kaldi, librispeech"),
        ("images", "coco, image_folder, webdataset"),
    ):
        assert f"  {dataset} (read by " in listing
        assert formats in listing.split(f"  {dataset} (read by ")[1].split("\n")[1]

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    batch = _speech_batch(tmp_path / "batch")
    args = ["land", "speech", str(batch), "--ds", DS, "--no-publish"]
    assert cli.main(args) == 0
    assert "landed speech dt=2026-11-22" in capsys.readouterr().out
    assert cli.main(args) == cli.EXIT_USAGE
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "already landed" in error and "--replace" in error
    assert cli.main([*args, "--replace"]) == 0
    assert cli.main(["land", "speech", "--ds", DS, "--source", "nope"]) == cli.EXIT_USAGE
    assert "no source 'nope'" in capsys.readouterr().err


def _all_bad_speech(root: Path) -> Path:
    """Every utterance bad: an empty audio file, a WAV cut inside its header, a line not JSON."""
    (root / "wav").mkdir(parents=True)
    (root / "wav" / "u1.wav").write_bytes(b"")
    (root / "wav" / "u2.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt ")
    lines = [json.dumps({"utterance_id": u, "text": "hi", "voice": "v"}) for u in ("u1", "u2")]
    (root / "transcripts.jsonl").write_text("\n".join([*lines, "{not json"]) + "\n")
    return root


def _all_bad_images(root: Path) -> Path:
    """Every pair bad: a zero-byte image, bytes that are no image, a caption line not JSON."""
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(b"")
    (root / "images" / "b.jpg").write_bytes(b"not a picture at all")
    lines = [
        json.dumps({"pair_id": p, "image": f"{p}.{x}", "caption": "a box"})
        for p, x in (("a", "png"), ("b", "jpg"))
    ]
    (root / "captions.jsonl").write_text("\n".join([*lines, '{"pair_id": ']) + "\n")
    return root


@pytest.mark.parametrize(
    ("dataset", "fmt", "write", "reasons"),
    [
        ("speech", "jsonl", _all_bad_speech, ("'audio:empty': 1", "'audio:truncated header': 1")),
        ("images", "image_folder", _all_bad_images, ("'image:empty file': 1", "'image:unreadable")),
    ],
)
def test_an_all_bad_batch_is_one_error_and_lands_and_publishes_nothing(
    tmp_path: Path,
    dataset: str,
    fmt: str,
    write: Callable[[Path], Path],
    reasons: tuple[str, ...],
) -> None:
    lake = Lake(tmp_path / "lake")
    batch = write(tmp_path / "batch")
    published: list = []

    with pytest.raises(ValueError) as refused:
        land(lake, get_dataset(dataset), DS, path=batch, fmt=fmt, publish=published.append)

    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{batch}: nothing landed, all 3 ")
    assert all(reason in message for reason in reasons), message
    assert published == []
    final = landing_dir(lake, dataset, DS)
    assert not final.exists() and not any(final.parent.iterdir())  # no staging folder either
