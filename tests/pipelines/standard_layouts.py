"""Small datasets in each standard layout that ``cascade land`` reads, for the importer tests
and the land-and-run tests: audio clips, pictures and click logs, a writer per format that lays
a batch out as that format's users have it on disk, and landing and running one through the
same entries a user and the DAG use."""

from __future__ import annotations

import datetime as dt
import io
import json
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

# --- speech -------------------------------------------------------------------------------------


def tone(seconds: float, rate: int, channels: int = 1, hz: float = 220.0) -> np.ndarray:
    """A quiet tone with a little noise, ``[frames, channels]`` (each channel its own pitch)."""
    t = np.arange(round(seconds * rate)) / rate
    noise = np.random.default_rng(rate).normal(0, 0.01, (len(t), channels))
    waves = [0.3 * np.sin(2 * np.pi * hz * (c + 1) * t) for c in range(channels)]
    return (np.stack(waves, axis=1) + noise).astype(np.float32)


def write_audio(
    path: Path, seconds: float, rate: int, channels: int = 1, hz: float = 220.0
) -> Path:
    import soundfile

    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(path, tone(seconds, rate, channels, hz), rate)
    return path


SENTENCES = (
    "open the door",
    "close the window",
    "turn on the light",
    "play some music",
    "what time is it",
    "call my sister",
)
"""English transcripts whose speaking rate (about 1.5 s a clip) passes the corpus job's checks."""


def utterances(speakers: Sequence[str], per_speaker: int) -> list[tuple[str, str, str]]:
    """``(speaker, utterance number, sentence)`` of a corpus read by ``speakers`` (numbers: the
    LibriSpeech layout takes nothing else)."""
    return [
        (speaker, f"{n:04d}", SENTENCES[(s + n) % len(SENTENCES)])
        for s, speaker in enumerate(speakers)
        for n in range(per_speaker)
    ]


def write_kaldi(root: Path, rows: Sequence[tuple[str, str, str]]) -> Path:
    """A Kaldi data directory ``root/data/train`` (wav.scp relative to ``root``, FLAC audio)."""
    data = root / "data" / "train"
    data.mkdir(parents=True)
    scp, text, utt2spk = [], [], []
    for i, (speaker, n, sentence) in enumerate(rows):
        uid = f"{speaker}-{n}"
        write_audio(root / "audio" / f"{uid}.flac", 1.5, 22_050, hz=180.0 + 7 * i)
        scp.append(f"{uid} audio/{uid}.flac")
        text.append(f"{uid} {sentence}")
        utt2spk.append(f"{uid} {speaker}")
    for name, lines in (("wav.scp", scp), ("text", text), ("utt2spk", utt2spk)):
        (data / name).write_text("\n".join(lines) + "\n")
    return data


def write_librispeech(root: Path, rows: Sequence[tuple[str, str, str]]) -> Path:
    """``root/LibriSpeech/dev-clean/SPEAKER/CHAPTER/`` with FLAC clips and ``*.trans.txt``."""
    top = root / "LibriSpeech"
    transcripts: dict[Path, list[str]] = {}
    for i, (speaker, n, sentence) in enumerate(rows):
        folder = top / "dev-clean" / speaker / "100"
        uid = f"{speaker}-100-{n}"
        write_audio(folder / f"{uid}.flac", 1.5, 16_000, hz=180.0 + 7 * i)
        transcripts.setdefault(folder / f"{speaker}-100.trans.txt", []).append(
            f"{uid} {sentence.upper()}"
        )
    for path, lines in transcripts.items():
        path.write_text("\n".join(lines) + "\n")
    return top


def write_common_voice(root: Path, rows: Sequence[tuple[str, str, str]]) -> Path:
    """``root/cv-corpus/en/validated.tsv`` with Ogg clips in ``clips/`` (48 kHz stereo)."""
    corpus = root / "cv-corpus" / "en"
    lines = ["client_id\tpath\tsentence\tup_votes\tdown_votes\tlocale"]
    for i, (speaker, n, sentence) in enumerate(rows):
        clip = f"common_voice_en_{speaker}{n}.ogg"
        write_audio(corpus / "clips" / clip, 1.5, 48_000, channels=2, hz=180.0 + 7 * i)
        lines.append(f"{speaker}\t{clip}\t{sentence.capitalize()}.\t2\t0\ten")
    (corpus / "validated.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus


def write_speech_jsonl(root: Path, rows: Sequence[tuple[str, str, str]]) -> Path:
    """``root/batch/`` with ``wav/`` (16 kHz WAV) beside ``transcripts.jsonl``."""
    batch = root / "batch"
    lines = []
    for i, (speaker, n, sentence) in enumerate(rows):
        uid = f"{speaker}-{n}"
        write_audio(batch / "wav" / f"{uid}.wav", 1.5, 16_000, hz=180.0 + 7 * i)
        record = {"utterance_id": uid, "text": sentence, "language": "en", "voice": speaker}
        lines.append(json.dumps(record))
    (batch / "transcripts.jsonl").write_text("\n".join(lines) + "\n")
    return batch


SPEECH_WRITERS: dict[str, Callable[[Path, Sequence[tuple[str, str, str]]], Path]] = {
    "kaldi": write_kaldi,
    "librispeech": write_librispeech,
    "common_voice": write_common_voice,
    "jsonl": write_speech_jsonl,
}
"""Format name -> a writer of that layout, returning the path to land."""


# --- images -------------------------------------------------------------------------------------


def picture(seed: int, fmt: str = "PNG", size: tuple[int, int] = (48, 40)) -> bytes:
    """A picture with a few coloured boxes, encoded as ``fmt``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, (250, 250, 240))
    draw = ImageDraw.Draw(image)
    for i in range(3):
        x, y = (seed * 7 + i * 13) % (size[0] - 12), (seed * 5 + i * 11) % (size[1] - 12)
        draw.rectangle((x, y, x + 12, y + 12), fill=((seed * 40) % 255, 90 + 50 * i, 200 - seed))
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white")
SHAPES = ("square", "circle", "star", "house", "tree", "boat", "car", "bird")


def captions(count: int) -> list[str]:
    """``count`` distinct captions (the corpus job drops near-duplicate ones)."""
    return [f"a {COLOURS[i % 8]} {SHAPES[(i // 8 + i) % 8]} number {i}" for i in range(count)]


def write_image_folder(root: Path, count: int) -> Path:
    """``root/batch/`` with ``images/`` (PNG and JPEG) beside ``captions.jsonl``."""
    batch = root / "batch"
    (batch / "images").mkdir(parents=True)
    lines = []
    for i, caption in enumerate(captions(count)):
        name = f"p{i:03d}.png" if i % 2 else f"p{i:03d}.jpg"
        (batch / "images" / name).write_bytes(picture(i, "PNG" if i % 2 else "JPEG", (64, 64)))
        record = {"pair_id": f"p{i:03d}", "image": name, "caption": caption, "language": "en"}
        lines.append(json.dumps(record))
    (batch / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return batch


def write_coco(root: Path, count: int) -> Path:
    """A COCO download's layout: ``annotations/captions_val2017.json`` beside ``val2017/``."""
    (root / "val2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    images, notes = [], []
    for i, caption in enumerate(captions(count)):
        name = f"{i:012d}.jpg"
        (root / "val2017" / name).write_bytes(picture(i, "JPEG", (64, 64)))
        images.append({"id": i, "file_name": name, "width": 64, "height": 64})
        notes.append({"id": 1000 + i, "image_id": i, "caption": caption})
    path = root / "annotations" / "captions_val2017.json"
    path.write_text(json.dumps({"images": images, "annotations": notes}))
    return path


def write_webdataset(root: Path, count: int) -> Path:
    """``root/shards/`` with two tar shards of ``KEY.png`` + ``KEY.txt`` samples."""
    shards = root / "shards"
    shards.mkdir(parents=True)
    texts = captions(count)
    for shard_number in range(2):
        with tarfile.open(shards / f"shard-{shard_number:05d}.tar", "w") as shard:
            for i in range(shard_number, count, 2):
                for name, content in (
                    (f"s{i:05d}.png", picture(i, "PNG", (64, 64))),
                    (f"s{i:05d}.txt", texts[i].encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(content)
                    shard.addfile(info, io.BytesIO(content))
    return shards


IMAGE_WRITERS: dict[str, Callable[[Path, int], Path]] = {
    "image_folder": write_image_folder,
    "coco": write_coco,
    "webdataset": write_webdataset,
}


# --- click logs ---------------------------------------------------------------------------------


def clicks(
    rows: int = 12, *, start: dt.datetime = dt.datetime(2026, 11, 21, 8), users: int = 3
) -> pd.DataFrame:
    """A log with string user and item keys (``users`` users, four items), one a minute."""
    return pd.DataFrame(
        {
            "user_id": [f"user-{i % users}" for i in range(rows)],
            "item_id": [f"sku-{i % 4}" for i in range(rows)],
            "event_timestamp": [start + dt.timedelta(minutes=i) for i in range(rows)],
            "click": [i % 2 for i in range(rows)],
        }
    )


def write_click_log(log: pd.DataFrame, path: Path, fmt: str) -> Path:
    """``log`` as one file of format ``csv``, ``parquet`` or ``jsonl`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        log.to_csv(path, index=False)
    elif fmt == "parquet":
        # Spark reads no nanosecond timestamps, pandas' default: exports write microseconds.
        log.to_parquet(path, index=False, coerce_timestamps="us")
    else:
        log.to_json(path, orient="records", lines=True, date_format="iso")
    return path


# --- landing through the command, running through the step entry ------------------------------


def land_with_cli(
    capsys: pytest.CaptureFixture[str], dataset: str, path: Path, ds: str, *extra: str
) -> dict[str, Any]:
    """``cascade land DATASET PATH --ds DS --no-publish --json EXTRA...``: its printed record."""
    from cascade import cli

    capsys.readouterr()
    code = cli.main(["land", dataset, str(path), "--ds", ds, "--no-publish", "--json", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


@dataclass
class Run:
    """The steps of a run that went through, and the gate's refusal that ended it (if one did)."""

    results: dict[str, Any]
    refusal: Exception | None


def run_until_refused(pipeline: str, ds: str, steps: Sequence[str]) -> Run:
    """Run ``steps`` of ``pipeline`` in order through the step runner (the entry of the DAG's
    tasks, ``cascade step`` and DVC's stages) until one refuses its input with a gate failure."""
    from cascade.step_runner import run_step
    from jobs.gx_suites import GateFailed

    results: dict[str, Any] = {}
    for step in steps:
        try:
            results[step] = run_step(step, ds, pipeline)
        except GateFailed as exc:
            return Run(results, exc)
    return Run(results, None)


def first_task_claiming(
    monkeypatch: pytest.MonkeyPatch, pipeline: str, events: Sequence[Any]
) -> Callable[[str], Any]:
    """The callable of ``pipeline``'s first DAG task, run without Airflow: its run claimed
    ``events`` (:class:`cascade.events.Event` objects) and its outlets go nowhere."""
    import collections
    import types

    from cascade import dag_factory
    from cascade.pipeline_registry import get_pipeline

    claimed = [event.model_dump(mode="json") for event in events]
    monkeypatch.setattr(dag_factory, "claimed_events", lambda: claimed)
    outlets: Any = collections.defaultdict(types.SimpleNamespace)
    monkeypatch.setattr(dag_factory, "outlet_events", lambda: outlets)
    spec = get_pipeline(pipeline)
    return dag_factory._step_task(spec, spec.steps[0]).function
