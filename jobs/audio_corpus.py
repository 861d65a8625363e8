"""The speech corpus on Spark: audio-text pairs in, validated 16 kHz log-mel features out.

    cascade asr synthesize --count 2000 --landing DIR      # synthesize a landing batch
    cascade asr corpus --landing DIR --out DIR        # decode, check, featurize

A landing batch is a folder of WAV files plus ``transcripts.jsonl`` (one JSON object per line
with ``utterance_id``, ``text``, ``language``, ``voice``); :func:`land_synthetic` writes one with
espeak-ng (:mod:`jobs.speech_synth`) on the Spark executors. :func:`build_corpus` then

- pairs every WAV with its transcript (either side missing is a quarantined row);
- decodes and validates each file: empty (0 bytes), unreadable (not RIFF/WAVE), header cut
  short, data cut short (fewer frames than the header declares), unsupported format, clipped,
  sample rate outside ``CorpusConfig.rates``, a transcript with nothing left after
  normalization → quarantine with the reason (``audio: KIND: detail``, kinds as
  :class:`~domains.speech.audio_features.WavError` names them);
- normalizes the transcript (:func:`~domains.speech.audio_features.normalize_transcript`: any
  script and digits kept; no fixed alphabet, the model fits its own from the training split);
- resamples to 16 kHz, filters on duration and speaking rate;
- computes log-mel filterbank features (25 ms windows, 10 ms hop, ``n_mels`` bins);
- splits by voice (speaker-disjoint train/dev/test, a hash of the voice name);
- writes parquet shards per split and a manifest (one row per utterance, no features) plus the
  quarantine with a ``reason`` column, and returns counts (``quarantine_by_reason`` counts each
  distinct problem, e.g. ``{"audio:truncated": 2, "audio:empty": 1}``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from domains.speech.audio_features import (
    HUMAN_VOICE_PREFIX,
    SAMPLE_RATE,
    CorpusConfig,
    decode_wav,
    log_mel,
    normalize_transcript,
    resample,
)
from jobs.quarantine import count_reasons, empty_files

SPLITS = ("train", "dev", "test")


# --- pure functions (no Spark; the audio features are in domains.speech.audio_features) ---


def split_of(voice: str, config: CorpusConfig) -> str:
    """Speaker-disjoint split: a stable hash of the voice, never of the utterance. Real people's
    recordings (:mod:`jobs.speech_human`) are evaluation-only (``test``) unless
    ``config.people_train_voices`` names the person: then all of their clips train."""
    if voice.startswith(HUMAN_VOICE_PREFIX):
        return "train" if voice in config.people_train_voices else "test"
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
    if not normalized:
        return {
            **row,
            "reason": "transcript: empty after normalization (no letter, mark or digit)",
        }
    audio = resample(samples, rate)
    seconds = len(audio) / SAMPLE_RATE
    rate_cps = len(normalized.replace(" ", "")) / seconds
    row.update(transcript=normalized, seconds=seconds, chars_per_s=rate_cps)
    if seconds < config.min_seconds:
        return {**row, "reason": f"duration: too short ({seconds:.2f} s < {config.min_seconds} s)"}
    if seconds > config.max_seconds:
        return {**row, "reason": f"duration: too long ({seconds:.2f} s > {config.max_seconds} s)"}
    if not config.min_chars_per_s <= rate_cps <= config.max_chars_per_s:
        return {**row, "reason": f"speaking rate {rate_cps:.1f} chars/s out of range"}
    features = log_mel(audio, config.n_mels)
    row.update(
        split=split_of(row["voice"], config),
        num_frames=int(features.shape[0]),
        features=features.astype(np.float16).tobytes(),
    )
    return row


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
        .where(F.length("content") > 0)
    )
    # binaryFile skips 0-byte files: listed here, they are quarantined as empty, not "missing".
    empty = [
        (p.name.removesuffix(".wav"), bytearray()) for p in empty_files(landing / "wav", "*.wav")
    ]
    if empty:
        audio = audio.unionByName(
            spark.createDataFrame(empty, "utterance_id string, content binary")
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
        distinct = [(r["reason"], r["count"]) for r in bad.groupBy("reason").count().collect()]
    finally:
        processed.unpersist()
    reasons: dict[str, int] = {}
    for reason, count in distinct:
        area = reason.split(":")[0].split("(")[0].strip()
        reasons[area] = reasons.get(area, 0) + count
    by_reason = count_reasons(distinct)
    summary = {
        "utterances": sum(counts.values()),
        "splits": {s: counts.get(s, 0) for s in SPLITS},
        "quarantined": sum(reasons.values()),
        "quarantine_reasons": reasons,
        "quarantine_by_reason": by_reason,
        "out": str(out),
        "config": asdict(config),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"[audio_corpus] {summary['utterances']} utterances {summary['splits']}, "
        f"{summary['quarantined']} quarantined {by_reason}",
        flush=True,
    )
    return summary


def spark_session() -> Any:
    from cascade.config import load_settings
    from jobs.spark_sessions import build_session, stack_conf

    settings = load_settings()
    return build_session(
        "cascade.audio_corpus",
        master=settings.spark_master,
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": settings.spark_driver_memory,
            **stack_conf(settings),
        },
        local_ip=settings.host,
        python_workers=True,
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
