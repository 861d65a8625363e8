"""The speech corpus on Spark: audio-text pairs in, validated 16 kHz log-mel features out.

    python -m jobs.audio_corpus land --count 2000 --landing DIR      # synthesize a landing batch
    python -m jobs.audio_corpus build --landing DIR --out DIR        # decode, check, featurize

A landing batch is a folder of WAV files plus ``transcripts.jsonl`` (one JSON object per line
with ``utterance_id``, ``text``, ``language``, ``voice``); :func:`land_synthetic` writes one with
espeak-ng (:mod:`jobs.speech_synth`) on the Spark executors. :func:`build_corpus` then

- pairs every WAV with its transcript (either side missing is a quarantined row);
- decodes and validates each file: unreadable, empty, clipped, sample rate outside
  ``CorpusConfig.rates``, transcript characters outside the vocabulary → quarantine with the
  reason;
- resamples to 16 kHz, filters on duration and speaking rate, normalizes the transcript;
- computes log-mel filterbank features (25 ms windows, 10 ms hop, ``n_mels`` bins);
- splits by voice (speaker-disjoint train/dev/test, a hash of the voice name);
- writes parquet shards per split and a manifest (one row per utterance, no features) plus the
  quarantine with a ``reason`` column, and returns counts.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import sys
import unicodedata
import wave
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jobs.speech_human import HUMAN_VOICE_PREFIX
from jobs.speech_synth import MANDARIN_PHRASES

SAMPLE_RATE = 16_000
ENGLISH_VOCAB = frozenset("abcdefghijklmnopqrstuvwxyz' ")
MANDARIN_VOCAB = frozenset("".join(MANDARIN_PHRASES))
VOCABULARY = ENGLISH_VOCAB | MANDARIN_VOCAB
"""Characters a transcript may hold after normalization (the model's output alphabet)."""
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """Checks and feature settings of the corpus job."""

    rates: tuple[int, ...] = (8_000, 16_000, 22_050, 24_000, 44_100, 48_000)
    """Accepted input sample rates (resampled to 16 kHz); anything else is quarantined."""
    min_seconds: float = 0.3
    max_seconds: float = 20.0
    min_chars_per_s: float = 1.0
    """Speaking-rate floor (transcript characters per second of audio): slower is misaligned."""
    max_chars_per_s: float = 30.0
    clip_share: float = 0.01
    """A file with more than this share of samples at full scale is clipped."""
    n_mels: int = 40
    dev_share: float = 0.1
    test_share: float = 0.1
    shards: int = 4
    """Least number of write tasks; each writes one parquet file per split it holds."""
    rows_per_shard: int = 4000
    """More write tasks as the corpus grows: about this many utterances (~50 MB of features)
    per task, so no task holds a whole split."""

    def __post_init__(self) -> None:
        if not 0 < self.min_seconds < self.max_seconds:
            raise ValueError("need 0 < min_seconds < max_seconds")
        if not 0 <= self.dev_share + self.test_share < 1:
            raise ValueError("dev_share + test_share must be in [0, 1)")
        if self.n_mels < 8 or self.shards < 1 or self.rows_per_shard < 1:
            raise ValueError("n_mels must be >= 8, shards and rows_per_shard >= 1")

    def write_tasks(self, rows: int) -> int:
        return max(self.shards, -(-rows // self.rows_per_shard))


# --- pure functions (no Spark) --------------------------------------------------------------


def normalize_transcript(text: str) -> str:
    """Lower case, NFKC, punctuation dropped, whitespace collapsed; Mandarin kept as is."""
    text = unicodedata.normalize("NFKC", text).lower()
    kept = [c if (c.isalnum() or c in "' ") else " " for c in text]
    return " ".join("".join(kept).split())


def out_of_vocabulary(text: str) -> list[str]:
    return sorted({c for c in text if c not in VOCABULARY})


def decode_wav(content: bytes) -> tuple[np.ndarray, int]:
    """``(float32 mono samples in [-1, 1], rate)``; ValueError naming what is wrong."""
    if not content:
        raise ValueError("empty file")
    try:
        with wave.open(io.BytesIO(content)) as read:
            channels, width, rate = read.getnchannels(), read.getsampwidth(), read.getframerate()
            frames = read.readframes(read.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"unreadable: {exc}") from None
    if width != 2:
        raise ValueError(f"unsupported sample width {8 * width} bits (16-bit PCM expected)")
    samples = np.frombuffer(frames[: len(frames) - len(frames) % (2 * channels)], dtype="<i2")
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1)
    return samples.astype(np.float32) / 32768.0, rate


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Polyphase resampling to ``target`` (exact rational ratio)."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(samples, target // g, rate // g).astype(np.float32)


def mel_filterbank(n_mels: int, n_fft: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters evenly spaced on the mel scale."""

    def mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(np.array(20.0)), mel(np.array(rate / 2)), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1.0 / rate)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    return np.clip(np.minimum(rising, falling), 0.0, None).astype(np.float32)


def log_mel(samples: np.ndarray, n_mels: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``[frames, n_mels]`` log-mel energies: 25 ms Hann windows every 10 ms."""
    win, hop, n_fft = int(0.025 * rate), int(0.010 * rate), 512
    if len(samples) < win:
        samples = np.pad(samples, (0, win - len(samples)))
    frames = 1 + (len(samples) - win) // hop
    index = np.arange(win)[None, :] + hop * np.arange(frames)[:, None]
    spectrum = np.abs(np.fft.rfft(samples[index] * np.hanning(win), n=n_fft)) ** 2
    return np.log(spectrum @ mel_filterbank(n_mels, n_fft, rate).T + 1e-6).astype(np.float32)


def split_of(voice: str, config: CorpusConfig) -> str:
    """Speaker-disjoint split: a stable hash of the voice, never of the utterance. Real people's
    recordings (:mod:`jobs.speech_human`) are evaluation-only: always ``test``."""
    if voice.startswith(HUMAN_VOICE_PREFIX):
        return "test"
    bucket = int.from_bytes(hashlib.sha256(voice.encode()).digest()[:4], "little") / 2**32
    if bucket < config.test_share:
        return "test"
    if bucket < config.test_share + config.dev_share:
        return "dev"
    return "train"


def process_one(
    utterance_id: str,
    content: bytes | None,
    transcript: dict[str, Any] | None,
    config: CorpusConfig,
) -> dict[str, Any]:
    """One landed pair -> a corpus row (``reason`` None) or a quarantine row (``reason`` set)."""
    row: dict[str, Any] = {
        "utterance_id": utterance_id,
        "reason": None,
        "text": None,
        "transcript": None,
        "language": None,
        "voice": None,
        "split": None,
        "source_rate": None,
        "seconds": None,
        "chars_per_s": None,
        "num_frames": None,
        "features": None,
    }
    if transcript is not None:
        row.update(
            text=transcript.get("text"),
            language=transcript.get("language"),
            voice=transcript.get("voice"),
        )
    if content is None:
        return {**row, "reason": "audio missing"}
    if transcript is None or not row["text"]:
        return {**row, "reason": "transcript missing"}
    if not row["voice"]:
        return {**row, "reason": "voice missing (needed for speaker-disjoint splits)"}
    try:
        samples, rate = decode_wav(content)
    except ValueError as exc:
        return {**row, "reason": f"audio: {exc}"}
    row["source_rate"] = rate
    if len(samples) == 0:
        return {**row, "reason": "audio: no samples"}
    if rate not in config.rates:
        return {**row, "reason": f"audio: sample rate {rate} Hz not in {list(config.rates)}"}
    clipped = float(np.mean(np.abs(samples) >= 0.999))
    if clipped > config.clip_share:
        return {**row, "reason": f"audio: clipped ({clipped:.1%} of samples at full scale)"}
    normalized = normalize_transcript(row["text"])
    bad = out_of_vocabulary(normalized)
    if not normalized or bad:
        return {**row, "reason": f"transcript: characters outside the vocabulary {bad}"}
    audio = resample(samples, rate)
    seconds = len(audio) / SAMPLE_RATE
    rate_cps = len(normalized.replace(" ", "")) / seconds
    row.update(transcript=normalized, seconds=seconds, chars_per_s=rate_cps)
    if not config.min_seconds <= seconds <= config.max_seconds:
        return {
            **row,
            "reason": f"duration {seconds:.2f} s outside "
            f"[{config.min_seconds}, {config.max_seconds}]",
        }
    if not config.min_chars_per_s <= rate_cps <= config.max_chars_per_s:
        return {**row, "reason": f"speaking rate {rate_cps:.1f} chars/s out of range"}
    features = log_mel(audio, config.n_mels)
    row.update(
        split=split_of(row["voice"], config),
        num_frames=int(features.shape[0]),
        features=features.astype(np.float16).tobytes(),
    )
    return row


def features_of(row: dict[str, Any] | pd.Series, n_mels: int) -> np.ndarray:
    """The ``[num_frames, n_mels]`` float32 features stored in a corpus row."""
    return np.frombuffer(row["features"], dtype=np.float16).reshape(-1, n_mels).astype(np.float32)


# --- Spark ----------------------------------------------------------------------------------

ROW_SCHEMA = (
    "utterance_id string, reason string, text string, transcript string, language string, "
    "voice string, split string, source_rate int, seconds double, chars_per_s double, "
    "num_frames int, features binary"
)


def land_synthetic(spark: Any, landing: Path, *, count: int, seed: int = 0, start: int = 0) -> int:
    """Synthesize utterances ``start .. start + count`` into ``landing`` on the executors."""
    from jobs.speech_synth import synthesize, utterance_spec, write_wav

    wav_dir = landing / "wav"
    wav_dir.mkdir(parents=True, exist_ok=True)

    def render(indices: Iterator[int]) -> Iterator[str]:
        for index in indices:
            spec = utterance_spec(index, seed=seed)
            pcm, rate = synthesize(spec)
            write_wav(wav_dir / f"{spec.utterance_id}.wav", pcm, rate)
            yield json.dumps(
                {**asdict(spec), "voice": spec.voice}, ensure_ascii=False, sort_keys=True
            )

    slices = max(2, min(64, count // 200))
    lines = spark.sparkContext.parallelize(range(start, start + count), slices)
    records = lines.mapPartitions(render).collect()
    with (landing / "transcripts.jsonl").open("a", encoding="utf-8") as out:
        out.write("".join(line + "\n" for line in records))
    return len(records)


def build_corpus(
    spark: Any, landing: Path, out: Path, config: CorpusConfig | None = None
) -> dict[str, Any]:
    """Validate, featurize and split a landing batch; returns counts per split and reason."""
    from pyspark.sql import functions as F

    config = config or CorpusConfig()
    transcripts_path = landing / "transcripts.jsonl"
    audio = (
        spark.read.format("binaryFile")
        .option("pathGlobFilter", "*.wav")
        .load(str(landing / "wav"))
        .select(
            F.regexp_extract("path", r"([^/]+)\.wav$", 1).alias("utterance_id"),
            F.col("content"),
        )
    )
    if transcripts_path.exists():
        texts = spark.read.json(str(transcripts_path)).select(
            "utterance_id", "text", "language", "voice"
        )
    else:
        texts = spark.createDataFrame(
            [], "utterance_id string, text string, language string, voice string"
        )
    texts = texts.dropDuplicates(["utterance_id"])
    # The transcripts are small and the audio is not: broadcasting them keeps the WAV bytes where
    # they were read (a full outer join would shuffle every file). Transcripts without audio come
    # from an anti join on the ids alone (binaryFile then skips reading the content).
    with_audio = audio.join(F.broadcast(texts), "utterance_id", "left")
    without_audio = texts.join(
        F.broadcast(audio.select("utterance_id")), "utterance_id", "left_anti"
    ).withColumn("content", F.lit(None).cast("binary"))
    pairs = with_audio.unionByName(without_audio)

    columns = [c.split()[0] for c in ROW_SCHEMA.split(", ")]

    def process(records: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        # RDD partitions rather than mapInPandas: the installed PySpark's Python side and its
        # JVM disagree on the pandas-UDF constructor; plain RDD functions work across them.
        for record in records:
            has_text = record["text"] is not None or record["voice"] is not None
            transcript = {k: record[k] for k in ("text", "language", "voice")} if has_text else None
            content = record["content"]
            row = process_one(
                record["utterance_id"],
                None if content is None else bytes(content),
                transcript,
                config,
            )
            yield tuple(row[c] for c in columns)

    processed = spark.createDataFrame(pairs.rdd.mapPartitions(process), ROW_SCHEMA).cache()
    try:
        good = processed.where(F.col("reason").isNull()).drop("reason")
        bad = processed.where(F.col("reason").isNotNull()).drop("features", "num_frames", "split")
        out.mkdir(parents=True, exist_ok=True)
        # Hashing on (split, id) spreads each split over the write tasks: hashing on the split
        # alone put a whole split in one task, which ran out of heap at 100k utterances.
        tasks = config.write_tasks(good.count())
        good.repartition(tasks, "split", "utterance_id").write.mode("overwrite").partitionBy(
            "split"
        ).parquet(str(out / "shards"))
        good.drop("features").coalesce(1).write.mode("overwrite").parquet(str(out / "manifest"))
        bad.coalesce(1).write.mode("overwrite").parquet(str(out / "quarantine"))
        counts = {r["split"]: r["count"] for r in good.groupBy("split").count().collect()}
        reasons = {
            r["reason"]: r["count"]
            for r in bad.select(F.regexp_extract("reason", r"^([^:(]+)", 1).alias("reason"))
            .groupBy("reason")
            .count()
            .collect()
        }
    finally:
        processed.unpersist()
    summary = {
        "utterances": sum(counts.values()),
        "splits": {s: counts.get(s, 0) for s in SPLITS},
        "quarantined": sum(reasons.values()),
        "quarantine_reasons": reasons,
        "out": str(out),
        "config": asdict(config),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"[audio_corpus] {summary['utterances']} utterances {summary['splits']}, "
        f"{summary['quarantined']} quarantined {reasons}",
        flush=True,
    )
    return summary


def spark_session() -> Any:
    import os

    from pyspark.sql import SparkSession

    from cascade.config import load_settings

    settings = load_settings()
    os.environ.setdefault("SPARK_LOCAL_IP", settings.host)
    # Python workers must run this interpreter (the venv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.master(settings.spark_master)
        .appName("cascade.audio_corpus")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .getOrCreate()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    land = sub.add_parser("land", help="synthesize a landing batch with espeak-ng")
    land.add_argument("--count", type=int, required=True)
    land.add_argument("--seed", type=int, default=0)
    land.add_argument("--start", type=int, default=0)
    land.add_argument("--landing", type=Path, required=True)
    build = sub.add_parser("build", help="build the corpus from a landing batch")
    build.add_argument("--landing", type=Path, required=True)
    build.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    spark = spark_session()
    if args.command == "land":
        n = land_synthetic(spark, args.landing, count=args.count, seed=args.seed, start=args.start)
        print(f"[audio_corpus] landed {n} utterances in {args.landing}")
    else:
        print(json.dumps(build_corpus(spark, args.landing, args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
