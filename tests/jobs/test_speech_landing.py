"""The speech importers: each standard layout, written here with generated audio, lands as
16 kHz mono 16-bit WAVs beside ``transcripts.jsonl`` that the corpus job accepts; malformed
items are quarantined with their reasons; a batch with nothing good raises and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from domains.speech.audio_features import SAMPLE_RATE, CorpusConfig
from jobs.audio_corpus import process_one
from jobs.speech_landing import (
    SPEECH_FORMATS,
    land_common_voice,
    land_kaldi,
    land_librispeech,
    land_speech_jsonl,
)
from tests.pipelines.standard_layouts import write_audio

DS = "2026-11-29"


def cut(path: Path, keep: float = 0.5) -> Path:
    content = path.read_bytes()
    path.write_bytes(content[: int(len(content) * keep)])
    return path


def landed(dest: Path) -> dict[str, dict[str, str | None]]:
    """``{utterance_id: record}`` after checking every WAV: 16 kHz, mono, 16-bit PCM."""
    records = {}
    for line in (dest / "transcripts.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        info = soundfile.info(dest / "wav" / f"{record['utterance_id']}.wav")
        assert (info.samplerate, info.channels, info.format, info.subtype) == (
            SAMPLE_RATE,
            1,
            "WAV",
            "PCM_16",
        ), info
        assert set(record) == {"utterance_id", "text", "language", "voice", "source"}
        records[record["utterance_id"]] = record
    assert sorted(p.stem for p in (dest / "wav").iterdir()) == sorted(records)
    return records


def quarantined(dest: Path) -> dict[str, str]:
    lines = (dest / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["item"]: r["reason"] for r in map(json.loads, lines)}


def seconds_of(dest: Path, utterance_id: str) -> float:
    return soundfile.info(dest / "wav" / f"{utterance_id}.wav").duration


def test_kaldi_data_directory_lands_any_format_rate_and_channels(tmp_path: Path) -> None:
    data, audio, dest = (
        tmp_path / "s5" / "data" / "train",
        tmp_path / "s5" / "audio",
        tmp_path / "out",
    )
    dest.mkdir()
    write_audio(audio / "a.flac", 1.0, 44_100, channels=2)
    write_audio(audio / "b.ogg", 1.5, 22_050)
    absolute = write_audio(tmp_path / "elsewhere" / "c.wav", 0.8, 8_000, channels=2)
    write_audio(audio / "long.wav", 3.0, 16_000)
    cut(write_audio(audio / "cut.wav", 1.0, 16_000))
    (audio / "empty.flac").write_bytes(b"")
    (audio / "text.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt this is not audio")
    data.mkdir(parents=True)
    (data / "wav.scp").write_text(
        "rec-a audio/a.flac\nrec-b audio/b.ogg\n"
        f"rec-c {absolute}\nrec-long audio/long.wav\nrec-cut audio/cut.wav\n"
        "rec-empty audio/empty.flac\nrec-text audio/text.wav\nrec-gone audio/gone.wav\n"
    )
    (data / "segments").write_text(
        "a-1 rec-a 0 1\nb-1 rec-b 0.0 -1\nc-1 rec-c 0 0.8\n"
        "long-1 rec-long 0.0 1.0\nlong-2 rec-long 1.5 3.0\nlong-3 rec-long 2.5 9.0\n"
        "cut-1 rec-cut 0 1\nempty-1 rec-empty 0 1\ntext-1 rec-text 0 1\ngone-1 rec-gone 0 1\n"
        "orphan-1 rec-none 0 1\n"
    )
    texts = ["a-1 open the door", "b-1 ДОБРЫЙ ДЕНЬ", "c-1 close it", "long-1 one", "long-2 two"]
    texts += ["long-3 three", "cut-1 x", "empty-1 x", "text-1 x", "gone-1 x", "orphan-1 x"]
    texts += ["nospk-1 x", "notext-1"]
    (data / "text").write_text("\n".join(texts) + "\n", encoding="utf-8")
    speakers = ["a-1 spk1", "b-1 spk2", "c-1 spk1", "long-1 spk3", "long-2 spk3", "long-3 spk3"]
    speakers += ["cut-1 s", "empty-1 s", "text-1 s", "gone-1 s", "orphan-1 s"]
    (data / "utt2spk").write_text("\n".join(speakers) + "\n")

    counts = land_kaldi(data, dest, ds=DS, language="en")

    records = landed(dest)
    assert set(records) == {"a-1", "b-1", "c-1", "long-1", "long-2"}
    assert records["b-1"]["text"] == "ДОБРЫЙ ДЕНЬ" and records["a-1"]["language"] == "en"
    assert {r["voice"] for r in records.values()} == {"spk1", "spk2", "spk3"}
    assert seconds_of(dest, "a-1") == pytest.approx(1.0, abs=0.01)
    assert seconds_of(dest, "b-1") == pytest.approx(1.5, abs=0.01)
    assert seconds_of(dest, "long-2") == pytest.approx(1.5, abs=0.01)
    # Stereo is averaged: the mono mix of a 220 Hz and a 440 Hz tone holds both.
    mono, _ = soundfile.read(dest / "wav" / "a-1.wav")
    spectrum = np.abs(np.fft.rfft(mono))
    peaks = sorted(np.argsort(spectrum)[-2:] * SAMPLE_RATE / len(mono))
    assert peaks == pytest.approx([220, 440], abs=2)
    reasons = quarantined(dest)
    assert set(reasons) == {
        "long-3", "cut-1", "empty-1", "text-1", "gone-1", "orphan-1", "nospk-1", "notext-1",
    }  # fmt: skip
    assert reasons["long-3"].startswith("segment: out of range")
    assert reasons["cut-1"].startswith("audio: truncated: the data chunk holds")
    assert reasons["empty-1"].startswith("audio: empty")
    assert reasons["text-1"].startswith("audio: truncated header")
    assert reasons["gone-1"].startswith("audio missing") and "gone.wav" in reasons["gone-1"]
    assert "rec-none is not in wav.scp" in reasons["orphan-1"]
    assert reasons["nospk-1"].startswith("audio missing (utterance nospk-1 is not in segments")
    assert reasons["notext-1"] == "audio missing (utterance notext-1 is not in segments)"
    assert counts == {"utterances": 5, "speakers": 3, "quarantined": 8, "seconds": 6}


def test_kaldi_without_segments_keeps_speakers_and_quarantines_missing_entries(
    tmp_path: Path,
) -> None:
    data, dest = tmp_path / "data", tmp_path / "out"
    dest.mkdir()
    write_audio(data / "u1.wav", 1.0, 48_000)
    write_audio(data / "u2.wav", 1.0, 16_000)
    write_audio(data / "u3.wav", 1.0, 16_000)
    (data / "wav.scp").write_text("u1 u1.wav\nu2 u2.wav\nu3 u3.wav\nu1 u2.wav\n")
    (data / "text").write_text("u1 hello\nu2 \nu3 world\n")
    (data / "utt2spk").write_text("u1 alice\nu2 bob\n")
    counts = land_kaldi(data, dest, ds=DS)
    assert landed(dest)["u1"] == {
        "utterance_id": "u1",
        "text": "hello",
        "language": None,
        "voice": "alice",
        "source": "kaldi",
    }
    reasons = quarantined(dest)
    assert reasons == {
        "u1": "kaldi: duplicate key (wav.scp line 4)",
        "u2": "transcript missing",
        "u3": "speaker missing (needed for speaker-disjoint splits)",
    }
    assert counts["utterances"] == 1 and counts["quarantined"] == 3


def test_kaldi_refuses_piped_commands_and_missing_tables(tmp_path: Path) -> None:
    data, dest = tmp_path / "data", tmp_path / "out"
    dest.mkdir()
    data.mkdir()
    (data / "wav.scp").write_text("r1 sox in.sph -t wav - |\n")
    (data / "text").write_text("r1 hi\n")
    with pytest.raises(ValueError, match="utt2spk") as missing:
        land_kaldi(data, dest, ds=DS)
    (data / "utt2spk").write_text("r1 s\n")
    with pytest.raises(ValueError, match=r"r1 is a piped command .*runs no commands") as piped:
        land_kaldi(data, dest, ds=DS)
    (data / "wav.scp").write_text("r1 in.wav\n")
    (data / "text").write_bytes("r1 caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"text: not UTF-8 text .*: save it as UTF-8") as latin:
        land_kaldi(data, dest, ds=DS)
    for error in (missing, piped, latin):
        assert "\n" not in str(error.value) and str(data) in str(error.value)
    assert not any(dest.iterdir())


def test_librispeech_layout_lands_flac_with_speakers(tmp_path: Path) -> None:
    root, dest = tmp_path / "LibriSpeech" / "dev-clean", tmp_path / "out"
    dest.mkdir()
    for speaker, chapter, rate in (("84", "121123", 16_000), ("174", "50561", 44_100)):
        folder = root / speaker / chapter
        lines = []
        for n in range(2):
            uid = f"{speaker}-{chapter}-{n:04d}"
            write_audio(folder / f"{uid}.flac", 1.0 + n / 2, rate, channels=1 + n)
            lines.append(f"{uid} GO DO YOU HEAR")
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
    first = root / "84" / "121123"
    write_audio(first / "84-121123-0009.flac", 1.0, 16_000)  # no transcript line
    cut(first / "84-121123-0001.flac")
    with (first / "84-121123.trans.txt").open("a") as handle:
        handle.write("84-121123-0005 A LINE WITHOUT AUDIO\n")

    counts = land_librispeech(tmp_path / "LibriSpeech", dest, ds=DS)

    records = landed(dest)
    assert set(records) == {"84-121123-0000", "174-50561-0000", "174-50561-0001"}
    assert records["174-50561-0001"]["voice"] == "174"
    assert records["174-50561-0001"]["text"] == "GO DO YOU HEAR"
    assert records["84-121123-0000"]["language"] == "en"
    assert seconds_of(dest, "174-50561-0001") == pytest.approx(1.5, abs=0.01)
    reasons = quarantined(dest)
    assert reasons["84-121123-0009"].startswith("transcript missing")
    assert reasons["84-121123-0001"].startswith("audio: unreadable")
    assert "84-121123-0001.flac" in reasons["84-121123-0001"]
    assert reasons["84-121123-0005"].startswith("audio missing")
    assert counts == {"utterances": 3, "speakers": 2, "quarantined": 3, "seconds": 4}


def test_common_voice_tsv_lands_mp3_and_ogg_clips_with_locale(tmp_path: Path) -> None:
    corpus, dest = tmp_path / "cv-corpus" / "cs", tmp_path / "out"
    dest.mkdir()
    write_audio(corpus / "clips" / "common_voice_cs_1.mp3", 1.2, 48_000)
    write_audio(corpus / "clips" / "common_voice_cs_2.ogg", 1.0, 32_000, channels=2)
    write_audio(corpus / "clips" / "common_voice_cs_3.mp3", 1.0, 48_000)
    cut(write_audio(corpus / "clips" / "common_voice_cs_4.mp3", 2.0, 48_000), keep=0.4)
    rows = [
        "client_id\tpath\tsentence\tup_votes\tlocale",
        'c0ffee\tcommon_voice_cs_1.mp3\tDobrý den, "řekla.\t2\tcs',
        "beef\tcommon_voice_cs_2.ogg\tJak se máte?\t3\t",
        "beef\tcommon_voice_cs_3.mp3\t\t1\tcs",
        "c0ffee\tcommon_voice_cs_4.mp3\tUříznuto.\t1\tcs",
        "c0ffee\tcommon_voice_cs_5.mp3\tNení tu.\t1\tcs",
        "",
        "c0ffee\tcommon_voice_cs_6.mp3\tMálo polí.",
    ]
    (corpus / "validated.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")

    counts = land_common_voice(corpus, dest, ds=DS, language="cs-CZ")

    records = landed(dest)
    assert records["common_voice_cs_1"]["text"] == 'Dobrý den, "řekla.'
    assert records["common_voice_cs_1"]["language"] == "cs"
    assert records["common_voice_cs_2"]["language"] == "cs-CZ"  # no locale: the argument
    assert records["common_voice_cs_2"]["voice"] == "beef"
    assert seconds_of(dest, "common_voice_cs_1") == pytest.approx(1.2, abs=0.06)
    reasons = quarantined(dest)
    assert reasons["common_voice_cs_3"] == "transcript missing"
    assert reasons["common_voice_cs_4"].startswith("audio: truncated: decoded")
    assert reasons["common_voice_cs_5"].startswith("audio missing")
    assert reasons["validated.tsv line 8"] == (
        "common voice: bad line (not as many fields as the header)"
    )
    assert counts["utterances"] == 2 and counts["speakers"] == 2 and counts["quarantined"] == 4
    (tmp_path / "bad.tsv").write_text("client_id\tpath\nx\ty.mp3\n")
    (tmp_path / "out2").mkdir()
    with pytest.raises(ValueError, match=r"columns \['sentence'\] missing"):
        land_common_voice(tmp_path / "bad.tsv", tmp_path / "out2", ds=DS)


def test_jsonl_manifest_lands_and_quarantines_bad_lines(tmp_path: Path) -> None:
    batch, dest = tmp_path / "batch", tmp_path / "out"
    dest.mkdir()
    write_audio(batch / "wav" / "u1.wav", 1.0, 22_050, channels=2)
    write_audio(batch / "wav" / "u2.wav", 1.0, 16_000)
    write_audio(batch / "wav" / "stray.wav", 1.0, 16_000)
    write_audio(batch / "clips" / "u3.flac", 1.0, 8_000)
    soundfile.write(batch / "wav" / "u4.wav", np.zeros((0, 1)), 16_000)
    lines = [
        {"utterance_id": "u1", "text": "open", "language": "en", "voice": "v1"},
        {"utterance_id": "u2", "text": "close", "speaker": "v2"},
        {"utterance_id": "u3", "text": "next", "voice": "v1", "audio": "clips/u3.flac"},
        {"utterance_id": "u4", "text": "empty", "voice": "v1"},
        {"utterance_id": "../up", "text": "escape", "voice": "v1"},
        {"text": "no id"},
    ]
    text = "".join(json.dumps(r) + "\n" for r in lines) + "{not json\n"
    (batch / "transcripts.jsonl").write_text(text)

    counts = land_speech_jsonl(batch, dest, ds=DS, language="en")

    records = landed(dest)
    assert set(records) == {"u1", "u2", "u3"}
    assert records["u2"]["voice"] == "v2" and records["u2"]["language"] == "en"
    reasons = quarantined(dest)
    assert reasons == {
        "u4": "audio: empty: no samples (u4.wav)",
        "'../up'": "utterance id: not a file name (holds a path separator)",
        "transcripts.jsonl line 6": "manifest: bad line (no utterance_id string)",
        "transcripts.jsonl line 7": reasons["transcripts.jsonl line 7"],
        "stray": "transcript missing (no line names stray.wav)",
    }
    assert reasons["transcripts.jsonl line 7"].startswith("manifest: bad line (not JSON")
    assert counts == {"utterances": 3, "speakers": 2, "quarantined": 5, "seconds": 3}


def test_an_all_bad_batch_raises_one_line_and_writes_nothing(tmp_path: Path) -> None:
    batch, dest = tmp_path / "batch", tmp_path / "out"
    dest.mkdir()
    (batch / "wav").mkdir(parents=True)
    (batch / "wav" / "u1.wav").write_bytes(b"")
    cut(write_audio(batch / "wav" / "u2.wav", 1.0, 16_000))
    lines = [{"utterance_id": u, "text": "x", "voice": "v"} for u in ("u1", "u2", "u3")]
    (batch / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ValueError) as error:
        land_speech_jsonl(batch, dest, ds=DS)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{batch}: nothing landed")
    assert "'audio:empty': 1" in message and "'audio:truncated': 1" in message
    assert message.endswith("fix the audio files and the manifest lines, then land again")
    assert not any(dest.iterdir())
    with pytest.raises(ValueError, match="not empty"):
        (dest / "x").write_text("")
        land_speech_jsonl(batch, dest, ds=DS)
    with pytest.raises(ValueError, match="not YYYY-MM-DD"):
        land_speech_jsonl(batch, tmp_path, ds="29.11.2026")


def test_landed_utterances_pass_the_corpus_jobs_checks(tmp_path: Path) -> None:
    """Every landed utterance, whatever its source format, becomes a corpus row (no reason)."""
    data, dest = tmp_path / "data", tmp_path / "out"
    dest.mkdir()
    sources = [("a", "flac", 44_100, 2), ("b", "ogg", 22_050, 1), ("c", "wav", 8_000, 2)]
    for uid, ext, rate, channels in sources:
        write_audio(data / f"{uid}.{ext}", 1.0, rate, channels)
    (data / "wav.scp").write_text("".join(f"{u} {u}.{e}\n" for u, e, _, _ in sources))
    (data / "text").write_text("a open the door\nb close the door\nc next song\n")
    (data / "utt2spk").write_text("a s1\nb s2\nc s1\n")
    assert land_kaldi(data, dest, ds=DS, language="en")["utterances"] == 3
    config = CorpusConfig()
    for record in map(json.loads, (dest / "transcripts.jsonl").read_text().splitlines()):
        content = (dest / "wav" / f"{record['utterance_id']}.wav").read_bytes()
        row = process_one(record["utterance_id"], content, record, config)
        assert row["reason"] is None, row["reason"]
        assert row["source_rate"] == SAMPLE_RATE and row["seconds"] == pytest.approx(1.0, abs=0.01)
        assert row["voice"] == record["voice"] and row["num_frames"] > 90


def test_every_format_has_an_importer() -> None:
    assert set(SPEECH_FORMATS) == {"kaldi", "librispeech", "common_voice", "jsonl"}
