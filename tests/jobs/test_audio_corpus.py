"""The speech corpus job: DSP pieces, and a landed batch with planted faults on Spark."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from domains.speech.audio_features import (
    SAMPLE_RATE,
    CorpusConfig,
    decode_wav,
    features_of,
    language_group,
    log_mel,
    mel_filterbank,
    normalize_transcript,
    resample,
)
from jobs.audio_corpus import build_corpus, land_synthetic, process_one, split_of
from jobs.audio_corpus_gate import CorpusGateFailed, validate_corpus
from jobs.speech_synth import write_wav


def _pcm(seconds: float, rate: int, amplitude: float = 0.3, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    samples = rng.normal(0, amplitude, int(seconds * rate)).clip(-1, 1)
    return (samples * 32767).astype("<i2").tobytes()


def test_transcripts_are_normalized_and_features_have_the_stated_shape() -> None:
    assert normalize_transcript("  Hello, WORLD!  It's 你好。") == "hello world it's 你好"
    assert normalize_transcript("...") == ""
    tone = np.sin(2 * np.pi * 1000 * np.arange(SAMPLE_RATE) / SAMPLE_RATE).astype(np.float32)
    features = log_mel(tone, 40)
    assert features.shape == (98, 40)  # 1 s: (16000 - 400) // 160 + 1 frames
    # A 1 kHz tone puts its energy in the band around 1 kHz.
    centres = np.argmax(mel_filterbank(40, 512), axis=1) * SAMPLE_RATE / 512
    assert abs(centres[int(np.argmax(features.mean(axis=0)))] - 1000) < 150
    assert len(resample(tone, SAMPLE_RATE, 8000)) == 8000
    assert len(resample(np.zeros(22050, np.float32), 22050)) == SAMPLE_RATE
    config = CorpusConfig()
    assert split_of("en-us+m3", config) == split_of("en-us+m3", config)
    with pytest.raises(ValueError, match="unreadable"):
        decode_wav(b"definitely not a wav file at all")
    with pytest.raises(ValueError, match="empty"):
        decode_wav(b"")


def test_one_normalization_keeps_any_script_and_digits_and_only_empty_text_is_refused(
    tmp_path: Path,
) -> None:
    codes = ("fr", "fr-CA", "ru", "el", "be", "en-gb", "zh", "greek", "cs-CZ", "de_AT")
    assert [language_group(c) for c in codes] == [
        "french", "french", "russian", "greek", "belarusian", "english", "mandarin", "greek",
        "cs", "de",
    ]  # fmt: skip
    assert language_group("ml") == "ml"  # any other language is its own code
    # NFKC (full-width forms, composed accents), lower case (ß stays ß), digits kept, any
    # script kept with its combining marks, apostrophes only inside words, the rest a space.
    assert normalize_transcript("Ｌe ＣHAT n°２, l’été") == "le chat n 2 l'été"
    assert normalize_transcript("Straße 12") == "straße 12"
    assert normalize_transcript("e\u0301cole") == "école"
    assert normalize_transcript("Příliš žluťoučký kůň!") == "příliš žluťoučký kůň"
    assert normalize_transcript("हिन्दी, भाषा") == "हिन्दी भाषा"
    assert normalize_transcript("'quoted' rock 'n' roll") == "quoted rock n roll"
    assert normalize_transcript("Ţară ŞI") == "ţară şi"  # no spelling is language-specific
    for text in ("Ｌe ＣHAT n°２, l’été", "Straße", "हिन्दी, भाषा"):
        assert normalize_transcript(normalize_transcript(text)) == normalize_transcript(text)
    config = CorpusConfig()
    pcm = _pcm(1.0, 16_000, amplitude=0.1)
    header = write_wav(tmp_path / "u.wav", pcm, 16_000).read_bytes()
    # No fixed alphabet: a Czech, German or Mandarin transcript with digits is kept as it is.
    for text, language, expected in (
        ("Kůň má 4 nohy", "cs", "kůň má 4 nohy"),
        ("Die Straße Nr. 7", "de", "die straße nr 7"),
        ("我有3个橙子", "zh", "我有3个橙子"),
        ("Кот и cat", "ru", "кот и cat"),
    ):
        row = process_one("u", header, {"text": text, "language": language, "voice": "v"}, config)
        assert row["reason"] is None and row["transcript"] == expected
    row = process_one("u", header, {"text": "?! …", "language": "en", "voice": "v"}, config)
    assert row["reason"] == "transcript: empty after normalization (no letter, mark or digit)"


def test_people_train_only_when_named_and_everyone_else_is_test_data() -> None:
    config = CorpusConfig()
    assert split_of("human-tuxpaint-fr", config) == "train"
    assert split_of("human-tuxpaint-ru", config) == "train"
    # The held-out readers, and any person the config does not name, are test data.
    for voice in ("human-tuxpaint-en", "human-tuxpaint-ca", "human-tuxpaint-be", "human-x"):
        assert split_of(voice, config) == "test"
    none_train = CorpusConfig(people_train_voices=())
    assert split_of("human-tuxpaint-fr", none_train) == "test"


def test_landed_batch_becomes_speaker_disjoint_shards_and_every_fault_is_quarantined(
    spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    landing, out = tmp_path / "landing", tmp_path / "corpus"
    assert land_synthetic(spark, landing, count=60, seed=1) == 60
    wav = landing / "wav"
    planted = {
        "bad-empty": "audio",
        "bad-notaudio": "audio",
        "bad-clipped": "audio",
        "bad-rate": "audio",
        "bad-notext": "transcript missing",
        "bad-noaudio": "audio missing",
        "bad-punct": "transcript",
        "bad-long": "duration",
        "bad-slow": "speaking rate",
    }
    (wav / "bad-empty.wav").write_bytes(b"")
    (wav / "bad-notaudio.wav").write_bytes(b"RIFF....this is text pretending to be a wav")
    loud = (np.sign(np.sin(np.arange(16000))) * 32767).astype("<i2").tobytes()
    write_wav(wav / "bad-clipped.wav", loud, 16000)
    write_wav(wav / "bad-rate.wav", _pcm(1.0, 11025), 11025)
    write_wav(wav / "bad-notext.wav", _pcm(1.0, 16000), 16000)
    write_wav(wav / "bad-punct.wav", _pcm(1.0, 16000), 16000)
    write_wav(wav / "bad-long.wav", _pcm(21.0, 16000), 16000)
    write_wav(wav / "bad-slow.wav", _pcm(6.0, 16000), 16000)
    extra = [
        {"utterance_id": u, "text": t, "language": "en-us", "voice": "en-us+m1"}
        for u, t in [
            ("bad-empty", "open"), ("bad-notaudio", "open"), ("bad-clipped", "open"),
            ("bad-rate", "open"), ("bad-noaudio", "open the door"),
            ("bad-punct", "?!"), ("bad-long", "open"), ("bad-slow", "a"),
        ]
    ]  # fmt: skip
    with (landing / "transcripts.jsonl").open("a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(e) + "\n" for e in extra))

    config = CorpusConfig(n_mels=40, shards=2, rows_per_shard=20)
    summary = build_corpus(spark, landing, out, config)
    assert summary["utterances"] == 60 and summary["quarantined"] == len(planted)
    quarantine = pd.read_parquet(out / "quarantine")
    reasons = dict(zip(quarantine.utterance_id, quarantine.reason, strict=True))
    assert set(reasons) == set(planted)
    for utterance_id, prefix in planted.items():
        assert reasons[utterance_id].startswith(prefix), (utterance_id, reasons[utterance_id])
    assert "clipped" in reasons["bad-clipped"] and "11025" in reasons["bad-rate"]

    manifest = pd.read_parquet(out / "manifest")
    assert len(manifest) == 60 and manifest.utterance_id.is_unique
    assert not set(manifest.utterance_id) & set(planted)
    voices = manifest.groupby("split").voice.apply(set).to_dict()
    assert voices.get("train") and not (voices["train"] & voices.get("test", set()))
    assert not voices["train"] & voices.get("dev", set())
    assert manifest.seconds.between(0.3, 20).all() and (manifest.transcript.str.len() > 0).all()

    shards = pd.read_parquet(out / "shards")
    assert len(shards) == 60
    # 60 utterances at 20 per write task: 3 tasks, so the train split is spread over 3 files.
    assert config.write_tasks(60) == 3
    assert len(list((out / "shards" / "split=train").glob("*.parquet"))) == 3
    row = shards.iloc[0]
    features = features_of(row, 40)
    assert features.shape == (row.num_frames, 40) and np.isfinite(features).all()
    assert math.isclose(row.num_frames, 1 + (row.seconds * SAMPLE_RATE - 400) // 160, abs_tol=1)

    # The GX gate passes the built manifest and names a speaker leak in a tampered one.
    report = validate_corpus(out)
    assert report["success"] and report["rows"] == 60 and (out / "gate.json").exists()
    leaked = tmp_path / "leaked"
    (leaked / "manifest").mkdir(parents=True)
    tampered = manifest.copy()
    voice = tampered.voice.iloc[0]
    other = next(s for s in ("train", "dev", "test") if s != tampered.split.iloc[0])
    tampered.loc[tampered.index[1:], "voice"] = voice  # one voice everywhere ...
    tampered.loc[tampered.index[1], "split"] = other  # ... across two splits
    tampered.to_parquet(leaked / "manifest" / "part-0.parquet")
    with pytest.raises(CorpusGateFailed, match=r"voices\.expect_column_values_to_be_between"):
        validate_corpus(leaked)
    # A corpus too small to hold a voice out for the test split is refused before training.
    small = tmp_path / "small"
    (small / "manifest").mkdir(parents=True)
    manifest.assign(split="train").to_parquet(small / "manifest" / "part-0.parquet")
    with pytest.raises(CorpusGateFailed, match=r"splits\.expect_\w+\(test_utterances\)"):
        validate_corpus(small)
