"""Every malformed audio and image class, planted in a landing batch and run through the real
corpus jobs on Spark: each lands in the quarantine under its own reason, and the summary counts
each reason apart. Plus the pieces: WAV header checks, the shared minimum duration, the SVG
rasterizer's caps and timeout."""

from __future__ import annotations

import io
import json
import struct
import wave
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from domains.speech.audio_features import (
    MIN_SECONDS,
    CorpusConfig,
    WavError,
    decode_wav,
    read_wav_header,
)
from jobs import audio_corpus, multimodal_corpus
from jobs.multimodal_sources import GeneratorConfig, generated_pair
from jobs.quarantine import reason_key
from jobs.svg_raster import SvgError, SvgRasterizer, expand_text_entities
from models.asr.compiled import MIN_AUDIO_FRAMES, MIN_FRAMES, frames_for_seconds

RATE = 16_000
SVG_NS = 'xmlns="http://www.w3.org/2000/svg"'


def wav(seconds: float, rate: int = RATE, *, width: int = 2, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    samples = rng.normal(0, 0.2, int(seconds * rate)).clip(-0.9, 0.9)
    if width == 1:
        pcm = (samples * 127 + 128).astype(np.uint8).tobytes()
    else:
        pcm = (samples * 32767).astype("<i2").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return buffer.getvalue()


def streamed(content: bytes) -> bytes:
    """``content`` as a streaming writer leaves it: RIFF and data sizes are placeholders."""
    data = bytearray(content)
    struct.pack_into("<I", data, 4, 0xFFFFFFFF)
    struct.pack_into("<I", data, 40, 0x7FFFF000)
    return bytes(data)


def test_wav_header_problems_are_named() -> None:
    whole = wav(1.0)
    cases = {
        b"": "empty",
        b"ID3\x04 an mp3, not a wav file": "unreadable",
        whole[:30]: "truncated header",
        whole[: len(whole) // 2]: "truncated",
        wav(0.5, width=1): "unsupported",
    }
    for content, kind in cases.items():
        with pytest.raises(WavError) as failure:
            decode_wav(content)
        assert failure.value.kind == kind and failure.value.detail.strip(), failure.value
    with pytest.raises(WavError, match=r"ends after 30 bytes, inside the 'fmt ' chunk"):
        decode_wav(whole[:30])
    with pytest.raises(WavError, match=r"holds 7989 of the 16000 frames"):
        decode_wav(whole[: len(whole) // 2])
    # A streamed file's sizes are placeholders: it is read to its end, not called truncated.
    header = read_wav_header(streamed(whole))
    assert header.streamed and header.frames == 16_000
    assert len(decode_wav(streamed(whole))[0]) == 16_000


def test_one_minimum_duration_for_corpus_compiler_and_server() -> None:
    assert CorpusConfig().min_seconds == MIN_SECONDS == 0.3
    assert MIN_AUDIO_FRAMES == frames_for_seconds(MIN_SECONDS) >= MIN_FRAMES


def test_reason_keys_keep_the_kind_and_drop_the_numbers() -> None:
    assert reason_key("audio: truncated: the data chunk holds 3 of 9 frames") == "audio:truncated"
    assert reason_key("audio: sample rate 11025 Hz not in [8000]") == "audio:sample rate"
    assert reason_key("audio: clipped (2.0% of samples at full scale)") == "audio:clipped"
    assert reason_key("duration: too short (0.12 s < 0.3 s)") == "duration:too short"
    assert reason_key("speaking rate 41.0 chars/s out of range") == "speaking rate"
    assert reason_key("voice missing (needed for splits)") == "voice missing"
    assert reason_key("image: too small (8x8 < 16 px)") == "image:too small"
    assert reason_key("language: unsupported 'fr' (expected en)") == "language:unsupported"


def test_svg_rasterizer_caps_and_timeout() -> None:
    drawing = f'<svg {SVG_NS} width="100" height="50"><circle cx="50" cy="25" r="20"/></svg>'
    with SvgRasterizer(max_side=64, max_bytes=4096, timeout_s=30) as rasterizer:
        png = rasterizer.rasterize(drawing.encode())
        assert Image.open(io.BytesIO(png)).size == (64, 32)  # the drawing's shape, capped
        with pytest.raises(SvgError, match="too large"):
            rasterizer.rasterize(drawing.encode() + b" " * 5000)
        with pytest.raises(SvgError, match="mismatched tag"):
            rasterizer.rasterize(f"<svg {SVG_NS}><g></svg>".encode())
        with pytest.raises(SvgError, match="not fetched"):
            remote = f'<svg {SVG_NS} width="9" height="9"><image href="http://127.0.0.1:9/x"/>'
            rasterizer.rasterize((remote + "</svg>").encode())
        # Still serving after the failures.
        assert rasterizer.rasterize(drawing.encode()) == png
    # A child that does not answer in time is killed; the next file gets a new one.
    with SvgRasterizer(max_side=64, max_bytes=4096, timeout_s=0.01) as slow:
        with pytest.raises(SvgError, match="within 0.01 s"):
            slow.rasterize(drawing.encode())
        slow.timeout_s = 30
        assert slow.rasterize(drawing.encode()) == png
    # Drawing programs' namespace entities are expanded; an external entity is left to the
    # parser, which refuses it.
    entities = (
        b'<!DOCTYPE svg [<!ENTITY ns_svg "http://www.w3.org/2000/svg">]>'
        b'<svg xmlns="&ns_svg;" width="9" height="9"/>'
    )
    assert expand_text_entities(entities) == b'<svg xmlns="http://www.w3.org/2000/svg" ' + (
        b'width="9" height="9"/>'
    )
    external = b'<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]><svg>&x;</svg>'
    assert expand_text_entities(external) == external


AUDIO_FAULTS = {
    # utterance id: (content or None, transcript or None, expected reason key)
    "truncated-data": (wav(1.0)[: 44 + 9000], "open the door", "audio:truncated"),
    "header-cut-30": (wav(1.0)[:30], "open the door", "audio:truncated header"),
    "zero-bytes": (b"", "open the door", "audio:empty"),
    "too-short": (wav(0.125), "open", "duration:too short"),
    "too-long": (wav(21.0), "open the door", "duration:too long"),
    "not-a-wav": (b"ID3\x04 an mp3 file" * 20, "open the door", "audio:unreadable"),
    "eight-bit": (wav(1.0, width=1), "open the door", "audio:unsupported"),
    "header-only": (wav(0.0), "open the door", "audio:no samples"),
    "odd-rate": (wav(1.0, 11_025), "open the door", "audio:sample rate"),
    "clipped": (
        (np.sign(np.sin(np.arange(RATE))) * 32767).astype("<i2").tobytes(),
        "open the door",
        "audio:clipped",
    ),
    "punctuation-only": (wav(1.0), "?! …", "transcript:empty after normalization"),
    "too-slow": (wav(6.0), "a", "speaking rate"),
    "no-transcript": (wav(1.0), None, "transcript missing"),
    "no-audio": (None, "open the door", "audio missing"),
}


@pytest.mark.slow
def test_every_malformed_audio_file_is_quarantined_with_its_reason(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    landing, out = tmp_path / "landing", tmp_path / "corpus"
    wav_dir = landing / "wav"
    wav_dir.mkdir(parents=True)
    good = {f"good-{i}": wav(1.0, seed=i) for i in range(3)}
    good["good-streamed"] = streamed(wav(1.0, seed=9))
    records = []
    for utterance_id, content in good.items():
        (wav_dir / f"{utterance_id}.wav").write_bytes(content)
        records.append((utterance_id, "open the door"))
    for utterance_id, (content, text, _) in AUDIO_FAULTS.items():
        if utterance_id == "clipped":
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as writer:
                writer.setnchannels(1)
                writer.setsampwidth(2)
                writer.setframerate(RATE)
                writer.writeframes(content)
            content = buffer.getvalue()
        if content is not None:
            (wav_dir / f"{utterance_id}.wav").write_bytes(content)
        if text is not None:
            records.append((utterance_id, text))
    with (landing / "transcripts.jsonl").open("w", encoding="utf-8") as handle:
        for utterance_id, text in records:
            record = {"utterance_id": utterance_id, "text": text, "language": "en-us"}
            handle.write(json.dumps({**record, "voice": "en-us+m1"}) + "\n")

    config = CorpusConfig(n_mels=40, shards=1, rows_per_shard=100)
    summary = audio_corpus.build_corpus(spark, landing, out, config)

    quarantine = pd.read_parquet(out / "quarantine").set_index("utterance_id")["reason"]
    assert sorted(quarantine.index) == sorted(AUDIO_FAULTS)
    for utterance_id, (_, _, key) in AUDIO_FAULTS.items():
        reason = quarantine[utterance_id]
        assert reason_key(reason) == key, (utterance_id, reason)
        assert not reason.rstrip().endswith(":"), reason  # every reason says what is wrong
    assert "ends after 30 bytes, inside the 'fmt ' chunk" in quarantine["header-cut-30"]
    assert "holds 4500 of the 16000 frames" in quarantine["truncated-data"]
    manifest = pd.read_parquet(out / "manifest")
    assert sorted(manifest.utterance_id) == sorted(good)  # the streamed file is kept whole
    assert manifest.set_index("utterance_id").seconds["good-streamed"] == pytest.approx(1.0)
    assert summary["utterances"] == len(good) and summary["quarantined"] == len(AUDIO_FAULTS)
    assert summary["quarantine_by_reason"] == dict(
        Counter(key for _, _, key in AUDIO_FAULTS.values())
    )
    # The coarse count stays for its readers: 8 problems with the file under one key.
    assert summary["quarantine_reasons"]["audio"] == 8
    assert json.loads((out / "summary.json").read_text())["quarantine_by_reason"]


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def image_faults() -> dict[str, tuple[str, bytes, str]]:
    """pair id: (file name, bytes, expected outcome: a reason key or ``kept``)."""
    picture = generated_pair(0, GeneratorConfig(seed=11))[1]
    whole = png(picture)
    circle = f'<svg {SVG_NS} width="40" height="40"><circle cx="20" cy="20" r="12"/></svg>'
    return {
        "uniform": ("uniform.png", png(np.full((48, 48, 3), 200, np.uint8)), "image:uniform"),
        "blank-transparent": ("clear.png", png(np.zeros((48, 48, 4), np.uint8)), "image:uniform"),
        "unreadable": ("garbage.jpg", b"plain text, not a picture " * 30, "image:unreadable"),
        "truncated": ("half.png", whole[: len(whole) // 2], "image:truncated or corrupt data"),
        "zero-bytes": ("empty.png", b"", "image:empty file"),
        "extreme-aspect": (
            "strip.png",
            png(picture[:20].repeat(10, axis=1)),
            "image:extreme aspect ratio",
        ),
        "tiny": ("tiny.png", png(picture[:10, :10]), "image:too small"),
        "broken-svg": (
            "broken.svg",
            f"<svg {SVG_NS}><g><circle r='3'/></svg>".encode(),
            "image:SVG not rasterized",
        ),  # fmt: skip
        "huge-svg": (
            "huge.svg",
            circle.encode() + b"<!--" + b"x" * 9000 + b"-->",
            "image:SVG too large",
        ),  # fmt: skip
        "good-svg": ("circle.svg", circle.encode(), "kept"),
    }


@pytest.mark.slow
def test_every_malformed_image_is_quarantined_with_its_reason(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    landing, out = tmp_path / "landing", tmp_path / "corpus"
    images = landing / "images"
    images.mkdir(parents=True)
    records = []
    for index in range(4):
        record, pixels = generated_pair(
            index, GeneratorConfig(seed=3, image_dup_share=0, caption_dup_share=0)
        )
        (images / record["image"]).write_bytes(png(pixels))
        records.append(record)
    faults = image_faults()
    for number, (pair_id, (name, content, _)) in enumerate(faults.items()):
        (images / name).write_bytes(content)
        caption = f"planted file number {number} called {pair_id}"
        records.append(
            {
                "pair_id": pair_id,
                "image": name,
                "caption": caption,
                "language": "en",
                "source": "faults",
            }  # fmt: skip
        )
    with (landing / "captions.jsonl").open("w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))

    config = multimodal_corpus.CorpusConfig(shards=1, minhash_tables=2, svg_max_bytes=8192)
    summary = multimodal_corpus.build_corpus(spark, landing, out, config)

    quarantine = pd.read_parquet(out / "quarantine").set_index("pair_id")["reason"]
    manifest = pd.read_parquet(out / "manifest").set_index("pair_id")
    for pair_id, (_, _, outcome) in faults.items():
        if outcome == "kept":
            assert pair_id in manifest.index, quarantine.get(pair_id)
        else:
            assert reason_key(quarantine[pair_id]) == outcome, (pair_id, quarantine[pair_id])
    assert "mismatched tag" in quarantine["broken-svg"]  # the parser's own message
    assert "uniform" in quarantine["blank-transparent"]
    expected = Counter(outcome for _, _, outcome in faults.values() if outcome != "kept")
    assert summary["quarantine_by_reason"] == dict(expected)
    assert summary["quarantined"] == sum(expected.values())
    assert summary["kept"] == 4 + 1
    kept = pd.read_parquet(out / "shards").set_index("pair_id").loc["good-svg"]
    pixels = np.frombuffer(kept["image"], np.uint8).reshape(64, 64, 3)
    assert pixels[32, 32].max() < 64 and pixels[2, 2].min() == 255  # black disc on white
